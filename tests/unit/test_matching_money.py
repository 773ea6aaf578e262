"""Fees, holds and the Bitsten price-improvement case, checked at the event level."""
from __future__ import annotations

from matching import Cancel, FeeSchedule, FeeTier, Market, OrderState, OrderType, Place, Side
from matching.events import Fill, OrderClosed
from matching.fees import PPM, ceil_div, fee_increment
from matching.holds import hold_requirement
from matching.testing import BTC_USDT, FEE_ACCOUNT, FEES, USDT, Harness, lots, of_type, ticks

BUY, SELL = Side.buy, Side.sell


def test_fee_rounds_up_on_the_cumulative_amount_not_per_fill():
    # 0.1% of 1 unit, a thousand times: per-fill ceil would charge 1000, cumulative charges 1
    num, total = 0, 0
    for _ in range(1000):
        fee, num = fee_increment(num, 1, 1_000)
        total += fee
    assert total == 1 == ceil_div(1000 * 1 * 1_000, PPM)
    assert fee_increment(0, 1_999, 1_000) == (2, 1_999_000)   # 1.999 -> 2, exchange's favour
    assert fee_increment(0, 0, 1_000) == (0, 0)


def test_hold_requirement_per_order_type():
    bid = Place("b", "a", "c", BUY, qty=lots("0.5"), price=ticks(60_000))
    quote = 30_000 * USDT
    assert hold_requirement(bid, BTC_USDT, FEES) == ("USDT", quote + quote * 2_000 // PPM)
    ask = Place("s", "a", "c", SELL, qty=lots("0.5"), price=ticks(60_000))
    assert hold_requirement(ask, BTC_USDT, FEES) == ("BTC", 50_000_000)
    mkt = Place("m", "a", "c", BUY, order_type=OrderType.market, budget=123)
    assert hold_requirement(mkt, BTC_USDT, FEES) == ("USDT", 123)
    vip = Place("v", "a", "c", BUY, qty=1, price=1, fee_tier="vip")
    assert hold_requirement(vip, BTC_USDT, FEES) == ("USDT", 1 + 1)  # ceil(1 * 500 / 1e6)


def test_bitsten_price_improvement_returns_to_the_buyer():
    """Bid 0.5 BTC @ 60,000 against a resting ask 0.2 @ 59,900, then cancel."""
    h = Harness()
    h.fund("seller")
    h.money.deposit("buyer", "USDT", 40_000 * USDT)
    h.place("seller", SELL, lots("0.2"), ticks(59_900))                 # o1
    events = h.place("buyer", BUY, lots("0.5"), ticks(60_000))          # o2
    hold = h.money.placed["o2"]
    assert hold == 30_000 * USDT + 60 * USDT                            # + 0.2% max fee
    [fill] = of_type(events, Fill)
    assert (fill.price_ticks, fill.qty_lots) == (ticks(59_900), lots("0.2"))
    assert fill.quote_amount == 11_980 * USDT
    assert fill.taker_fee == 11_980 * USDT * 2_000 // PPM               # 23.96 USDT
    events = h.submit(Cancel("o2", "buyer"))
    [close] = of_type(events, OrderClosed)
    assert close.state is OrderState.cancelled
    assert close.hold_captured == 11_980 * USDT + fill.taker_fee
    assert h.money.released["o2"] == hold - close.hold_captured
    # the buyer ends with exactly 40,000 - 11,980 - fee and nothing held
    assert h.money.posted[("buyer", "USDT")] == 40_000 * USDT - 11_980 * USDT - fill.taker_fee
    assert h.money.held("buyer", "USDT") == 0
    assert h.money.posted[("buyer", "BTC")] == 20_000_000


def test_fully_filled_bid_at_better_prices_releases_the_improvement():
    h = Harness()
    h.fund("s")
    h.fund("b")
    h.place("s", SELL, lots("0.5"), ticks(59_000))
    events = h.place("b", BUY, lots("0.5"), ticks(60_000))
    [close] = of_type(events, OrderClosed)[-1:]
    assert close.state is OrderState.filled and close.order_id == "o2"
    improvement = h.money.placed["o2"] - close.hold_captured
    assert improvement == h.money.released["o2"] > 500 * USDT


def test_fees_balance_each_fill_and_totals_stay_constant():
    h = Harness()
    for account in ("a", "b", "c"):
        h.fund(account)
    totals = {asset: h.money.total(asset) for asset in ("BTC", "USDT")}
    h.place("a", SELL, lots("0.3"), ticks(60_001))
    h.place("c", SELL, lots("0.3"), ticks(60_003), fee_tier="vip")
    events = h.place("b", BUY, lots("0.5"), ticks(60_003))
    for fill in of_type(events, Fill):
        assert fill.buyer_pays - fill.seller_receives == fill.maker_fee + fill.taker_fee
    assert {asset: h.money.total(asset) for asset in ("BTC", "USDT")} == totals
    assert h.money.posted[(FEE_ACCOUNT, "USDT")] > 0


def test_many_small_fills_never_capture_more_than_the_hold():
    # rates chosen so per-fill rounding would overshoot: 1 lot at 3 ticks, maker fee 33.3334%
    market = Market("T-Q", "T", "Q", lot_size=1, quote_per_tick_lot=1)
    h = Harness(market=market, fees=FeeSchedule({"default": FeeTier(333_334, 1)}))
    h.money.deposit("b", "Q", 10**6)
    h.money.deposit("s", "T", 10**6)
    h.place("b", BUY, 50, 3)                              # resting maker bid
    for _ in range(50):
        h.place("s", SELL, 1, 3)                          # 50 fills of 1 lot
    assert h.engine.order("o1").state is OrderState.filled
    per_fill_ceil = 50 * ceil_div(3 * 333_334, PPM)       # 100
    assert h.money.captured["o1"] == 150 + ceil_div(150 * 333_334, PPM) < 150 + per_fill_ceil
    assert h.money.captured["o1"] <= h.money.placed["o1"]
