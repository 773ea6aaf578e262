"""Who may move money: reserved firm account names, per-caller idempotency namespaces, treasury
adjustments (maker-checker).

Why: an API caller could open a firm account (equity) and post from it, or squat the name of a
firm account or take a subsystem's idempotency key before the subsystem did (issue 11). The rules
live in `custody.money_rules`; this migration backs them where the database can do it cheaply:

- `account`: no account of a firm kind may be named in the customer namespace (`customer:...`),
  which is where every account opened over the API lives. So whatever a caller opens, no firm
  account's name can ever be taken by it. (NOT VALID: rows written before are not re-checked.)
- `journal_transaction.idempotency_key` and `hold.idempotency_key` take up to 300 characters:
  a caller's key of up to 200 characters is stored behind its namespace `api:<key name>:`.
- `treasury_adjustment` (operational): a journal entry on any accounts, proposed by one operator
  with a reason, posted only when `quorum` other operators approved it (proposed -> posted, or
  -> rejected); `treasury_adjustment_vote` keeps each operator's approve/reject once.

Revision ID: 0012_money_boundaries
Revises: 0011_rebalances
"""
from alembic import op

revision = "0012_money_boundaries"
down_revision = "0011_rebalances"
branch_labels = None
depends_on = None

SQL = """
ALTER TABLE account ADD CONSTRAINT account_firm_name_not_in_customer_namespace
    CHECK (kind = 'customer' OR name NOT LIKE 'customer:%') NOT VALID;

ALTER TABLE journal_transaction DROP CONSTRAINT journal_transaction_idempotency_key_check;
ALTER TABLE journal_transaction ADD CONSTRAINT journal_transaction_idempotency_key_check
    CHECK (length(idempotency_key) BETWEEN 1 AND 300);
ALTER TABLE hold DROP CONSTRAINT hold_idempotency_key_check;
ALTER TABLE hold ADD CONSTRAINT hold_idempotency_key_check
    CHECK (length(idempotency_key) BETWEEN 1 AND 300);

-- Operational: proposed -> posted | rejected (custody/states.py, ADJUSTMENT_TRANSITIONS).
-- `transfers` is the exact content proposed: [{"debit_account_id", "credit_account_id", "amount"}],
-- amounts as strings of minor units. What is posted is exactly this, under `treasury-adjustment:<id>`.
CREATE TABLE treasury_adjustment (
    id                       bigserial PRIMARY KEY,
    idempotency_key          text NOT NULL UNIQUE CHECK (length(idempotency_key) BETWEEN 1 AND 300),
    proposed_by              text NOT NULL,
    reason                   text NOT NULL CHECK (length(btrim(reason)) BETWEEN 1 AND 2000),
    transfers                jsonb NOT NULL,
    corrects_transaction_id  bigint REFERENCES journal_transaction(id),
    quorum                   integer NOT NULL CHECK (quorum >= 1),
    state                    text NOT NULL CHECK (state IN ('proposed', 'posted', 'rejected')),
    transaction_id           bigint REFERENCES journal_transaction(id),
    created_at               timestamptz NOT NULL DEFAULT now(),
    updated_at               timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE treasury_adjustment_vote (
    adjustment_id  bigint NOT NULL REFERENCES treasury_adjustment(id),
    operator       text NOT NULL,
    decision       text NOT NULL CHECK (decision IN ('approve', 'reject')),
    comment        text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (adjustment_id, operator)
);
"""

DOWN = """
DROP TABLE treasury_adjustment_vote;
DROP TABLE treasury_adjustment;
ALTER TABLE hold DROP CONSTRAINT hold_idempotency_key_check;
ALTER TABLE hold ADD CONSTRAINT hold_idempotency_key_check CHECK (length(idempotency_key) BETWEEN 1 AND 200);
ALTER TABLE journal_transaction DROP CONSTRAINT journal_transaction_idempotency_key_check;
ALTER TABLE journal_transaction ADD CONSTRAINT journal_transaction_idempotency_key_check
    CHECK (length(idempotency_key) BETWEEN 1 AND 200);
ALTER TABLE account DROP CONSTRAINT account_firm_name_not_in_customer_namespace;
"""


def upgrade() -> None:
    op.execute(SQL)


def downgrade() -> None:
    op.execute(DOWN)
