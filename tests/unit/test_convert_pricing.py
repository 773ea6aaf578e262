"""custody.convert.pricing: exact quote arithmetic (no database).

The README's worked example, the rounding directions (fee up, payout down, remainder stated and
below one minor unit), amounts on the receiving side, the spread, and average prices over book
levels, including refusals when the book is too shallow or the payout rounds to nothing, and the
band a book's average must keep around its reference.
"""
from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from custody.convert.pricing import (
    Level,
    PricingRefused,
    apply_spread,
    fee_for,
    figures_for_from,
    figures_for_to,
    operator_rate,
    receive_through,
    spend_through,
    within_band,
)
from regtest.util import assert_equal

EUR_PER_BTC = 5_800_000  # 58,000.00 EUR in cents per whole BTC


def test_the_worked_example():
    rate = apply_spread(operator_rate(EUR_PER_BTC, 8, selling_base=False), 0)
    assert_equal(rate, Fraction(500, 29))  # satoshi per cent
    f = figures_for_from(100_00, rate, 2_500)
    assert_equal((f.fee, f.net, f.to_amount, f.cost, f.rounding, f.remainder),
                 (25, 99_75, 171_982, 99_75, 0, Fraction(11, 250)))


def test_whole_units_that_bought_nothing_are_rounding():
    rate = operator_rate(EUR_PER_BTC, 8, selling_base=True)  # 0.058 cents per satoshi
    f = figures_for_from(172_000, rate, 2_500)  # 0.00172000 BTC
    # fee ceil(430.0) = 430; net 171,570 buys floor(9,951.06) = 9,951 cents, which cost
    # ceil(9,951 / 0.058) = 171,569 satoshi: 1 satoshi bought nothing
    assert_equal((f.fee, f.to_amount, f.cost, f.rounding), (430, 9_951, 171_569, 1))
    assert 0 <= f.remainder < 1


def test_selling_the_base_uses_the_price_directly():
    rate = operator_rate(EUR_PER_BTC, 8, selling_base=True)  # cents per satoshi
    f = figures_for_from(171_982, rate, 2_500)  # 0.00171982 BTC
    assert_equal(f.fee, 430)  # ceil(171,982 * 0.0025) = ceil(429.955)
    assert_equal(f.to_amount, (171_982 - 430) * EUR_PER_BTC // 10**8)


def test_the_fee_rounds_up_and_the_payout_down():
    assert_equal((fee_for(1, 2_500), fee_for(400, 2_500), fee_for(401, 2_500)), (1, 1, 2))
    with pytest.raises(PricingRefused) as refused:
        figures_for_from(1, Fraction(1, 2), 2_500)  # everything goes to the fee
    assert_equal(refused.value.reason, "too_small")


@given(amount=st.integers(1, 10**12), num=st.integers(1, 10**9), den=st.integers(1, 10**9),
       fee_ppm=st.integers(0, 50_000))
def test_figures_are_exact_and_in_the_house_favour(amount, num, den, fee_ppm):
    rate = Fraction(num, den)
    try:
        f = figures_for_from(amount, rate, fee_ppm)
    except PricingRefused:
        assert (amount - fee_for(amount, fee_ppm)) * rate < 1
        return
    assert f.fee * 10**6 >= amount * fee_ppm > (f.fee - 1) * 10**6
    assert f.to_amount == (f.net * rate).numerator // (f.net * rate).denominator
    assert f.net == f.cost + f.rounding and f.rounding >= 0
    assert f.cost * rate >= f.to_amount > (f.cost - 1) * rate  # the least that pays the payout
    assert f.remainder == f.cost - f.to_amount / rate and 0 <= f.remainder < 1


@given(wanted=st.integers(1, 10**12), num=st.integers(1, 10**9), den=st.integers(1, 10**9),
       fee_ppm=st.integers(0, 50_000))
def test_receiving_side_sells_the_least_that_pays_at_least_the_amount(wanted, num, den, fee_ppm):
    rate = Fraction(num, den)
    f = figures_for_to(wanted, rate, fee_ppm)
    assert f.to_amount >= wanted
    if f.from_amount > 1:
        less = f.from_amount - 1
        assert (less - fee_for(less, fee_ppm)) * rate < wanted


def test_the_spread_lowers_the_rate():
    assert_equal(apply_spread(Fraction(100), 1_000), Fraction(999, 10))
    exact = Fraction(10**40 + 1, 3**80)
    long = apply_spread(exact, 0)  # a denominator beyond 10^30 is rounded down to 10^30
    assert 10**30 % long.denominator == 0 and exact - Fraction(1, 10**30) < long <= exact


def test_average_price_over_levels():
    levels = [Level(gives=100, takes=10), Level(gives=200, takes=10)]  # 10 per unit, then 20 per unit
    assert_equal(spend_through(levels, 100), 10)
    assert_equal(spend_through(levels, 200), 15)  # all of the first level, half the second
    assert_equal(receive_through(levels, 15), 200)
    with pytest.raises(PricingRefused) as refused:
        spend_through(levels, 301)
    assert_equal(refused.value.reason, "depth")


def test_the_band_holds_both_sides_of_the_reference_exactly():
    reference = Fraction(100, 6)
    band = 50_000  # 5%
    assert within_band(reference * Fraction(105, 100), reference, band)
    assert within_band(reference * Fraction(95, 100), reference, band)
    assert not within_band(reference * Fraction(105, 100) + Fraction(1, 10**30), reference, band)
    assert not within_band(reference * Fraction(95, 100) - Fraction(1, 10**30), reference, band)
    assert within_band(reference, reference, 0) and not within_band(reference * Fraction(1_000_001, 10**6), reference, 0)
