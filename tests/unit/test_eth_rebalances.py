"""custody.eth_rebalances' pure part: what a mined, unbooked rebalance explains on each
reconciliation line (hot: - amount on its asset, - gas on ETH; the destination tier: + amount;
a reverted one moved its gas only)."""
from __future__ import annotations

from custody.eth_rebalances import MinedRebalance, in_transit
from regtest.util import assert_equal

ETH_TO_WARM = MinedRebalance("ETH", 2 * 10**18, 50_000, "warm")
USDT_TO_COLD = MinedRebalance("USDT", 600 * 10**6, 70_000, "cold")
REVERTED = MinedRebalance("USDT", 5 * 10**6, 30_000, "cold", reverted=True)
MOVES = [ETH_TO_WARM, USDT_TO_COLD, REVERTED]


def test_hot_loses_the_value_of_each_and_all_the_gas_on_ether():
    assert_equal(in_transit(MOVES, "hot", "ETH"), -2 * 10**18 - 50_000 - 70_000 - 30_000)
    assert_equal(in_transit(MOVES, "hot", "USDT"), -600 * 10**6)  # the reverted transfer moved no token


def test_the_destination_tier_gains_the_value_only():
    assert_equal(in_transit(MOVES, "warm", "ETH"), 2 * 10**18)
    assert_equal(in_transit(MOVES, "warm", "USDT"), 0)
    assert_equal(in_transit(MOVES, "cold", "USDT"), 600 * 10**6)
    assert_equal(in_transit(MOVES, "cold", "ETH"), 0)
    assert_equal(in_transit(MOVES, "deposit", "ETH"), 0)


def test_every_move_sums_to_minus_its_gas_across_the_lines():
    for m in MOVES:
        total = sum(in_transit([m], tier, asset) for tier in ("hot", "warm", "cold") for asset in ("ETH", "USDT"))
        assert_equal(total if m.asset == "ETH" else in_transit([m], "hot", "ETH"), -m.gas)


def test_a_refill_leaves_warm_and_arrives_at_hot():
    refill = MinedRebalance("USDT", 300 * 10**6, 40_000, "hot", source_tier="warm")
    assert_equal(in_transit([refill], "warm", "USDT"), -300 * 10**6)
    assert_equal(in_transit([refill], "warm", "ETH"), -40_000)  # warm pays its own gas
    assert_equal(in_transit([refill], "hot", "USDT"), 300 * 10**6)
    assert_equal(in_transit([refill], "hot", "ETH"), 0)
