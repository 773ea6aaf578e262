"""withdrawal_crash: a crash between signing and recording, and between broadcasting and recording,
is followed by a restart (fresh service objects on the same database and nodes); each withdrawal is
paid exactly once on chain and the books are exact."""
from __future__ import annotations

from decimal import Decimal

import pytest
from sqlalchemy import text

from custody.container import Container
from regtest.util import assert_equal
from tests.e2e.custody.conftest import BTC_FINALITY
from tests.e2e.custody.test_withdrawal_signer_refusals import fund


class Crash(BaseException):
    """Stands for the process dying: not an Exception, so no handler of ours swallows it."""


def restart(custody, signer_keys) -> Container:
    fresh = Container(settings=custody.settings, engine=custody.engine, ledger=custody.ledger)
    return fresh.with_chains(custody.adapters, signer_keys=signer_keys)


def paid_to(bitcoind, dest) -> tuple[int, int]:
    """(satoshis received, number of transactions paying) for `dest`, mempool included."""
    [entry] = [e for e in bitcoind.wallet("listreceivedbyaddress", 0, True, True) if e["address"] == dest] or [{"amount": 0, "txids": []}]
    return int(Decimal(str(entry["amount"])) * 100_000_000), len(entry["txids"])


def test_crash_after_signing_before_recording(custody, customer, bitcoind, signer_keys, engine, ledger, log, monkeypatch):
    [acct] = fund(custody, customer, bitcoind, 1)
    dest = bitcoind.wallet("getnewaddress", "", "bech32")
    wd = custody.withdrawals.request(client_withdrawal_id="crash-1", account_id=acct, amount=7_000_000, destination=dest,
                                     requested_by="backend")
    p = custody.payouts
    batch = p.batch_bitcoin()

    def die(*a, **k):
        raise Crash()

    monkeypatch.setattr(p, "_record_signed", die)
    log.info("the signer signs; the process dies before the signed transaction is stored")
    with pytest.raises(Crash):
        p.sign_open_batches()
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT count(*) FROM chain_transaction WHERE batch_id = :b"), {"b": batch}).scalar_one(), 0)
    assert_equal(ledger.balance(acct).held, 7_005_000)

    log.info("restart: the open batch is signed again, stored, broadcast once")
    again = restart(custody, signer_keys).payouts
    [txid] = again.sign_open_batches()
    assert_equal(again.broadcast(), 1)
    bitcoind.mine(BTC_FINALITY)
    again.track()
    assert_equal(custody.withdrawals.get(wd.id).state, "final")
    assert_equal(paid_to(bitcoind, dest), (7_000_000, 1))
    assert_equal(ledger.balance(acct).posted, 100_000_000 - 7_005_000)


def test_crash_after_broadcast_before_recording(custody, customer, bitcoind, signer_keys, engine, ledger, log, monkeypatch):
    [acct] = fund(custody, customer, bitcoind, 1)
    dest = bitcoind.wallet("getnewaddress", "", "bech32")
    wd = custody.withdrawals.request(client_withdrawal_id="crash-2", account_id=acct, amount=8_000_000, destination=dest,
                                     requested_by="backend")
    p = custody.payouts
    p.batch_bitcoin()
    [txid] = p.sign_open_batches()
    adapter = p.adapters["bitcoin"]
    real = adapter.broadcast

    def send_then_die(raw):
        real(raw)
        raise Crash()

    monkeypatch.setattr(adapter, "broadcast", send_then_die)
    log.info("the node accepts the transaction; the process dies before recording it")
    with pytest.raises(Crash):
        p.broadcast()
    monkeypatch.setattr(adapter, "broadcast", real)
    assert txid in bitcoind.rpc("getrawmempool")
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT state FROM chain_transaction WHERE txid = :t"), {"t": txid}).scalar_one(), "signed")

    log.info("restart: the same bytes are sent again, the node answers already known; one payment")
    again = restart(custody, signer_keys).payouts
    assert_equal(again.broadcast(), 1)
    bitcoind.mine(BTC_FINALITY)
    again.track()
    again.track()
    assert_equal(custody.withdrawals.get(wd.id).state, "final")
    assert_equal(paid_to(bitcoind, dest), (8_000_000, 1))
    with engine.connect() as c:
        finals = c.execute(text("SELECT count(*) FROM journal_transaction WHERE idempotency_key = :k"),
                           {"k": f"batch:{custody.withdrawals.get(wd.id).batch_id}:final"}).scalar_one()
    assert_equal(finals, 1)
