"""Rebalance thresholds: integers of minor units only, floor below target below ceiling; the amount
moved out is spendable - target strictly above the ceiling and nothing at or below it; a refill is
target - spendable strictly below the floor. And when a stuck sweep or rebalance is bumped, how far."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from custody.firm_moves import BumpConfig, bumped_rate, is_stuck
from custody.rebalances import RebalanceThreshold, amount_to_move, default_thresholds, refill_amount

BTC = 100_000_000


def test_nothing_moves_at_or_below_the_ceiling():
    t = RebalanceThreshold(ceiling=10 * BTC, target=4 * BTC)
    assert amount_to_move(0, t) == 0
    assert amount_to_move(10 * BTC, t) == 0
    assert amount_to_move(10 * BTC + 1, t) == 6 * BTC + 1
    assert amount_to_move(25 * BTC, t) == 21 * BTC


@pytest.mark.parametrize("ceiling, target", [(10, 10), (10, 11), (-1, -2), (10, -1), (10.0, 5), (10, 5.0), (True, 0),
                                             ("10", 5)])
def test_thresholds_refuse_anything_but_ordered_non_negative_ints(ceiling, target):
    with pytest.raises(ValueError):
        RebalanceThreshold(ceiling=ceiling, target=target)


@pytest.mark.parametrize("spendable", [-1, 1.5, True, None])
def test_spendable_must_be_a_non_negative_int(spendable):
    with pytest.raises(ValueError):
        amount_to_move(spendable, RebalanceThreshold(ceiling=10, target=5))


@given(st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**63))
def test_after_a_move_the_hot_wallet_holds_the_target(a, b, spendable):
    target, ceiling = min(a, b), max(a, b) + 1
    t = RebalanceThreshold(ceiling=ceiling, target=target)
    moved = amount_to_move(spendable, t)
    assert type(moved) is int
    if spendable > ceiling:
        assert moved > 0 and spendable - moved == target
    else:
        assert moved == 0


def test_regtest_defaults_are_whole_satoshis():
    [(asset, t)] = default_thresholds().items()
    assert asset == "BTC" and (t.ceiling, t.target) == (50 * BTC, 20 * BTC)


def test_a_refill_brings_hot_back_to_the_target_only_below_the_floor():
    t = RebalanceThreshold(ceiling=10 * BTC, target=4 * BTC, floor=2 * BTC, excess_to="warm")
    assert refill_amount(2 * BTC, t) == 0
    assert refill_amount(2 * BTC - 1, t) == 2 * BTC + 1
    assert refill_amount(0, t) == 4 * BTC
    assert refill_amount(0, RebalanceThreshold(ceiling=10 * BTC, target=4 * BTC)) == 0  # no floor: never


@pytest.mark.parametrize("floor, excess_to", [(4 * BTC, "cold"), (5 * BTC, "cold"), (-1, "cold"), (1.0, "cold"),
                                              (True, "cold"), (None, "hot"), (None, "deposit")])
def test_the_floor_is_below_the_target_and_the_excess_goes_to_warm_or_cold(floor, excess_to):
    with pytest.raises(ValueError):
        RebalanceThreshold(ceiling=10 * BTC, target=4 * BTC, floor=floor, excess_to=excess_to)


@given(st.integers(0, 2**40), st.integers(1, 2**40), st.integers(1, 2**40), st.integers(0, 2**42))
def test_hot_is_never_both_above_its_ceiling_and_below_its_floor(floor, dt, dc, spendable):
    t = RebalanceThreshold(ceiling=floor + dt + dc, target=floor + dt, floor=floor)
    out, into = amount_to_move(spendable, t), refill_amount(spendable, t)
    assert out == 0 or into == 0
    if into:
        assert spendable + into == t.target


def test_a_stuck_version_is_bumped_by_the_percent_up_to_the_ceiling_and_no_further():
    config = BumpConfig(stuck_blocks=3, bump_percent=50, max_fee_rate_sat_per_kvb=3_000)
    assert not is_stuck(102, 100, config) and is_stuck(103, 100, config) and not is_stuck(200, None, config)
    assert bumped_rate(1_000, config) == 1_500
    assert bumped_rate(2_500, config) == 3_000  # capped
    assert bumped_rate(3_000, config) is None  # the ceiling leaves no higher rate: an incident, not a bump
    with pytest.raises(ValueError):
        BumpConfig(bump_percent=0)
