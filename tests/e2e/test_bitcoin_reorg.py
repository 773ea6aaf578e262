"""bitcoin_reorg: invalidateblock undoes two blocks carrying deposits; a longer competing chain
re-mines one deposit and double-spends the other.

The adapter must report the fork point, both orphaned outputs, and the re-mined output again
(same key, new block); the double-spent deposit is reported as conflicted.
"""
from __future__ import annotations

from chain_adapters.base import TxState, Watch
from regtest.util import assert_equal, wait_until
from tests.e2e import txbuild


def test_bitcoin_reorg_orphans_and_remines(bitcoind, btc, btc_adapter, log):
    ad = btc_adapter
    w1, w2, elsewhere = btc.new_address("w1"), btc.new_address("w2"), btc.new_address("elsewhere")
    watch = Watch(frozenset({w1, w2}))
    key, utxo = btc.funded_key(1_000_000)
    fork = ad.tip()

    log.info("Block %d: the faucet pays 0.5 BTC to w1", fork.height + 1)
    a_txid = bitcoind.fund(w1, 50_000_000)
    bitcoind.mine(1)
    log.info("Block %d: a Python-signed P2WPKH pays 600,000 sat to w2", fork.height + 2)
    b_raw = txbuild.spend_p2wpkh(key, utxo.txid, utxo.index, utxo.amount,
                                 [(w2, 600_000), (key.address, utxo.amount - 601_000)])
    b_txid = ad.broadcast(b_raw).txid
    bitcoind.mine(1)
    first = ad.scan(fork, watch)
    assert_equal(sorted((o.txid, o.amount) for o in first.observations),
                 sorted([(a_txid, 50_000_000), (b_txid, 600_000)]))
    old_blocks = [b.ref for b in first.blocks]

    log.info("invalidateblock %s: both blocks leave the main chain, their txs return to the mempool",
             old_blocks[0].hash)
    bitcoind.rpc("invalidateblock", old_blocks[0].hash)
    wait_until(lambda: b_txid in bitcoind.rpc("getrawmempool"), what="B back in the mempool")
    log.info("Double-spend B's input with a higher fee, paying an unwatched address")
    b2_raw = txbuild.spend_p2wpkh(key, utxo.txid, utxo.index, utxo.amount,
                                  [(elsewhere, utxo.amount - 20_000)])
    b2_txid = ad.broadcast(b2_raw).txid
    log.info("Mine a longer competing chain (3 blocks) to a different address")
    bitcoind.mine(3, address=btc.new_address("other-miner"))

    second = ad.scan(first.cursor, watch)
    assert second.reorg is not None
    assert_equal(second.reorg.fork_point, fork)
    assert_equal(list(second.reorg.undone), old_blocks[::-1])
    assert_equal(sorted(o.txid for o in second.reorg.orphaned), sorted([a_txid, b_txid]))
    log.info("The faucet payment was re-mined: reported again in its new block")
    [again] = second.observations
    assert_equal((again.txid, again.address, again.amount), (a_txid, w1, 50_000_000))
    assert again.block not in old_blocks
    assert_equal(second.cursor, ad.tip())
    assert_equal(ad.tx_status(b_txid, raw=b_raw).state, TxState.CONFLICTED)
    assert_equal(ad.tx_status(b2_txid).state, TxState.CONFIRMED)
