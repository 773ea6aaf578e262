"""custody.eth_moves' pure decisions: the fees of a same-nonce replacement (both raised by the bump
percent, at least the node's estimate, at most the cap; none when the cap leaves less than the
node's +10% minimum) and when a version is stuck."""
from __future__ import annotations

import pytest

from custody.eth_moves import EthBumpConfig, is_stuck, raised, replacement_fees
from regtest.util import assert_equal

GWEI = 10**9


def test_both_fees_are_raised_by_the_percent_rounded_up():
    assert_equal(raised(10 * GWEI, 25), 12_500_000_000)
    assert_equal(raised(3, 10), 4)  # 3.3 rounded up
    assert_equal(raised(1, 10), 2)  # never the same fee
    assert_equal(replacement_fees(10 * GWEI, 2 * GWEI, estimate_max_fee=GWEI, estimate_priority=1, bump_percent=25,
                                  cap=100 * GWEI), (12_500_000_000, 2_500_000_000))


def test_the_node_estimate_wins_when_the_base_fee_ran_away():
    assert_equal(replacement_fees(10 * GWEI, GWEI, estimate_max_fee=80 * GWEI, estimate_priority=3 * GWEI, bump_percent=25,
                                  cap=100 * GWEI), (80 * GWEI, 3 * GWEI))


def test_the_cap_bounds_the_max_fee_and_the_priority_follows_it():
    assert_equal(replacement_fees(10 * GWEI, 10 * GWEI, estimate_max_fee=GWEI, estimate_priority=1, bump_percent=50,
                                  cap=12 * GWEI), (12 * GWEI, 12 * GWEI))


def test_no_replacement_when_the_cap_leaves_less_than_the_nodes_minimum():
    assert_equal(replacement_fees(10 * GWEI, GWEI, estimate_max_fee=GWEI, estimate_priority=1, bump_percent=50,
                                  cap=10_900_000_000), None)  # +9%: geth and anvil refuse it
    assert_equal(replacement_fees(10 * GWEI, 10 * GWEI, estimate_max_fee=GWEI, estimate_priority=1, bump_percent=50,
                                  cap=11 * GWEI), (11 * GWEI, 11 * GWEI))  # exactly +10% on both


def test_stuck_after_stuck_blocks_since_it_was_sent():
    assert_equal([is_stuck(tip, 100, 3) for tip in (100, 102, 103, 110)], [False, False, True, True])
    assert_equal(is_stuck(200, None, 3), False)  # never sent


def test_the_bump_percent_is_at_least_the_nodes_replacement_minimum():
    with pytest.raises(ValueError):
        EthBumpConfig(bump_percent=9)
    with pytest.raises(ValueError):
        EthBumpConfig(stuck_blocks=0)
