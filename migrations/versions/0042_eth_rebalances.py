"""Ethereum rebalances: `eth_rebalance` (custody's rows) and `signer_eth_rebalance` (the signer's record).

- `eth_rebalance`: one row per move of ether or an ERC-20 token out of the hot address to the
  signer's warm address (ethereum account "warm", 0/0) or to the cold address pinned in the
  signer's configuration, or from warm back to hot (a refill, after `approvals_required`
  operators signed it: `eth_rebalance_approval`) (custody.eth_rebalances). Its hot nonce is NULL until it is signed: the
  nonce is taken from `eth_nonce` in the signing transaction, under the counter's row lock held
  across the signer call (custody.payouts' discipline), so a refusal or a crash before the store
  gives the nonce back and never leaves a hole. At most one unfinished move per asset out of one
  tier (partial unique index).
- `signer_eth_rebalance`: the signer's own, append-only record of every ethereum rebalance it
  signed (chain id, sender, nonce, destination, asset, amount, txid): a rebalance is signed again
  only at the nonce it recorded, and a new one never at a hot nonce it already signed anything at.

Roles: `eth_rebalance` and `eth_rebalance_approval` are the worker's; custody_api may only read
them (READ_ONLY_0042 below, the 0038 list plus both): no HTTP route approves an ethereum refill
yet (an approval row is worth nothing anyway without a signature the signer verifies against its
own keys; once routes exist, the approvals table moves to the api's limited list, INSERT only).
`signer_eth_rebalance` joins the signer's tables
(SIGNER_TABLES_0042: 0037's plus `signer_eth_rebalance`): only the signer role writes it.
"""
from alembic import op

revision = "0042_eth_rebalances"
down_revision = "0043_reserves_jobs"
branch_labels = None
depends_on = None

READ_ONLY_0032 = ("'api_key', 'chain_asset', 'chain_cursor', 'chain_transaction', 'denylist_address', 'eth_nonce', "
                  "'job_stat', 'matching_snapshot', 'btc_wallet_output', 'deposit_address_check', 'node_view_health', "
                  "'outbox', 'outbox_aggregate'")
READ_ONLY_0037 = READ_ONLY_0032 + ", 'convert_quote', 'eth_sweep', 'eth_gas_funding'"
READ_ONLY_0038 = READ_ONLY_0037 + ", 'firm_tx_version'"
READ_ONLY_0043 = READ_ONLY_0038 + ", 'reserve_report', 'reserve_leaf', 'reserve_node'"  # 0043: reports are the worker's
READ_ONLY_0042 = READ_ONLY_0043 + ", 'eth_rebalance', 'eth_rebalance_approval'"
SIGNER_TABLES_0037 = "'signer_audit', 'signer_signature', 'signer_eth_sweep'"
SIGNER_TABLES_0042 = SIGNER_TABLES_0037 + ", 'signer_eth_rebalance'"

SQL = """
CREATE TABLE eth_rebalance (
    id                bigserial PRIMARY KEY,
    asset             text NOT NULL REFERENCES asset(code),
    source_tier       text NOT NULL CHECK (source_tier IN ('hot', 'warm')),
    destination_tier  text NOT NULL CHECK (destination_tier IN ('hot', 'warm', 'cold')),
    destination       text NOT NULL,                 -- checksummed; the signer derives or pins it again itself
    amount            numeric(78,0) NOT NULL CHECK (amount > 0),  -- wei, or the token's base units
    spendable         numeric(78,0) NOT NULL CHECK (spendable >= 0),  -- what the decision saw
    ceiling           numeric(78,0) NOT NULL CHECK (ceiling >= 0),
    target            numeric(78,0) NOT NULL CHECK (target >= 0),
    floor             numeric(78,0) CHECK (floor >= 0),
    approvals_required integer NOT NULL DEFAULT 0 CHECK (approvals_required >= 0),  -- a refill's operator quorum
    nonce             numeric(78,0) CHECK (nonce >= 0),  -- the sender's (hot or warm), taken when it is signed
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
    CHECK (state = 'open' OR (txid IS NOT NULL AND raw IS NOT NULL AND nonce IS NOT NULL)),
    CHECK ((source_tier, destination_tier) IN (('hot', 'warm'), ('hot', 'cold'), ('warm', 'hot')))
);
CREATE UNIQUE INDEX eth_rebalance_one_in_progress ON eth_rebalance (asset, source_tier)
    WHERE state NOT IN ('final', 'reverted');
-- the warm address sends refills only, one at a time whatever the asset: its nonces follow one another
CREATE UNIQUE INDEX eth_rebalance_one_refill ON eth_rebalance (source_tier)
    WHERE source_tier = 'warm' AND state NOT IN ('final', 'reverted');
CREATE UNIQUE INDEX eth_rebalance_nonce ON eth_rebalance (source_tier, nonce);

-- An operator's signed approval of an ethereum warm -> hot refill (payload kind rebalance-approval,
-- chain "ethereum"; signer.approvals): verified by custody at the door and by the signer again.
CREATE TABLE eth_rebalance_approval (
    id                 bigserial PRIMARY KEY,
    rebalance_id       bigint NOT NULL REFERENCES eth_rebalance(id),
    operator           text NOT NULL,
    key_id             text NOT NULL,
    scheme             text NOT NULL,
    signed_payload     bytea NOT NULL,
    signature          bytea NOT NULL,
    authenticator_data bytea,
    client_data_json   bytea,
    at                 timestamptz NOT NULL DEFAULT now(),
    UNIQUE (rebalance_id, key_id)
);
CREATE TRIGGER eth_rebalance_approval_append_only BEFORE UPDATE OR DELETE ON eth_rebalance_approval
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER eth_rebalance_never_deleted BEFORE DELETE ON eth_rebalance
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();

CREATE TABLE signer_eth_rebalance (
    id            bigserial PRIMARY KEY,
    signed_at     timestamptz NOT NULL,
    rebalance_id  bigint NOT NULL,               -- no foreign key: the signer's evidence stands alone
    chain_id      bigint NOT NULL,
    sender        text NOT NULL,
    nonce         numeric(78,0) NOT NULL,
    destination   text NOT NULL,
    asset         text NOT NULL,
    amount        numeric(78,0) NOT NULL CHECK (amount > 0),
    txid          text NOT NULL
);
CREATE INDEX signer_eth_rebalance_sender ON signer_eth_rebalance (lower(sender), nonce);
CREATE INDEX signer_eth_rebalance_row ON signer_eth_rebalance (rebalance_id);
CREATE TRIGGER signer_eth_rebalance_append_only BEFORE UPDATE OR DELETE ON signer_eth_rebalance
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
    op.execute(_signer_tables(SIGNER_TABLES_0042))
    op.execute(_read_only(READ_ONLY_0042))
    op.execute("CALL custody_apply_role_grants()")


def downgrade() -> None:
    op.execute(_read_only(READ_ONLY_0043))
    op.execute(_signer_tables(SIGNER_TABLES_0037))
    op.execute("DROP TABLE signer_eth_rebalance; DROP TABLE eth_rebalance_approval; DROP TABLE eth_rebalance;")
    op.execute("CALL custody_apply_role_grants()")
