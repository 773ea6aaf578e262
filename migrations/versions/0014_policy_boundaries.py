"""Policy boundaries (issue 11, observations 4, 6, 7, 10): allowlist loosening waits for an operator,
quarantine returns are tied to their deposit, velocity is counted per owner, and a reorged-out
credit is frozen until an operator resolves its incident.

- `allowlist_entry.cooling_off_secs`: the account's cooling-off when the entry was added, so a
  later loosening never makes an address already added usable sooner (entries added before this
  migration get their account's cooling-off now in force).
- `allowlist_policy.version`: counts the account's allowlist rule changes; decisions name it.
- `allowlist_change`: a requested loosening (mode, cooling-off, approvals), pending until an
  operator approves or rejects it; a newer request supersedes it. At most one pending per account.
- `withdrawal_request.return_of_deposit`: the quarantined deposit a withdrawal returns (one at most).
- `incident.resolution`: how an operator resolved it (decision, comment, ledger effects).
- an index on `account.owner` for the per-owner velocity sum.

Revision ID: 0014_policy_boundaries
Revises: 0013_destination_lookups
"""
from alembic import op

revision = "0014_policy_boundaries"
down_revision = "0013_destination_lookups"
branch_labels = None
depends_on = None

SQL = """
ALTER TABLE allowlist_entry ADD COLUMN cooling_off_secs integer CHECK (cooling_off_secs >= 0);
UPDATE allowlist_entry e
SET cooling_off_secs = coalesce((SELECT p.cooling_off_secs FROM allowlist_policy p WHERE p.account_id = e.account_id), 0);
ALTER TABLE allowlist_entry ALTER COLUMN cooling_off_secs SET NOT NULL;
ALTER TABLE allowlist_policy ADD COLUMN version integer NOT NULL DEFAULT 1 CHECK (version >= 1);

-- Operational: pending -> approved | rejected | superseded (decided once; the row is then kept).
CREATE TABLE allowlist_change (
    id                bigserial PRIMARY KEY,
    account_id        bigint NOT NULL REFERENCES account(id),
    mode              text NOT NULL CHECK (mode IN ('enforce', 'review')),
    cooling_off_secs  integer NOT NULL CHECK (cooling_off_secs >= 0),
    approvals         integer NOT NULL CHECK (approvals >= 1),
    loosens           text[] NOT NULL,
    requested_by      text NOT NULL,
    requested_at      timestamptz NOT NULL DEFAULT now(),
    state             text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'approved', 'rejected', 'superseded')),
    decided_by        text,
    decided_at        timestamptz,
    comment           text
);
CREATE UNIQUE INDEX allowlist_change_one_pending ON allowlist_change (account_id) WHERE state = 'pending';
CREATE TRIGGER allowlist_change_never_deleted BEFORE DELETE ON allowlist_change
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();

ALTER TABLE withdrawal_request ADD COLUMN return_of_deposit bigint UNIQUE REFERENCES deposit_observation(id);
ALTER TABLE incident ADD COLUMN resolution jsonb;
CREATE INDEX account_owner ON account (owner) WHERE owner IS NOT NULL;
"""


def upgrade() -> None:
    op.execute(SQL)


def downgrade() -> None:
    raise NotImplementedError("these tables hold operational history and are not downgraded")
