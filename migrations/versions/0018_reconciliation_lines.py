"""Reconciliation remembers each line's last pass, so a shrinking surplus is caught.

Revision ID: 0018_reconciliation_lines
Revises: 0016_containment

Why: a surplus on a line is a warning and a shortfall critical, judged on the line's net difference
at one pass. Unbooked treasury funding (a surplus) then masked a later theft: +1 ETH funding, then
0.4 ETH leaving unbooked, read as a +0.6 ETH surplus, a warning only. Reconciliation now compares
each line with its previous pass (custody.reconciliation `shortfall_since`): a difference that fell
by more than what explains a fall (bookings that follow no chain movement, deposits recorded late
for blocks the previous pass had read) is a shortfall. This table holds, per line, what that
comparison needs from the previous pass; one row per line, updated in place by each pass.
"""
from alembic import op

revision = "0018_reconciliation_lines"
down_revision = "0016_containment"
branch_labels = None
depends_on = None

SQL = """
CREATE TABLE reconciliation_line (
    chain             text NOT NULL,
    tier              text NOT NULL,
    asset             text NOT NULL REFERENCES asset(code),
    difference        numeric(78,0) NOT NULL,  -- on chain - books - in transit at that pass (signed)
    booked_off_chain  numeric(78,0) NOT NULL,  -- running total booked to the line by entries that follow no chain movement
    observation_mark  bigint NOT NULL,         -- the highest deposit_observation id the pass's snapshot saw
    height            bigint NOT NULL,         -- the block the pass read the chain at
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (chain, tier, asset)
);
"""


def upgrade() -> None:
    op.execute(SQL)


def downgrade() -> None:
    op.execute("DROP TABLE reconciliation_line")
