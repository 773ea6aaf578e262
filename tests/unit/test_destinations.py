"""Withdrawal destinations, decided without a database or a node (custody.destinations): addresses
compare in one spelling; zero, burn and precompile addresses are reserved; the refusal table answers
its first code; the derived set holds the hot receive and change addresses, cold and unissued
deposit addresses; the payout call simulated is the one signed. And custody's code table is the
enum, in order, with its statuses."""
from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chain_adapters.ethereum import CallResult
from custody import errors as custody_errors
from custody.addresses import derive_btc_address, derive_eth_address
from custody.destinations import (
    CHANGE_LOOKAHEAD,
    ETH_GAS_ETHER,
    ETH_GAS_TOKEN,
    LOOKAHEAD,
    PRECOMPILE_LIMIT,
    DestinationFacts,
    WalletKey,
    derived_addresses,
    eth_payout_call,
    normalise,
    refusal,
    reserved,
)
from custody.errors import CustodyErrorCode as C
from signer.ethereum_tx import erc20_transfer_data
from signer.keys import Secret, SignerKeys, seed_from_text

KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
EOA = "0x52908400098527886E0F7030069857D2E4169EE7"  # EIP-55 test vector
TOKEN = "0x5FbDB2315678afecb367f032d93F642f64180aa3"


def wallet(chain: str, tier: str, next_index: int = 0, gap_limit: int = 20) -> WalletKey:
    return WalletKey(chain, tier, "regtest", KEYS.account_xpub(chain, tier), next_index, gap_limit)


def test_addresses_compare_in_one_spelling():
    assert normalise("bitcoin", "BCRT1QW508D6QEJXTDG4Y5R3ZARVARY0C5XW7KYGT080") == "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080"
    assert normalise("bitcoin", " bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t4 ") == "bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t4"
    assert normalise("bitcoin", "1BoatSLRHtKNngkdXEeobR76b53LETtpyT") == "1BoatSLRHtKNngkdXEeobR76b53LETtpyT"  # base58: case-bearing
    assert normalise("ethereum", EOA) == EOA.lower()


@pytest.mark.parametrize("address, code", [
    ("0x0000000000000000000000000000000000000000", C.destination_zero_address),
    ("0x000000000000000000000000000000000000dEaD", C.destination_burn_address),
    ("0x000000000000000000000000000000000000DEAD", C.destination_burn_address),
    ("0xdEAD000000000000000042069420694206942069", C.destination_burn_address),
    ("0x0000000000000000000000000000000000000001", C.destination_precompile),  # ecrecover
    ("0x0000000000000000000000000000000000000011", C.destination_precompile),  # the last of Prague's
    ("0x0000000000000000000000000000000000000100", C.destination_precompile),  # P-256 (RIP-7212)
    ("0x000000000000000000000000000000000000fFfF", C.destination_precompile),
    ("0x0000000000000000000000000000000000010000", None),  # 2**16: an ordinary address
    (EOA, None),
    ("0x00000000000000000000000000000000000000", None),  # too short: the format check's business
    ("not an address", None),
])
def test_reserved_ethereum_addresses(address, code):
    assert reserved("ethereum", address) is code


def test_bitcoin_has_no_reserved_addresses():
    assert reserved("bitcoin", "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080") is None
    assert reserved("bitcoin", "0x0000000000000000000000000000000000000000") is None


@given(st.integers(0, 2**160 - 1))
def test_every_address_below_two_to_the_sixteen_is_reserved(n):
    address = "0x" + format(n, "040x")
    assert (reserved("ethereum", address) is None) == (n >= PRECOMPILE_LIMIT and address.lower() not in
                                                       {"0x000000000000000000000000000000000000dead",
                                                        "0xdead000000000000000042069420694206942069"})


def test_the_table_answers_its_first_code():
    ok = DestinationFacts(internal=False)
    assert refusal("ethereum", EOA, ok) is None
    assert refusal("bitcoin", "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080", ok) is None
    assert refusal("ethereum", "0x" + "0" * 40, DestinationFacts(internal=True, token_contract=True)) is C.destination_zero_address
    assert refusal("ethereum", TOKEN, DestinationFacts(internal=True, token_contract=True)) is C.destination_token_contract
    assert refusal("ethereum", EOA, DestinationFacts(internal=True, has_code=True)) is C.destination_internal
    assert refusal("bitcoin", "bcrt1q...", DestinationFacts(internal=True)) is C.destination_internal
    assert refusal("ethereum", EOA, DestinationFacts(False, has_code=True, allowlisted=False)) is C.destination_contract_not_allowlisted
    reverts = DestinationFacts(False, has_code=True, allowlisted=True, simulation=CallResult.REVERTED, hot_covers=True)
    assert refusal("ethereum", EOA, reverts) is C.destination_would_revert


@pytest.mark.parametrize("simulation, hot_covers", [(CallResult.OK, True), (CallResult.UNFUNDED, False),
                                                    (CallResult.REVERTED, False), (None, None)])
def test_an_allowlisted_contract_is_paid_unless_the_funded_payout_reverts(simulation, hot_covers):
    """A revert while the hot wallet cannot cover the payout says nothing about the destination."""
    facts = DestinationFacts(False, has_code=True, allowlisted=True, simulation=simulation, hot_covers=hot_covers)
    assert refusal("ethereum", EOA, facts) is None


def test_derived_addresses_are_hot_receive_and_change_cold_and_unissued_deposit():
    keys = [wallet("bitcoin", "hot"), wallet("bitcoin", "deposit", next_index=3, gap_limit=5),
            wallet("bitcoin", "cold", next_index=2), wallet("ethereum", "hot"), wallet("ethereum", "deposit", next_index=1)]
    derived = derived_addresses(keys, bitcoin_batch_ids=[4, 7], next_batch_id=9, lookahead=3, change_lookahead=3)

    def btc(tier, change, index):
        return derive_btc_address(KEYS.account_xpub("bitcoin", tier), "regtest", change, index)

    def eth(tier, index):
        return derive_eth_address(KEYS.account_xpub("ethereum", tier), index).lower()

    expected = {btc("hot", 0, i) for i in range(3)}  # receive
    expected |= {btc("hot", 1, b) for b in (4, 7, 9, 10, 11)}  # change of every bitcoin batch and the next ids
    expected |= {btc("deposit", 0, i) for i in range(3, 8)}  # not issued yet, up to the gap limit
    expected |= {btc("cold", 0, i) for i in range(5)}  # rebalance destinations and the next ones
    expected |= {eth("hot", i) for i in range(3)} | {eth("deposit", i) for i in range(1, 21)}
    assert derived == expected
    assert btc("deposit", 0, 0) not in derived  # issued: deposit_address answers for it
    assert btc("hot", 1, 8) not in derived  # batch 8 is an ethereum batch: no bitcoin change there


def test_change_addresses_are_refused_much_further_ahead_than_receive_addresses():
    """Anyone with the hot xpub can derive 1/<last batch + n>: the change window is CHANGE_LOOKAHEAD
    batch ids, not LOOKAHEAD."""
    derived = derived_addresses([wallet("bitcoin", "hot")], bitcoin_batch_ids=[], next_batch_id=5)
    change = KEYS.account_xpub("bitcoin", "hot")
    assert derive_btc_address(change, "regtest", 1, 5 + LOOKAHEAD) in derived
    assert derive_btc_address(change, "regtest", 1, 4 + CHANGE_LOOKAHEAD) in derived
    assert derive_btc_address(change, "regtest", 1, 5 + CHANGE_LOOKAHEAD) not in derived
    assert derive_btc_address(change, "regtest", 0, LOOKAHEAD) not in derived


def test_the_simulated_call_is_the_signed_call():
    ether = eth_payout_call(None, EOA, 5 * 10**17)
    assert (ether.to, ether.value, ether.data, ether.gas) == (EOA, 5 * 10**17, b"", ETH_GAS_ETHER)
    token = eth_payout_call(TOKEN, EOA, 1_234_567)
    assert (token.to, token.value, token.data, token.gas) == (TOKEN, 0, erc20_transfer_data(EOA, 1_234_567), ETH_GAS_TOKEN)


def test_custody_code_table_is_the_enum_in_order():
    rows = re.findall(r"^\| (\w+) \| (\d{3}) \| (.+?) \|$", custody_errors.__doc__, re.M)
    assert [(name, int(status)) for name, status, _ in rows] == [(c.value, c.http_status) for c in custody_errors.CustodyErrorCode]
