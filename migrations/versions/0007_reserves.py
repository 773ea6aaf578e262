"""Proof of reserves: reports and their per-account leaves.

Revision ID: 0007_reserves
Revises: 0006_sweeps
"""
from alembic import op

revision = "0007_reserves"
down_revision = "0006_sweeps"
branch_labels = None
depends_on = None

SQL = """
-- Append-only: a published report (liabilities root, on-chain holdings with signed control messages).
CREATE TABLE reserve_report (
    id            bigserial PRIMARY KEY,
    asset         text NOT NULL REFERENCES asset(code),
    chain_height  bigint NOT NULL,
    block_hash    text NOT NULL,
    root_hash     text NOT NULL,
    liabilities   numeric(78,0) NOT NULL,
    holdings      numeric(78,0) NOT NULL,
    body          jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
-- Append-only: each customer account's leaf (salt kept so the customer can be given their proof).
CREATE TABLE reserve_leaf (
    report_id   bigint NOT NULL REFERENCES reserve_report(id),
    leaf_index  integer NOT NULL,
    account_id  bigint NOT NULL REFERENCES account(id),
    balance     numeric(78,0) NOT NULL CHECK (balance >= 0),
    salt        bytea NOT NULL,
    PRIMARY KEY (report_id, leaf_index),
    UNIQUE (report_id, account_id)
);
CREATE TRIGGER reserve_report_append_only BEFORE UPDATE OR DELETE ON reserve_report
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER reserve_leaf_append_only BEFORE UPDATE OR DELETE ON reserve_leaf
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
"""


def upgrade() -> None:
    op.execute(SQL)


def downgrade() -> None:
    raise NotImplementedError("published reports are not downgraded")
