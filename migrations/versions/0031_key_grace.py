"""A key in its rotation grace period may not revoke or rotate keys (review 14, F6).

Revision ID: 0031_key_grace
Revises: 0028_index_guards

Why: a rotation leaves the old key working for a grace period (its `revoked_at` in the future).
`custody_rotate_api_key` only asked that the *target* be live and not rotated yet, so whoever held
a leaked admin key that its owner had just rotated could rotate (or revoke) the key that replaced
it during the grace period and end up holding the only live key of the name.

What changes:
- `custody_revoke_api_key(id, by, caller)` and `custody_rotate_api_key(id, prefix, hash,
  grace_seconds, by, caller)`: the same as migration 0025's, plus `caller`, the id of the API key
  making the call, which must be an admin key that is not revoked and not in a grace period
  (`revoked_at IS NULL`); otherwise SQLSTATE 42501 (`insufficient_privilege`). The api calls these.
- The two functions without a caller (migration 0025) stay for the owner's CLI (`python -m custody
  revoke-api-key` / `rotate-api-key`), but EXECUTE on them is revoked from PUBLIC: the api role can
  no longer reach them. (A compromised api could still name some other live admin key as caller;
  the check stops a key in its grace period from being used through the service, not a process
  that holds the database role.)
"""
from alembic import op

revision = "0031_key_grace"
down_revision = "0028_index_guards"
branch_labels = None
depends_on = None

SQL = """
CREATE FUNCTION custody_check_key_manager(p_caller bigint) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM api_key WHERE id = p_caller AND role = 'admin' AND revoked_at IS NULL) THEN
        RAISE EXCEPTION 'api key % may not manage keys (not an admin key, revoked, or in a rotation''s grace period)',
            p_caller USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;

CREATE FUNCTION custody_revoke_api_key(p_id bigint, p_by text, p_caller bigint) RETURNS timestamptz
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
BEGIN
    PERFORM custody_check_key_manager(p_caller);
    RETURN custody_revoke_api_key(p_id, p_by);
END $$;

CREATE FUNCTION custody_rotate_api_key(p_id bigint, p_prefix text, p_hash text, p_grace_seconds integer, p_by text,
                                       p_caller bigint)
    RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
BEGIN
    PERFORM custody_check_key_manager(p_caller);
    RETURN custody_rotate_api_key(p_id, p_prefix, p_hash, p_grace_seconds, p_by);
END $$;

REVOKE EXECUTE ON FUNCTION custody_check_key_manager(bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION custody_revoke_api_key(bigint, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION custody_rotate_api_key(bigint, text, text, integer, text) FROM PUBLIC;
"""

DOWN = """
GRANT EXECUTE ON FUNCTION custody_revoke_api_key(bigint, text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION custody_rotate_api_key(bigint, text, text, integer, text) TO PUBLIC;
DROP FUNCTION custody_rotate_api_key(bigint, text, text, integer, text, bigint);
DROP FUNCTION custody_revoke_api_key(bigint, text, bigint);
DROP FUNCTION custody_check_key_manager(bigint);
"""


def upgrade() -> None:
    op.execute(SQL)


def downgrade() -> None:
    op.execute(DOWN)
