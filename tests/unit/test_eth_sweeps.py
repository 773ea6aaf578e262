"""The pure decisions of custody.eth_sweeps: how much gas the hot address funds, how much an ether
sweep sends, the gas limit's margin, and what reconciliation counts in transit for a mined sweep or
funding (each line, and across lines: only the gas leaves the firm)."""
from __future__ import annotations

import pytest

from custody.eth_sweeps import (TRANSFER_GAS, MinedMove, ether_sweep_amount, gas_funding_needed, gas_limit_with_margin,
                                moves_in_transit)
from custody.states import IllegalTransition, check
from regtest.util import assert_equal

LINES = [(tier, asset) for tier in ("deposit", "hot") for asset in ("ETH", "USDT")]


def in_transit(moves) -> dict:
    return {(tier, asset): moves_in_transit(moves, tier, asset) for tier, asset in LINES}


def test_gas_funding_is_what_the_sweep_may_burn_less_the_booked_ether_there():
    assert_equal(gas_funding_needed(60_000, 3 * 10**9, 0), 180 * 10**12)
    assert_equal(gas_funding_needed(60_000, 3 * 10**9, 80 * 10**12), 100 * 10**12)
    assert_equal(gas_funding_needed(60_000, 3 * 10**9, 180 * 10**12), 0)  # it pays its own gas
    assert_equal(gas_funding_needed(60_000, 3 * 10**9, 10**18), 0)
    assert_equal(gas_funding_needed(60_000, 3 * 10**9, -5), 180 * 10**12)  # never more than the gas


def test_an_ether_sweep_sends_the_booked_ether_less_its_gas_reserve():
    assert_equal(ether_sweep_amount(10**18, 2 * 10**9), 10**18 - TRANSFER_GAS * 2 * 10**9)
    assert_equal(ether_sweep_amount(TRANSFER_GAS * 2 * 10**9, 2 * 10**9), 0)  # dust: not worth its gas
    assert_equal(ether_sweep_amount(5, 2 * 10**9), 0)


def test_the_gas_limit_is_the_estimate_plus_the_margin_rounded_up():
    assert_equal(gas_limit_with_margin(51_234, 10), 56_358)  # 56,357.4 rounded up
    assert_equal(gas_limit_with_margin(50_000, 0), 50_000)
    assert_equal(gas_limit_with_margin(1_000, 10), TRANSFER_GAS)


def test_a_mined_funding_moves_ether_from_hot_to_the_deposit_address_and_burns_its_gas():
    moves = [MinedMove("gas", "ETH", 7_000, 21)]
    assert_equal(in_transit(moves), {("deposit", "ETH"): 7_000, ("deposit", "USDT"): 0,
                                     ("hot", "ETH"): -7_021, ("hot", "USDT"): 0})


def test_a_mined_token_sweep_moves_the_token_and_burns_the_deposit_addresses_ether():
    moves = [MinedMove("sweep", "USDT", 150_000_000, 4_000)]
    assert_equal(in_transit(moves), {("deposit", "ETH"): -4_000, ("deposit", "USDT"): -150_000_000,
                                     ("hot", "ETH"): 0, ("hot", "USDT"): 150_000_000})


def test_a_mined_ether_sweep_and_a_reverted_token_sweep():
    moves = [MinedMove("sweep", "ETH", 9_000, 21), MinedMove("sweep", "USDT", 5, 300, reverted=True)]
    assert_equal(in_transit(moves), {("deposit", "ETH"): -9_021 - 300, ("deposit", "USDT"): 0,
                                     ("hot", "ETH"): 9_000, ("hot", "USDT"): 0})


def test_across_lines_only_the_gas_leaves_the_firm():
    moves = [MinedMove("gas", "ETH", 7_000, 21), MinedMove("sweep", "USDT", 10, 5_000),
             MinedMove("sweep", "ETH", 123_456, 21)]
    moved = in_transit(moves)
    assert_equal(moved[("deposit", "USDT")] + moved[("hot", "USDT")], 0)
    assert_equal(moved[("deposit", "ETH")] + moved[("hot", "ETH")], -(21 + 5_000 + 21))


@pytest.mark.parametrize("machine", ["eth_sweep", "eth_gas_funding"])
def test_a_sweep_is_never_dropped_nor_abandoned(machine):
    """Its nonce is reserved: a hole would block every later transaction of the sender."""
    for pair in [("open", "signed"), ("signed", "broadcast"), ("broadcast", "confirmed"), ("confirmed", "final"),
                 ("confirmed", "reverted"), ("confirmed", "broadcast")]:
        check(machine, *pair)
    for pair in [("open", "abandoned"), ("broadcast", "dropped"), ("signed", "open"), ("final", "broadcast"),
                 ("reverted", "open")]:
        with pytest.raises(IllegalTransition):
            check(machine, *pair)
