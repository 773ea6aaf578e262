"""The operator console's sign-in: WebAuthn credentials, single-use challenges, server-side sessions.

Revision ID: 0034_console
Revises: 0032_event_guards

- `console_credential`: one operator's WebAuthn credential (credential id, COSE public key, sign
  count, the relying party id and origin it was made for). It is born `pending` (the operator
  enrolled it) with no role; an admin makes it `active` with a role (`operator`, `auditor`,
  `admin`), or `revoked`. A guard trigger (`custody_console_credential_guard`) refuses a row
  inserted other than pending, a change of the credential's identity (username, credential id, key,
  rp id, origin), activation without a role or by the credential's own user, a role change once
  decided, and any change of a revoked row.
- `console_challenge`: every sign-in and enrolment challenge the service handed out, with its
  expiry; consumed once (`used_at`), so a replayed assertion finds its challenge used.
- `console_session`: a signed-in session, keyed by the SHA-256 of its token (the cookie holds the
  token; the database never does), with its role, last activity (idle timeout) and absolute expiry.

custody_api writes these (the api process is where people sign in), so they join
`custody_api_limited_tables()` with the columns it changes; 0032's list is written out here in
full (`LIMITED_0034`).

What a database writer with custody_api's rights could forge: a pending credential made active,
or a session for any credential: it is the process that signs people in. What it cannot forge is an
approval of a payment: the signer verifies every approval against approver keys in its own
configuration (signer.approvals), never against this table.
"""
from alembic import op

revision = "0034_console"
down_revision = "0033_convert"
branch_labels = None
depends_on = None

# 0032's custody_api_limited_tables(), written out in full, plus the console's three tables.
LIMITED_0032 = """
        ('wallet', 'UPDATE (next_index)'),
        ('wallet_utxo', 'UPDATE (reserved_by, rebalance_id)'),
        ('deposit_address', 'INSERT'),
        ('deposit_observation', 'UPDATE (state, updated_at, journal_transaction_id, return_withdrawal_id)'),
        ('withdrawal_batch', 'UPDATE (state, containment, updated_at)'),
        ('batch_output', 'DELETE'),
        ('sweep', 'UPDATE (containment, updated_at)'),
        ('rebalance', 'INSERT, UPDATE (state, containment, updated_at)'),
        ('reconciliation_line', 'INSERT, UPDATE'),
        ('reserve_report', 'INSERT'),
        ('reserve_leaf', 'INSERT'),
        ('audit_event', 'INSERT'),
        ('approval', 'INSERT'),
        ('policy_decision', 'INSERT'),
        ('treasury_adjustment_vote', 'INSERT'),
        ('market', 'INSERT'),
        ('matching_command', 'INSERT'),
        ('fill', 'INSERT'),
        ('account', 'INSERT, UPDATE'),
        ('account_balance', 'INSERT, UPDATE'),
        ('asset', 'INSERT'),
        ('hold', 'INSERT, UPDATE'),
        ('journal_transaction', 'INSERT'),
        ('journal_entry', 'INSERT'),
        ('withdrawal_request', 'INSERT, UPDATE'),
        ('allowlist_change', 'INSERT, UPDATE'),
        ('allowlist_policy', 'INSERT, UPDATE'),
        ('treasury_adjustment', 'INSERT, UPDATE'),
        ('incident', 'INSERT, UPDATE'),
        ('control_flag', 'INSERT, UPDATE'),
        ('trade_order', 'INSERT, UPDATE'),
        ('allowlist_entry', 'INSERT, UPDATE, DELETE'),
        ('webhook_endpoint', 'INSERT, UPDATE (description, event_types, enabled, secret_enc, previous_secret_enc, previous_secret_expires_at, updated_at, deleted_at)'),
        ('webhook_delivery', 'UPDATE (state, attempts, next_attempt_at, updated_at)')"""
CONSOLE_ROWS = """,
        ('console_credential', 'INSERT, UPDATE (role, state, decided_by, decided_at, sign_count, last_used_at)'),
        ('console_challenge', 'INSERT, UPDATE (used_at), DELETE'),
        ('console_session', 'INSERT, UPDATE (last_seen_at, ended_at, ended_reason)')"""
# 0033 added the convert subsystem's operator prices to 0032's list.
LIMITED_0033 = LIMITED_0032 + """,
        ('convert_price', 'INSERT, UPDATE')"""
LIMITED_0034 = LIMITED_0033 + CONSOLE_ROWS


def _limited(rows: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION custody_api_limited_tables() RETURNS TABLE (relation text, privileges text) LANGUAGE sql IMMUTABLE
    AS $$ VALUES {rows}
    $$;
"""


UPGRADE = r"""
CREATE TABLE console_credential (
    id            bigserial PRIMARY KEY,
    username      text NOT NULL CHECK (username ~ '^[A-Za-z0-9._-]{1,64}$'),
    role          text CHECK (role IN ('operator', 'auditor', 'admin')),
    credential_id bytea NOT NULL UNIQUE CHECK (octet_length(credential_id) BETWEEN 16 AND 1023),
    public_key    bytea NOT NULL CHECK (octet_length(public_key) BETWEEN 32 AND 4096),
    sign_count    bigint NOT NULL DEFAULT 0 CHECK (sign_count >= 0),
    rp_id         text NOT NULL,
    origin        text NOT NULL,
    state         text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'active', 'revoked')),
    requested_at  timestamptz NOT NULL DEFAULT now(),
    decided_by    text,
    decided_at    timestamptz,
    last_used_at  timestamptz,
    CHECK (state <> 'active' OR (role IS NOT NULL AND decided_by IS NOT NULL))
);
CREATE INDEX console_credential_user ON console_credential (username);

CREATE FUNCTION custody_console_credential_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state <> 'pending' OR NEW.role IS NOT NULL OR NEW.decided_by IS NOT NULL THEN
            RAISE EXCEPTION 'console: a credential is enrolled pending, without a role' USING ERRCODE = '42501';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.username <> OLD.username OR NEW.credential_id <> OLD.credential_id OR NEW.public_key <> OLD.public_key
       OR NEW.rp_id <> OLD.rp_id OR NEW.origin <> OLD.origin OR NEW.requested_at <> OLD.requested_at THEN
        RAISE EXCEPTION 'console: a credential''s identity never changes' USING ERRCODE = '42501';
    END IF;
    IF OLD.state = 'revoked' THEN
        RAISE EXCEPTION 'console: a revoked credential stays revoked' USING ERRCODE = '42501';
    END IF;
    IF OLD.state = 'active' AND (NEW.role IS DISTINCT FROM OLD.role OR NEW.state = 'pending') THEN
        RAISE EXCEPTION 'console: an active credential''s role is fixed (enrol again for another role)' USING ERRCODE = '42501';
    END IF;
    IF OLD.state = 'pending' AND NEW.state = 'active' AND lower(NEW.decided_by) = lower(NEW.username) THEN
        RAISE EXCEPTION 'console: nobody approves their own enrolment' USING ERRCODE = '42501';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER console_credential_guard BEFORE INSERT OR UPDATE ON console_credential
    FOR EACH ROW EXECUTE FUNCTION custody_console_credential_guard();

CREATE TABLE console_challenge (
    id         bigserial PRIMARY KEY,
    challenge  bytea NOT NULL UNIQUE CHECK (octet_length(challenge) = 32),
    purpose    text NOT NULL CHECK (purpose IN ('enrol', 'sign_in')),
    username   text,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    used_at    timestamptz
);
CREATE INDEX console_challenge_expiry ON console_challenge (expires_at);

CREATE TABLE console_session (
    id           bigserial PRIMARY KEY,
    token_hash   bytea NOT NULL UNIQUE CHECK (octet_length(token_hash) = 32),
    credential   bigint NOT NULL REFERENCES console_credential (id),
    username     text NOT NULL,
    role         text NOT NULL CHECK (role IN ('operator', 'auditor', 'admin')),
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    ended_at     timestamptz,
    ended_reason text
);
"""

DOWNGRADE = """
DROP TABLE console_session;
DROP TABLE console_challenge;
DROP TABLE console_credential;
DROP FUNCTION custody_console_credential_guard();
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute(_limited(LIMITED_0034))
    op.execute("CALL custody_apply_role_grants()")


def downgrade() -> None:
    op.execute(_limited(LIMITED_0033))
    op.execute(DOWNGRADE)
    op.execute("CALL custody_apply_role_grants()")
