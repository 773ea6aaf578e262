"""Containment: a withdrawal batch, sweep or rebalance whose signing or booking failed is set aside.

Revision ID: 0016_containment
Revises: 0014_policy_boundaries

Why: one row whose ledger booking failed (a capture refused because its idempotency key was taken,
a final booking refused because a hold left the in-flight account without available balance) made
the whole payouts job raise on every run, which stopped broadcast and tracking of every other
withdrawal, or left the row retried forever behind a warning. Now the failing row is set aside:
the jobs skip it, an incident says why (critical once its transaction is on chain), and an
operator retries it once the cause is fixed (custody.containment).

What changes: `withdrawal_batch`, `sweep` and `rebalance` each get
- `containment` ('active' | 'set_aside'; custody/states.py CONTAINMENT_TRANSITIONS), beside `state`,
  which keeps saying where the transaction is, so reconciliation is unchanged;
- `set_aside_step` (sign, broadcast, track, bump) and `set_aside_incident_id`: the last setting aside;
- `set_aside_count`: how often it was set aside, so a failure after a retry opens a new incident
  (incidents are deduplicated by key) instead of pointing at an old, perhaps resolved one.
"""
from alembic import op

revision = "0016_containment"
down_revision = "0014_policy_boundaries"
branch_labels = None
depends_on = None

TABLES = ("withdrawal_batch", "sweep", "rebalance")

SQL = "\n".join(f"""
ALTER TABLE {table}
    ADD COLUMN containment text NOT NULL DEFAULT 'active' CHECK (containment IN ('active', 'set_aside')),
    ADD COLUMN set_aside_step text,
    ADD COLUMN set_aside_incident_id bigint REFERENCES incident(id),
    ADD COLUMN set_aside_count integer NOT NULL DEFAULT 0 CHECK (set_aside_count >= 0);
CREATE INDEX {table}_set_aside ON {table} (id) WHERE containment = 'set_aside';
""" for table in TABLES)


def upgrade() -> None:
    op.execute(SQL)


def downgrade() -> None:
    for table in TABLES:
        op.execute(f"DROP INDEX {table}_set_aside")
        op.execute(f"ALTER TABLE {table} DROP COLUMN containment, DROP COLUMN set_aside_step, "
                   "DROP COLUMN set_aside_incident_id, DROP COLUMN set_aside_count")
