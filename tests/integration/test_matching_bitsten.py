"""The Bitsten scenario through the real ledger: price improvement returns to the buyer."""
from __future__ import annotations

from matching.model import Side
from matching.testing import lots, ticks
from tests.integration.test_matching_support import USDT, env, holds_of  # noqa: F401

BUY, SELL = Side.buy, Side.sell


def test_bitsten_limit_bid_partially_filled_then_cancelled_keeps_its_price_improvement(env):
    buyer = env.fund("buyer", usdt=40_000 * USDT)
    seller = env.fund("seller", btc=20_000_000)
    t, m = env.trading, env.symbol

    ask = t.place(m, seller, "ask-1", SELL, qty=lots("0.2"), price=ticks(59_900))
    assert ask.code is None
    bid = t.place(m, buyer, "bid-1", BUY, qty=lots("0.5"), price=ticks(60_000))
    assert bid.code is None
    hold = holds_of(env.ledger, bid.order_id)[0]
    # 0.5 BTC at the 60,000 limit plus the larger fee rate (0.2%) on it
    assert hold.amount == 30_000 * USDT + 60 * USDT
    row = t.order(bid.order_id)
    assert row.state == "partially_filled" and int(row.filled) == lots("0.2")

    cancel = t.cancel(m, buyer, bid.order_id)
    assert cancel.code is None and t.order(bid.order_id).state == "cancelled"

    taker_fee = 11_980 * USDT * 2_000 // 1_000_000          # 23.96 USDT, exact
    usdt = env.balance(buyer, "USDT")
    assert usdt.posted == 40_000 * USDT - 11_980 * USDT - taker_fee
    assert usdt.held == 0 and usdt.available == usdt.posted
    assert env.balance(buyer, "BTC").posted == 20_000_000
    maker_fee = 11_980 * USDT * 1_000 // 1_000_000
    assert env.balance(seller, "USDT").posted == 11_980 * USDT - maker_fee
    assert env.balance(seller, "BTC").posted == 0
    assert env.fee_income() == taker_fee + maker_fee
    (hold,) = holds_of(env.ledger, bid.order_id)
    assert hold.state.value == "released"
    assert hold.captured == 11_980 * USDT + taker_fee
    assert hold.released == hold.amount - hold.captured       # 18,000 + 20 improvement + fee allowance
    assert [f.journal_transaction_id is not None for f in t.fills(m, order_id=bid.order_id)] == [True]
    env.ledger.assert_verified()
