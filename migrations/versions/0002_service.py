"""Service: API keys (stored hashed) and the append-only audit log.

Revision ID: 0002_service
Revises: 0001_ledger
"""
from alembic import op

revision = "0002_service"
down_revision = "0001_ledger"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE TABLE api_key (
    id          bigserial PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    role        text NOT NULL CHECK (role IN ('backend', 'operator', 'auditor', 'admin')),
    key_prefix  text NOT NULL,
    key_hash    text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE TRIGGER api_key_never_deleted BEFORE DELETE ON api_key
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();

CREATE TABLE audit_event (
    id       bigserial PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    actor    text NOT NULL,
    action   text NOT NULL,
    subject  text NOT NULL,
    detail   jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE TRIGGER audit_event_append_only BEFORE UPDATE OR DELETE ON audit_event
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER audit_event_no_truncate BEFORE TRUNCATE ON audit_event
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_change();
"""
    )


def downgrade() -> None:
    op.execute("DROP TABLE audit_event; DROP TABLE api_key;")
