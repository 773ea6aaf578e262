"""ethereum_deposits: ether and ERC-20 (6 decimals) deposits to watched addresses are reported
with exact amounts; transfers to other addresses, to other tokens' holders and reverted
transactions are not.
"""
from __future__ import annotations

import pytest
from web3 import Web3

from chain_adapters.base import TxState, Watch
from regtest.util import assert_equal
from tests.e2e import txbuild


def test_ether_and_token_deposits_exact(anvil, usdt, eth_adapter, log):
    ad = eth_adapter
    alice, bob, stranger = (txbuild.eth_new_address(n) for n in ("alice", "bob", "stranger"))
    watch = Watch(frozenset({alice, bob}), tokens=ad.tokens)
    cursor = ad.tip()
    log.info("Ether: 1 wei, and 3.141592653589793238 ETH; tokens: 0.000001 and 1,000,000.123456 USDT")
    e1 = anvil.fund(alice, 1)
    e2 = anvil.fund(bob, 3_141_592_653_589_793_238)
    t1 = usdt.mint(alice, 1)
    t2 = usdt.mint(bob, 1_000_000_123_456)
    log.info("Noise: payments to an unwatched address")
    anvil.fund(stranger, 10**18)
    usdt.mint(stranger, 5)
    result = ad.scan(cursor, watch)
    got = sorted((o.asset, o.txid, o.address, o.amount) for o in result.observations)
    assert_equal(got, sorted([("ETH", e1, alice, 1), ("ETH", e2, bob, 3_141_592_653_589_793_238),
                              ("USDT", t1, alice, 1), ("USDT", t2, bob, 1_000_000_123_456)]))
    assert_equal(usdt.balance_of(bob), 1_000_000_123_456)
    assert_equal(usdt.contract.functions.decimals().call(), 6)


def test_reverted_transaction_is_not_a_deposit(anvil, usdt, eth_adapter, log):
    ad = eth_adapter
    token_holder = txbuild.eth_new_address("no-funds")
    watch = Watch(frozenset({Web3.to_checksum_address(usdt.address)}), tokens=ad.tokens)
    cursor = ad.tip()
    log.info("A transaction carrying value to the token contract reverts (no payable function)")
    sender = txbuild.eth_address(txbuild.ETH_DEV_KEY_1)
    fee = ad.estimate_fee()
    raw = txbuild.eip1559_transfer(txbuild.ETH_DEV_KEY_1, to=usdt.address, value=5, gas=100_000,
                                   nonce=ad.nonce(sender), chain_id=ad.chain_id,
                                   max_fee=fee.max_fee_wei, priority_fee=fee.priority_fee_wei)
    sent = ad.broadcast(raw)
    anvil.wait_mined(sent.txid)
    status = ad.tx_status(sent.txid)
    assert_equal((status.state, status.reverted), (TxState.CONFIRMED, True))
    assert_equal(ad.scan(cursor, watch).observations, [])
    assert token_holder


@pytest.mark.parametrize("pending", [True, False])
def test_nonce(anvil, eth_adapter, pending):
    sender = txbuild.eth_address(txbuild.ETH_DEV_KEY_1)
    assert_equal(eth_adapter.nonce(sender, pending=pending), anvil.w3.eth.get_transaction_count(sender))
