"""The signer's own-address set (signer.own_addresses), decided from its keys alone: every tier
and branch it covers, both chains, any spelling, and where its windows end."""
from __future__ import annotations

from signer.bitcoin_tx import address_to_script
from signer.keys import Secret, SignerKeys, seed_from_text
from signer.own_addresses import (bitcoin_change_scripts, bitcoin_own_scripts, change_indexes, ethereum_own_addresses,
                                  pays_own_address)
from signer.service import Signer

KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
SIGNER = Signer(None, KEYS, bitcoin_network="regtest")  # no database: only derivation is used
TIERS = ("deposit", "hot", "warm")
BTC = bitcoin_own_scripts({t: KEYS.account_xpub("bitcoin", t) for t in TIERS}, "regtest", deposit_window=100) \
    | bitcoin_change_scripts(KEYS.account_xpub("bitcoin", "hot"), "regtest", 50, window=10)
ETH = ethereum_own_addresses({t: KEYS.account_xpub("ethereum", t) for t in TIERS}, deposit_window=100)
OUTSIDE = "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080"


def ours(address: str, script: bytes = b"") -> bool:
    return pays_own_address(address, script, bitcoin_scripts=BTC, ethereum_addresses=ETH, network="regtest")


def btc(tier: str, change: int, index: int) -> str:
    return SIGNER._derive_address(KEYS.account_xpub("bitcoin", tier), change, index)


def eth(tier: str, index: int) -> str:
    from bip_utils import Bip44, Bip44Changes, Bip44Coins
    account = Bip44.FromExtendedKey(KEYS.account_xpub("ethereum", tier), Bip44Coins.ETHEREUM)
    return account.Change(Bip44Changes.CHAIN_EXT).AddressIndex(index).PublicKey().ToAddress()


def test_hot_receive_and_change_around_the_batch_are_ours_in_any_spelling():
    assert ours(btc("hot", 0, 0)) and ours(btc("hot", 0, 0).upper())
    assert ours(btc("hot", 1, 50)) and ours(btc("hot", 1, 40)) and ours(btc("hot", 1, 60))
    assert not ours(btc("hot", 1, 61)) and not ours(btc("hot", 1, 39))  # the window's ends
    assert list(change_indexes(3, 10)) == list(range(0, 14))


def test_deposit_and_warm_branches_within_the_window():
    assert ours(btc("deposit", 0, 0)) and ours(btc("deposit", 0, 99)) and not ours(btc("deposit", 0, 100))
    assert ours(btc("warm", 0, 5))


def test_the_paid_script_counts_not_the_address_it_is_labelled_with():
    hot_script = address_to_script(btc("hot", 0, 0), "regtest")
    assert ours(OUTSIDE, hot_script)
    assert not ours(OUTSIDE) and not ours("not an address")


def test_ethereum_hot_sender_and_deposit_addresses_in_any_case():
    assert ours(eth("hot", 0)) and ours(eth("hot", 0).lower()) and ours(eth("hot", 0).upper().replace("0X", "0x"))
    assert ours(eth("deposit", 42)) and not ours(eth("deposit", 100))
    assert not ours("0x" + "11" * 20)


def test_warm_up_derives_exactly_the_windows_the_signing_check_reads():
    """signer serve warms the own-address windows at start (Signer.warm_up); the check then finds
    every branch it needs already derived: the warm-up uses the signer's own windows."""
    from signer import own_addresses

    warm = Signer(None, KEYS, bitcoin_network="regtest", deposit_window=321, receive_window=7)
    warm.warm_up()
    btc_misses = own_addresses._bitcoin_branch.cache_info().misses
    eth_misses = own_addresses._ethereum_branch.cache_info().misses
    warm._check_not_own(10**6, [])  # no outputs: only the derivation the check does for every batch
    assert own_addresses._ethereum_branch.cache_info().misses == eth_misses
    assert own_addresses._bitcoin_branch.cache_info().misses == btc_misses  # change scripts are derived one by one
