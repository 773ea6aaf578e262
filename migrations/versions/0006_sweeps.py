"""Sweeps: deposit-address coins moved into the hot wallet.

Revision ID: 0006_sweeps
Revises: 0005_withdrawals
"""
from alembic import op

revision = "0006_sweeps"
down_revision = "0005_withdrawals"
branch_labels = None
depends_on = None

SQL = """
-- Operational: open -> signed -> broadcast -> confirmed -> final | dropped.
CREATE TABLE sweep (
    id            bigserial PRIMARY KEY,
    chain         text NOT NULL,
    asset         text NOT NULL,
    state         text NOT NULL,
    destination   text NOT NULL,
    amount        numeric(78,0) NOT NULL CHECK (amount > 0),  -- sum of the swept coins
    fee           numeric(78,0) NOT NULL DEFAULT 0 CHECK (fee >= 0),
    fee_rate      numeric(78,0) NOT NULL,
    txid          text UNIQUE,
    raw           bytea,
    confirmations integer NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE deposit_observation ADD COLUMN swept_by bigint REFERENCES sweep(id);
CREATE INDEX deposit_observation_unswept ON deposit_observation (chain, id)
    WHERE swept_by IS NULL AND state IN ('credited', 'quarantined', 'released', 'returned', 'dust');
CREATE TRIGGER sweep_never_deleted BEFORE DELETE ON sweep FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
"""


def upgrade() -> None:
    op.execute(SQL)


def downgrade() -> None:
    raise NotImplementedError("sweep history is not downgraded")
