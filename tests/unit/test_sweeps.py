"""Sweeps' pure decision: which coins of a sweep, reorged out of the wallet index after booking, are
gone for good (`stranded_coins`), so that the sweep is dropped and rebuilt; and the state tables
that let a signed sweep be dropped while a signed rebalance cannot be."""
from __future__ import annotations

import pytest

from chain_adapters.base import TxState
from custody.states import IllegalTransition, check
from custody.sweeps import stranded_coins

UNKNOWN, MEMPOOL, CONFIRMED = TxState.UNKNOWN, TxState.MEMPOOL, TxState.CONFIRMED


def test_a_coin_whose_deposit_the_node_knows_nowhere_strands_a_sweep_it_knows_nowhere():
    assert stranded_coins(UNKNOWN, {7: UNKNOWN, 3: UNKNOWN}) == [3, 7]


@pytest.mark.parametrize("deposit", [MEMPOOL, CONFIRMED])
def test_a_deposit_in_the_mempool_or_chain_may_be_mined_with_the_sweep(deposit):
    # mempool: the reorg returned it there and it may be mined again; confirmed: the scanner has not walked it yet
    assert stranded_coins(UNKNOWN, {7: deposit}) == []
    assert stranded_coins(UNKNOWN, {7: deposit, 9: UNKNOWN}) == [9]


@pytest.mark.parametrize("sweep", [MEMPOOL, CONFIRMED, TxState.REPLACED, TxState.CONFLICTED])
def test_a_sweep_the_node_holds_is_left_to_track(sweep):
    assert stranded_coins(sweep, {7: UNKNOWN}) == []


def test_nothing_is_stranded_without_a_coin():
    assert stranded_coins(UNKNOWN, {}) == []


def test_a_signed_sweep_may_be_dropped_a_signed_rebalance_not():
    check("sweep", "signed", "dropped")
    check("sweep", "broadcast", "dropped")
    with pytest.raises(IllegalTransition):
        check("rebalance", "signed", "dropped")
    with pytest.raises(IllegalTransition):
        check("sweep", "dropped", "broadcast")
