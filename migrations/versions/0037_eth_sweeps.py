"""Ethereum sweeps with a gas station: `eth_sweep`, `eth_gas_funding`, the signer's `signer_eth_sweep`.

Revision ID: 0037_eth_sweeps
Revises: 0032_event_guards

Why (issue 16): ether and ERC-20 deposits stayed on their deposit addresses. A token sweep needs
ether for gas on the deposit address first, so the hot address funds it; both transactions are the
firm's own moves and must keep reconciliation at zero at every step (custody/eth_sweeps.py).

What changes:
- `eth_sweep`: one row per sweep transaction (deposit address -> our hot address, ether or one
  token), with its deposit-address nonce reserved when the row is created and its gas limit and fee
  caps fixed then, so a re-sign after a crash signs the same transaction. States
  open -> signed -> broadcast -> confirmed -> final | reverted (custody/states.py).
- `eth_gas_funding`: at most one per sweep (UNIQUE sweep_id: no double funding), hot address ->
  deposit address, ether for exactly the gas the sweep may burn (gas limit x max fee per gas), with
  its hot-address nonce reserved (taken from `eth_nonce`, committed) before the signer is asked.
- `deposit_observation.eth_swept_by`: which sweep took a booked token or ether deposit (the
  bitcoin column `swept_by` references the bitcoin `sweep` table).
- `signer_eth_sweep`: the signer's own, append-only record of every gas funding and sweep it
  signed (sender, nonce, chain id, what it paid). It checks the next deposit-address nonce and
  the one-funding-per-sweep rule against it, never against custody's rows. Listed in
  `custody_signer_tables()` (0021's list plus this table), so only custody_signer may write it.
- custody_api may only read the two new operational tables (`custody_api_read_only_tables()`:
  0032's list plus `eth_sweep`, `eth_gas_funding`): only the worker sweeps.
"""
from alembic import op

revision = "0037_eth_sweeps"
down_revision = "0034_console"
branch_labels = None
depends_on = None

READ_ONLY_0032 = ("'api_key', 'chain_asset', 'chain_cursor', 'chain_transaction', 'denylist_address', 'eth_nonce', "
                  "'job_stat', 'matching_snapshot', 'btc_wallet_output', 'deposit_address_check', 'node_view_health', "
                  "'outbox', 'outbox_aggregate'")
READ_ONLY_0033 = READ_ONLY_0032 + ", 'convert_quote'"  # 0033 (convert) added its quotes
READ_ONLY_0037 = READ_ONLY_0033 + ", 'eth_sweep', 'eth_gas_funding'"
SIGNER_TABLES_0021 = "'signer_audit', 'signer_signature'"
SIGNER_TABLES_0037 = SIGNER_TABLES_0021 + ", 'signer_eth_sweep'"

SQL = """
CREATE TABLE eth_sweep (
    id                bigserial PRIMARY KEY,
    asset             text NOT NULL REFERENCES asset(code),
    address           text NOT NULL,                 -- the deposit address it empties (checksummed)
    deposit_index     integer NOT NULL CHECK (deposit_index >= 0),
    nonce             numeric(78,0) NOT NULL CHECK (nonce >= 0),  -- the deposit address's, reserved at creation
    amount            numeric(78,0) NOT NULL CHECK (amount > 0),  -- ether in wei, or the token's base units
    gas_limit         numeric(78,0) NOT NULL CHECK (gas_limit >= 21000),
    max_fee_wei       numeric(78,0) NOT NULL CHECK (max_fee_wei > 0),
    priority_fee_wei  numeric(78,0) NOT NULL CHECK (priority_fee_wei >= 0),
    state             text NOT NULL CHECK (state IN ('open', 'signed', 'broadcast', 'confirmed', 'final', 'reverted')),
    txid              text UNIQUE,
    raw               bytea,
    fee               numeric(78,0),                 -- gas actually burnt (wei), known once mined
    confirmations     integer NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CHECK (state = 'open' OR (txid IS NOT NULL AND raw IS NOT NULL))
);
-- one unfinished move per deposit address: its nonces are used one after the other
CREATE UNIQUE INDEX eth_sweep_one_per_address ON eth_sweep (lower(address)) WHERE state NOT IN ('final', 'reverted');
CREATE UNIQUE INDEX eth_sweep_nonce ON eth_sweep (lower(address), nonce);

CREATE TABLE eth_gas_funding (
    id                bigserial PRIMARY KEY,
    sweep_id          bigint NOT NULL UNIQUE REFERENCES eth_sweep(id),
    address           text NOT NULL,                 -- the deposit address funded
    nonce             numeric(78,0) NOT NULL UNIQUE CHECK (nonce >= 0),  -- the hot address's, reserved at creation
    amount            numeric(78,0) NOT NULL CHECK (amount > 0),
    gas_limit         numeric(78,0) NOT NULL CHECK (gas_limit >= 21000),
    max_fee_wei       numeric(78,0) NOT NULL CHECK (max_fee_wei > 0),
    priority_fee_wei  numeric(78,0) NOT NULL CHECK (priority_fee_wei >= 0),
    state             text NOT NULL CHECK (state IN ('open', 'signed', 'broadcast', 'confirmed', 'final', 'reverted')),
    txid              text UNIQUE,
    raw               bytea,
    fee               numeric(78,0),
    confirmations     integer NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CHECK (state = 'open' OR (txid IS NOT NULL AND raw IS NOT NULL))
);
CREATE TRIGGER eth_sweep_never_deleted BEFORE DELETE ON eth_sweep FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER eth_gas_funding_never_deleted BEFORE DELETE ON eth_gas_funding
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();

ALTER TABLE deposit_observation ADD COLUMN eth_swept_by bigint REFERENCES eth_sweep(id);
CREATE INDEX deposit_observation_eth_unswept ON deposit_observation (asset, deposit_address_id)
    WHERE chain = 'ethereum' AND eth_swept_by IS NULL;

CREATE TABLE signer_eth_sweep (
    id           bigserial PRIMARY KEY,
    signed_at    timestamptz NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('gas', 'sweep')),
    sweep_id     bigint NOT NULL,               -- no foreign key: the signer's evidence stands alone
    chain_id     bigint NOT NULL,
    sender       text NOT NULL,
    nonce        numeric(78,0) NOT NULL,
    destination  text NOT NULL,
    asset        text NOT NULL,
    amount       numeric(78,0) NOT NULL CHECK (amount > 0),
    txid         text NOT NULL
);
CREATE INDEX signer_eth_sweep_sender ON signer_eth_sweep (lower(sender), nonce);
CREATE INDEX signer_eth_sweep_sweep ON signer_eth_sweep (sweep_id, kind);
CREATE TRIGGER signer_eth_sweep_append_only BEFORE UPDATE OR DELETE ON signer_eth_sweep
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
"""


def _signer_tables(tables: str) -> str:
    return ("CREATE OR REPLACE FUNCTION custody_signer_tables() RETURNS text[] LANGUAGE sql IMMUTABLE "
            f"AS $$ SELECT ARRAY[{tables}]::text[] $$;")


def _read_only(tables: str) -> str:
    return ("CREATE OR REPLACE FUNCTION custody_api_read_only_tables() RETURNS text[] LANGUAGE sql IMMUTABLE "
            f"AS $$ SELECT ARRAY[{tables}]::text[] $$;")


def upgrade() -> None:
    op.execute(SQL)
    op.execute(_signer_tables(SIGNER_TABLES_0037))
    op.execute(_read_only(READ_ONLY_0037))
    op.execute("CALL custody_apply_role_grants()")


def downgrade() -> None:
    op.execute(_read_only(READ_ONLY_0033))
    op.execute(_signer_tables(SIGNER_TABLES_0021))
    op.execute("""
DROP TABLE signer_eth_sweep;
ALTER TABLE deposit_observation DROP COLUMN eth_swept_by;
DROP TABLE eth_gas_funding;
DROP TABLE eth_sweep;
""")
    op.execute("CALL custody_apply_role_grants()")
