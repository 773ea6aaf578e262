"""signer_transactions: transactions built and signed by signer.bitcoin_tx / signer.ethereum_tx are
accepted by the real nodes, pay exactly what they say, and can be replaced by a higher fee.

- bitcoin: a 20-output batch plus change from 3 P2WPKH coins of the signer's hot wallet passes
  testmempoolaccept (our vsize and fee are the node's), is broadcast through the adapter, mined,
  and every output is found with its exact amount and address; a second batch is replaced by RBF
  (same inputs, higher fee) and only the replacement confirms.
- ethereum: an ether transfer and an ERC-20 transfer signed from the signer's hot key are mined
  with exact amounts and exact gas costs; a same-nonce replacement with higher fees displaces
  the pending one.

Keys come from the BIP84/BIP44 test mnemonic ("abandon" x11 "about"), hot tier, at indices from
KEY_INDEX up: far above any gap-limited range custody's own tests scan in the same session, so
these coins and nonces never show up in custody's hot wallet.
"""
from __future__ import annotations

import hashlib

import pytest
from bip_utils import SegwitBech32Encoder
from eth_account import Account

from chain_adapters.base import TxState
from chain_adapters.bitcoin import to_sat
from custody.addresses import derive_btc_address, derive_eth_address
from regtest import control
from regtest.util import assert_equal
from signer.bitcoin_tx import (
    PayOutput,
    SpendInput,
    address_to_script,
    estimate_vsize,
    pay_output,
    select_coins,
    sign_batch,
)
from signer.ethereum_tx import erc20_transfer_data, sign_eip1559
from signer.keys import Secret, SignerKeys, seed_from_text
from tests.e2e import txbuild

MNEMONIC = "abandon " * 11 + "about"
KEY_INDEX = 700_000
NETWORK = "regtest"
COIN = 1_000_000  # each funded input, sat
ETHER = 10**18


@pytest.fixture(scope="module")
def keys() -> SignerKeys:
    return SignerKeys(seed_from_text(Secret(MNEMONIC)), NETWORK)


def _hot_address(keys: SignerKeys, change: int, index: int) -> str:
    return derive_btc_address(keys.account_xpub("bitcoin", "hot"), NETWORK, change, index)


def _fund_hot_coins(bitcoind, keys: SignerKeys, indices: range, log) -> list[SpendInput]:
    """One confirmed COIN-sized output to each hot receive address at `indices`."""
    coins = []
    for index in indices:
        address = _hot_address(keys, 0, index)
        txid = bitcoind.fund(address, COIN)
        [out] = [o for o in bitcoind.rpc("getrawtransaction", txid, True)["vout"]
                 if o["scriptPubKey"].get("address") == address]
        coins.append(SpendInput(txid, out["n"], to_sat(out["value"]),
                                keys.private_key_for("bitcoin", "hot", 0, index),
                                bytes.fromhex(out["scriptPubKey"]["hex"])))
    bitcoind.mine(1)
    log.info("Funded %d hot coins of %d sat at indices %d..%d", len(coins), COIN, indices[0], indices[-1])
    return coins


def _destinations(bitcoind, label: str) -> list[str]:
    """20 destinations of every payable kind: 14 P2WPKH and 4 P2TR from the node's wallet, 2 P2WSH."""
    p2wpkh = [bitcoind.wallet("getnewaddress", f"{label}-{i}", "bech32") for i in range(14)]
    p2tr = [bitcoind.wallet("getnewaddress", f"{label}-tr-{i}", "bech32m") for i in range(4)]
    p2wsh = [SegwitBech32Encoder.Encode("bcrt", 0, hashlib.sha256(f"{label}-wsh-{i}".encode()).digest())
             for i in range(2)]
    return p2wpkh + p2tr + p2wsh


def _batch(bitcoind, keys, coins, label, rate, change_index):
    outputs = [pay_output(a, 100_000 + 1_000 * i, NETWORK) for i, a in enumerate(_destinations(bitcoind, label))]
    change_address = _hot_address(keys, 1, change_index)
    change_script = address_to_script(change_address, NETWORK)
    target = sum(o.amount for o in outputs)
    chosen, change_amount, fee = select_coins(coins, target, rate, [o.script for o in outputs], change_script)
    assert_equal(len(chosen), 3)  # 2.19M sat of payments need all three 1M coins
    signed = sign_batch(chosen, outputs, NETWORK, change=PayOutput(change_address, change_amount, change_script))
    assert_equal(signed.fee, fee)
    return outputs, change_address, change_amount, signed


def _assert_paid(bitcoind, txid: str, expected: list[tuple[str, int]]) -> None:
    """Every output of the confirmed `txid` is unspent with exactly the expected address and amount."""
    tx = bitcoind.rpc("getrawtransaction", txid, True)
    assert tx["confirmations"] >= 1
    assert_equal(len(tx["vout"]), len(expected))
    for n, (address, amount) in enumerate(expected):
        out = bitcoind.rpc("gettxout", txid, n)
        assert_equal((out["scriptPubKey"]["address"], to_sat(out["value"])), (address, amount))


def test_batch_of_20_plus_change_is_accepted_and_mined(bitcoind, btc_adapter, keys, log):
    coins = _fund_hot_coins(bitcoind, keys, range(KEY_INDEX, KEY_INDEX + 3), log)
    rate = 2_000  # sat per 1000 vB
    outputs, change_address, change, signed = _batch(bitcoind, keys, coins, "batch", rate, KEY_INDEX)
    log.info("Signed %s: 3 inputs, 21 outputs, %d vB, fee %d sat", signed.txid, signed.vsize, signed.fee)
    assert signed.fee * 1000 >= rate * signed.vsize
    assert signed.vsize <= estimate_vsize(3, [o.script for o in outputs] + [address_to_script(change_address, NETWORK)])

    [verdict] = bitcoind.rpc("testmempoolaccept", [signed.raw.hex()])
    assert verdict["allowed"], verdict
    assert_equal((verdict["txid"], verdict["vsize"], to_sat(verdict["fees"]["base"])),
                 (signed.txid, signed.vsize, signed.fee))

    log.info("Broadcast through the adapter and mine")
    result = btc_adapter.broadcast(signed.raw)
    assert_equal((result.txid, result.already_known), (signed.txid, False))
    bitcoind.mine(1)
    assert_equal(btc_adapter.tx_status(signed.txid).state, TxState.CONFIRMED)
    _assert_paid(bitcoind, signed.txid, [(o.address, o.amount) for o in outputs] + [(change_address, change)])
    for coin in coins:
        assert bitcoind.rpc("gettxout", coin.txid, coin.vout) is None  # spent
    log.info("All 20 payments and the change are on chain with exact amounts")


def test_batch_replaced_by_fee(bitcoind, btc_adapter, keys, log):
    coins = _fund_hot_coins(bitcoind, keys, range(KEY_INDEX + 3, KEY_INDEX + 6), log)
    outputs, change_address, _, first = _batch(bitcoind, keys, coins, "rbf", 2_000, KEY_INDEX + 1)
    assert_equal(btc_adapter.broadcast(first.raw).txid, first.txid)
    assert_equal(btc_adapter.tx_status(first.txid).state, TxState.MEMPOOL)
    log.info("First version %s pays %d sat (%d vB); bump to 10 sat/vB", first.txid, first.fee, first.vsize)

    chosen, change, fee = select_coins(coins, sum(o.amount for o in outputs), 10_000, [o.script for o in outputs],
                                       address_to_script(change_address, NETWORK))
    assert_equal(sorted((c.txid, c.vout) for c in chosen), sorted((c.txid, c.vout) for c in coins))
    second = sign_batch(chosen, outputs, NETWORK, change=PayOutput(change_address, change))
    assert second.fee > first.fee and second.txid != first.txid

    [verdict] = bitcoind.rpc("testmempoolaccept", [second.raw.hex()])
    assert verdict["allowed"], verdict  # testmempoolaccept evaluates replacements too
    assert_equal(btc_adapter.broadcast(second.raw).txid, second.txid)
    replaced = btc_adapter.tx_status(first.txid, raw=first.raw)
    assert_equal((replaced.state, replaced.replaced_by), (TxState.REPLACED, second.txid))
    assert_equal(btc_adapter.tx_status(second.txid).state, TxState.MEMPOOL)

    bitcoind.mine(1)
    assert_equal(btc_adapter.tx_status(second.txid).state, TxState.CONFIRMED)
    assert_equal(btc_adapter.tx_status(first.txid, raw=first.raw).state, TxState.CONFLICTED)
    _assert_paid(bitcoind, second.txid, [(o.address, o.amount) for o in outputs] + [(change_address, change)])
    log.info("Only the replacement %s (fee %d sat) confirmed", second.txid, second.fee)


# --- ethereum ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def eth_hot(keys, anvil, usdt):
    """(private key, address) of the hot ethereum key at KEY_INDEX, funded with ether and USDT."""
    key = keys.private_key_for("ethereum", "hot", 0, KEY_INDEX)
    address = derive_eth_address(keys.account_xpub("ethereum", "hot"), KEY_INDEX)
    assert_equal(Account.from_key(key).address, address)
    anvil.fund(address, 10 * ETHER)
    usdt.mint(address, 1_000 * 10**6)
    return key, address


def _gas_cost(anvil, txid: str) -> int:
    receipt = anvil.w3.eth.get_transaction_receipt(txid)
    assert_equal(receipt["status"], 1)
    return receipt["gasUsed"] * receipt["effectiveGasPrice"]


def test_ether_transfer_mined_exactly(anvil, eth_adapter, eth_hot, log):
    key, sender = eth_hot
    to = txbuild.eth_new_address("signer-ether")
    fee = eth_adapter.estimate_fee()
    before = eth_adapter.balance(sender)
    value = 123_456_789_000_000_007
    signed = sign_eip1559(key, chain_id=eth_adapter.chain_id, nonce=eth_adapter.nonce(sender), to=to, value=value,
                          gas=21_000, max_fee_wei=fee.max_fee_wei, priority_fee_wei=fee.priority_fee_wei)
    assert_equal(signed.sender, sender)
    assert_equal(eth_adapter.broadcast(signed.raw).txid, signed.txid)
    anvil.wait_mined(signed.txid)
    cost = _gas_cost(anvil, signed.txid)
    assert_equal(eth_adapter.balance(to), value)
    assert_equal(eth_adapter.balance(sender), before - value - cost)
    log.info("Ether transfer %s mined: %d wei paid, %d wei gas", signed.txid, value, cost)


def test_erc20_transfer_mined_exactly(anvil, eth_adapter, usdt, eth_hot, log):
    key, sender = eth_hot
    to = txbuild.eth_new_address("signer-usdt")
    amount = 12_345_678  # 12.345678 USDT
    fee = eth_adapter.estimate_fee()
    ether_before, tokens_before = eth_adapter.balance(sender), usdt.balance_of(sender)
    signed = sign_eip1559(key, chain_id=eth_adapter.chain_id, nonce=eth_adapter.nonce(sender), to=usdt.address,
                          value=0, data=erc20_transfer_data(to, amount), gas=100_000,
                          max_fee_wei=fee.max_fee_wei, priority_fee_wei=fee.priority_fee_wei)
    assert_equal(eth_adapter.broadcast(signed.raw).txid, signed.txid)
    anvil.wait_mined(signed.txid)
    cost = _gas_cost(anvil, signed.txid)
    assert_equal(usdt.balance_of(to), amount)
    assert_equal(usdt.balance_of(sender), tokens_before - amount)
    assert_equal(eth_adapter.balance(sender), ether_before - cost)
    log.info("ERC-20 transfer %s mined: %d units, %d wei gas", signed.txid, amount, cost)


def test_same_nonce_replacement(anvil, eth_adapter, eth_hot, log):
    key, sender = eth_hot
    to = txbuild.eth_new_address("signer-replace")
    fee = eth_adapter.estimate_fee()
    tip = max(fee.priority_fee_wei, 1)  # doubling a zero tip would not be a bump
    common = dict(chain_id=eth_adapter.chain_id, to=to, gas=21_000)
    with control.manual_mining(anvil):
        nonce = eth_adapter.nonce(sender)
        first = sign_eip1559(key, nonce=nonce, value=1_000, max_fee_wei=fee.max_fee_wei + tip,
                             priority_fee_wei=tip, **common)
        eth_adapter.broadcast(first.raw)
        log.info("Pending %s at nonce %d; replace it with doubled fees", first.txid, nonce)
        second = sign_eip1559(key, nonce=nonce, value=2_000, max_fee_wei=2 * (fee.max_fee_wei + tip),
                              priority_fee_wei=2 * tip, **common)
        assert_equal(eth_adapter.broadcast(second.raw).txid, second.txid)
        assert_equal(eth_adapter.tx_status(first.txid, raw=first.raw).state, TxState.REPLACED)
        assert_equal(eth_adapter.tx_status(second.txid).state, TxState.MEMPOOL)
        anvil.mine(1)
    assert_equal(eth_adapter.tx_status(second.txid).state, TxState.CONFIRMED)
    assert_equal(eth_adapter.tx_status(first.txid, raw=first.raw).state, TxState.CONFLICTED)
    assert_equal(eth_adapter.balance(to), 2_000)
    assert_equal(eth_adapter.nonce(sender), nonce + 1)
