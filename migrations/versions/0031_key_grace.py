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
  revoke-api-key` / `rotate-api-key`) and now call the new ones with no caller, which a service
  role (custody_api, custody_worker, custody_signer: the session's login or its SET ROLE) is refused
  (42501). EXECUTE grants cannot do this: `custody_apply_role_grants()` grants every function. (A compromised api could still name some other live admin key as caller;
  the check stops a key in its grace period from being used through the service, not a process
  that holds the database role.)
"""
from alembic import op

revision = "0031_key_grace"
down_revision = "0028_index_guards"
branch_labels = None
depends_on = None

SQL = """
-- Is the calling session one of the service roles (logged in as one, or SET ROLE to one)? Inside a
-- SECURITY DEFINER function current_user is the owner, but session_user and the `role` setting
-- still name the caller.
CREATE FUNCTION custody_called_by_service_role() RETURNS boolean
    LANGUAGE sql STABLE SET search_path = public AS $$
    SELECT session_user::text IN ('custody_api', 'custody_worker', 'custody_signer')
        OR current_setting('role') IN ('custody_api', 'custody_worker', 'custody_signer') $$;

CREATE FUNCTION custody_revoke_api_key(p_id bigint, p_by text, p_caller bigint) RETURNS timestamptz
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
DECLARE
    k api_key%ROWTYPE;
BEGIN
    IF p_caller IS NULL AND custody_called_by_service_role() THEN
        RAISE EXCEPTION 'a service role must name the calling key' USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_caller IS NOT NULL AND NOT EXISTS (SELECT 1 FROM api_key WHERE id = p_caller AND role = 'admin'
                                                                    AND revoked_at IS NULL) THEN
        RAISE EXCEPTION 'api key % may not manage keys (not an admin key, revoked, or in a rotation''s grace period)',
            p_caller USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT * INTO k FROM api_key WHERE id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'api key % does not exist', p_id USING ERRCODE = 'no_data_found';
    END IF;
    IF k.revoked_at IS NOT NULL AND k.revoked_at <= now() THEN
        RAISE EXCEPTION 'api key % is revoked already', p_id USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    UPDATE api_key SET revoked_at = now(), revoked_by = p_by WHERE id = p_id;
    INSERT INTO audit_event (actor, action, subject, detail)
    VALUES (p_by, 'api_key.revoke', k.name, jsonb_build_object('id', p_id, 'role', k.role));
    RETURN now();
END $$;

CREATE FUNCTION custody_rotate_api_key(p_id bigint, p_prefix text, p_hash text, p_grace_seconds integer, p_by text,
                                       p_caller bigint)
    RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
DECLARE
    k api_key%ROWTYPE;
    v_new bigint;
BEGIN
    IF p_caller IS NULL AND custody_called_by_service_role() THEN
        RAISE EXCEPTION 'a service role must name the calling key' USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_caller IS NOT NULL AND NOT EXISTS (SELECT 1 FROM api_key WHERE id = p_caller AND role = 'admin'
                                                                    AND revoked_at IS NULL) THEN
        RAISE EXCEPTION 'api key % may not manage keys (not an admin key, revoked, or in a rotation''s grace period)',
            p_caller USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_grace_seconds IS NULL OR p_grace_seconds < 0 OR p_grace_seconds > 604800 THEN
        RAISE EXCEPTION 'grace period % s is outside 0..604800', p_grace_seconds USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO k FROM api_key WHERE id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'api key % does not exist', p_id USING ERRCODE = 'no_data_found';
    END IF;
    IF k.revoked_at IS NOT NULL OR EXISTS (SELECT 1 FROM api_key WHERE replaces = p_id) THEN
        RAISE EXCEPTION 'api key % is revoked or rotated already', p_id USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    INSERT INTO api_key (name, role, key_prefix, key_hash, replaces)
    VALUES (k.name, k.role, p_prefix, p_hash, p_id) RETURNING id INTO v_new;
    UPDATE api_key SET revoked_at = now() + make_interval(secs => p_grace_seconds), revoked_by = p_by
     WHERE id = p_id;
    INSERT INTO audit_event (actor, action, subject, detail)
    VALUES (p_by, 'api_key.rotate', k.name,
            jsonb_build_object('id', p_id, 'new_id', v_new, 'role', k.role, 'grace_seconds', p_grace_seconds));
    RETURN v_new;
END $$;

-- Migration 0025's caller-less signatures, for the owner's CLI: the same checks with no caller.
CREATE OR REPLACE FUNCTION custody_revoke_api_key(p_id bigint, p_by text) RETURNS timestamptz
    LANGUAGE sql SECURITY DEFINER SET search_path = public AS $$ SELECT custody_revoke_api_key(p_id, p_by, NULL) $$;
CREATE OR REPLACE FUNCTION custody_rotate_api_key(p_id bigint, p_prefix text, p_hash text, p_grace_seconds integer,
                                                  p_by text)
    RETURNS bigint LANGUAGE sql SECURITY DEFINER SET search_path = public
    AS $$ SELECT custody_rotate_api_key(p_id, p_prefix, p_hash, p_grace_seconds, p_by, NULL) $$;
CALL custody_apply_role_grants();
"""

DOWN = """
DROP FUNCTION custody_rotate_api_key(bigint, text, text, integer, text, bigint);
DROP FUNCTION custody_revoke_api_key(bigint, text, bigint);
DROP FUNCTION custody_called_by_service_role();
"""

# migration 0025's caller-less functions as they were (the downgrade puts them back)
_RESTORE_0025 = """
CREATE OR REPLACE FUNCTION custody_revoke_api_key(p_id bigint, p_by text) RETURNS timestamptz
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
DECLARE
    k api_key%ROWTYPE;
BEGIN
    SELECT * INTO k FROM api_key WHERE id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'api key % does not exist', p_id USING ERRCODE = 'no_data_found';
    END IF;
    IF k.revoked_at IS NOT NULL AND k.revoked_at <= now() THEN
        RAISE EXCEPTION 'api key % is revoked already', p_id USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    UPDATE api_key SET revoked_at = now(), revoked_by = p_by WHERE id = p_id;
    INSERT INTO audit_event (actor, action, subject, detail)
    VALUES (p_by, 'api_key.revoke', k.name, jsonb_build_object('id', p_id, 'role', k.role));
    RETURN now();
END $$;

CREATE OR REPLACE FUNCTION custody_rotate_api_key(p_id bigint, p_prefix text, p_hash text, p_grace_seconds integer, p_by text)
    RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
DECLARE
    k api_key%ROWTYPE;
    v_new bigint;
BEGIN
    IF p_grace_seconds IS NULL OR p_grace_seconds < 0 OR p_grace_seconds > 604800 THEN
        RAISE EXCEPTION 'grace period % s is outside 0..604800', p_grace_seconds USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO k FROM api_key WHERE id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'api key % does not exist', p_id USING ERRCODE = 'no_data_found';
    END IF;
    IF k.revoked_at IS NOT NULL OR EXISTS (SELECT 1 FROM api_key WHERE replaces = p_id) THEN
        RAISE EXCEPTION 'api key % is revoked or rotated already', p_id USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    INSERT INTO api_key (name, role, key_prefix, key_hash, replaces)
    VALUES (k.name, k.role, p_prefix, p_hash, p_id) RETURNING id INTO v_new;
    UPDATE api_key SET revoked_at = now() + make_interval(secs => p_grace_seconds), revoked_by = p_by
     WHERE id = p_id;
    INSERT INTO audit_event (actor, action, subject, detail)
    VALUES (p_by, 'api_key.rotate', k.name,
            jsonb_build_object('id', p_id, 'new_id', v_new, 'role', k.role, 'grace_seconds', p_grace_seconds));
    RETURN v_new;
END $$;

"""


def upgrade() -> None:
    op.execute(SQL)


def downgrade() -> None:
    op.execute(_RESTORE_0025)  # first: they no longer call the functions dropped next
    op.execute(DOWN)
