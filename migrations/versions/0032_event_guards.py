"""Guards on the event stream: who may write events, and how large a transaction's metadata may be (review 14).

Revision ID: 0032_event_guards
Revises: 0031_key_grace

Why (review 14, F2): migration 0026 let custody_api INSERT `outbox` rows and INSERT/UPDATE
`outbox_aggregate`, and `custody_emit` ran as its caller: a compromised api could forge any event
(`ledger.transaction_posted`, `deposit.credited`, ...) that consumers build balances from, or
rewind an aggregate's `last_seq` so that the next trigger-emitted event of that aggregate was
dropped silently (`ON CONFLICT (event_key) DO NOTHING`).

What changes:
- `custody_emit_row(topic, key, aggregate, version, payload)`: 0026's `custody_emit` body, renamed,
  SECURITY INVOKER: only a role that may write `outbox` and `outbox_aggregate` (the owner, the
  worker) gets anything out of it.
- The five event triggers' functions (`custody_event_transaction_posted`, `_hold_changed`,
  `_order_changed`, `_fill`, `_withdrawal_state`) call `custody_emit_row` and are SECURITY DEFINER
  (owner, `search_path` pinned): a posting, hold, order, fill or withdrawal row the api writes still
  gets its event, written with the owner's rights, whatever role wrote the row.
- `custody_emit(...)` (what custody.controls.emit calls) is SECURITY DEFINER (owner, `search_path`
  pinned). Called by custody_api (its login, or `SET ROLE custody_api`: the session's `role`
  setting, which a definer function does not change), it writes only the topics the api's own
  requests emit (`custody_api_event_topics()`: withdrawal.requested / approved / rejected,
  incident.opened, kill_switch.engaged / released, treasury.adjustment_posted, and
  deposit.credited for an operator's release of a quarantined deposit, only for an observation
  that is `released` and under its own key and aggregate); any other topic is refused with
  SQLSTATE 42501 (insufficient_privilege). Other roles (worker, owner) write every topic.
- custody_api loses INSERT on `outbox` and INSERT, UPDATE on `outbox_aggregate`: both leave
  `custody_api_limited_tables()` (0024's list minus those two) for `custody_api_read_only_tables()`
  (0028's list plus those two; a table in neither list gets every privilege).
- F3: `journal_transaction.metadata` is at most 16,384 bytes as JSON text
  (`journal_transaction_metadata_size`, a CHECK NOT VALID: rows already written stay), so that no
  posting makes an event the broker refuses for its size.
- F3: `outbox.dead_lettered_at`, `dead_letter_reason`: an event the broker refused for good
  (custody.broker.EventRefused: larger than the server's max_payload, a refusal that is not a
  connection failure or a timeout) is set aside by the dispatcher, which opens an incident
  (`event_dead_lettered`, warning); only the later events of its own aggregate wait behind it.
  Re-queued by clearing `dead_lettered_at` (the owner) once the cause is fixed.
"""
from alembic import op

revision = "0032_event_guards"
down_revision = "0031_key_grace"
branch_labels = None
depends_on = None

TRIGGER_FUNCTIONS = ("custody_event_transaction_posted", "custody_event_hold_changed", "custody_event_order_changed",
                     "custody_event_fill", "custody_event_withdrawal_state")
_ARRAY = "ARRAY[" + ", ".join(f"'{f}'" for f in TRIGGER_FUNCTIONS) + "]"

# 0024's custody_api_limited_tables(), written out, minus outbox and outbox_aggregate.
LIMITED_0024 = """
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
        ('outbox', 'INSERT'),
        ('outbox_aggregate', 'INSERT, UPDATE'),
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

LIMITED_0032 = (LIMITED_0024.replace("        ('outbox', 'INSERT'),\n", "")
                .replace("        ('outbox_aggregate', 'INSERT, UPDATE'),\n", ""))
assert LIMITED_0032.count("outbox") == 0


# 0028's custody_api_read_only_tables(), written out; 0032 adds the outbox and its numbering.
READ_ONLY_0028 = ("'api_key', 'chain_asset', 'chain_cursor', 'chain_transaction', 'denylist_address', 'eth_nonce', "
                  "'job_stat', 'matching_snapshot', 'btc_wallet_output', 'deposit_address_check', 'node_view_health'")
READ_ONLY_0032 = READ_ONLY_0028 + ", 'outbox', 'outbox_aggregate'"


def _read_only(tables: str) -> str:
    return ("CREATE OR REPLACE FUNCTION custody_api_read_only_tables() RETURNS text[] LANGUAGE sql IMMUTABLE "
            f"AS $$ SELECT ARRAY[{tables}]::text[] $$;")


def _limited(rows: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION custody_api_limited_tables() RETURNS TABLE (relation text, privileges text) LANGUAGE sql IMMUTABLE
    AS $$ VALUES {rows}
    $$;
"""


UPGRADE = r"""
ALTER FUNCTION custody_emit(text, text, text, integer, jsonb) RENAME TO custody_emit_row;

DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY """ + _ARRAY + r""" LOOP
        EXECUTE replace(pg_get_functiondef(format('%I()', f)::regprocedure), 'custody_emit(', 'custody_emit_row(');
        EXECUTE format('ALTER FUNCTION %I() SECURITY DEFINER SET search_path = public, pg_temp', f);
    END LOOP;
END $$;

-- The topics custody_api's own requests emit (custody.controls.emit in the code the api runs).
CREATE FUNCTION custody_api_event_topics() RETURNS text[] LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY['withdrawal.requested', 'withdrawal.approved', 'withdrawal.rejected', 'incident.opened',
                 'kill_switch.engaged', 'kill_switch.released', 'treasury.adjustment_posted', 'deposit.credited']::text[]
$$;

CREATE FUNCTION custody_emit(p_topic text, p_key text, p_aggregate text, p_version integer, p_payload jsonb)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    -- a definer function runs as its owner, but the session's `role` setting stays the caller's
    v_caller text := CASE WHEN current_setting('role') = 'none' THEN session_user::text ELSE current_setting('role') END;
    v_id bigint;
BEGIN
    IF v_caller = 'custody_api' THEN
        IF NOT p_topic = ANY (custody_api_event_topics()) THEN
            RAISE EXCEPTION 'custody_api may not emit % events', p_topic USING ERRCODE = 'insufficient_privilege';
        END IF;
        IF p_topic = 'deposit.credited' THEN  -- only an operator's release of a quarantined deposit
            v_id := CASE WHEN p_key ~ '^deposit\.credited:[0-9]{1,18}$' THEN split_part(p_key, ':', 2)::bigint END;
            IF v_id IS NULL OR p_aggregate IS DISTINCT FROM 'deposit:' || v_id OR NOT EXISTS (
                   SELECT 1 FROM deposit_observation WHERE id = v_id AND state = 'released'
                      AND journal_transaction_id IS NOT NULL) THEN
                RAISE EXCEPTION 'custody_api may emit deposit.credited only for a released deposit, under its own key'
                    USING ERRCODE = 'insufficient_privilege';
            END IF;
        END IF;
    END IF;
    RETURN custody_emit_row(p_topic, p_key, p_aggregate, p_version, p_payload);
END $$;

ALTER TABLE journal_transaction ADD CONSTRAINT journal_transaction_metadata_size
    CHECK (octet_length(metadata::text) <= 16384) NOT VALID;

-- An event the broker refused for good (custody.jobs.OutboxDispatcher): set aside with the reason;
-- its aggregate's later events wait behind it, every other aggregate's go on.
ALTER TABLE outbox ADD COLUMN dead_lettered_at timestamptz, ADD COLUMN dead_letter_reason text;
CREATE INDEX outbox_dead_lettered ON outbox (aggregate, aggregate_seq) WHERE dead_lettered_at IS NOT NULL;
"""

DOWNGRADE = r"""
DROP INDEX outbox_dead_lettered;
ALTER TABLE outbox DROP COLUMN dead_lettered_at, DROP COLUMN dead_letter_reason;
ALTER TABLE journal_transaction DROP CONSTRAINT journal_transaction_metadata_size;
DROP FUNCTION custody_emit(text, text, text, integer, jsonb);
DROP FUNCTION custody_api_event_topics();
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY """ + _ARRAY + r""" LOOP
        EXECUTE format('ALTER FUNCTION %I() SECURITY INVOKER RESET search_path', f);
        EXECUTE replace(pg_get_functiondef(format('%I()', f)::regprocedure), 'custody_emit_row(', 'custody_emit(');
    END LOOP;
END $$;
ALTER FUNCTION custody_emit_row(text, text, text, integer, jsonb) RENAME TO custody_emit;
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute(_limited(LIMITED_0032))
    op.execute(_read_only(READ_ONLY_0032))
    op.execute("CALL custody_apply_role_grants()")


def downgrade() -> None:
    op.execute(_read_only(READ_ONLY_0028))
    op.execute(_limited(LIMITED_0024))
    op.execute(DOWNGRADE)
    op.execute("CALL custody_apply_role_grants()")
