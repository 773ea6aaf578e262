"""Fee bumps for ethereum sweeps, gas fundings and rebalances (issue 16): same-nonce replacements.

Revision ID: 0045_eth_fee_bumps
Revises: 0044_eth_refill_routes

Why: a gas funding, sweep or ethereum rebalance signed below the base fee waited forever, and every
later transaction of its sender (a deposit address's next sweep, every hot-address withdrawal,
funding and rebalance) waited behind it. custody.eth_moves now re-signs a stuck one at the same
nonce with higher fees (EIP-1559 replacement) and follows every version until one is mined.

What changes:
- `eth_tx_version` (custody's, the worker's): every signed version of an `eth_gas_funding`,
  `eth_sweep` or `eth_rebalance` transaction, append-only (trigger), `replaces_id` naming the
  version it replaces; the row's `txid` / `raw` are the version followed now. Read-only for
  custody_api (it joins `custody_api_read_only_tables()`, rewritten from what the database holds,
  0040's way). The rows signed before this migration get their one version here.
- `broadcast_height` on the three tables: the tip when the version followed now was sent (reset
  at each bump), from which `stuck_blocks` is counted.
- `eth_sweep.max_fee_cap_wei`: the highest max fee per gas a bump of the sweep may reach, set when
  it is planned; the gas funding (token sweep) or the reserve kept back (ether sweep) covers gas
  limit x this cap, so the deposit address can pay for a bumped version. NULL (rows from before):
  the row's own `max_fee_wei`, so those are never bumped past what the address holds.
- the signer's records `signer_eth_sweep` and `signer_eth_rebalance` gain `gas_limit`,
  `max_fee_wei`, `priority_fee_wei` and `replaces_txid` (NULL on rows from before): the signer
  checks a replacement against ITS record of the version replaced (same chain id, sender, nonce,
  destination, asset, amount, gas limit; both fees raised enough, within its cap), never against
  custody's row. They stay the signer's tables (append-only, only the signer role writes them).

Who can forge what: custody_api reads `eth_tx_version` only. A worker (or a database writer)
could insert a forged version row, but the signer never reads it: a version it did not sign is
never signed again, and custody sends only bytes whose txid it recorded with a version.
"""
import importlib.util
from pathlib import Path

from alembic import op

revision = "0045_eth_fee_bumps"
down_revision = "0044_eth_refill_routes"
branch_labels = None
depends_on = None

_spec = importlib.util.spec_from_file_location("_migration_0040", Path(__file__).with_name("0040_convert_fixes.py"))
assert _spec is not None and _spec.loader is not None
_0040 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_0040)

UPGRADE = f"""
CREATE TABLE eth_tx_version (
    id                bigserial PRIMARY KEY,
    machine           text NOT NULL CHECK (machine IN ('eth_gas_funding', 'eth_sweep', 'eth_rebalance')),
    row_id            bigint NOT NULL,
    txid              text NOT NULL UNIQUE,
    raw               bytea NOT NULL,
    nonce             numeric(78,0) NOT NULL CHECK (nonce >= 0),
    gas_limit         numeric(78,0) NOT NULL CHECK (gas_limit > 0),
    max_fee_wei       numeric(78,0) NOT NULL CHECK (max_fee_wei > 0),
    priority_fee_wei  numeric(78,0) NOT NULL CHECK (priority_fee_wei >= 0),
    replaces_id       bigint REFERENCES eth_tx_version(id),
    created_at        timestamptz NOT NULL DEFAULT now()
);  -- two workers bump a version once: the row is locked across the signer call (custody.eth_moves)
CREATE INDEX eth_tx_version_row ON eth_tx_version (machine, row_id);
CREATE UNIQUE INDEX eth_tx_version_one_replacement ON eth_tx_version (replaces_id) WHERE replaces_id IS NOT NULL;
CREATE TRIGGER eth_tx_version_append_only BEFORE UPDATE OR DELETE ON eth_tx_version
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();

ALTER TABLE eth_gas_funding ADD COLUMN broadcast_height bigint;
ALTER TABLE eth_sweep ADD COLUMN broadcast_height bigint;
ALTER TABLE eth_rebalance ADD COLUMN broadcast_height bigint;
ALTER TABLE eth_sweep ADD COLUMN max_fee_cap_wei numeric(78,0) CHECK (max_fee_cap_wei IS NULL OR max_fee_cap_wei >= max_fee_wei);

-- the rows signed before this migration: their one version (a funding's nonce may be NULL only while open)
INSERT INTO eth_tx_version (machine, row_id, txid, raw, nonce, gas_limit, max_fee_wei, priority_fee_wei)
    SELECT 'eth_gas_funding', id, txid, raw, nonce, gas_limit, max_fee_wei, priority_fee_wei
    FROM eth_gas_funding WHERE txid IS NOT NULL AND nonce IS NOT NULL ORDER BY id;
INSERT INTO eth_tx_version (machine, row_id, txid, raw, nonce, gas_limit, max_fee_wei, priority_fee_wei)
    SELECT 'eth_sweep', id, txid, raw, nonce, gas_limit, max_fee_wei, priority_fee_wei
    FROM eth_sweep WHERE txid IS NOT NULL ORDER BY id;
INSERT INTO eth_tx_version (machine, row_id, txid, raw, nonce, gas_limit, max_fee_wei, priority_fee_wei)
    SELECT 'eth_rebalance', id, txid, raw, nonce, gas_limit, max_fee_wei, priority_fee_wei
    FROM eth_rebalance WHERE txid IS NOT NULL AND nonce IS NOT NULL ORDER BY id;

ALTER TABLE signer_eth_sweep ADD COLUMN gas_limit numeric(78,0), ADD COLUMN max_fee_wei numeric(78,0),
    ADD COLUMN priority_fee_wei numeric(78,0), ADD COLUMN replaces_txid text;
ALTER TABLE signer_eth_rebalance ADD COLUMN gas_limit numeric(78,0), ADD COLUMN max_fee_wei numeric(78,0),
    ADD COLUMN priority_fee_wei numeric(78,0), ADD COLUMN replaces_txid text;
CREATE INDEX signer_eth_sweep_txid ON signer_eth_sweep (txid);
CREATE INDEX signer_eth_rebalance_txid ON signer_eth_rebalance (txid);

{_0040._set_read_only("custody_api_read_only_tables() || ARRAY['eth_tx_version']")}
CALL custody_apply_role_grants();
"""

DOWNGRADE = f"""
{_0040._set_read_only("array_remove(custody_api_read_only_tables(), 'eth_tx_version')")}
DROP INDEX signer_eth_sweep_txid;
DROP INDEX signer_eth_rebalance_txid;
ALTER TABLE signer_eth_rebalance DROP COLUMN gas_limit, DROP COLUMN max_fee_wei, DROP COLUMN priority_fee_wei,
    DROP COLUMN replaces_txid;
ALTER TABLE signer_eth_sweep DROP COLUMN gas_limit, DROP COLUMN max_fee_wei, DROP COLUMN priority_fee_wei,
    DROP COLUMN replaces_txid;
ALTER TABLE eth_sweep DROP COLUMN max_fee_cap_wei;
ALTER TABLE eth_rebalance DROP COLUMN broadcast_height;
ALTER TABLE eth_sweep DROP COLUMN broadcast_height;
ALTER TABLE eth_gas_funding DROP COLUMN broadcast_height;
DROP TABLE eth_tx_version;
CALL custody_apply_role_grants();
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
