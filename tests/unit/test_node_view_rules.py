"""custody.node_view's pure decisions (wallet names, descriptors, when a range is widened, from
when an import rescans) and bitcoind's one-at-a-time refusals mapped to NodeBusy."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from chain_adapters.bitcoin import bitcoind_error
from chain_adapters.errors import ErrorCode, NodeBusy, RpcError
from custody.addresses import canonical_btc_account_key
from custody.node_view import branches, new_end, rescan_from, wallet_name
from regtest.util import assert_equal
from signer.keys import Secret, SignerKeys, seed_from_text

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
XPUBS = {tier: canonical_btc_account_key(KEYS.account_xpub("bitcoin", tier), "regtest") for tier in ("deposit", "hot", "cold")}


def test_busy_refusals_become_node_busy_and_other_errors_stay_rpc_errors():
    busy = bitcoind_error(-8, 'Scan already in progress, use action "abort" or "status"')
    assert isinstance(busy, NodeBusy)
    assert_equal(busy.code, ErrorCode.NODE_BUSY)
    assert isinstance(bitcoind_error(-4, "Wallet is currently rescanning. Abort existing rescan or wait."), NodeBusy)
    other = bitcoind_error(-8, "Block height out of range")
    assert type(other) is RpcError and other.rpc_code == -8
    assert type(bitcoind_error(-4, "Insufficient funds")) is RpcError


def test_the_wallet_name_is_deterministic_and_differs_per_deployment():
    one = wallet_name("regtest", XPUBS["deposit"], XPUBS["hot"], "2025-01-01T00:00:00.000001")
    assert_equal(one, wallet_name("regtest", XPUBS["deposit"], XPUBS["hot"], "2025-01-01T00:00:00.000001"))
    assert one != wallet_name("regtest", XPUBS["deposit"], XPUBS["hot"], "2025-01-01T00:00:00.000002")
    assert one.startswith("custody-view-")


def test_descriptors_are_in_bip32_form_one_per_tier_and_branch():
    found = branches("regtest", XPUBS)
    assert_equal([(b.tier, b.branch) for b in found], [("deposit", 0), ("hot", 0), ("hot", 1), ("cold", 0)])
    for b in found:
        assert b.descriptor.startswith("wpkh(tpub") and b.descriptor.endswith(f"/{b.branch}/*)"), b.descriptor
        assert "#" not in b.descriptor
    assert_equal(len(branches("regtest", {t: XPUBS[t] for t in ("deposit", "hot")})), 3)  # no cold registered
    with pytest.raises(ValueError):
        branches("regtest", {"deposit": XPUBS["hot"], "hot": XPUBS["hot"]})


def test_a_range_is_widened_before_it_is_overtaken():
    assert_equal(new_end(None, -1, 1000), 999)  # first import: nothing issued yet
    assert_equal(new_end(None, 4000, 1000), 5000)  # first import of a deployment with history
    assert new_end(999, 10, 1000) is None  # plenty ahead
    assert new_end(999, 498, 1000) is None  # 501 ahead: still more than half
    assert_equal(new_end(999, 499, 1000), 1499)  # 500 ahead: widen
    assert_equal(new_end(999, 2000, 1000), 3000)  # overtaken (the worker was down): widen past it


def test_an_import_rescans_from_the_first_hand_out_of_a_newly_covered_index_never_later_than_the_read():
    read_at = T0 + timedelta(days=30)
    assert_equal(rescan_from(None, read_at), int(read_at.timestamp()))  # nothing handed out: from the read
    issued = T0 + timedelta(days=2)
    assert_equal(rescan_from(issued, read_at), int(issued.timestamp()))  # overtaken: from the first hand-out
    assert_equal(rescan_from(read_at + timedelta(seconds=5), read_at), int(read_at.timestamp()))


def test_one_issued_rule_for_the_index_and_the_node_view():
    """custody.wallet_index.Issued: hot receive is 0/0 only, hot change 1/<b> once batch b exists,
    deposit and cold 0/<i> below the wallet's next_index; nothing else (branch 1 of deposit)."""
    from custody.wallet_index import Issued

    issued = Issued({"deposit": 5, "cold": 2}, frozenset({3, 9}))
    assert [issued("hot", 0, i) for i in (0, 1)] == [True, False]
    assert [issued("hot", 1, b) for b in (2, 3, 9, 10)] == [False, True, True, False]
    assert [issued("deposit", 0, i) for i in (0, 4, 5)] == [True, True, False]
    assert [issued("cold", 0, i) for i in (1, 2)] == [True, False]
    assert not issued("deposit", 1, 0)
    assert not Issued({}, frozenset())("cold", 0, 0)  # no cold wallet registered: nothing is issued
