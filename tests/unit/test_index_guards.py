"""The pure decisions behind the wallet index's guards and the node view's escalation (issue 13,
review R1): `follow` (ids committed out of order are looked for until they appear or a window
passes), `deposit_address_refusal` and `rebalance_refusal` (a row is watched only when our key
derives its address at an index that was handed out), `blind_severity` (warning, then critical)."""
from __future__ import annotations

from types import SimpleNamespace

from custody.addresses import derive_btc_address
from custody.reconciliation import blind_severity
from custody.wallet_index import Ours, deposit_address_refusal, follow, rebalance_refusal
from regtest.util import assert_equal
from signer.keys import Secret, SignerKeys, seed_from_text

KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
DEPOSIT = SimpleNamespace(id=1, chain="bitcoin", tier="deposit", xpub=KEYS.account_xpub("bitcoin", "deposit"),
                          network="regtest", next_index=5)
COLD = SimpleNamespace(id=3, chain="bitcoin", tier="cold", xpub=KEYS.account_xpub("bitcoin", "cold"), network="regtest",
                       next_index=2)


def test_follow_keeps_looking_for_a_skipped_id_until_it_commits():
    last, gaps, dropped = follow(0, [], [1, 2, 4, 7], now=0.0)
    assert_equal((last, gaps, dropped), (7, [(3, 3, 0.0), (5, 6, 0.0)], []))
    last, gaps, dropped = follow(last, gaps, [5, 8], now=10.0)  # 5 committed late; 8 is new
    assert_equal((last, gaps, dropped), (8, [(3, 3, 0.0), (6, 6, 0.0)], []))
    last, gaps, dropped = follow(last, gaps, [], now=4000.0)  # never committed (rolled back): given up
    assert_equal((last, gaps, dropped), (8, [], [(3, 3), (6, 6)]))


def test_follow_holds_a_large_jump_as_one_range():
    last, gaps, _ = follow(10, [], [1_000_010], now=0.0)
    assert_equal((last, gaps), (1_000_010, [(11, 1_000_009, 0.0)]))


def _row(address: str, index: int, wallet_id: int = 1):
    return SimpleNamespace(id=9, chain="bitcoin", wallet_id=wallet_id, address=address, derivation_index=index)


def test_a_deposit_row_is_watched_only_as_the_deposit_keys_derivation_at_a_handed_out_index():
    good = derive_btc_address(DEPOSIT.xpub, "regtest", 0, 3)
    assert deposit_address_refusal(_row(good, 3), DEPOSIT, None) is None
    assert "derives" in deposit_address_refusal(_row(good, 4), DEPOSIT, None)  # another index's address
    hot = derive_btc_address(KEYS.account_xpub("bitcoin", "hot"), "regtest", 0, 0)
    assert "derives" in deposit_address_refusal(_row(hot, 3), DEPOSIT, None)
    later = derive_btc_address(DEPOSIT.xpub, "regtest", 0, 7)
    assert "never handed out" in deposit_address_refusal(_row(later, 7), DEPOSIT, None)
    assert "deposit wallet" in deposit_address_refusal(_row(good, 3, wallet_id=3), COLD, None)
    assert "deposit wallet" in deposit_address_refusal(_row(good, 3), None, None)
    assert "hot tier" in deposit_address_refusal(_row(good, 3), DEPOSIT, Ours("hot", 0, 0))


def test_a_rebalance_destination_is_watched_only_as_the_cold_keys_derivation():
    def rebalance(destination: str, index: int, tier: str = "cold"):
        return SimpleNamespace(id=4, chain="bitcoin", destination_tier=tier, destination=destination, destination_index=index)
    good = derive_btc_address(COLD.xpub, "regtest", 0, 1)
    assert rebalance_refusal(rebalance(good, 1), COLD, None) is None
    assert "derives" in rebalance_refusal(rebalance(derive_btc_address(DEPOSIT.xpub, "regtest", 0, 1), 1), COLD, None)
    assert "never handed out" in rebalance_refusal(rebalance(derive_btc_address(COLD.xpub, "regtest", 0, 2), 2), COLD, None)
    assert "cold wallet" in rebalance_refusal(rebalance(good, 1), None, None)
    assert "warm wallet" in rebalance_refusal(rebalance(good, 1, tier="warm"), COLD, None)  # the cold key is not warm's
    warm = SimpleNamespace(id=5, chain="bitcoin", tier="warm", xpub=KEYS.account_xpub("bitcoin", "warm"), network="regtest",
                           next_index=1)
    assert rebalance_refusal(rebalance(derive_btc_address(warm.xpub, "regtest", 0, 0), 0, tier="warm"), warm, None) is None
    assert "hot wallet" in rebalance_refusal(rebalance(good, 1, tier="hot"), COLD, None)


def test_a_blind_node_view_escalates_from_nothing_to_warning_to_critical():
    assert_equal([blind_severity(s, 300, 1800) for s in (0, 299.9, 300, 1799, 1800, 10**6)],
                 [None, None, "warning", "warning", "critical", "critical"])
