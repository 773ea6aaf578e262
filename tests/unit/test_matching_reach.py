"""What the gateway asks the engine before an order that may trade is sequenced: the resting orders
it could meet (`Engine.makers_in_reach`), `Evict` for one whose owner a fill could not pay, and
text fields PostgreSQL could not store (`validation.unstorable_field`)."""
from __future__ import annotations

from matching import Cancel, Evict, OrderState, OrderType, Place, Side
from matching.errors import ErrorCode
from matching.events import OrderClosed, RequestRejected
from matching.snapshot import replay, state_hash, take
from matching.testing import Harness, lots, of_type, ticks
from matching.validation import check_shape, unstorable_field

BUY, SELL = Side.buy, Side.sell


def book() -> Harness:
    """Asks: o1 (x) 1 @100, o2 (y) 1 @100, o3 (y) 1 @101, o4 (x) 1 @103."""
    h = Harness()
    for account in ("x", "y", "z"):
        h.fund(account)
    h.place("x", SELL, lots("1"), ticks(100))
    h.place("y", SELL, lots("1"), ticks(100))
    h.place("y", SELL, lots("1"), ticks(101))
    h.place("x", SELL, lots("1"), ticks(103))
    return h


def reach(h: Harness, price, qty, budget=None, account="z", group="z") -> list[str]:
    return [o.order_id for o in h.engine.makers_in_reach(BUY, price, qty, budget, account, group)]


def test_reach_is_the_crossing_levels_until_the_quantity_is_covered():
    h = book()
    assert reach(h, ticks(99), lots("1")) == []                        # does not cross
    assert reach(h, ticks(100), lots("0.5")) == ["o1", "o2"]            # a whole level
    assert reach(h, ticks(101), lots("2")) == ["o1", "o2"]              # covered at 100
    assert reach(h, ticks(101), lots("2.5")) == ["o1", "o2", "o3"]
    assert reach(h, None, lots("9")) == ["o1", "o2", "o3", "o4"]        # market: every level
    assert reach(h, None, None, budget=1) == ["o1", "o2"]               # a market bid's budget


def test_orders_it_may_not_trade_with_do_not_count_towards_the_quantity():
    h = book()
    assert reach(h, ticks(101), lots("1"), account="x", group="x") == ["o1", "o2"]
    assert reach(h, ticks(101), lots("1.5"), account="x", group="x") == ["o1", "o2", "o3"]
    assert reach(h, ticks(101), lots("1.5"), account="z", group="y") == ["o1", "o2", "o3"]
    assert h.engine.book.asks.depth() == [(ticks(100), lots("2")), (ticks(101), lots("1")),
                                          (ticks(103), lots("1"))]  # read-only


def test_evict_cancels_an_open_order_and_replays():
    h = book()
    h.place("z", BUY, order_type=OrderType.stop, budget=10**9, stop_price=ticks(105))
    snap = take(h.engine)
    events = h.submit(Evict("o2"))
    assert [(e.order_id, e.state, e.reason) for e in of_type(events, OrderClosed)] == [
        ("o2", OrderState.cancelled, "account_closed")]
    assert h.money.released["o2"] == h.money.placed["o2"]
    events = h.submit(Evict("o5"))  # an untriggered stop
    assert of_type(events, OrderClosed)[0].reason == "account_closed"
    events = h.submit(Evict("o2"))
    assert [e.code for e in of_type(events, RequestRejected)] == [ErrorCode.order_not_open]
    assert state_hash(replay(snap, h.journal.entries)) == state_hash(h.engine)


def test_text_postgresql_cannot_store_is_found():
    good = Place("o1", "acct", "c1", BUY, qty=1, price=1, stp_group="g")
    check_shape(good)
    assert unstorable_field(good) is None
    assert unstorable_field(Place("o1", "acct", "c1", BUY, qty=1, price=1, stp_group="é€")) is None
    assert unstorable_field(Place("o1", "acct", "c\x001", BUY, qty=1, price=1)) == "client_order_id"
    assert unstorable_field(Place("o1", "acct", "c1", BUY, qty=1, price=1, stp_group="\ud800")) == "stp_group"
    assert unstorable_field(Cancel("o\x00", "acct")) == "order_id"
