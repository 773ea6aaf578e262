"""matching.settlement.fill_legs: both settlement formats of a fill move the same net amounts per
account; format 2 shows each party only its own fee (issue 17); an unknown format is refused."""
from __future__ import annotations

from collections import Counter

import pytest

from matching.events import Fill
from matching.model import Side
from matching.settlement import SettlementError, fill_legs
from regtest.util import assert_equal

ACCOUNTS = dict(buyer_quote=1, seller_quote=2, buyer_base=3, seller_base=4, fee_account=5, buyer_hold=11, seller_hold=12)


def fill(taker_side: Side, maker_fee: int, taker_fee: int) -> Fill:
    return Fill(seq=7, match_no=1, maker_order_id="m", taker_order_id="t", maker_account="mk", taker_account="tk",
                taker_side=taker_side, price_ticks=100, qty_lots=3, base_amount=30_000, quote_amount=6_000,
                maker_fee=maker_fee, taker_fee=taker_fee)


def net(legs) -> Counter:
    moved: Counter = Counter()
    for t in legs:
        moved[t.debit_account_id] -= t.amount
        moved[t.credit_account_id] += t.amount
    return moved


@pytest.mark.parametrize("side", [Side.buy, Side.sell])
@pytest.mark.parametrize("fees", [(6, 12), (0, 12), (6, 0), (0, 0)])
def test_both_formats_move_the_same_net_amounts(side, fees):
    f = fill(side, *fees)
    old, _ = fill_legs(1, f, **ACCOUNTS)
    new, roles = fill_legs(2, f, **ACCOUNTS)
    assert_equal(net(old), net(new))
    captured = lambda legs: sum(t.amount for t in legs if t.hold_id == ACCOUNTS["buyer_hold"])  # noqa: E731
    assert_equal(captured(old), captured(new), f.buyer_pays)
    assert_equal(len(roles), len(new))


def test_format_2_charges_each_party_its_own_fee():
    f = fill(Side.buy, maker_fee=6, taker_fee=12)  # the buyer takes: its fee is the taker's
    legs, roles = fill_legs(2, f, **ACCOUNTS)
    assert_equal([(r, t.debit_account_id, t.credit_account_id, t.amount) for r, t in zip(roles, legs)], [
        ("quote", 1, 2, 6_000), ("seller_fee", 2, 5, 6), ("buyer_fee", 1, 5, 12), ("base", 4, 3, 30_000)])
    with pytest.raises(SettlementError):
        fill_legs(3, f, **ACCOUNTS)
