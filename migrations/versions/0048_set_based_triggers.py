"""Events of holds and withdrawals, and the liquidity guard, per statement instead of per row; a posting's event in one statement (issue 20).

Revision ID: 0048_set_based_triggers
Revises: 0047_rebalance_cpfp

Why: the payout job of 500 withdrawals made about 2,000 `custody_emit_row` calls per batch (one per
withdrawal state change and per hold change, from the per-row triggers of 0026/0032), each a
PL/pgSQL call of three statements (a key lookup, the aggregate's numbering upsert, the outbox
INSERT); and a single posting's event (the deferred `journal_transaction_event`) was a third of the
database's time per posting.

What changes (the events written, their keys, payloads, per-aggregate numbering and order are
unchanged; only how many statements write them):
- `hold_event` (AFTER INSERT OR UPDATE, FOR EACH ROW) becomes `hold_event_insert` and
  `hold_event_update`: AFTER ... FOR EACH STATEMENT with transition tables (REFERENCING NEW TABLE,
  and OLD TABLE for updates; PostgreSQL allows transition tables only on single-event triggers
  without column lists). One call per statement builds every changed hold's `ledger.hold_changed`
  and writes them with one numbering upsert and one outbox INSERT for all of them (a few
  statements per call, whatever the number of rows), the outbox ids assigned in the order of the
  rows in the transition table (the order in which the row trigger fired). An UPDATE that leaves
  (state, captured, released) as they were emits nothing, as before. No statement joins a
  transition table (see `_emit_statement`: a plan cached for one row would make a join over 500
  quadratic).
- `withdrawal_request_event` (AFTER INSERT OR UPDATE OF state, FOR EACH ROW) becomes
  `withdrawal_request_event_insert` / `_update` the same way; an UPDATE emits for the rows whose
  state changed (an UPDATE of other columns now fires the statement trigger once and emits nothing).
- Each aggregate (`hold:<id>`, `withdrawal:<id>`) occurs at most once per statement (one row per
  primary key in a transition table), so one numbering upsert per aggregate gives the same
  sequence numbers as one `custody_emit_row` per row. The trigger fires at the end of the
  statement that changed the rows, as the AFTER ROW trigger did, so the order relative to other
  events of the same aggregate (`withdrawal.requested` after `withdrawal.state_changed`) is kept.
  Locks: the aggregates' numbering rows are taken by the transaction that already holds the
  changed hold or withdrawal rows' locks, as before.
- An event whose key exists already (only a rewound numbering can cause that: the keys are
  `<aggregate>#<seq>`) is skipped and its number given back, as `custody_emit_row` did.
- `custody_event_transaction_posted` (the deferred per-row constraint trigger stays: a constraint
  trigger cannot be FOR EACH STATEMENT, and it must run at COMMIT when every entry exists) writes its
  event in one statement instead of calling `custody_emit_row` (three statements and a call): the
  key `ledger.transaction_posted:<id>` names a journal transaction created in this database
  transaction, so the key lookup before numbering is replaced by ON CONFLICT (key) on the INSERT,
  and a conflict gives the number back afterwards, as `custody_emit_row` does.
- The trigger functions stay SECURITY DEFINER (owner, `search_path` pinned) as in 0032: the api's
  rows get their events written with the owner's rights. The per-row functions of 0026/0032 stay
  (unused) for the downgrade.
- `journal_entry_liquidity_guard` (0033: BEFORE INSERT FOR EACH ROW WHEN the entry is a debit and
  the writer is custody_api or custody_worker) becomes AFTER INSERT FOR EACH STATEMENT (same name,
  same WHEN on the writer) over the statement's entries (the transition table `new_rows`, which
  journal_entry_references already collects): one call per posting instead of one per debit leg
  (a batch of 100 transfers made 100 calls, about a quarter of the database's time per transfer).
  The rule is unchanged: a debit of a liquidity account so written is refused (same message and
  SQLSTATE) unless it is a leg of a proposed treasury adjustment with its quorum; raising at the
  end of the INSERT statement aborts it as raising before the row did, and the guard (its name
  sorts first) runs before the entries' reference check.
"""
from alembic import op

revision = "0048_set_based_triggers"
down_revision = "0047_rebalance_cpfp"
branch_labels = None
depends_on = None

_DEFINER = "SECURITY DEFINER SET search_path = public, pg_temp"


def _emit_statement(events: str, old: str | None = None) -> str:
    """The PL/pgSQL body that writes the events `events` selects (columns topic, aggregate, payload,
    ord; keys are `<aggregate>#<seq>`, version 1), then gives back the numbers of any that were not
    written (key taken). Precondition: each aggregate at most once in `events`. `old`: a SELECT
    INTO v_old of the old rows' figures as a jsonb object keyed by id, for `events` to compare
    against (`v_old -> n.id::text`).

    No statement joins a transition table to anything: PL/pgSQL plans each statement once per
    session, with the transition table's row count of that first call as its estimate, so a join
    planned for one row would be a nested loop over every pair of rows of a large statement (and
    one planned for many a scan of a whole table for one row). The old rows are looked up in a
    jsonb object, each aggregate's number in the jsonb object of the numbering upsert's RETURNING,
    the account's asset by a scalar subquery on its key: each a lookup per row whatever the plan."""
    prelude = f"\n    {old}" if old else ""
    return f"""
DECLARE
    v_old jsonb;
    v_topics text[];
    v_aggregates text[];
    v_payloads jsonb[];
    v_seq jsonb;
    v_written text[];
BEGIN{prelude}
    SELECT array_agg(e.topic ORDER BY e.ord), array_agg(e.aggregate ORDER BY e.ord), array_agg(e.payload ORDER BY e.ord)
      INTO v_topics, v_aggregates, v_payloads
      FROM (
{events}
           ) e;
    IF v_aggregates IS NULL THEN
        RETURN NULL;
    END IF;
    WITH numbered AS (
        INSERT INTO outbox_aggregate AS a (aggregate, last_seq)
        SELECT u.aggregate, 1 FROM unnest(v_aggregates) WITH ORDINALITY AS u(aggregate, i) ORDER BY u.i
        ON CONFLICT (aggregate) DO UPDATE SET last_seq = a.last_seq + 1
        RETURNING a.aggregate, a.last_seq
    )
    SELECT jsonb_object_agg(n.aggregate, n.last_seq) INTO v_seq FROM numbered n;
    WITH written AS (
        INSERT INTO outbox (topic, event_key, aggregate, aggregate_seq, version, payload)
        SELECT u.topic, u.aggregate || '#' || (v_seq ->> u.aggregate), u.aggregate, (v_seq ->> u.aggregate)::bigint,
               1, u.payload
          FROM unnest(v_topics, v_aggregates, v_payloads) WITH ORDINALITY AS u(topic, aggregate, payload, i)
         ORDER BY u.i
        ON CONFLICT (event_key) DO NOTHING
        RETURNING aggregate
    )
    SELECT array_agg(w.aggregate) INTO v_written FROM written w;
    IF coalesce(cardinality(v_written), 0) < cardinality(v_aggregates) THEN
        -- written meanwhile under the same key: give those numbers back (the numbering stays gapless)
        UPDATE outbox_aggregate SET last_seq = last_seq - 1
         WHERE aggregate = ANY (ARRAY(SELECT u.aggregate FROM unnest(v_aggregates) u(aggregate)
                                       WHERE NOT u.aggregate = ANY (coalesce(v_written, '{{}}'))));
    END IF;
    RETURN NULL;
END"""


_HOLD_PAYLOAD = """jsonb_build_object(
                   'hold_id', n.id, 'account_id', n.account_id,
                   'asset', (SELECT acc.asset FROM account acc WHERE acc.id = n.account_id),
                   'amount', n.amount, 'captured', n.captured, 'released', n.released,
                   'held', CASE WHEN n.state = 'pending' THEN n.amount - n.captured - n.released ELSE 0 END,
                   'state', n.state, 'owner', n.owner, 'reference', n.reference)"""

_NEW_ROWS = "          FROM (SELECT r.*, row_number() OVER () AS ord FROM new_rows r) n"

_WITHDRAWAL_PAYLOAD = """jsonb_build_object(
                   'withdrawal_id', n.id, 'client_withdrawal_id', n.client_withdrawal_id,
                   'account_id', n.account_id, 'asset', n.asset, 'chain', n.chain, 'amount', n.amount,
                   'fee_quoted', n.fee_quoted, 'destination', n.destination, 'priority', n.priority,
                   'state', n.state, 'previous_state', {previous},
                   'hold_id', n.hold_id, 'batch_id', n.batch_id)"""

_HOLD_EVENTS = (f"        SELECT 'ledger.hold_changed' AS topic, 'hold:' || n.id AS aggregate, n.ord,\n"
                f"               {_HOLD_PAYLOAD} AS payload\n{_NEW_ROWS}")
_WITHDRAWAL_EVENTS = ("        SELECT 'withdrawal.state_changed' AS topic, 'withdrawal:' || n.id AS aggregate, n.ord,\n"
                      "               " + _WITHDRAWAL_PAYLOAD + " AS payload\n" + _NEW_ROWS)


def _trigger_function(name: str, body: str) -> str:
    return f"""
CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql {_DEFINER} AS $$
{body} $$;
"""


HOLDS_INSERTED = _trigger_function("custody_event_holds_inserted", _emit_statement(_HOLD_EVENTS))
HOLDS_UPDATED = _trigger_function("custody_event_holds_updated", _emit_statement(
    _HOLD_EVENTS + "\n         WHERE jsonb_build_array(n.state, n.captured, n.released) IS DISTINCT FROM v_old -> n.id::text",
    old="SELECT jsonb_object_agg(o.id, jsonb_build_array(o.state, o.captured, o.released)) INTO v_old FROM old_rows o;"))
WITHDRAWALS_INSERTED = _trigger_function("custody_event_withdrawals_inserted", _emit_statement(
    _WITHDRAWAL_EVENTS.format(previous="NULL::text")))
WITHDRAWALS_UPDATED = _trigger_function("custody_event_withdrawals_updated", _emit_statement(
    _WITHDRAWAL_EVENTS.format(previous="v_old ->> n.id::text")
    + "\n         WHERE (v_old ->> n.id::text) IS DISTINCT FROM n.state",
    old="SELECT jsonb_object_agg(o.id, o.state) INTO v_old FROM old_rows o;"))

TRANSACTION_POSTED = f"""
CREATE OR REPLACE FUNCTION custody_event_transaction_posted() RETURNS trigger LANGUAGE plpgsql {_DEFINER} AS $$
DECLARE
    v_aggregate text := 'journal_transaction:' || NEW.id;
    v_written boolean;
BEGIN
    WITH numbered AS (
        INSERT INTO outbox_aggregate AS a (aggregate, last_seq) VALUES (v_aggregate, 1)
        ON CONFLICT (aggregate) DO UPDATE SET last_seq = a.last_seq + 1
        RETURNING a.last_seq
    ), written AS (
        INSERT INTO outbox (topic, event_key, aggregate, aggregate_seq, version, payload)
        SELECT 'ledger.transaction_posted', 'ledger.transaction_posted:' || NEW.id, v_aggregate, n.last_seq, 1,
               jsonb_build_object(
                   'transaction_id', NEW.id, 'idempotency_key', NEW.idempotency_key, 'kind', NEW.kind,
                   'reverses_id', NEW.reverses_id, 'metadata', NEW.metadata, 'posted_at', NEW.created_at,
                   'legs', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                               'entry_id', e.id, 'account_id', e.account_id, 'asset', e.asset,
                               'amount', e.amount, 'hold_id', e.hold_id) ORDER BY e.id), '[]'::jsonb)
                            FROM journal_entry e WHERE e.transaction_id = NEW.id))
          FROM numbered n
        ON CONFLICT (event_key) DO NOTHING
        RETURNING true
    )
    SELECT EXISTS (SELECT 1 FROM written) INTO v_written;
    IF NOT v_written THEN  -- the key was written before (or meanwhile): give the number back
        UPDATE outbox_aggregate SET last_seq = last_seq - 1 WHERE aggregate = v_aggregate;
    END IF;
    RETURN NULL;
END $$;
"""

LIQUIDITY_GUARD = r"""
CREATE FUNCTION convert_guard_liquidity_debits() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- lookups by key per row only (scalar subqueries): see _emit_statement on transition tables
    IF EXISTS (
        SELECT 1
          FROM new_rows n
         WHERE n.amount < 0
           AND (SELECT acc.kind FROM account acc WHERE acc.id = n.account_id) = 'liquidity'
           AND NOT coalesce((
               SELECT EXISTS (
                   SELECT 1 FROM treasury_adjustment a
                    WHERE a.id = CASE WHEN t.idempotency_key ~ '^treasury-adjustment:[0-9]{1,18}$'
                                      THEN split_part(t.idempotency_key, ':', 2)::bigint END
                      AND a.state = 'proposed'
                      AND EXISTS (SELECT 1 FROM jsonb_array_elements(a.transfers) x
                                   WHERE (x->>'debit_account_id')::bigint = n.account_id
                                     AND (x->>'amount')::numeric = -n.amount)
                      AND (SELECT count(DISTINCT v.operator) FROM treasury_adjustment_vote v
                            WHERE v.adjustment_id = a.id AND v.decision = 'approve' AND v.operator <> a.proposed_by)
                          >= a.quorum)
                 FROM journal_transaction t WHERE t.id = n.transaction_id), false)) THEN
        RAISE EXCEPTION 'ledger: % may debit a liquidity account only through convert_accept or an approved treasury adjustment',
            current_user USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER journal_entry_liquidity_guard ON journal_entry;
CREATE TRIGGER journal_entry_liquidity_guard AFTER INSERT ON journal_entry REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (current_user IN ('custody_api', 'custody_worker'))
    EXECUTE FUNCTION convert_guard_liquidity_debits();
"""

LIQUIDITY_GUARD_0033 = """
DROP TRIGGER journal_entry_liquidity_guard ON journal_entry;
CREATE TRIGGER journal_entry_liquidity_guard BEFORE INSERT ON journal_entry
    FOR EACH ROW WHEN (NEW.amount < 0 AND current_user IN ('custody_api', 'custody_worker'))
    EXECUTE FUNCTION convert_guard_liquidity_debit();
DROP FUNCTION convert_guard_liquidity_debits();
"""

UPGRADE = LIQUIDITY_GUARD + HOLDS_INSERTED + HOLDS_UPDATED + WITHDRAWALS_INSERTED + WITHDRAWALS_UPDATED + TRANSACTION_POSTED + """
DROP TRIGGER hold_event ON hold;
CREATE TRIGGER hold_event_insert AFTER INSERT ON hold REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION custody_event_holds_inserted();
CREATE TRIGGER hold_event_update AFTER UPDATE ON hold REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION custody_event_holds_updated();

DROP TRIGGER withdrawal_request_event ON withdrawal_request;
CREATE TRIGGER withdrawal_request_event_insert AFTER INSERT ON withdrawal_request REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION custody_event_withdrawals_inserted();
CREATE TRIGGER withdrawal_request_event_update AFTER UPDATE ON withdrawal_request
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION custody_event_withdrawals_updated();
"""

# 0032's body of the posting's event function (0026's, calling custody_emit_row).
TRANSACTION_POSTED_0032 = f"""
CREATE OR REPLACE FUNCTION custody_event_transaction_posted() RETURNS trigger LANGUAGE plpgsql {_DEFINER} AS $$
BEGIN
    PERFORM custody_emit_row('ledger.transaction_posted', 'ledger.transaction_posted:' || NEW.id,
        'journal_transaction:' || NEW.id, 1, jsonb_build_object(
            'transaction_id', NEW.id, 'idempotency_key', NEW.idempotency_key, 'kind', NEW.kind,
            'reverses_id', NEW.reverses_id, 'metadata', NEW.metadata, 'posted_at', NEW.created_at,
            'legs', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                        'entry_id', e.id, 'account_id', e.account_id, 'asset', e.asset,
                        'amount', e.amount, 'hold_id', e.hold_id) ORDER BY e.id), '[]'::jsonb)
                     FROM journal_entry e WHERE e.transaction_id = NEW.id)));
    RETURN NULL;
END $$;
"""

DOWNGRADE = LIQUIDITY_GUARD_0033 + TRANSACTION_POSTED_0032 + """
DROP TRIGGER withdrawal_request_event_insert ON withdrawal_request;
DROP TRIGGER withdrawal_request_event_update ON withdrawal_request;
CREATE TRIGGER withdrawal_request_event AFTER INSERT OR UPDATE OF state ON withdrawal_request
    FOR EACH ROW EXECUTE FUNCTION custody_event_withdrawal_state();
DROP TRIGGER hold_event_insert ON hold;
DROP TRIGGER hold_event_update ON hold;
CREATE TRIGGER hold_event AFTER INSERT OR UPDATE ON hold
    FOR EACH ROW EXECUTE FUNCTION custody_event_hold_changed();
DROP FUNCTION custody_event_holds_inserted(), custody_event_holds_updated(),
              custody_event_withdrawals_inserted(), custody_event_withdrawals_updated();
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
