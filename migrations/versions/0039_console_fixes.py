"""Console fixes (review 15): who enrolled a credential, and the admin's signed activation of it.

Revision ID: 0039_console_fixes
Revises: 0038_treasury_tiers

- `console_credential.enrolled_by`: the console user whose live session made the enrolment request
  (NULL when nobody was signed in). That user never approves the credential (R15-3): custody checks
  it, and the guard trigger refuses `decided_by = enrolled_by` (case-folded) as it refuses
  `decided_by = username`. Set at insert only; part of the credential's identity.
- `activation_key_id`, `activation_signature`, `activation_authenticator_data`,
  `activation_client_data`: the approving admin's WebAuthn assertion over the credential's canonical
  activation payload (custody.console.auth.activation_payload: credential id, SHA-256 of its public
  key, username, role). Written only in the update that makes a pending credential active, never
  changed afterwards (the trigger). The approver entry export (`approver_entry`) verifies it against
  the console admin keys of the service's configuration (`CONSOLE_ADMINS`), never against a row:
  a database writer with custody_api's rights can still activate a row, but cannot make the export
  serve its key as an operator's approver key (R15-1), because it holds no configured admin's key.
- custody_api may UPDATE the four activation columns of `console_credential` (the api process
  records the admin's approval); the role list is written out in full below (LIMITED_0039: 0038's
  list with that one row changed).
"""
from alembic import op

revision = "0039_console_fixes"
down_revision = "0038_treasury_tiers"
branch_labels = None
depends_on = None

# 0038's custody_api_limited_tables(), written out in full, with console_credential's new columns.
LIMITED_0038 = """
        ('wallet', 'UPDATE (next_index)'),
        ('wallet_utxo', 'UPDATE (reserved_by, rebalance_id)'),
        ('deposit_address', 'INSERT'),
        ('deposit_observation', 'UPDATE (state, updated_at, journal_transaction_id, return_withdrawal_id)'),
        ('withdrawal_batch', 'UPDATE (state, containment, updated_at)'),
        ('batch_output', 'DELETE'),
        ('sweep', 'UPDATE (containment, updated_at)'),
        ('rebalance', 'INSERT, UPDATE (state, containment, updated_at, txid, raw, fee)'),
        ('rebalance_input', 'INSERT'),
        ('rebalance_approval', 'INSERT'),
        ('reconciliation_line', 'INSERT, UPDATE'),
        ('reserve_report', 'INSERT'),
        ('reserve_leaf', 'INSERT'),
        ('reserve_node', 'INSERT'),
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
        ('webhook_delivery', 'UPDATE (state, attempts, next_attempt_at, updated_at)'),
        ('convert_price', 'INSERT, UPDATE'),
        ('console_credential', 'INSERT, UPDATE (role, state, decided_by, decided_at, sign_count, last_used_at)'),
        ('console_challenge', 'INSERT, UPDATE (used_at), DELETE'),
        ('console_session', 'INSERT, UPDATE (last_seen_at, ended_at, ended_reason)')"""
LIMITED_0039 = LIMITED_0038.replace(
    "('console_credential', 'INSERT, UPDATE (role, state, decided_by, decided_at, sign_count, last_used_at)')",
    "('console_credential', 'INSERT, UPDATE (role, state, decided_by, decided_at, sign_count, last_used_at, activation_key_id, activation_signature, activation_authenticator_data, activation_client_data)')")
assert LIMITED_0039.count("activation_client_data") == 1


def _limited(rows: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION custody_api_limited_tables() RETURNS TABLE (relation text, privileges text) LANGUAGE sql IMMUTABLE
    AS $$ VALUES {rows}
    $$;
"""


GUARD = r"""
CREATE OR REPLACE FUNCTION custody_console_credential_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state <> 'pending' OR NEW.role IS NOT NULL OR NEW.decided_by IS NOT NULL
           OR NEW.activation_key_id IS NOT NULL OR NEW.activation_signature IS NOT NULL THEN
            RAISE EXCEPTION 'console: a credential is enrolled pending, without a role' USING ERRCODE = '42501';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.username <> OLD.username OR NEW.credential_id <> OLD.credential_id OR NEW.public_key <> OLD.public_key
       OR NEW.rp_id <> OLD.rp_id OR NEW.origin <> OLD.origin OR NEW.requested_at <> OLD.requested_at
       OR NEW.enrolled_by IS DISTINCT FROM OLD.enrolled_by THEN
        RAISE EXCEPTION 'console: a credential''s identity never changes' USING ERRCODE = '42501';
    END IF;
    IF OLD.state = 'revoked' THEN
        RAISE EXCEPTION 'console: a revoked credential stays revoked' USING ERRCODE = '42501';
    END IF;
    IF OLD.state = 'active' AND (NEW.role IS DISTINCT FROM OLD.role OR NEW.state = 'pending') THEN
        RAISE EXCEPTION 'console: an active credential''s role is fixed (enrol again for another role)' USING ERRCODE = '42501';
    END IF;
    IF (NEW.activation_key_id, NEW.activation_signature, NEW.activation_authenticator_data, NEW.activation_client_data)
       IS DISTINCT FROM (OLD.activation_key_id, OLD.activation_signature, OLD.activation_authenticator_data,
                         OLD.activation_client_data)
       AND NOT (OLD.state = 'pending' AND NEW.state = 'active') THEN
        RAISE EXCEPTION 'console: an activation proof is written when the credential is activated, never after'
            USING ERRCODE = '42501';
    END IF;
    IF OLD.state = 'pending' AND NEW.state = 'active'
       AND (lower(NEW.decided_by) = lower(NEW.username) OR lower(NEW.decided_by) = lower(NEW.enrolled_by)) THEN
        RAISE EXCEPTION 'console: nobody approves their own enrolment' USING ERRCODE = '42501';
    END IF;
    RETURN NEW;
END $$;
"""

UPGRADE = """
ALTER TABLE console_credential
    ADD COLUMN enrolled_by text,
    ADD COLUMN activation_key_id text,
    ADD COLUMN activation_signature bytea CHECK (octet_length(activation_signature) <= 1024),
    ADD COLUMN activation_authenticator_data bytea CHECK (octet_length(activation_authenticator_data) <= 4096),
    ADD COLUMN activation_client_data bytea CHECK (octet_length(activation_client_data) <= 4096);
CREATE INDEX console_credential_user_folded ON console_credential (lower(username));
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute(GUARD)
    op.execute(_limited(LIMITED_0039))
    op.execute("CALL custody_apply_role_grants()")


def downgrade() -> None:
    raise NotImplementedError("console activation proofs are not downgraded")
