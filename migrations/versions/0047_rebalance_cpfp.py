"""CPFP for a stuck rebalance into hot that RBF cannot bump (issue 16): `rebalance_cpfp`, `signer_cpfp`.

Revision ID: 0047_rebalance_cpfp
Revises: 0046_refill_expiry

Why: a cold -> hot move (signed offline through a PSBT) or a rebalance into hot without change
cannot be re-signed at a higher fee by the worker (custody.rebalances `_resign`); stuck in the
mempool it waited forever. custody.cpfp now has the signer sign a child spending the parent's
output at our hot receive address back to that address, paying for the package.

What changes:
- `rebalance_cpfp` (custody's, the worker's): one row per parent rebalance (UNIQUE rebalance_id:
  one child per parent), the parent's txid and the vout it spends, the child version followed now
  (`txid`, `raw`, `fee`, `fee_rate` = the package rate it aims at), `state` (custody/states.py
  CPFP_TRANSITIONS: signed -> broadcast -> confirmed -> final, or broadcast -> dropped), the
  containment columns (custody.containment). Read-only for custody_api.
- `firm_tx_version.machine` admits 'cpfp': every signed child version is kept there (append-only),
  a bump's child `replaces_id` naming the child it replaces; only the mined one is booked.
- `signer_cpfp` (the signer's own record, append-only, only the signer role writes it): every
  child it signed, its parent outpoint, fee and the child txid it replaces. The signer signs at
  most one child per parent outpoint and replaces a child only by one at a higher fee.

Who can forge what: custody_api reads `rebalance_cpfp` only. A worker (or a database writer) could
write a forged row or version; the signer never trusts it: it reads the parent's bytes itself and
checks the output pays its own hot receive address, the child pays only that address, the fee is
within its ceiling, against its own record.
"""
import importlib.util
from pathlib import Path

from alembic import op

revision = "0047_rebalance_cpfp"
down_revision = "0046_refill_expiry"
branch_labels = None
depends_on = None

_spec = importlib.util.spec_from_file_location("_migration_0040", Path(__file__).with_name("0040_convert_fixes.py"))
assert _spec is not None and _spec.loader is not None
_0040 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_0040)


def _set_signer_tables(tables: str) -> str:
    """Redefine custody_signer_tables() as the text[] expression `tables` (from what the database holds)."""
    return f"""
DO $do$
DECLARE v_tables text;
BEGIN
    SELECT string_agg(quote_literal(r.t), ', ' ORDER BY r.n) INTO v_tables FROM unnest({tables}) WITH ORDINALITY AS r(t, n);
    EXECUTE format('CREATE OR REPLACE FUNCTION custody_signer_tables() RETURNS text[] LANGUAGE sql IMMUTABLE '
                   'AS $f$ SELECT ARRAY[%s]::text[] $f$', v_tables);
END $do$;
"""


UPGRADE = f"""
CREATE TABLE rebalance_cpfp (
    id                    bigserial PRIMARY KEY,
    chain                 text NOT NULL DEFAULT 'bitcoin' CHECK (chain = 'bitcoin'),
    rebalance_id          bigint NOT NULL UNIQUE REFERENCES rebalance(id),  -- one child per parent
    parent_txid           text NOT NULL,
    parent_vout           integer NOT NULL CHECK (parent_vout >= 0),
    amount                numeric(78,0) NOT NULL CHECK (amount > 0),  -- the parent output the child spends
    state                 text NOT NULL CHECK (state IN ('signed', 'broadcast', 'confirmed', 'final', 'dropped')),
    txid                  text NOT NULL UNIQUE,
    raw                   bytea NOT NULL,
    fee                   numeric(78,0) NOT NULL CHECK (fee > 0),
    fee_rate              numeric(78,0) NOT NULL CHECK (fee_rate > 0),  -- the package rate aimed at, sat/kvB
    broadcast_height      bigint,
    confirmations         integer NOT NULL DEFAULT 0,
    containment           text NOT NULL DEFAULT 'active' CHECK (containment IN ('active', 'set_aside')),
    set_aside_step        text,
    set_aside_incident_id bigint REFERENCES incident(id),
    set_aside_count       integer NOT NULL DEFAULT 0 CHECK (set_aside_count >= 0),
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    UNIQUE (parent_txid, parent_vout)
);
CREATE TRIGGER rebalance_cpfp_never_deleted BEFORE DELETE ON rebalance_cpfp
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();

ALTER TABLE firm_tx_version DROP CONSTRAINT firm_tx_version_machine_check;
ALTER TABLE firm_tx_version ADD CONSTRAINT firm_tx_version_machine_check CHECK (machine IN ('sweep', 'rebalance', 'cpfp'));

CREATE TABLE signer_cpfp (
    id             bigserial PRIMARY KEY,
    signed_at      timestamptz NOT NULL,
    rebalance_id   bigint NOT NULL,              -- no foreign key: the signer's evidence stands alone
    parent_txid    text NOT NULL,
    parent_vout    integer NOT NULL,
    txid           text NOT NULL,
    fee            numeric(78,0) NOT NULL CHECK (fee > 0),
    replaces_txid  text
);
CREATE INDEX signer_cpfp_parent ON signer_cpfp (parent_txid, parent_vout);
CREATE TRIGGER signer_cpfp_append_only BEFORE UPDATE OR DELETE ON signer_cpfp
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();

{_set_signer_tables("custody_signer_tables() || ARRAY['signer_cpfp']")}
{_0040._set_read_only("custody_api_read_only_tables() || ARRAY['rebalance_cpfp']")}
CALL custody_apply_role_grants();
"""

DOWNGRADE = f"""
{_0040._set_read_only("array_remove(custody_api_read_only_tables(), 'rebalance_cpfp')")}
{_set_signer_tables("array_remove(custody_signer_tables(), 'signer_cpfp')")}
DROP TABLE signer_cpfp;
ALTER TABLE firm_tx_version DROP CONSTRAINT firm_tx_version_machine_check;
ALTER TABLE firm_tx_version ADD CONSTRAINT firm_tx_version_machine_check CHECK (machine IN ('sweep', 'rebalance'))
    NOT VALID;
DROP TABLE rebalance_cpfp;
CALL custody_apply_role_grants();
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
