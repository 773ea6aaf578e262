"""bitcoin_rbf: a Python-signed deposit is replaced by a higher-fee spend of the same input.

The replaced transaction is reported as replaced (naming the live one), the replacement as live,
a re-broadcast of the replaced one is refused with `insufficient_fee`, and once mined only the
replacement's output is observed.
"""
from __future__ import annotations

from chain_adapters.base import TxState, Watch
from chain_adapters.errors import ErrorCode
from regtest.util import assert_equal, assert_raises_code
from tests.e2e import txbuild


def test_bitcoin_rbf_replaced_and_live(bitcoind, btc, btc_adapter, log):
    ad = btc_adapter
    dest = btc.new_address("rbf-dest")
    key, utxo = btc.funded_key(2_000_000)
    cursor = ad.tip()

    log.info("A zero-fee spend is refused with insufficient_fee")
    free = txbuild.spend_p2wpkh(key, utxo.txid, utxo.index, utxo.amount, [(dest, utxo.amount)])
    assert_raises_code(ErrorCode.INSUFFICIENT_FEE, ad.broadcast, free)

    t1 = txbuild.spend_p2wpkh(key, utxo.txid, utxo.index, utxo.amount, [(dest, 1_500_000), (key.address, utxo.amount - 1_501_000)])
    t1_txid = ad.broadcast(t1).txid
    log.info("T1 %s (fee 1,000 sat) waits in the mempool", t1_txid)
    assert_equal(ad.tx_status(t1_txid).state, TxState.MEMPOOL)

    t2 = txbuild.spend_p2wpkh(key, utxo.txid, utxo.index, utxo.amount, [(dest, 1_500_000), (key.address, utxo.amount - 1_510_000)])
    t2_txid = ad.broadcast(t2).txid
    log.info("T2 %s (fee 10,000 sat) replaces it", t2_txid)
    replaced = ad.tx_status(t1_txid, raw=t1)
    assert_equal((replaced.state, replaced.replaced_by), (TxState.REPLACED, t2_txid))
    assert_equal(ad.tx_status(t2_txid).state, TxState.MEMPOOL)
    assert_equal(ad.tx_status(t1_txid).state, TxState.UNKNOWN)  # without the raw tx: forgotten

    log.info("Re-broadcasting T1 cannot displace T2")
    assert_raises_code(ErrorCode.INSUFFICIENT_FEE, ad.broadcast, t1)

    bitcoind.mine(1)
    assert_equal(ad.tx_status(t2_txid).state, TxState.CONFIRMED)
    assert_equal(ad.tx_status(t1_txid, raw=t1).state, TxState.CONFLICTED)
    [obs] = ad.scan(cursor, Watch(frozenset({dest}))).observations
    assert_equal((obs.txid, obs.amount), (t2_txid, 1_500_000))
