"""What a confirmed coin at a bitcoin hot address is, as `Payouts.sync_hot_wallet` finds it. Our
payout's change is recorded when the payout is signed (by its exact vout), so a coin of a payout
that is not recorded yet is another of its outputs: a withdrawal that paid one of our own
addresses. It is never taken as our change (it left the books with the payout): it is booked as
funding, with a warning. Sweeps and rebalances pay no one else, so their outputs are ours."""
from __future__ import annotations

import pytest

from custody.payouts import hot_coin_origin


@pytest.mark.parametrize("tx_kind", ["payout", "sweep", "rebalance", None])
def test_a_coin_recorded_already_is_known(tx_kind):
    assert hot_coin_origin(known=True, tx_kind=tx_kind) == "known"


def test_an_unrecorded_output_of_our_payout_is_a_withdrawal_that_paid_our_address():
    assert hot_coin_origin(known=False, tx_kind="payout") == "misdirected"


@pytest.mark.parametrize("tx_kind", ["sweep", "rebalance", "cpfp"])
def test_sweep_and_rebalance_outputs_are_ours(tx_kind):
    assert hot_coin_origin(known=False, tx_kind=tx_kind) == "ours"


def test_anyone_elses_coin_is_funding():
    assert hot_coin_origin(known=False, tx_kind=None) == "funding"
