"""The signer's own record of every withdrawal transaction it signed: `signer_signature`.

Revision ID: 0021_signer_signatures
Revises: 0020_process_roles

Why (issue 12, review R1): the signer kept no record of what it had already signed, so one approved
withdrawal could be signed again and again (other coins, another nonce, another chain id: each a
separate payment the chain accepts), and a fee-bump replacement was checked against
`chain_transaction` and `wallet_utxo.spent_by`, which custody writes. Now the signer writes one row
per withdrawal per transaction it signs, in the same database transaction as its `signer_audit`
row, and checks every later signature against them (signer/service.py):
- a withdrawal already signed may only be signed again by a transaction that conflicts with EVERY
  earlier one (bitcoin: spends an outpoint each earlier one spends; ethereum: the same chain id,
  sender and nonce), so at most one of them can ever confirm (`already_signed`);
- a replacement must pay exactly the withdrawals, destinations and amounts, and spend exactly the
  inputs (or use exactly the nonce, sender and chain id) recorded here for the version it replaces
  (`replacement_unknown`);
- value signed without approvals is capped per asset and window from these rows
  (`unapproved_limit_reached`).

Rows carry no foreign keys: they are the signer's evidence, independent of custody's rows (which
are never deleted anyway). Append-only (the ledger's refuse-change trigger), and the signer's own
table: `custody_signer_tables()` now lists it and `custody_apply_role_grants()` is called again, so
only custody_signer may INSERT (and use its sequence); custody_api and custody_worker may only read.

A batch signed before this migration has no rows here, so the signer refuses to fee-bump it
(`replacement_unknown`): it confirms at the fee it was signed with, or an operator handles it.
"""
from alembic import op

revision = "0021_signer_signatures"
down_revision = "0020_process_roles"
branch_labels = None
depends_on = None

SQL = """
CREATE TABLE signer_signature (
    id             bigserial PRIMARY KEY,
    signed_at      timestamptz NOT NULL,          -- the signer's clock
    withdrawal_id  bigint NOT NULL,
    batch_id       bigint NOT NULL,
    chain          text NOT NULL CHECK (chain IN ('bitcoin', 'ethereum')),
    asset          text NOT NULL,
    amount         numeric(78, 0) NOT NULL CHECK (amount > 0),
    destination    text NOT NULL,                 -- the approved address the transaction pays
    txid           text NOT NULL,
    replaces_txid  text,                          -- a fee-bump replacement: the version it replaces
    approvals      integer NOT NULL CHECK (approvals >= 0),  -- distinct valid approvers counted
    inputs         text[],                        -- bitcoin: the outpoints spent, 'txid:vout'
    sender         text,                          -- ethereum: the signing address
    nonce          numeric(78, 0),                -- ethereum
    chain_id       bigint,                        -- ethereum
    CHECK ((chain = 'bitcoin' AND inputs IS NOT NULL AND cardinality(inputs) > 0
            AND sender IS NULL AND nonce IS NULL AND chain_id IS NULL)
        OR (chain = 'ethereum' AND inputs IS NULL
            AND sender IS NOT NULL AND nonce IS NOT NULL AND chain_id IS NOT NULL))
);
CREATE INDEX signer_signature_withdrawal ON signer_signature (withdrawal_id);
CREATE INDEX signer_signature_version ON signer_signature (batch_id, txid);
CREATE INDEX signer_signature_unapproved ON signer_signature (asset, signed_at) WHERE approvals = 0;
CREATE TRIGGER signer_signature_append_only BEFORE UPDATE OR DELETE ON signer_signature
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();

CREATE OR REPLACE FUNCTION custody_signer_tables() RETURNS text[] LANGUAGE sql IMMUTABLE
    AS $$ SELECT ARRAY['signer_audit', 'signer_signature']::text[] $$;
CALL custody_apply_role_grants();
"""


def upgrade() -> None:
    op.execute(SQL)


def downgrade() -> None:
    op.execute("""
CREATE OR REPLACE FUNCTION custody_signer_tables() RETURNS text[] LANGUAGE sql IMMUTABLE
    AS $$ SELECT ARRAY['signer_audit']::text[] $$;
DROP TABLE signer_signature;
CALL custody_apply_role_grants();
""")
