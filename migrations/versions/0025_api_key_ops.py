"""API keys are listed, revoked and rotated; the worker's job runs are counted (issue 14).

Revision ID: 0025_api_key_ops
Revises: 0024_webhooks

Why: a key could only be created (`create-api-key`), and `api_key.name` was UNIQUE, so a key could
not be replaced under its own name. A name is more than a label: it is the caller's idempotency
namespace (`api:<name>:`) and hold owner (custody.money_rules), so a rotated key must keep it. And
the worker's jobs ran without a number anyone could scrape: the worker has no HTTP server.

What changes:
- `api_key.replaces` (the key this one rotated, at most once: UNIQUE) and `revoked_by`. `name` is
  no longer unique; instead exactly one key per name was *created* (`replaces IS NULL`, a unique
  partial index), and every other key of that name is a rotation of it, with its name and role
  (the functions below insert them so). A revoked name is therefore never handed to a new caller.
- A rotation may leave the old key working for a grace period: its `revoked_at` is then in the
  future, and a key authenticates while `revoked_at IS NULL OR revoked_at > now()`.
- The api may not write `api_key` (it stays in `custody_api_read_only_tables()`: a compromised api
  must not plant keys). The admin routes call two SECURITY DEFINER functions instead, which can
  only revoke a key, or rotate an existing, live key into one of the same name and role:
  `custody_revoke_api_key(id, by)` and `custody_rotate_api_key(id, prefix, hash, grace_seconds, by)`.
  Both lock the row, write the audit event in the same transaction and raise SQLSTATE P0002
  (`no_data_found`) for an unknown id and 55000 (`object_not_in_prerequisite_state`) for a key
  that is revoked or already rotated. What a compromised api can still do with them is rotate a
  live key into one it knows (the old key's holder notices: their key stops working); it cannot
  create a name or a role.
- `job_stat`: one row per scheduled job name (runs, failures, skips, total seconds, last run),
  upserted by the worker after each run (custody.jobs) and read by the api's `/metrics`. The api
  only reads it (`custody_api_read_only_tables()`).
"""
from alembic import op

revision = "0025_api_key_ops"
down_revision = "0024_webhooks"
branch_labels = None
depends_on = None

SQL = """
ALTER TABLE api_key DROP CONSTRAINT api_key_name_key;
ALTER TABLE api_key ADD COLUMN replaces bigint UNIQUE REFERENCES api_key(id);
ALTER TABLE api_key ADD COLUMN revoked_by text;
CREATE UNIQUE INDEX api_key_name_created_once ON api_key (name) WHERE replaces IS NULL;
CREATE INDEX api_key_by_name ON api_key (name, id);

CREATE TABLE job_stat (
    name              text PRIMARY KEY,
    runs              bigint NOT NULL DEFAULT 0,   -- runs that took the job's lock (succeeded or failed)
    failures          bigint NOT NULL DEFAULT 0,   -- of those, runs that raised (or a step of which raised)
    skipped           bigint NOT NULL DEFAULT 0,   -- ticks another worker held the job
    seconds_total     double precision NOT NULL DEFAULT 0,  -- wall time of the runs (not money)
    last_seconds      double precision,
    last_run_at       timestamptz,
    last_failure_at   timestamptz
);

CREATE FUNCTION custody_revoke_api_key(p_id bigint, p_by text) RETURNS timestamptz
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

CREATE FUNCTION custody_rotate_api_key(p_id bigint, p_prefix text, p_hash text, p_grace_seconds integer, p_by text)
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

CREATE OR REPLACE FUNCTION custody_api_read_only_tables() RETURNS text[] LANGUAGE sql IMMUTABLE
    AS $$ SELECT ARRAY['api_key', 'chain_asset', 'chain_cursor', 'chain_transaction', 'denylist_address',
                       'eth_nonce', 'job_stat', 'matching_snapshot', 'btc_wallet_output']::text[] $$;
CALL custody_apply_role_grants();
"""

DOWN = """
DROP FUNCTION custody_rotate_api_key(bigint, text, text, integer, text);
DROP FUNCTION custody_revoke_api_key(bigint, text);
CREATE OR REPLACE FUNCTION custody_api_read_only_tables() RETURNS text[] LANGUAGE sql IMMUTABLE
    AS $$ SELECT ARRAY['api_key', 'chain_asset', 'chain_cursor', 'chain_transaction', 'denylist_address',
                       'eth_nonce', 'matching_snapshot', 'btc_wallet_output']::text[] $$;
DROP TABLE job_stat;
DROP INDEX api_key_by_name;
DROP INDEX api_key_name_created_once;
ALTER TABLE api_key DROP COLUMN revoked_by;
ALTER TABLE api_key DROP COLUMN replaces;
ALTER TABLE api_key ADD CONSTRAINT api_key_name_key UNIQUE (name);
CALL custody_apply_role_grants();
"""


def upgrade() -> None:
    op.execute(SQL)


def downgrade() -> None:
    op.execute(DOWN)
