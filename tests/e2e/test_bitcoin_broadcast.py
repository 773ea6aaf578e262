"""bitcoin_broadcast: a P2WPKH spend built and signed with python-bitcoinlib is accepted through
the adapter; a second (and third, after mining) broadcast is success with no second effect.
"""
from __future__ import annotations

from regtest.util import assert_equal
from tests.e2e import txbuild


def test_p2wpkh_broadcast_twice_one_effect(bitcoind, btc, btc_adapter, log):
    ad = btc_adapter
    dest = btc.new_address("p2wpkh-dest")
    key, utxo = btc.funded_key(3_000_000)
    assert_equal(ad.unspent([key.address]), [utxo])
    raw = txbuild.spend_p2wpkh(key, utxo.txid, utxo.index, utxo.amount,
                               [(dest, 2_000_000), (key.address, utxo.amount - 2_002_000)])
    first = ad.broadcast(raw)
    log.info("Accepted %s; broadcast again while in the mempool", first.txid)
    second = ad.broadcast(raw)
    assert_equal((first.already_known, second.already_known, second.txid), (False, True, first.txid))
    assert_equal(bitcoind.rpc("getrawmempool").count(first.txid), 1)
    bitcoind.mine(1)
    assert_equal(ad.broadcast(raw).already_known, True)
    [paid] = ad.unspent([dest])
    assert_equal((paid.txid, paid.amount, paid.address), (first.txid, 2_000_000, dest))
    [change] = ad.unspent([key.address])
    assert_equal(change.amount, utxo.amount - 2_002_000)


def test_fee_estimate_falls_back_without_history(btc_adapter):
    fee = btc_adapter.estimate_fee(2)
    assert fee.source in ("node", "fallback") and fee.sat_per_kvb > 0
    if fee.source == "fallback":
        assert_equal(fee.sat_per_kvb, btc_adapter.fallback_fee_sat_per_kvb)
