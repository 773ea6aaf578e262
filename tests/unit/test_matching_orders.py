"""Order types, priority and order lifecycle commands of the pure matching engine."""
from __future__ import annotations

from matching import Amend, Cancel, ErrorCode, OrderState, OrderType, Side, TimeInForce
from matching.events import (Fill, OrderAccepted, OrderAmended, OrderClosed, OrderExists,
                             OrderRejected, RequestRejected, Triggered)
from matching.testing import USDT, Harness, lots, of_type, ticks

BUY, SELL = Side.buy, Side.sell


def harness(*accounts: str) -> Harness:
    h = Harness()
    for account in accounts:
        h.fund(account)
    return h


def fills(events):
    return [(f.maker_order_id, f.taker_order_id, f.price_ticks, f.qty_lots)
            for f in of_type(events, Fill)]


def closed(events):
    return {e.order_id: (e.state, e.reason) for e in of_type(events, OrderClosed)}


def state(h: Harness, order_id: str) -> OrderState:
    return h.engine.order(order_id).state


def test_limit_gtc_rests_then_matches_at_maker_price_in_time_priority():
    h = harness("a", "b", "c")
    h.place("a", SELL, lots("1"), ticks(60_100))                      # o1
    h.place("b", SELL, lots("1"), ticks(60_000))                      # o2, better price
    h.place("c", SELL, lots("1"), ticks(60_000))                      # o3, same price, later
    assert state(h, "o1") is OrderState.working
    events = h.place("a", BUY, lots("1.5"), ticks(60_200))            # o4 sweeps
    assert fills(events) == [("o2", "o4", ticks(60_000), lots("1")),
                             ("o3", "o4", ticks(60_000), lots("0.5"))]
    assert state(h, "o4") is OrderState.filled
    assert state(h, "o3") is OrderState.partially_filled
    assert h.engine.book.asks.depth() == [(ticks(60_000), lots("0.5")), (ticks(60_100), lots("1"))]


def test_limit_remainder_rests_and_book_is_never_crossed():
    h = harness("a", "b")
    h.place("a", SELL, lots("1"), ticks(100))
    h.place("b", BUY, lots("3"), ticks(101))
    assert state(h, "o2") is OrderState.partially_filled
    assert h.engine.book.bids.depth() == [(ticks(101), lots("2"))]
    assert h.engine.book.asks.depth() == []
    assert not h.engine.book.is_crossed()


def test_market_bid_spends_at_most_its_budget_fees_included():
    h = harness("a", "b")
    h.place("a", SELL, lots("1"), ticks(100))   # 1 BTC at 100 USDT
    h.place("a", SELL, lots("1"), ticks(200))
    budget = 150 * USDT
    events = h.place("b", BUY, order_type=OrderType.market, budget=budget)
    fs = of_type(events, Fill)
    assert [f.price_ticks for f in fs] == [ticks(100), ticks(200)]
    spent = sum(f.buyer_pays for f in fs)
    assert spent <= budget
    # one more lot at 200 USDT/BTC (0.02 USDT + fee) would not have fitted
    assert budget - spent < ticks(200) * 1 + 1 + 1
    close = of_type(events, OrderClosed)[-1]
    assert (close.order_id, close.state, close.reason) == ("o3", OrderState.filled,
                                                           "budget_exhausted")
    assert close.hold_captured == spent
    assert h.money.released["o3"] == budget - spent


def test_market_bid_against_empty_book_expires_and_releases_everything():
    h = harness("b")
    events = h.place("b", BUY, order_type=OrderType.market, budget=10 * USDT)
    assert closed(events) == {"o1": (OrderState.expired, "ioc_remainder")}
    assert h.money.released["o1"] == 10 * USDT


def test_market_ask_sells_its_quantity_and_expires_the_rest():
    h = harness("a", "b")
    h.place("a", BUY, lots("0.3"), ticks(100))
    events = h.place("b", SELL, lots("0.5"), order_type=OrderType.market)
    assert fills(events) == [("o1", "o2", ticks(100), lots("0.3"))]
    assert closed(events)["o2"] == (OrderState.expired, "ioc_remainder")
    assert h.money.released["o2"] == lots("0.2") * 10_000


def test_ioc_takes_what_it_can_and_never_rests():
    h = harness("a", "b")
    h.place("a", SELL, lots("1"), ticks(100))
    events = h.place("b", BUY, lots("2"), ticks(100), tif=TimeInForce.ioc)
    assert fills(events) == [("o1", "o2", ticks(100), lots("1"))]
    assert closed(events)["o2"] == (OrderState.expired, "ioc_remainder")
    assert h.engine.book.bids.depth() == []


def test_fok_five_against_four_point_nine_cancels_whole_and_posts_nothing():
    h = harness("a", "b")
    h.place("a", SELL, lots("2.9"), ticks(60_000))
    h.place("a", SELL, lots("2"), ticks(60_100))
    book_before = h.engine.book.asks.depth()
    events = h.place("b", BUY, lots("5"), ticks(61_000), tif=TimeInForce.fok)
    assert of_type(events, Fill) == []
    assert closed(events) == {"o3": (OrderState.expired, "fok_unfillable")}
    assert h.engine.book.asks.depth() == book_before
    assert h.money.released["o3"] == h.money.placed["o3"]


def test_fok_fills_whole_when_liquidity_suffices():
    h = harness("a", "b")
    h.place("a", SELL, lots("2.9"), ticks(60_000))
    h.place("a", SELL, lots("2.1"), ticks(60_100))
    events = h.place("b", BUY, lots("5"), ticks(61_000), tif=TimeInForce.fok)
    assert sum(f.qty_lots for f in of_type(events, Fill)) == lots("5")
    assert state(h, "o3") is OrderState.filled


def test_post_only_that_would_cross_is_rejected_and_one_that_does_not_rests():
    h = harness("a", "b")
    h.place("a", SELL, lots("1"), ticks(62_500))
    events = h.place("b", BUY, lots("1"), ticks(62_500), post_only=True)
    rejected = of_type(events, OrderRejected)
    assert [(r.order_id, r.code) for r in rejected] == [("o2", ErrorCode.post_only_would_cross)]
    assert of_type(events, Fill) == []
    h.place("b", BUY, lots("1"), ticks(62_499), post_only=True)
    assert state(h, "o3") is OrderState.working


def test_iceberg_shows_display_qty_and_each_refill_loses_time_priority():
    h = harness("a", "b", "c")
    h.place("a", SELL, lots("3"), ticks(100), display_qty=lots("1"))   # o1 iceberg
    h.place("b", SELL, lots("1"), ticks(100))                          # o2 behind it
    assert h.engine.book.asks.depth() == [(ticks(100), lots("2"))]     # 1 shown + 1
    events = h.place("c", BUY, lots("1"), ticks(100))                  # takes o1's slice
    assert fills(events) == [("o1", "o3", ticks(100), lots("1"))]
    events = h.place("c", BUY, lots("1"), ticks(100))                  # o2 is now first
    assert fills(events) == [("o2", "o4", ticks(100), lots("1"))]
    # a large taker meets every slice in turn, refilled at the back each time
    events = h.place("c", BUY, lots("5"), ticks(100), tif=TimeInForce.ioc)
    assert fills(events) == [("o1", "o5", ticks(100), lots("1")),
                             ("o1", "o5", ticks(100), lots("1"))]
    assert state(h, "o1") is OrderState.filled


def test_iceberg_refill_goes_behind_orders_that_arrived_after_it():
    h = harness("a", "b", "c")
    h.place("a", SELL, lots("2"), ticks(100), display_qty=lots("1"))   # o1
    h.place("b", SELL, lots("1"), ticks(100))                          # o2
    events = h.place("c", BUY, lots("2"), ticks(100))                  # o1 slice, then o2
    assert fills(events) == [("o1", "o3", ticks(100), lots("1")),
                             ("o2", "o3", ticks(100), lots("1"))]


def test_stop_reserves_nothing_then_triggers_on_last_trade_and_becomes_an_order():
    h = harness("a", "b", "c", "s")
    before = h.money.available("s", "USDT")
    events = h.place("s", BUY, lots("1"), ticks(105), order_type=OrderType.stop_limit,
                     stop_price=ticks(102))                            # o1
    assert [e.state for e in of_type(events, OrderAccepted)] == [OrderState.untriggered]
    assert h.money.available("s", "USDT") == before                    # nothing held
    h.place("a", SELL, lots("2"), ticks(103))                          # o2 resting ask
    h.place("b", SELL, lots("0.1"), ticks(101))                        # o3
    h.place("c", BUY, lots("0.1"), ticks(101))                         # o4 trades at 101
    assert state(h, "o1") is OrderState.untriggered
    events = h.place("c", BUY, lots("0.1"), ticks(103))                # o5 trades at 103
    trig = of_type(events, Triggered)
    assert [(t.order_id, t.last_price, t.becomes) for t in trig] == [
        ("o1", ticks(103), OrderType.limit)]
    assert trig[0].hold_amount > 0
    # the harness held and activated it: it bought at 103 from o2
    assert ("o2", "o1", ticks(103), lots("1")) in fills(events)
    assert state(h, "o1") is OrderState.filled


def test_stop_market_sell_triggers_and_sells_into_bids():
    h = harness("a", "b", "s")
    h.place("a", BUY, lots("1"), ticks(95))                            # o1
    h.place("s", SELL, lots("0.5"), order_type=OrderType.stop, stop_price=ticks(99))  # o2
    h.place("b", SELL, lots("0.1"), ticks(99))                         # o3 resting
    events = h.place("a", BUY, lots("0.1"), ticks(99))                 # o4: trade at 99
    assert ("o1", "o2", ticks(95), lots("0.5")) in fills(events)
    assert state(h, "o2") is OrderState.filled


def test_triggered_stop_whose_hold_fails_is_rejected():
    h = harness("a", "b")
    h.money.deposit("poor", "USDT", 1)                                  # cannot hold anything
    h.place("poor", BUY, lots("1"), ticks(105), order_type=OrderType.stop_limit,
            stop_price=ticks(100))
    h.place("a", SELL, lots("1"), ticks(100))
    events = h.place("b", BUY, lots("1"), ticks(100))
    assert [(r.order_id, r.code) for r in of_type(events, OrderRejected)] == [
        ("o1", ErrorCode.hold_failed)]


def test_cancel_releases_the_residual_hold_and_second_cancel_is_refused():
    h = harness("a")
    h.place("a", BUY, lots("1"), ticks(100))
    events = h.submit(Cancel("o1", "a"))
    assert closed(events) == {"o1": (OrderState.cancelled, "cancelled_by_owner")}
    assert h.money.open_holds() == {}
    again = h.submit(Cancel("o1", "a"))
    assert [(r.command, r.code) for r in of_type(again, RequestRejected)] == [
        ("cancel", ErrorCode.order_not_open)]
    other = h.submit(Cancel("o1", "b"))
    assert of_type(other, RequestRejected)[0].code is ErrorCode.order_owner_mismatch
    assert of_type(h.submit(Cancel("nope", "a")), RequestRejected)[0].code is \
        ErrorCode.order_not_found


def test_cancel_untriggered_stop():
    h = harness("a")
    h.place("a", SELL, lots("1"), order_type=OrderType.stop, stop_price=ticks(90))
    events = h.submit(Cancel("o1", "a"))
    assert closed(events) == {"o1": (OrderState.cancelled, "cancelled_by_owner")}
    assert h.engine.stops.in_firing_order() == []


def test_amend_reduce_keeps_priority_price_change_and_increase_lose_it():
    h = harness("a", "b", "c")
    h.place("a", SELL, lots("2"), ticks(100))                          # o1
    h.place("b", SELL, lots("2"), ticks(100))                          # o2
    events = h.submit(Amend("o1", "a", qty=lots("1")))
    assert of_type(events, OrderAmended)[0].priority_kept
    assert h.engine.book.asks.depth() == [(ticks(100), lots("3"))]
    assert fills(h.place("c", BUY, lots("0.5"), ticks(100)))[0][0] == "o1"
    events = h.submit(Amend("o1", "a", qty=lots("2")))                 # increase: to the back
    assert not of_type(events, OrderAmended)[0].priority_kept
    assert fills(h.place("c", BUY, lots("0.5"), ticks(100)))[0][0] == "o2"
    h.submit(Amend("o2", "b", price=ticks(101)))                       # price change
    h.submit(Amend("o2", "b", price=ticks(100)))                       # back: behind o1 now
    assert fills(h.place("c", BUY, lots("0.5"), ticks(100)))[0][0] == "o1"


def test_amend_to_a_crossing_price_trades_and_post_only_amend_is_refused():
    h = harness("a", "b")
    h.place("a", SELL, lots("1"), ticks(100))                          # o1
    h.place("b", BUY, lots("1"), ticks(90))                            # o2
    events = h.submit(Amend("o2", "b", price=ticks(100)))
    assert fills(events) == [("o1", "o2", ticks(100), lots("1"))]
    h.place("a", SELL, lots("1"), ticks(100))                          # o3
    h.place("b", BUY, lots("1"), ticks(90), post_only=True)            # o4
    events = h.submit(Amend("o4", "b", price=ticks(100)))
    assert of_type(events, RequestRejected)[0].code is ErrorCode.post_only_would_cross
    assert h.engine.order("o4").price == ticks(90)


def test_amend_below_filled_quantity_is_refused():
    h = harness("a", "b")
    h.place("a", SELL, lots("2"), ticks(100))
    h.place("b", BUY, lots("1"), ticks(100))
    events = h.submit(Amend("o1", "a", qty=lots("1")))
    assert of_type(events, RequestRejected)[0].code is ErrorCode.invalid_quantity


def test_client_order_id_retry_returns_the_existing_order_without_a_new_command():
    h = harness("a")
    h.place("a", BUY, lots("1"), ticks(100), client_order_id="cli-771")
    journal_len = len(h.journal.entries)
    events = h.place("a", BUY, lots("9"), ticks(1), client_order_id="cli-771")
    assert [(e.order_id, e.state) for e in of_type(events, OrderExists)] == [
        ("o1", OrderState.working)]
    assert len(h.journal.entries) == journal_len
    assert h.engine.book.bids.depth() == [(ticks(100), lots("1"))]
    # the same client order id under another account is a different order
    h.fund("b")
    h.place("b", BUY, lots("1"), ticks(100), client_order_id="cli-771")
    assert h.engine.order_by_client_id("b", "cli-771").state is OrderState.working


def test_engine_level_retry_is_a_no_op_even_if_journaled():
    from matching.model import Place
    h = harness("a")
    h.place("a", BUY, lots("1"), ticks(100), client_order_id="x")
    seq = h.engine.last_seq + 1
    events = h.engine.apply(seq, Place("other-id", "a", "x", BUY, qty=lots("5"), price=ticks(1)))
    assert [type(e) for e in events] == [OrderExists]
    assert "other-id" not in h.engine.orders


def test_invalid_places_are_rejected_with_codes_in_precedence_order():
    h = harness("a")
    cases = [
        (dict(side=BUY, qty=0, price=ticks(1)), ErrorCode.invalid_quantity),
        (dict(side=BUY, qty=lots("1")), ErrorCode.invalid_price),
        (dict(side=BUY, order_type=OrderType.market), ErrorCode.invalid_budget),
        (dict(side=BUY, qty=1, order_type=OrderType.market, budget=5), ErrorCode.invalid_quantity),
        (dict(side=SELL, qty=1, order_type=OrderType.stop), ErrorCode.invalid_stop_price),
        (dict(side=SELL, qty=2, price=ticks(100), display_qty=3),
         ErrorCode.invalid_display_quantity),
        (dict(side=SELL, qty=2, price=ticks(100), post_only=True, tif=TimeInForce.ioc),
         ErrorCode.invalid_time_in_force),
        (dict(side=SELL, qty=2, order_type=OrderType.market, tif=TimeInForce.gtc),
         ErrorCode.invalid_time_in_force),
        (dict(side=SELL, qty=2, price=ticks(100), fee_tier="nope"), ErrorCode.unknown_fee_tier),
        (dict(side=SELL, qty=1, price=1), ErrorCode.below_min_notional),
    ]
    for kwargs, code in cases:
        side = kwargs.pop("side")
        events = h.place("a", side, **kwargs)
        assert [r.code for r in of_type(events, OrderRejected)] == [code], kwargs
    assert h.money.open_holds() == {}


def test_duplicate_order_id_is_rejected_without_touching_the_first_order():
    from matching.model import Place
    h = harness("a")
    h.place("a", BUY, lots("1"), ticks(100))
    events = h.sequencer.submit(Place("o1", "a", "fresh", BUY, qty=1, price=ticks(100))).events
    assert of_type(events, OrderRejected)[0].code is ErrorCode.duplicate_order_id
    assert h.engine.order("o1").client_order_id == "c1"


def test_malformed_commands_are_refused_before_the_journal():
    import pytest

    from matching import MatchingError
    from matching.model import Place
    h = harness("a")
    for bad in (Place("o9", "a", "c9", "buy", qty=1, price=ticks(100)),
                Place("o9", "a", "c9", BUY, qty=1.5, price=ticks(100)),
                Place("o9", "a", "c9", BUY, qty=True, price=ticks(100)),
                Cancel(["o1"], "a"), "not a command"):
        with pytest.raises(MatchingError) as err:
            h.sequencer.submit(bad)
        assert err.value.code is ErrorCode.invalid_request
    assert h.journal.entries == [] and h.engine.last_seq == 0 and not h.sequencer.halted
