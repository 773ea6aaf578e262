"""Self-trade prevention: each policy, groups spanning accounts, and its interaction with FOK."""
from __future__ import annotations

from matching import ErrorCode, OrderState, OrderType, Side, StpPolicy, TimeInForce
from matching.events import Fill, OrderClosed, OrderRejected
from matching.stp import DEFAULT_POLICY
from matching.testing import Harness, lots, of_type, ticks

BUY, SELL = Side.buy, Side.sell


def setup(policy: StpPolicy | None = None) -> Harness:
    """Book: asks o1 (x, group g) 1 BTC @100, o2 (y) 1 BTC @100; x and z share group g."""
    h = Harness()
    for account in ("x", "y", "z"):
        h.fund(account)
    h.place("x", SELL, lots("1"), ticks(100), stp_group="g")
    h.place("y", SELL, lots("1"), ticks(100))
    return h


def buy_from_z(h: Harness, qty: str, policy: StpPolicy | None, **kw) -> list:
    return h.place("z", BUY, lots(qty), ticks(100), stp_group="g", stp_policy=policy, **kw)


def test_default_policy_is_cancel_newest():
    assert DEFAULT_POLICY is StpPolicy.cancel_newest


def test_cancel_newest_rejects_the_incoming_order_and_keeps_the_resting_one():
    h = setup()
    events = buy_from_z(h, "1.5", None)
    assert of_type(events, Fill) == []
    assert [(r.order_id, r.code) for r in of_type(events, OrderRejected)] == [
        ("o3", ErrorCode.self_trade_prevented)]
    assert h.engine.order("o1").state is OrderState.working
    assert h.money.open_holds().keys() == {"o1", "o2"}


def test_cancel_newest_after_some_fills_cancels_the_remainder():
    h = Harness()
    for account in ("x", "y", "z"):
        h.fund(account)
    h.place("y", SELL, lots("1"), ticks(99))
    h.place("x", SELL, lots("1"), ticks(100), stp_group="g")
    events = buy_from_z(h, "2", StpPolicy.cancel_newest)
    assert [f.qty_lots for f in of_type(events, Fill)] == [lots("1")]
    closes = {e.order_id: (e.state, e.reason) for e in of_type(events, OrderClosed)}
    assert closes["o3"] == (OrderState.cancelled, "self_trade_prevented")


def test_cancel_oldest_cancels_the_resting_order_and_keeps_matching():
    h = setup()
    events = buy_from_z(h, "1", StpPolicy.cancel_oldest)
    closes = {e.order_id: (e.state, e.reason) for e in of_type(events, OrderClosed)}
    assert closes["o1"] == (OrderState.cancelled, "self_trade_prevented")
    assert [(f.maker_order_id, f.qty_lots) for f in of_type(events, Fill)] == [("o2", lots("1"))]
    assert closes["o3"] == (OrderState.filled, "filled")


def test_decrement_both_reduces_both_without_a_trade():
    h = setup()
    events = buy_from_z(h, "1.5", StpPolicy.decrement_both)
    # o1 (1 BTC) and z lose 1 BTC each; z then buys 0.5 from o2
    assert [(f.maker_order_id, f.qty_lots) for f in of_type(events, Fill)] == [("o2", lots("0.5"))]
    o1, o3 = h.engine.order("o1"), h.engine.order("o3")
    assert (o1.state, o1.decremented, o1.filled) == (OrderState.cancelled, lots("1"), 0)
    assert (o3.state, o3.decremented, o3.filled) == (OrderState.filled, lots("1"), lots("0.5"))
    assert h.money.released["o1"] == h.money.placed["o1"]


def test_decrement_both_smaller_incoming_leaves_the_resting_order_smaller():
    h = setup()
    events = buy_from_z(h, "0.4", StpPolicy.decrement_both)
    assert of_type(events, Fill) == []
    assert h.engine.order("o1").remaining == lots("0.6")
    assert of_type(events, OrderRejected)[0].code is ErrorCode.self_trade_prevented
    assert h.engine.book.asks.depth() == [(ticks(100), lots("1.6"))]


def test_market_bid_with_decrement_both_falls_back_to_cancel_newest():
    h = setup()
    events = h.place("z", BUY, order_type=OrderType.market, budget=10**9, stp_group="g",
                     stp_policy=StpPolicy.decrement_both)
    assert of_type(events, Fill) == []
    assert h.engine.order("o1").remaining == lots("1")


def test_fok_counts_only_liquidity_it_may_trade_with():
    # 2 BTC rest, 1 of them in z's own group: a 2 BTC FOK cannot complete, and nothing happens,
    # not even the STP cancellation cancel_oldest would have made
    h = setup()
    events = buy_from_z(h, "2", StpPolicy.cancel_oldest, tif=TimeInForce.fok)
    assert of_type(events, Fill) == []
    closes = {e.order_id: (e.state, e.reason) for e in of_type(events, OrderClosed)}
    assert closes == {"o3": (OrderState.expired, "fok_unfillable")}
    assert h.engine.order("o1").state is OrderState.working
    # 1 BTC FOK: completes against y, having cancelled x's resting order on the way
    events = buy_from_z(h, "1", StpPolicy.cancel_oldest, tif=TimeInForce.fok)
    assert [(f.maker_order_id, f.qty_lots) for f in of_type(events, Fill)] == [("o2", lots("1"))]
    assert h.engine.order("o1").state is OrderState.cancelled


def test_accounts_without_a_group_never_trade_with_themselves_only():
    h = Harness()
    h.fund("x")
    h.fund("y")
    h.place("x", SELL, lots("1"), ticks(100))
    assert of_type(h.place("x", BUY, lots("1"), ticks(100)), Fill) == []
    assert len(of_type(h.place("y", BUY, lots("1"), ticks(100)), Fill)) == 1


def test_an_account_never_trades_with_itself_whatever_groups_its_orders_carry():
    # issue 11: a caller-chosen group on each side used to let the engine match an account with
    # itself; the ledger then refused the fill. A group only widens prevention.
    for maker_group, taker_group in (("g1", "g2"), ("g1", None), (None, "g2")):
        h = Harness()
        h.fund("x")
        h.place("x", SELL, lots("1"), ticks(100), stp_group=maker_group)
        events = h.place("x", BUY, lots("1"), ticks(100), stp_group=taker_group)
        assert of_type(events, Fill) == [], (maker_group, taker_group)
        assert [r.code for r in of_type(events, OrderRejected)] == [ErrorCode.self_trade_prevented]
        assert h.engine.order("o1").state is OrderState.working


def test_each_policy_applies_to_an_account_meeting_itself_under_another_group():
    h = Harness()
    for account in ("x", "y"):
        h.fund(account)
    h.place("x", SELL, lots("1"), ticks(100), stp_group="g1")
    h.place("y", SELL, lots("1"), ticks(100))
    events = h.place("x", BUY, lots("1"), ticks(100), stp_group="g2",
                     stp_policy=StpPolicy.cancel_oldest)
    assert [(f.maker_account, f.taker_account) for f in of_type(events, Fill)] == [("y", "x")]
    assert h.engine.order("o1").state is OrderState.cancelled

    h = Harness()
    h.fund("x")
    h.place("x", SELL, lots("1"), ticks(100), stp_group="g1")
    events = h.place("x", BUY, lots("0.4"), ticks(100), stp_group="g2",
                     stp_policy=StpPolicy.decrement_both)
    assert of_type(events, Fill) == []
    assert h.engine.order("o1").remaining == lots("0.6")


def test_random_streams_with_caller_chosen_groups_never_fill_an_account_against_itself():
    # The money model refuses a self-trade as the ledger does; any group, any policy, any side.
    import random

    rng = random.Random(11)
    h = Harness()
    for account in ("x", "y", "z"):
        h.fund(account)
    for _ in range(600):
        events = h.place(rng.choice("xyz"), rng.choice([BUY, SELL]), lots("0.1") * rng.randint(1, 5),
                         ticks(rng.randint(98, 102)), stp_group=rng.choice([None, "g1", "g2", "x"]),
                         stp_policy=rng.choice([None, *StpPolicy]))
        assert all(f.maker_account != f.taker_account for f in of_type(events, Fill))
