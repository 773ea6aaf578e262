"""Every order type, STP policy and amend settles exactly through the ledger (PostgreSQL)."""
from __future__ import annotations

import pytest

from matching.model import OrderType, Side, TimeInForce
from matching.stp import StpPolicy
from matching.testing import lots, ticks
from tests.integration.test_matching_support import (USDT, check_holds, env,  # noqa: F401
                                                     holds_of)

BUY, SELL = Side.buy, Side.sell
BTC = 100_000_000


def fee(quote: int, ppm: int) -> int:
    return -(-quote * ppm // 1_000_000)


@pytest.fixture()
def book(env):
    """A seller with two asks and a funded buyer."""
    env.alice = env.fund("alice", btc=10 * BTC, usdt=1_000_000 * USDT)
    env.bob = env.fund("bob", btc=10 * BTC, usdt=1_000_000 * USDT)
    yield env
    check_holds(env)


def test_limit_gtc_maker_and_taker_settle_both_legs_and_fees(book):
    t, m = book.trading, book.symbol
    ask = t.place(m, book.alice, "a1", SELL, qty=lots("1"), price=ticks(100))
    bid = t.place(m, book.bob, "b1", BUY, qty=lots("1"), price=ticks(100))
    assert t.order(ask.order_id).state == t.order(bid.order_id).state == "filled"
    quote = 100 * USDT
    assert book.balance(book.bob, "USDT").posted == 1_000_000 * USDT - quote - fee(quote, 2_000)
    assert book.balance(book.alice, "USDT").posted == 1_000_000 * USDT + quote - fee(quote, 1_000)
    assert book.balance(book.bob, "BTC").posted == 11 * BTC
    assert book.balance(book.alice, "BTC").posted == 9 * BTC
    assert book.fee_income() == fee(quote, 2_000) + fee(quote, 1_000)
    assert book.balance(book.bob, "USDT").held == book.balance(book.alice, "BTC").held == 0


def test_market_bid_spends_at_most_its_budget_and_gets_the_rest_back(book):
    t, m = book.trading, book.symbol
    t.place(m, book.alice, "a1", SELL, qty=lots("0.5"), price=ticks(100))
    t.place(m, book.alice, "a2", SELL, qty=lots("1"), price=ticks(110))
    bid = t.place(m, book.bob, "mb", BUY, order_type=OrderType.market, budget=100 * USDT)
    row = t.order(bid.order_id)
    assert row.state == "filled" and row.close_reason == "budget_exhausted"
    (hold,) = holds_of(book.ledger, bid.order_id)
    assert hold.amount == 100 * USDT and hold.captured <= 100 * USDT
    assert hold.captured == int(row.quote_traded) + int(row.fees_paid)
    assert book.balance(book.bob, "USDT").posted == 1_000_000 * USDT - hold.captured
    assert book.balance(book.bob, "USDT").held == 0


def test_market_ask_sells_into_bids_and_expires_the_rest(book):
    t, m = book.trading, book.symbol
    t.place(m, book.bob, "b1", BUY, qty=lots("0.3"), price=ticks(100))
    ask = t.place(m, book.alice, "ma", SELL, order_type=OrderType.market, qty=lots("0.5"))
    row = t.order(ask.order_id)
    assert row.state == "expired" and int(row.filled) == lots("0.3")
    assert book.balance(book.alice, "BTC").posted == 10 * BTC - 30_000_000
    assert book.balance(book.alice, "BTC").held == 0


def test_ioc_takes_what_it_can_and_releases_the_rest(book):
    t, m = book.trading, book.symbol
    t.place(m, book.alice, "a1", SELL, qty=lots("0.2"), price=ticks(99))
    ioc = t.place(m, book.bob, "ioc", BUY, qty=lots("1"), price=ticks(100), tif=TimeInForce.ioc)
    row = t.order(ioc.order_id)
    assert row.state == "expired" and int(row.filled) == lots("0.2")
    quote = 19_800_000  # 0.2 BTC at 99 USDT = 19.8 USDT
    assert book.balance(book.bob, "USDT").posted == 1_000_000 * USDT - quote - fee(quote, 2_000)
    assert book.balance(book.bob, "USDT").held == 0


def test_fok_5_btc_against_4_9_cancels_whole_and_posts_nothing(book):
    t, m = book.trading, book.symbol
    t.place(m, book.alice, "a1", SELL, qty=lots("4.9"), price=ticks(100))
    before = book.balance(book.bob, "USDT")
    fok = t.place(m, book.bob, "fok", BUY, qty=lots("5"), price=ticks(100), tif=TimeInForce.fok)
    row = t.order(fok.order_id)
    assert row.state == "expired" and row.close_reason == "fok_unfillable" and int(row.filled) == 0
    assert t.fills(m, order_id=fok.order_id) == []
    (hold,) = holds_of(book.ledger, fok.order_id)
    assert hold.captured == 0 and hold.released == hold.amount
    assert book.balance(book.bob, "USDT") == before
    seq, _, asks = t.depth(m)
    assert asks == [(ticks(100), lots("4.9"))]


def test_post_only_that_would_cross_is_rejected_and_its_hold_released(book):
    t, m = book.trading, book.symbol
    t.place(m, book.alice, "a1", SELL, qty=lots("1"), price=ticks(100))
    po = t.place(m, book.bob, "po", BUY, qty=lots("1"), price=ticks(100), post_only=True)
    assert po.code == "post_only_would_cross"
    row = t.order(po.order_id)
    assert row.state == "rejected" and row.reject_code == "post_only_would_cross"
    (hold,) = holds_of(book.ledger, po.order_id)
    assert hold.state.value == "released" and hold.captured == 0
    assert book.balance(book.bob, "USDT").held == 0


def test_stop_limit_reserves_nothing_until_it_triggers_then_holds_and_trades(book):
    t, m = book.trading, book.symbol
    carol = book.fund("carol", usdt=1_000 * USDT)
    stop = t.place(m, carol, "stop", BUY, order_type=OrderType.stop_limit, qty=lots("1"),
                   price=ticks(105), stop_price=ticks(101))
    assert t.order(stop.order_id).state == "untriggered" and holds_of(book.ledger, stop.order_id) == []
    assert book.balance(carol, "USDT").held == 0
    t.place(m, book.alice, "a1", SELL, qty=lots("0.1"), price=ticks(101))
    t.place(m, book.alice, "a2", SELL, qty=lots("2"), price=ticks(104))
    t.place(m, book.bob, "b1", BUY, qty=lots("0.1"), price=ticks(101))     # last price 101: fires
    row = t.order(stop.order_id)
    assert row.state == "filled" and row.order_type == "limit"
    (hold,) = holds_of(book.ledger, stop.order_id)
    quote = 104 * USDT
    assert hold.captured == quote + fee(quote, 2_000) and hold.state.value == "released"
    assert book.balance(carol, "BTC").posted == BTC
    assert book.balance(carol, "USDT").posted == 1_000 * USDT - quote - fee(quote, 2_000)


def test_triggered_stop_without_funds_is_rejected(book):
    t, m = book.trading, book.symbol
    poor = book.fund("poor", usdt=1 * USDT)
    stop = t.place(m, poor, "stop", BUY, order_type=OrderType.stop, budget=500 * USDT,
                   stop_price=ticks(101))
    t.place(m, book.alice, "a1", SELL, qty=lots("0.1"), price=ticks(101))
    t.place(m, book.bob, "b1", BUY, qty=lots("0.1"), price=ticks(101))
    row = t.order(stop.order_id)
    assert row.state == "rejected" and row.reject_code == "hold_failed"
    assert holds_of(book.ledger, stop.order_id) == []


def test_iceberg_refill_goes_to_the_back_of_its_level(book):
    t, m = book.trading, book.symbol
    ice = t.place(m, book.alice, "ice", SELL, qty=lots("3"), price=ticks(100), display_qty=lots("1"))
    carol = book.fund("carol", btc=BTC)
    other = t.place(m, carol, "plain", SELL, qty=lots("1"), price=ticks(100))
    assert t.depth(m)[2] == [(ticks(100), lots("2"))]  # only the displayed slice shows
    t.place(m, book.bob, "b1", BUY, qty=lots("1.5"), price=ticks(100))
    fills = t.fills(m)
    assert [(f.maker_order_id, int(f.qty_lots)) for f in fills] == [
        (ice.order_id, lots("1")), (other.order_id, lots("0.5"))]  # the refill waited behind carol
    assert book.balance(carol, "USDT").posted > 0
    assert t.order(ice.order_id).state == "partially_filled"


@pytest.mark.parametrize("policy", list(StpPolicy))
def test_self_trade_prevention_policies_release_what_they_remove(book, policy):
    t, m = book.trading, book.symbol
    rest = t.place(m, book.alice, "rest", SELL, qty=lots("1"), price=ticks(100))
    new = t.place(m, book.alice, "new", BUY, qty=lots("0.4"), price=ticks(100), stp_policy=policy)
    assert t.fills(m) == []
    r, n = t.order(rest.order_id), t.order(new.order_id)
    if policy is StpPolicy.cancel_newest:
        assert (r.state, n.state) == ("working", "rejected") and n.reject_code == "self_trade_prevented"
    elif policy is StpPolicy.cancel_oldest:
        assert (r.state, n.state) == ("cancelled", "working")
    else:
        assert (r.state, n.state) == ("working", "rejected") and int(r.remaining) == lots("0.6")
    assert book.balance(book.alice, "USDT").posted == 1_000_000 * USDT
    assert book.balance(book.alice, "BTC").posted == 10 * BTC


def test_client_order_id_retry_returns_the_existing_order_and_holds_once(book):
    t, m = book.trading, book.symbol
    first = t.place(m, book.bob, "same", BUY, qty=lots("1"), price=ticks(100))
    again = t.place(m, book.bob, "same", BUY, qty=lots("1"), price=ticks(100))
    assert again.existed and again.order_id == first.order_id and again.seq is None
    assert len(holds_of(book.ledger, first.order_id)) == 1


def test_insufficient_funds_rejects_before_sequencing(book):
    t, m = book.trading, book.symbol
    poor = book.fund("poor", usdt=10 * USDT)
    r = t.place(m, poor, "big", BUY, qty=lots("1"), price=ticks(100))
    assert r.code == "insufficient_funds" and r.seq is None
    assert t.order(r.order_id).state == "rejected"
    assert t.place(m, poor, "big", BUY, qty=lots("1"), price=ticks(100)).existed


def test_amend_up_swaps_the_hold_and_amend_beyond_funds_is_refused(book):
    t, m = book.trading, book.symbol
    carol = book.fund("carol", usdt=300 * USDT)
    bid = t.place(m, carol, "b", BUY, qty=lots("1"), price=ticks(100))
    t.place(m, book.alice, "a1", SELL, qty=lots("0.5"), price=ticks(100))   # half fills
    up = t.amend(m, carol, bid.order_id, price=ticks(200))
    assert up.code is None
    first, second = holds_of(book.ledger, bid.order_id)
    assert first.state.value == "released" and first.captured == 50 * USDT + fee(50 * USDT, 1_000)
    assert second.state.value == "pending" and second.amount == 100 * USDT + fee(100 * USDT, 2_000)
    refused = t.amend(m, carol, bid.order_id, price=ticks(600))
    assert refused.code == "insufficient_funds" and refused.seq is None
    assert int(t.order(bid.order_id).price) == ticks(200)
    t.cancel(m, carol, bid.order_id)
    assert book.balance(carol, "USDT").held == 0
    assert book.balance(carol, "USDT").posted == 300 * USDT - first.captured


def test_cancel_of_someone_elses_order_is_refused(book):
    t, m = book.trading, book.symbol
    bid = t.place(m, book.bob, "b", BUY, qty=lots("1"), price=ticks(100))
    assert t.cancel(m, book.alice, bid.order_id).code == "order_owner_mismatch"
    assert t.order(bid.order_id).state == "working"
