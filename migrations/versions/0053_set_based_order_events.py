"""Events of orders and fills per statement instead of per row; every statement trigger's events in one statement (issue 20).

Revision ID: 0053_set_based_order_events
Revises: 0050_refill_times

Why: a unit of work of the matching service (one group commit of order entry) writes its order rows
in one upsert and its fill rows in one INSERT (matching.store), but the per-row triggers of 0026/0032
(`trade_order_event`, `fill_event`) made one `custody_emit_row` call per changed order and per fill,
each a PL/pgSQL call of three statements (a key lookup, the aggregate's numbering upsert, the outbox
INSERT): a group of 12 orders made about 16 such calls.

What changes (the events written, their keys, payloads and per-aggregate numbering are unchanged;
only how many statements write them):
- `trade_order_event` (AFTER INSERT OR UPDATE, FOR EACH ROW) becomes `trade_order_event_insert` and
  `trade_order_event_update`: AFTER ... FOR EACH STATEMENT with transition tables, on 0048's rules
  for the holds' events (one numbering upsert and one outbox INSERT per statement, outbox ids in
  the order of the rows in the transition table, no statement joining a transition table; here
  in one statement, see below). Topics as in 0026: `order.amended` when an update keeps the state
  and the filled quantity of an open order, `order.accepted` for an open state, else
  `order.<state>`; an UPDATE that leaves (state, filled, price, qty) as they were emits nothing.
  Each order id occurs once per statement, so 0048's precondition (one event per aggregate per
  statement) holds.
- One thing moves: in ONE `INSERT ... ON CONFLICT DO UPDATE` (the unit's upsert) PostgreSQL runs
  the statement's AFTER UPDATE triggers before its AFTER INSERT triggers, so the events of the
  orders the upsert updates now come before those of the orders it inserts (the row triggers
  interleaved them in the order of the rows). Per aggregate nothing changes (an order is inserted
  or updated once per statement, and its events keep their numbers and order); across aggregates
  the outbox promises no order (custody.events).
- `trade_order_id_fixed` (BEFORE UPDATE OF id, FOR EACH ROW, only when the id changes): refuses to
  change an order's id. The update trigger pairs an old row with its new row by id (the transition
  tables have no other common key); no code changes an id (the upsert's SET list leaves it out), so
  nothing that worked is refused, and a writer that tried would have made the row trigger's event
  and the statement trigger's differ.
- `fill_event` (AFTER INSERT, FOR EACH ROW) becomes `fill_event_insert` (AFTER INSERT FOR EACH
  STATEMENT, transition table). Fills are numbered on the market's aggregate (`market:<symbol>`),
  so one statement has several events per aggregate: the numbering upsert adds each aggregate's
  count at once and the k-th fill of an aggregate in the statement gets `last - count + k`. The
  keys are the fills' own (`fill:<market>:<seq>:<match_no>`, ON CONFLICT DO NOTHING on the outbox):
  `custody_emit_row` skipped a key written before without taking a number; here, when a key was
  taken (only an event written by hand under that key, since a fill row is inserted once), the
  statement's written events of that aggregate are numbered again from the first number it took,
  in order, and the aggregate's last number is set to the last one used: the numbering stays
  gapless and the same as the row trigger's.
- Every statement trigger writes its events in ONE statement (`_emit_one_statement`): the events
  (a materialized CTE over the transition table), the numbering upsert and the outbox INSERT, which
  reads the numbers through a one-row CTE (a cross join with one row, so still no join of the
  transition table); 0048's bodies made three (the events into arrays, the upsert, the INSERT),
  four for an UPDATE (the old rows' figures are read in the same statement, a one-row cross join).
  The four functions of 0048 (`custody_event_holds_inserted`/`_updated`,
  `custody_event_withdrawals_inserted`/`_updated`) are replaced by such bodies, same events:
  inside `ledger_apply` every hold placed, captured or released is a statement of its own, so a
  group of 12 orders ran about 18 of these triggers. A key taken (ON CONFLICT) gives its number
  back afterwards, as before. The fills' function is one statement too (with its renumbering
  only when a key was taken).
- The trigger functions are SECURITY DEFINER (owner, `search_path` pinned) as in 0032/0048, and
  `custody_apply_role_grants()` runs at the end: no process role may EXECUTE them (0049). The
  per-row functions of 0026/0032 stay (unused) for the downgrade.
"""
import importlib.util
from pathlib import Path

from alembic import op

revision = "0053_set_based_order_events"
down_revision = "0050_refill_times"
branch_labels = None
depends_on = None


def _sibling(filename: str):
    """A migration module of this directory, loaded by path (their names start with a digit)."""
    spec = importlib.util.spec_from_file_location(f"_migration_{filename[:4]}", Path(__file__).with_name(filename))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_0048 = _sibling("0048_set_based_triggers.py")

_OPEN = "('received', 'pending_new', 'working', 'untriggered', 'pending_cancel')"  # 0026: order.accepted

_ORDER_PAYLOAD = """jsonb_build_object(
                   'order_id', n.id, 'market', n.market, 'account', n.account,
                   'client_order_id', n.client_order_id, 'side', n.side, 'order_type', n.order_type,
                   'price_ticks', n.price, 'qty_lots', n.qty, 'budget', n.budget, 'state', n.state,
                   'filled_lots', n.filled, 'remaining_lots', n.remaining, 'quote_traded', n.quote_traded,
                   'fees_paid', n.fees_paid, 'hold_id', n.hold_id, 'reject_code', n.reject_code,
                   'close_reason', n.close_reason, 'last_seq', n.last_seq)"""

_NEW_ROWS = "          FROM (SELECT r.*, row_number() OVER () AS ord FROM new_rows r) n"

_ORDERS_INSERTED_EVENTS = (
    f"        SELECT CASE WHEN n.state IN {_OPEN} THEN 'order.accepted' ELSE 'order.' || n.state END AS topic,\n"
    f"               'order:' || n.id AS aggregate, n.ord,\n"
    f"               {_ORDER_PAYLOAD} AS payload\n{_NEW_ROWS}")



def _old_rows(figures: str) -> str:
    """The FROM clause's second item of an UPDATE trigger's events: one row, `was.m`, the old rows'
    `figures` as a jsonb object keyed by id (a cross join with one row: no join of a transition
    table; each row's old figures are then a lookup in `was.m`)."""
    return f"\n          CROSS JOIN (SELECT jsonb_object_agg(o.id, {figures}) AS m FROM old_rows o) was"


# was.m: order id -> [state, filled, price, qty] of the old row (jsonb compares numbers as numbers).
_ORDERS_UPDATED_EVENTS = (
    f"        SELECT CASE WHEN n.state IN {_OPEN} AND (was.m -> n.id -> 0) = to_jsonb(n.state)\n"
    f"                         AND (was.m -> n.id -> 1) = to_jsonb(n.filled) THEN 'order.amended'\n"
    f"                    WHEN n.state IN {_OPEN} THEN 'order.accepted'\n"
    f"                    ELSE 'order.' || n.state END AS topic,\n"
    f"               'order:' || n.id AS aggregate, n.ord,\n"
    f"               {_ORDER_PAYLOAD} AS payload\n{_NEW_ROWS}"
    + _old_rows("jsonb_build_array(o.state, o.filled, o.price, o.qty)") +
    "\n         WHERE jsonb_build_array(n.state, n.filled, n.price, n.qty) IS DISTINCT FROM was.m -> n.id")


def _emit_one_statement(events: str) -> str:
    """The PL/pgSQL body that writes the events `events` selects (columns topic, aggregate, ord,
    payload; keys `<aggregate>#<seq>`, version 1) in ONE statement: the events (a materialized
    CTE), the numbering upsert, and the outbox INSERT that reads the numbers through a one-row
    CTE (a cross join with one row: no join of the transition table, see 0048's `_emit_statement`).
    Then, only when a key was taken, gives back the numbers of the events not written. Same
    precondition and results as 0048's `_emit_statement` (each aggregate at most once in
    `events`; outbox ids in `ord` order; numbering row locks taken in `ord` order). An UPDATE
    trigger's `events` read the old rows' figures through `_old_rows`, in the same statement."""
    return f"""
DECLARE
    v_aggregates text[];
    v_written text[];
BEGIN
    WITH e AS MATERIALIZED (
{events}
    ), numbered AS (
        INSERT INTO outbox_aggregate AS a (aggregate, last_seq)
        SELECT e.aggregate, 1 FROM e ORDER BY e.ord
        ON CONFLICT (aggregate) DO UPDATE SET last_seq = a.last_seq + 1
        RETURNING a.aggregate, a.last_seq
    ), seqs AS (
        SELECT jsonb_object_agg(n.aggregate, n.last_seq) AS m FROM numbered n
    ), written AS (
        INSERT INTO outbox (topic, event_key, aggregate, aggregate_seq, version, payload)
        SELECT e.topic, e.aggregate || '#' || (s.m ->> e.aggregate), e.aggregate, (s.m ->> e.aggregate)::bigint,
               1, e.payload
          FROM e CROSS JOIN seqs s
         ORDER BY e.ord
        ON CONFLICT (event_key) DO NOTHING
        RETURNING aggregate
    )
    SELECT (SELECT array_agg(e.aggregate) FROM e), (SELECT array_agg(w.aggregate) FROM written w)
      INTO v_aggregates, v_written;
    IF coalesce(cardinality(v_written), 0) < coalesce(cardinality(v_aggregates), 0) THEN
        -- written meanwhile under the same key: give those numbers back (the numbering stays gapless)
        UPDATE outbox_aggregate SET last_seq = last_seq - 1
         WHERE aggregate = ANY (ARRAY(SELECT u.aggregate FROM unnest(v_aggregates) u(aggregate)
                                       WHERE NOT u.aggregate = ANY (coalesce(v_written, '{{}}'))));
    END IF;
    RETURN NULL;
END"""


def _replacing(name: str, body: str) -> str:
    return _0048._trigger_function(name, body).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


# 0048's four statement triggers of holds and withdrawals, same events, written in one statement.
HOLDS_AND_WITHDRAWALS = (
    _replacing("custody_event_holds_inserted", _emit_one_statement(_0048._HOLD_EVENTS))
    + _replacing("custody_event_holds_updated", _emit_one_statement(
        _0048._HOLD_EVENTS + _old_rows("jsonb_build_array(o.state, o.captured, o.released)")
        + "\n         WHERE jsonb_build_array(n.state, n.captured, n.released) IS DISTINCT FROM was.m -> n.id::text"))
    + _replacing("custody_event_withdrawals_inserted", _emit_one_statement(
        _0048._WITHDRAWAL_EVENTS.format(previous="NULL::text")))
    + _replacing("custody_event_withdrawals_updated", _emit_one_statement(
        _0048._WITHDRAWAL_EVENTS.format(previous="was.m ->> n.id::text") + _old_rows("o.state")
        + "\n         WHERE (was.m ->> n.id::text) IS DISTINCT FROM n.state")))
HOLDS_AND_WITHDRAWALS_0048 = "".join(
    f.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    for f in (_0048.HOLDS_INSERTED, _0048.HOLDS_UPDATED, _0048.WITHDRAWALS_INSERTED, _0048.WITHDRAWALS_UPDATED))

ORDERS_INSERTED = _0048._trigger_function("custody_event_orders_inserted", _emit_one_statement(_ORDERS_INSERTED_EVENTS))
ORDERS_UPDATED = _0048._trigger_function("custody_event_orders_updated", _emit_one_statement(_ORDERS_UPDATED_EVENTS))

FILLS_INSERTED = f"""
CREATE FUNCTION custody_event_fills_inserted() RETURNS trigger LANGUAGE plpgsql {_0048._DEFINER} AS $$
DECLARE
    v_events integer;
    v_written integer;
    v_last jsonb;
    v_counts jsonb;
    v_aggregate text;
    v_seq bigint;
    v_id bigint;
BEGIN
    -- one statement; no join of the transition table but a cross join with one row (see 0048's _emit_statement)
    WITH e AS MATERIALIZED (
        SELECT 'fill:' || r.market || ':' || r.seq || ':' || r.match_no AS key, 'market:' || r.market AS aggregate,
               row_number() OVER () AS ord,
               jsonb_build_object(
                   'fill_id', r.id, 'market', r.market, 'seq', r.seq, 'match_no', r.match_no,
                   'maker_order_id', r.maker_order_id, 'taker_order_id', r.taker_order_id,
                   'maker_account', r.maker_account, 'taker_account', r.taker_account,
                   'taker_side', r.taker_side, 'price_ticks', r.price_ticks, 'qty_lots', r.qty_lots,
                   'base_amount', r.base_amount, 'quote_amount', r.quote_amount,
                   'maker_fee', r.maker_fee, 'taker_fee', r.taker_fee,
                   'journal_transaction_id', r.journal_transaction_id) AS payload
          FROM new_rows r
    ), counts AS (
        SELECT e.aggregate, count(*) AS n, min(e.ord) AS first FROM e GROUP BY e.aggregate
    ), numbered AS (  -- each aggregate's count at once, the row locks in the order of first appearance
        INSERT INTO outbox_aggregate AS a (aggregate, last_seq)
        SELECT c.aggregate, c.n FROM counts c ORDER BY c.first
        ON CONFLICT (aggregate) DO UPDATE SET last_seq = a.last_seq + EXCLUDED.last_seq
        RETURNING a.aggregate, a.last_seq
    ), seqs AS (
        SELECT jsonb_object_agg(n.aggregate, n.last_seq) AS m FROM numbered n
    ), written AS (  -- the k-th fill of an aggregate here gets last - count + k
        INSERT INTO outbox (topic, event_key, aggregate, aggregate_seq, version, payload)
        SELECT 'fill.executed', e.key, e.aggregate,
               (s.m ->> e.aggregate)::bigint - count(*) OVER whole + row_number() OVER upto, 1, e.payload
          FROM e CROSS JOIN seqs s
        WINDOW whole AS (PARTITION BY e.aggregate), upto AS (PARTITION BY e.aggregate ORDER BY e.ord)
         ORDER BY e.ord
        ON CONFLICT (event_key) DO NOTHING
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM e), (SELECT count(*) FROM written), (SELECT s.m FROM seqs s),
           (SELECT jsonb_object_agg(c.aggregate, c.n) FROM counts c)
      INTO v_events, v_written, v_last, v_counts;
    IF v_written < v_events THEN
        -- a key was written before (or meanwhile): number the events written here again, in order,
        -- from the first number this statement took, and give the unused numbers back (gapless).
        -- Under the aggregate's row lock, the rows numbered (last - count, last] are this statement's.
        FOR v_aggregate IN SELECT jsonb_object_keys(v_counts) LOOP
            v_seq := (v_last ->> v_aggregate)::bigint - (v_counts ->> v_aggregate)::bigint;
            FOR v_id IN
                SELECT o.id FROM outbox o
                 WHERE o.aggregate = v_aggregate AND o.aggregate_seq > v_seq
                   AND o.aggregate_seq <= (v_last ->> v_aggregate)::bigint
                 ORDER BY o.aggregate_seq LOOP
                v_seq := v_seq + 1;
                UPDATE outbox SET aggregate_seq = v_seq WHERE id = v_id;
            END LOOP;
            UPDATE outbox_aggregate SET last_seq = v_seq WHERE aggregate = v_aggregate;
        END LOOP;
    END IF;
    RETURN NULL;
END $$;
"""

ORDER_ID_FIXED = f"""
CREATE FUNCTION matching_refuse_order_id_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'matching: an order''s id never changes (% -> %)', OLD.id, NEW.id
        USING ERRCODE = 'restrict_violation';
END $$;
CREATE TRIGGER trade_order_id_fixed BEFORE UPDATE OF id ON trade_order
    FOR EACH ROW WHEN (OLD.id IS DISTINCT FROM NEW.id) EXECUTE FUNCTION matching_refuse_order_id_change();
"""

UPGRADE = HOLDS_AND_WITHDRAWALS + ORDER_ID_FIXED + ORDERS_INSERTED + ORDERS_UPDATED + FILLS_INSERTED + """
DROP TRIGGER trade_order_event ON trade_order;
CREATE TRIGGER trade_order_event_insert AFTER INSERT ON trade_order REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION custody_event_orders_inserted();
CREATE TRIGGER trade_order_event_update AFTER UPDATE ON trade_order
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION custody_event_orders_updated();

DROP TRIGGER fill_event ON fill;
CREATE TRIGGER fill_event_insert AFTER INSERT ON fill REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION custody_event_fills_inserted();
"""

# 0026's per-row triggers (their functions, made SECURITY DEFINER by 0032, were kept), 0048's bodies.
DOWNGRADE = HOLDS_AND_WITHDRAWALS_0048 + """
DROP TRIGGER trade_order_event_insert ON trade_order;
DROP TRIGGER trade_order_event_update ON trade_order;
CREATE TRIGGER trade_order_event AFTER INSERT OR UPDATE ON trade_order
    FOR EACH ROW EXECUTE FUNCTION custody_event_order_changed();
DROP TRIGGER fill_event_insert ON fill;
CREATE TRIGGER fill_event AFTER INSERT ON fill
    FOR EACH ROW EXECUTE FUNCTION custody_event_fill();
DROP TRIGGER trade_order_id_fixed ON trade_order;
DROP FUNCTION custody_event_orders_inserted(), custody_event_orders_updated(), custody_event_fills_inserted(),
              matching_refuse_order_id_change();
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute("CALL custody_apply_role_grants()")


def downgrade() -> None:
    op.execute(DOWNGRADE)
    op.execute("CALL custody_apply_role_grants()")
