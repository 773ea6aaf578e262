"""The statement-level event triggers of migration 0045 write the same events as the per-row
triggers they replaced (0026/0032): same topics, keys, aggregates, per-aggregate sequence numbers,
payloads, and the same order of outbox ids, up to the ids the sequences hand out.

One database transaction, rolled back at the end: first the migration's downgrade SQL puts the
per-row triggers back (inside a savepoint), a scenario runs and its outbox rows are read; the
savepoint is rolled back (the statement triggers are in place again, the scenario undone) and the
same scenario runs again with the same keys. The scenario covers what the payout job and the API
do to holds and withdrawals: single and multi-row INSERTs and UPDATEs in one statement, UPDATEs
that change nothing an event reports, an UPDATE that changes the state of some rows only, a
`custody_emit` on the same aggregate after a trigger's event, hold place / capture / release, a
batch of hold commands in one `ledger_apply` statement, and postings (the deferred event,
fired by SET CONSTRAINTS ... IMMEDIATE before the outbox is read).

Orders and fills (migration 0053): the matching service opens its own connections, so that scenario
runs twice on two copies of one fresh database, the first with 0026's per-row triggers put back
(0053's downgrade SQL), through `Trading.submit_batch`, and the outbox rows of each step are
compared: equal, except the one documented move (in one upsert the events of updated orders now
come before those of inserted ones).
"""
from __future__ import annotations

import importlib.util
import json
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, make_url, text

from custody.database import drop_database, ensure_database, make_engine, migrate, with_database
from ledger.model import AccountKind, PlaceHold, ReleaseHold, Transfer
from ledger.service import Ledger
from matching.fees import FeeSchedule, FeeTier
from matching.model import Amend, Cancel, Market, OrderType, Place, Side, TimeInForce
from matching.service import Trading, order_id_for
from matching.settlement import customer_account_name

_MIGRATION = Path(__file__).resolve().parents[2] / "migrations/versions/0048_set_based_triggers.py"
_spec = importlib.util.spec_from_file_location("set_based_events_0045", _MIGRATION)
_migration = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_migration)

_DEFERRED = "journal_transaction_balanced, journal_transaction_event"


def _scenario(c, ledger, run: str, alice: int, bob: int, pool: int) -> list[tuple]:
    """Run the scenario on `c` (inside its transaction); return its outbox rows in id order."""
    start = c.execute(text("SELECT coalesce(max(id), 0) FROM outbox")).scalar_one()
    k = f"diff:{run}"
    h1 = ledger.place_hold(f"{k}:h1", alice, 5_000, owner="diff", reference="r1", conn=c).id
    h2 = ledger.place_hold(f"{k}:h2", alice, 3_000, owner="diff", reference="r2", conn=c).id
    ledger.capture_hold(f"{k}:cap1", h1, [Transfer(alice, pool, 1_000)], owner="diff", conn=c)
    ledger.post(f"{k}:p1", [Transfer(alice, bob, 10), Transfer(bob, alice, 5), Transfer(pool, bob, 7)], conn=c)
    ledger.release_hold(h2, owner="diff", conn=c)
    results = ledger.apply([PlaceHold(f"{k}:h3", alice, 100, "diff", "r3"), PlaceHold(f"{k}:h4", bob, 1, "diff", "r4"),
                            ReleaseHold(h1, "diff")], conn=c)
    assert all(r.ok for r in results), results
    held = [r.id for r in results[:2]]
    # several holds changed by one statement; one of them in a way no event reports
    c.execute(text("UPDATE hold SET expires_at = now() + interval '1 hour' WHERE id = ANY(:h)"), {"h": held})
    c.execute(text("UPDATE hold SET released = CASE WHEN id = :a THEN amount ELSE 0 END, "
                   "state = CASE WHEN id = :a THEN 'released' ELSE state END, "
                   "resolved_at = CASE WHEN id = :a THEN now() END WHERE id = ANY(:h)"), {"h": held, "a": held[0]})
    wids = c.execute(text(
        "INSERT INTO withdrawal_request (client_withdrawal_id, account_id, asset, chain, amount, fee_quoted, destination, "
        "priority, requested_by, content_hash, state, hold_id) "
        "SELECT :k || '-w' || g, :a, 'BTC', 'bitcoin', 1000 * g, 50, 'bcrt1qdest' || g, 'normal', 'diff', 'h', "
        "'pending_approval', :h FROM generate_series(1, 3) g ORDER BY g RETURNING id"),
        {"k": k, "a": alice, "h": h1}).scalars().all()
    for wid in wids:  # as custody.controls.emit does after the request's INSERT
        c.execute(text("SELECT custody_emit('withdrawal.requested', NULL, 'withdrawal:' || CAST(:w AS text), 1, "
                       "CAST(:p AS jsonb))"), {"w": wid, "p": json.dumps({"withdrawal_id": wid})})
    one = c.execute(text(
        "INSERT INTO withdrawal_request (client_withdrawal_id, account_id, asset, chain, amount, fee_quoted, destination, "
        "priority, requested_by, content_hash, state) VALUES (:k || '-w9', :a, 'BTC', 'bitcoin', 9, 0, 'd', 'fast', "
        "'diff', 'h', 'approved') RETURNING id"), {"k": k, "a": bob}).scalar_one()
    c.execute(text("UPDATE withdrawal_request SET state = 'approved', updated_at = now() WHERE id = ANY(:w)"), {"w": wids})
    c.execute(text("UPDATE withdrawal_request SET updated_at = now() WHERE id = ANY(:w)"), {"w": wids})  # no event
    c.execute(text("UPDATE withdrawal_request SET state = 'approved' WHERE id = :o"), {"o": one})  # same state: none
    c.execute(text("UPDATE withdrawal_request SET state = CASE WHEN id = :w THEN 'rejected' ELSE state END "
                   "WHERE id = ANY(:all)"), {"w": wids[1], "all": wids + [one]})
    c.execute(text("UPDATE withdrawal_request SET state = 'signed' WHERE id = :o"), {"o": one})
    many = c.execute(text(  # a statement of many rows after ones of few (the trigger's plans are cached)
        "INSERT INTO withdrawal_request (client_withdrawal_id, account_id, asset, chain, amount, fee_quoted, destination, "
        "priority, requested_by, content_hash, state) SELECT :k || '-m' || g, :a, 'BTC', 'bitcoin', g, 0, 'd', 'normal', "
        "'diff', 'h', 'approved' FROM generate_series(1, 200) g ORDER BY g RETURNING id"), {"k": k, "a": bob}).scalars().all()
    c.execute(text("UPDATE withdrawal_request SET state = CASE WHEN id % 3 = 0 THEN 'approved' ELSE 'batched' END "
                   "WHERE id = ANY(:m)"), {"m": many})
    ledger.post(f"{k}:p2", [Transfer(bob, alice, 3)], conn=c)
    c.execute(text(f"SET CONSTRAINTS {_DEFERRED} IMMEDIATE"))  # the postings' events and checks, now
    rows = c.execute(text("SELECT topic, event_key, aggregate, aggregate_seq, version, payload FROM outbox "
                          "WHERE id > :s ORDER BY id"), {"s": start}).all()
    c.execute(text(f"SET CONSTRAINTS {_DEFERRED} DEFERRED"))
    return [tuple(r) for r in rows]


class _Ids:
    """Renames the ids the sequences handed out, per kind, in order of first appearance."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, Any], int] = {}

    def __call__(self, kind: str, value: Any) -> Any:
        if value is None:
            return None
        return f"{kind}#{self.seen.setdefault((kind, str(value)), len(self.seen))}"

    def text(self, s: str) -> str:
        for prefix, kind in (("ledger.transaction_posted:", "transaction"), ("journal_transaction:", "transaction"),
                             ("hold:", "hold"), ("withdrawal:", "withdrawal")):
            if s.startswith(prefix):
                ident, _, seq = s[len(prefix):].partition("#")
                return prefix + self(kind, ident) + (f"#{seq}" if seq else "")
        return s

    def payload(self, p: dict) -> dict:
        out = dict(p)
        for field, kind in (("hold_id", "hold"), ("withdrawal_id", "withdrawal"), ("transaction_id", "transaction"),
                            ("batch_id", "batch")):
            if field in out:
                out[field] = self(kind, out[field])
        if "legs" in out:
            out["legs"] = [{**leg, "entry_id": self("entry", leg["entry_id"]), "hold_id": self("hold", leg["hold_id"])}
                           for leg in out["legs"]]
        return out


def _normalized(rows: list[tuple]) -> list[tuple]:
    ids = _Ids()
    return [(topic, ids.text(key), ids.text(aggregate), seq, version, ids.payload(payload))
            for topic, key, aggregate, seq, version, payload in rows]


def test_statement_triggers_write_the_events_the_row_triggers_wrote(engine, ledger):
    run = uuid.uuid4().hex[:8]
    ledger.create_asset("BTC", 8)
    world = ledger.open_account("BTC", AccountKind.equity, f"diff:{run}:world").id
    pool = ledger.open_account("BTC", AccountKind.customer, f"diff:{run}:carol").id
    alice = ledger.open_account("BTC", AccountKind.customer, f"diff:{run}:alice").id
    bob = ledger.open_account("BTC", AccountKind.customer, f"diff:{run}:bob").id
    ledger.transfer(f"diff:{run}:fund-a", world, alice, 100_000)
    ledger.transfer(f"diff:{run}:fund-b", world, bob, 100_000)
    with engine.connect() as c:
        tx = c.begin()
        try:
            c.execute(text("SAVEPOINT row_triggers"))
            c.exec_driver_sql(_migration.DOWNGRADE)  # 0032's per-row triggers and posting event
            triggers = set(c.execute(text("SELECT tgname FROM pg_trigger WHERE tgrelid IN ('hold'::regclass, "
                                          "'withdrawal_request'::regclass) AND NOT tgisinternal")).scalars())
            assert {"hold_event", "withdrawal_request_event"} <= triggers
            before = _scenario(c, ledger, run, alice, bob, pool)
            c.execute(text("ROLLBACK TO SAVEPOINT row_triggers"))
            triggers = set(c.execute(text("SELECT tgname FROM pg_trigger WHERE tgrelid IN ('hold'::regclass, "
                                          "'withdrawal_request'::regclass) AND NOT tgisinternal")).scalars())
            assert {"hold_event_insert", "hold_event_update", "withdrawal_request_event_insert",
                    "withdrawal_request_event_update"} <= triggers and "hold_event" not in triggers
            after = _scenario(c, ledger, run, alice, bob, pool)
        finally:
            tx.rollback()
    topics = [r[0] for r in before]
    assert topics.count("ledger.transaction_posted") == 3 and topics.count("withdrawal.state_changed") >= 9 + 200 + 120
    assert topics.count("ledger.hold_changed") == 8 and topics.count("withdrawal.requested") == 3
    assert _normalized(after) == _normalized(before)


# ---- orders and fills (migration 0053) -----------------------------------------------------------

_MIGRATION_0053 = Path(__file__).resolve().parents[2] / "migrations/versions/0053_set_based_order_events.py"
_spec_0053 = importlib.util.spec_from_file_location("set_based_order_events_0053", _MIGRATION_0053)
_migration_0053 = importlib.util.module_from_spec(_spec_0053)
_spec_0053.loader.exec_module(_migration_0053)

_SYMBOL = "BTC-USDT"


def _clone(url: str, template: str) -> None:
    """`url`'s database as a copy of `template`'s (which nobody may be connected to)."""
    admin = create_engine(with_database(url, "postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{make_url(url).database}" TEMPLATE "{make_url(template).database}"'))
    finally:
        admin.dispose()


def _trading_scenario(db) -> list[list[tuple]]:
    """Order entry through `Trading.submit_batch` on `db`: group commits whose one upsert inserts and
    updates orders at once, several fills in one statement (one of them under a key written before),
    amends, a rejection before sequencing, a stop that fires, IOC and market orders, requests that
    write nothing, and direct UPDATEs of order rows (one that changes nothing an event reports).
    Returns the outbox rows of each step, in id order, without their ids and time stamps."""
    ledger = Ledger(db)
    ledger.create_asset("BTC", 8)
    ledger.create_asset("USDT", 6)
    world = {a: ledger.open_account(a, AccountKind.equity, f"world:{a}").id for a in ("BTC", "USDT")}
    for owner in ("a", "b", "c", "d", "e"):
        for asset in ("BTC", "USDT"):
            account = ledger.open_account(asset, AccountKind.customer, customer_account_name(owner, asset), owner=owner)
            ledger.transfer(f"fund:{owner}:{asset}", world[asset], account.id, 10**12)
    trading = Trading(db, ledger)
    trading.create_market(Market(_SYMBOL, "BTC", "USDT", lot_size=10_000, quote_per_tick_lot=1),
                          FeeSchedule({"default": FeeTier(1_000, 2_000)}))

    def place(owner: str, cid: str, side: Side, **fields) -> Place:
        return Place(order_id_for(_SYMBOL, owner, cid), owner, cid, side, **fields)

    steps: list[list[tuple]] = []

    def step(run) -> None:
        with db.connect() as c:
            start = c.execute(text("SELECT coalesce(max(id), 0) FROM outbox")).scalar_one()
        run()
        with db.connect() as c:
            rows = c.execute(text("SELECT topic, event_key, aggregate, aggregate_seq, version, payload FROM outbox "
                                  "WHERE id > :s ORDER BY id"), {"s": start}).all()
        steps.append([(t, k, a, s, v, {f: x for f, x in p.items() if f != "posted_at"}) for t, k, a, s, v, p in rows])

    def batch(*commands) -> None:
        step(lambda: trading.submit_batch(_SYMBOL, list(commands)))

    sell, buy = Side.sell, Side.buy
    batch(place("a", "a1", sell, qty=1, price=100), place("b", "b1", sell, qty=2, price=101),
          place("c", "c1", sell, qty=1, price=102),
          place("e", "e1", sell, order_type=OrderType.stop_limit, qty=1, price=95, stop_price=99))
    taker_seq = trading.engine(_SYMBOL).last_seq + 1
    with db.begin() as c:  # the key of the taker's second fill, written before it (by hand, as the owner)
        c.execute(text("SELECT custody_emit('fill.executed', :k, 'squatter', 1, '{}'::jsonb)"),
                  {"k": f"fill:{_SYMBOL}:{taker_seq}:2"})
    batch(place("d", "d1", buy, qty=5, price=102),  # three fills in one statement; rests 1
          place("a", "a2", sell, qty=1, price=103),
          place("poor", "p1", buy, qty=10**6, price=100),  # no funds: rejected before sequencing
          place("c", "c2", buy, qty=1, price=99), place("c", "c3", sell, qty=5, price=200))
    batch(Amend(order_id_for(_SYMBOL, "d", "d1"), "d", price=101),
          Amend(order_id_for(_SYMBOL, "a", "a2"), "a", qty=2),
          Cancel("no-such-order", "a"),
          place("a", "a2", sell, qty=1, price=103))  # a retry of a known client order id: nothing new
    batch(place("b", "b2", sell, qty=3, price=99, tif=TimeInForce.ioc))  # fills d1 and c2; e1's stop fires
    batch(place("d", "d2", buy, order_type=OrderType.market, budget=400),
          Cancel(order_id_for(_SYMBOL, "c", "c3"), "c"))

    def by_hand() -> None:
        with db.begin() as c:
            c.execute(text("UPDATE trade_order SET last_seq = last_seq WHERE market = :m"), {"m": _SYMBOL})  # no event
            c.execute(text("UPDATE trade_order SET price = price + 1 WHERE market = :m AND account IN ('c', 'd')"),
                      {"m": _SYMBOL})  # the market bid has no price: no event

    step(by_hand)
    ledger.assert_verified()
    return steps


def _updates_first(rows: list[tuple]) -> list[tuple]:
    """The row triggers' events of one step in the order the statement triggers write them: in each
    run of order events (one statement's: a step upserts once), the events of updated orders
    (aggregate_seq > 1) before those of inserted ones (the first event of their order)."""
    out: list[tuple] = []
    run: list[tuple] = []
    for row in rows + [("end",)]:
        if row[0].startswith("order."):
            run.append(row)
            continue
        out += [r for r in run if r[3] > 1] + [r for r in run if r[3] == 1]
        run = []
        if row[0] != "end":
            out.append(row)
    return out


def test_order_and_fill_statement_triggers_write_the_events_the_row_triggers_wrote(database_url):
    statements_url = with_database(database_url, f"events_orders_{uuid.uuid4().hex[:10]}")
    rows_url = with_database(database_url, f"events_orders_{uuid.uuid4().hex[:10]}")
    ensure_database(statements_url)
    try:
        migrate(statements_url)
        _clone(rows_url, statements_url)  # the same database twice, then one with 0026's row triggers
        results = {}
        for url, setup in ((rows_url, _migration_0053.DOWNGRADE), (statements_url, None)):
            db = make_engine(url, pool_size=2)
            try:
                if setup:
                    with db.begin() as c:
                        c.exec_driver_sql(setup)
                with db.connect() as c:
                    triggers = set(c.execute(text("SELECT tgname FROM pg_trigger WHERE tgrelid IN "
                                                  "('trade_order'::regclass, 'fill'::regclass) AND NOT tgisinternal")).scalars())
                assert ({"trade_order_event", "fill_event"} <= triggers) == bool(setup)
                assert ({"trade_order_event_insert", "trade_order_event_update", "fill_event_insert"} <= triggers) != bool(setup)
                results[url] = _trading_scenario(db)
            finally:
                db.dispose()
    finally:
        drop_database(rows_url)
        drop_database(statements_url)
    before, after = results[rows_url], results[statements_url]
    flat = [r for rows in before for r in rows]
    topics = [r[0] for r in flat]
    # the scenario covers what it says
    assert {"order.accepted", "order.amended", "order.rejected", "order.partially_filled", "order.filled",
            "order.cancelled", "order.expired"} <= set(topics), topics
    fills = [r for r in before[1] if r[0] == "fill.executed"]
    assert [r[1].rsplit(":", 1)[1] for r in fills] == ["1", "3"] and [r[3] for r in fills] == [1, 2]  # key 2 taken
    # the last step's second UPDATE (c1, c2, c3, d1; the market bid has no price), its first none
    assert sorted(r[0] for r in before[5]) == ["order.cancelled"] + ["order.filled"] * 3
    assert before[1] != _updates_first(before[1])  # the upsert inserted and updated orders: order moved
    assert [_updates_first(rows) for rows in before] == after
