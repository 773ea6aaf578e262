"""custody.cpfp's pure parts: the child's fee for a package rate, and what a mined unbooked child
takes from the hot line."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from custody.cpfp import child_fee, in_transit_fee
from regtest.util import assert_equal
from signer.bitcoin_tx import fee_for


def test_the_package_reaches_the_rate():
    parent_fee, parent_vsize, child_vsize, rate = 300, 250, 110, 15_000
    fee = child_fee(parent_fee, parent_vsize, child_vsize, rate)
    assert_equal(fee, fee_for(parent_vsize + child_vsize, rate) - parent_fee)
    assert (parent_fee + fee) * 1000 >= rate * (parent_vsize + child_vsize)  # the package's rate, at least
    assert (parent_fee + fee - 1) * 1000 < rate * (parent_vsize + child_vsize)  # and not a satoshi more


def test_a_parent_already_paying_the_rate_still_gives_a_relayable_child():
    assert_equal(child_fee(100_000, 250, 110, 2_000), fee_for(110, 1_000))


def test_a_replacement_pays_more_than_the_child_it_replaces_by_the_incremental_relay_fee():
    first = child_fee(300, 250, 110, 15_000)
    assert_equal(child_fee(300, 250, 110, 15_000, replaces_fee=first), first + 110)
    higher = child_fee(300, 250, 110, 22_500, replaces_fee=first)
    assert_equal(higher, fee_for(360, 22_500) - 300)
    assert higher >= first + 110


@pytest.mark.parametrize("bad", [1.5, -1, True, None])
def test_only_ints(bad):
    with pytest.raises(ValueError):
        child_fee(bad, 250, 110, 1000)


def test_only_a_mined_child_is_in_transit():
    children = [SimpleNamespace(txid="a", raw=b"", fee=500), SimpleNamespace(txid="b", raw=b"", fee=700)]
    assert_equal(in_transit_fee(children, lambda txid, raw: txid == "b"), 700)
    assert_equal(in_transit_fee(children, lambda txid, raw: False), 0)
