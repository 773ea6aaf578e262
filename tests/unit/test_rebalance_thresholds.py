"""Rebalance thresholds: integers of minor units only, target below ceiling, and the amount moved is
spendable - target strictly above the ceiling and nothing at or below it."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from custody.rebalances import RebalanceThreshold, amount_to_move, default_thresholds

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
