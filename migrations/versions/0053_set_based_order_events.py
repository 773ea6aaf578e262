"""Events of orders and fills per statement instead of per row (issue 20).

Revision ID: 0053_set_based_order_events
Revises: 0052_trust_gaps

Why: a unit of work of the matching service (one group commit of order entry) writes its order rows
in one upsert and its fill rows in one INSERT (matching.store), but the per-row triggers of 0026/0032
(`trade_order_event`, `fill_event`) made one `custody_emit_row` call per changed order and per fill,
each a PL/pgSQL call of three statements (a key lookup, the aggregate's numbering upsert, the outbox
INSERT): a group of 12 orders made about 16 such calls.

What changes (the events written, their keys, payloads and per-aggregate numbering are unchanged;
only how many statements write them):
- `trade_order_event` (AFTER INSERT OR UPDATE, FOR EACH ROW) becomes `trade_order_event_insert` and
  `trade_order_event_update`: AFTER ... FOR EACH STATEMENT with transition tables, written as
  0048 writes the holds' events (`_emit_statement` of 0048: one numbering upsert and one outbox
  INSERT per statement, outbox ids in the order of the rows in the transition table, no statement
  joining a transition table). Topics as in 0026: `order.amended` when an update keeps the state
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
- The trigger functions are SECURITY DEFINER (owner, `search_path` pinned) as in 0032/0048, and
  `custody_apply_role_grants()` runs at the end: no process role may EXECUTE them (0049). The
  per-row functions of 0026/0032 stay (unused) for the downgrade.
"""
import importlib.util
from pathlib import Path

from alembic import op

revision = "0053_set_based_order_events"
down_revision = "0052_trust_gaps"
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

# v_old: order id -> [state, filled, price, qty] of the old row (jsonb compares numbers as numbers).
_ORDERS_UPDATED_EVENTS = (
    f"        SELECT CASE WHEN n.state IN {_OPEN} AND (v_old -> n.id -> 0) = to_jsonb(n.state)\n"
    f"                         AND (v_old -> n.id -> 1) = to_jsonb(n.filled) THEN 'order.amended'\n"
    f"                    WHEN n.state IN {_OPEN} THEN 'order.accepted'\n"
    f"                    ELSE 'order.' || n.state END AS topic,\n"
    f"               'order:' || n.id AS aggregate, n.ord,\n"
    f"               {_ORDER_PAYLOAD} AS payload\n{_NEW_ROWS}\n"
    f"         WHERE jsonb_build_array(n.state, n.filled, n.price, n.qty) IS DISTINCT FROM v_old -> n.id")

ORDERS_INSERTED = _0048._trigger_function("custody_event_orders_inserted",
                                          _0048._emit_statement(_ORDERS_INSERTED_EVENTS))
ORDERS_UPDATED = _0048._trigger_function("custody_event_orders_updated", _0048._emit_statement(
    _ORDERS_UPDATED_EVENTS,
    old="SELECT jsonb_object_agg(o.id, jsonb_build_array(o.state, o.filled, o.price, o.qty)) INTO v_old FROM old_rows o;"))

FILLS_INSERTED = f"""
CREATE FUNCTION custody_event_fills_inserted() RETURNS trigger LANGUAGE plpgsql {_0048._DEFINER} AS $$
DECLARE
    v_keys text[];
    v_aggregates text[];
    v_payloads jsonb[];
    v_last jsonb;
    v_written integer;
    v_aggregate text;
    v_count integer;
    v_seq bigint;
    v_id bigint;
BEGIN
    -- no statement joins the transition table (see 0048's _emit_statement)
    SELECT array_agg(n.key ORDER BY n.ord), array_agg(n.aggregate ORDER BY n.ord), array_agg(n.payload ORDER BY n.ord)
      INTO v_keys, v_aggregates, v_payloads
      FROM (SELECT 'fill:' || r.market || ':' || r.seq || ':' || r.match_no AS key, 'market:' || r.market AS aggregate,
                   row_number() OVER () AS ord,
                   jsonb_build_object(
                       'fill_id', r.id, 'market', r.market, 'seq', r.seq, 'match_no', r.match_no,
                       'maker_order_id', r.maker_order_id, 'taker_order_id', r.taker_order_id,
                       'maker_account', r.maker_account, 'taker_account', r.taker_account,
                       'taker_side', r.taker_side, 'price_ticks', r.price_ticks, 'qty_lots', r.qty_lots,
                       'base_amount', r.base_amount, 'quote_amount', r.quote_amount,
                       'maker_fee', r.maker_fee, 'taker_fee', r.taker_fee,
                       'journal_transaction_id', r.journal_transaction_id) AS payload
              FROM new_rows r) n;
    IF v_keys IS NULL THEN
        RETURN NULL;
    END IF;
    -- each aggregate's count at once, the row locks taken in the order of first appearance
    WITH numbered AS (
        INSERT INTO outbox_aggregate AS a (aggregate, last_seq)
        SELECT c.aggregate, c.n
          FROM (SELECT u.aggregate, count(*) AS n, min(u.i) AS first
                  FROM unnest(v_aggregates) WITH ORDINALITY AS u(aggregate, i) GROUP BY u.aggregate) c
         ORDER BY c.first
        ON CONFLICT (aggregate) DO UPDATE SET last_seq = a.last_seq + EXCLUDED.last_seq
        RETURNING a.aggregate, a.last_seq
    )
    SELECT jsonb_object_agg(n.aggregate, n.last_seq) INTO v_last FROM numbered n;
    WITH written AS (
        INSERT INTO outbox (topic, event_key, aggregate, aggregate_seq, version, payload)
        SELECT 'fill.executed', u.key, u.aggregate,
               (v_last ->> u.aggregate)::bigint - count(*) OVER whole + row_number() OVER upto, 1, u.payload
          FROM unnest(v_keys, v_aggregates, v_payloads) WITH ORDINALITY AS u(key, aggregate, payload, i)
        WINDOW whole AS (PARTITION BY u.aggregate), upto AS (PARTITION BY u.aggregate ORDER BY u.i)
         ORDER BY u.i
        ON CONFLICT (event_key) DO NOTHING
        RETURNING 1
    )
    SELECT count(*) INTO v_written FROM written;
    IF v_written < cardinality(v_keys) THEN
        -- a key was written before (or meanwhile): number the events written here again, in order,
        -- from the first number this statement took, and give the unused numbers back (gapless)
        FOR v_aggregate, v_count IN
            SELECT u.aggregate, count(*) FROM unnest(v_aggregates) WITH ORDINALITY AS u(aggregate, i)
             GROUP BY u.aggregate ORDER BY min(u.i) LOOP
            v_seq := (v_last ->> v_aggregate)::bigint - v_count;
            FOR v_id IN
                SELECT o.id FROM outbox o
                 WHERE o.aggregate = v_aggregate AND o.aggregate_seq > v_seq
                   AND o.aggregate_seq <= (v_last ->> v_aggregate)::bigint AND o.event_key = ANY (v_keys)
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

UPGRADE = ORDER_ID_FIXED + ORDERS_INSERTED + ORDERS_UPDATED + FILLS_INSERTED + """
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

# 0026's per-row triggers (their functions, made SECURITY DEFINER by 0032, were kept).
DOWNGRADE = """
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
