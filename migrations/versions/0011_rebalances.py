"""Rebalances: value moved between the firm's own wallet tiers (bitcoin: hot -> cold by thresholds).

Revision ID: 0011_rebalances
Revises: 0010_posting_fast_path
"""
from alembic import op

revision = "0011_rebalances"
down_revision = "0010_posting_fast_path"
branch_labels = None
depends_on = None

SQL = """
-- Operational: open -> signed -> broadcast -> confirmed -> final (custody/states.py, REBALANCE_TRANSITIONS).
-- `amount` is what the destination tier receives; the source pays amount + fee and keeps `change_amount`.
-- The thresholds in force when it was decided are kept beside the decision they caused.
CREATE TABLE rebalance (
    id                 bigserial PRIMARY KEY,
    chain              text NOT NULL,
    asset              text NOT NULL REFERENCES asset(code),
    source_tier        text NOT NULL CHECK (source_tier IN ('hot', 'warm', 'cold')),
    destination_tier   text NOT NULL CHECK (destination_tier IN ('hot', 'warm', 'cold')),
    state              text NOT NULL,
    destination        text NOT NULL,
    destination_index  integer NOT NULL CHECK (destination_index >= 0),  -- <destination wallet>/0/<index>
    amount             numeric(78,0) NOT NULL CHECK (amount > 0),
    fee                numeric(78,0) NOT NULL CHECK (fee >= 0),
    change_amount      numeric(78,0) NOT NULL DEFAULT 0 CHECK (change_amount >= 0),
    fee_rate           numeric(78,0) NOT NULL CHECK (fee_rate >= 0),
    spendable          numeric(78,0) NOT NULL CHECK (spendable >= 0),  -- the source's spendable balance that triggered it
    ceiling            numeric(78,0) NOT NULL CHECK (ceiling >= 0),
    target             numeric(78,0) NOT NULL CHECK (target >= 0),
    txid               text UNIQUE,
    raw                bytea,
    confirmations      integer NOT NULL DEFAULT 0,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CHECK (source_tier <> destination_tier),
    UNIQUE (chain, destination)
);
-- At most one rebalance per chain and asset is in progress at a time (the job checks first; this
-- is the backstop against two runs racing).
CREATE UNIQUE INDEX rebalance_one_open ON rebalance (chain, asset)
    WHERE state IN ('open', 'signed', 'broadcast', 'confirmed');
CREATE TRIGGER rebalance_never_deleted BEFORE DELETE ON rebalance FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();

-- A hot-wallet coin reserved for (and, once signed, spent by) a rebalance; such a coin is never
-- offered to a withdrawal batch.
ALTER TABLE wallet_utxo ADD COLUMN rebalance_id bigint REFERENCES rebalance(id);
CREATE INDEX wallet_utxo_rebalance ON wallet_utxo (rebalance_id) WHERE rebalance_id IS NOT NULL;
"""


def upgrade() -> None:
    op.execute(SQL)


def downgrade() -> None:
    raise NotImplementedError("rebalance history is not downgraded")
