"""withdrawal_signer_refusals: the signer refuses a batch whose withdrawal has no decision, an
expired decision, a hold released underneath it, or while the kill switch is on, each with its
code and its own audit record, and nothing reaches the chain; the refused output is dropped and the
rest of the work proceeds."""
from __future__ import annotations

import datetime as dt

import pytest

from sqlalchemy import text

from custody.controls import set_kill_switch
from regtest.util import assert_equal
from tests.e2e.custody.conftest import BTC_FINALITY


def fund(custody, customer, bitcoind, n):
    accounts = [customer("BTC") for _ in range(n)]
    addresses = [custody.wallets.issue_address(f"addr:{a}", a).address for a in accounts]
    bitcoind.wallet("sendmany", "", {a: "1" for a in addresses})
    p = custody.payouts
    bitcoind.fund(p.hot_address("bitcoin"), 10 * 100_000_000)
    bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    p.sync_hot_wallet()
    return accounts


def test_signer_refusals(custody, customer, bitcoind, engine, ledger, log):
    w, p = custody.withdrawals, custody.payouts
    [a, b] = fund(custody, customer, bitcoind, 2)
    dest = bitcoind.wallet("getnewaddress", "", "bech32")
    first = w.request(client_withdrawal_id="refuse-1", account_id=a, amount=1_000_000, destination=dest, requested_by="backend")
    batch = p.batch_bitcoin()
    with engine.connect() as c:
        audit_before = c.execute(text("SELECT count(*) FROM signer_audit")).scalar_one()

    def refused_with(code: str) -> None:
        p.refusals.clear()
        assert_equal(p.sign_open_batches(), [])
        assert_equal(p.refusals, [(batch, code)])
        with engine.connect() as c:
            assert_equal(c.execute(text("SELECT count(*) FROM chain_transaction WHERE batch_id = :b"), {"b": batch}).scalar_one(), 0)
            last = c.execute(text("SELECT outcome, code FROM signer_audit ORDER BY id DESC LIMIT 1")).one()
        assert_equal(tuple(last), ("refused", code))

    log.info("kill switch on: kill_switch_on")
    with engine.begin() as c:
        set_kill_switch(c, True, "test", "op-test")
    refused_with("kill_switch_on")
    with engine.begin() as c:
        set_kill_switch(c, False, "test over", "op-test")

    log.info("signer's clock two days later: decision_expired")
    real_clock = p.signer.clock
    p.signer.clock = lambda: real_clock() + dt.timedelta(days=2)
    try:
        refused_with("decision_expired")
    finally:
        p.signer.clock = real_clock

    log.info("the decision link removed underneath: no_decision")
    with engine.begin() as c:
        c.execute(text("UPDATE withdrawal_request SET decision_id = NULL WHERE id = :w"), {"w": first.id})
    refused_with("no_decision")
    with engine.begin() as c:
        c.execute(text("UPDATE withdrawal_request SET decision_id = :d WHERE id = :w"), {"d": first.decision_id, "w": first.id})

    log.info("the hold released underneath: hold_not_live")
    ledger.release_hold(first.hold_id, owner="withdrawals")
    refused_with("hold_not_live")
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT count(*) FROM signer_audit")).scalar_one(), audit_before + 4)

    log.info("drop the bad output: the batch is abandoned; the next withdrawal is paid normally")
    p.drop_from_batch(batch, first.id, reason="hold_released", retry=False)
    assert_equal(w.get(first.id).state, "rejected")
    assert_equal(ledger.balance(a).held, 0)
    second = w.request(client_withdrawal_id="refuse-2", account_id=b, amount=2_000_000, destination=dest, requested_by="backend")
    assert p.batch_bitcoin() not in (None, batch)
    [txid] = p.sign_open_batches()
    log.info("signed, then the kill switch goes on: nothing is broadcast until it is released")
    with engine.begin() as c:
        set_kill_switch(c, True, "test: halt after signing", "op-test")
    assert_equal(p.broadcast(), 0)
    assert txid not in bitcoind.rpc("getrawmempool")
    with engine.begin() as c:
        set_kill_switch(c, False, "test: released", "op-test")
    assert_equal(p.broadcast(), 1)
    bitcoind.mine(BTC_FINALITY)
    p.track()
    assert_equal(w.get(second.id).state, "final")
    assert_equal(ledger.balance(a).posted, 100_000_000)
    tx = bitcoind.rpc("getrawtransaction", txid, True)
    assert_equal(sorted(o["scriptPubKey"]["address"] for o in tx["vout"] if o["scriptPubKey"]["address"] == dest), [dest])


def test_signer_checks_change_fee_and_what_an_ethereum_call_does(custody, customer, bitcoind, anvil, engine, ledger, log):


    from signer.service import BatchOutput, SigningRefused

    w, p = custody.withdrawals, custody.payouts
    [a] = fund(custody, customer, bitcoind, 1)
    dest = bitcoind.wallet("getnewaddress", "", "bech32")
    wd = w.request(client_withdrawal_id=f"checks-{a}", account_id=a, amount=1_000_000, destination=dest, requested_by="backend")
    batch = p.batch_bitcoin()
    with engine.connect() as c:
        rows, coins, outputs, change = p._bitcoin_plan(c, batch, 10_000)  # noqa: SLF001 - feed the signer bad plans
    log.info("change to an address that is not the batch's own: refused")
    with pytest.raises(SigningRefused) as err:
        p.signer.sign_bitcoin_batch(batch, coins, outputs, (dest, change[1]))
    assert_equal(err.value.code.value, "output_mismatch")
    log.info("a fee far above the ceiling rate (change shrunk to dust-free minimum): refused")
    with pytest.raises(SigningRefused) as err:
        p.signer.sign_bitcoin_batch(batch, coins, outputs, (change[0], 1_000))
    assert_equal(err.value.code.value, "fee_above_ceiling")
    p.drop_from_batch(batch, wd.id, reason="test", retry=False)
    assert_equal(ledger.balance(a).held, 0)

    log.info("ethereum: a call paying someone else than the withdrawal says: refused")
    eth = customer("ETH")
    anvil.fund(custody.wallets.issue_address(f"addr:{eth}", eth).address, 10**18)
    anvil.mine(12)
    custody.deposits.run_once(["ethereum"])
    to = "0x" + "11" * 20
    from tests.e2e import txbuild
    good = txbuild.eth_new_address("checks-eth")
    we = w.request(client_withdrawal_id=f"checks-eth-{eth}", account_id=eth, amount=10**17, destination=good, requested_by="backend")
    [ebatch] = p.batch_ethereum()
    out = BatchOutput(we.id, we.destination, we.amount)
    with pytest.raises(SigningRefused) as err:
        p.signer.sign_ethereum_payment(ebatch, out, hot_index=0, chain_id=31337, nonce=0, to=to, value=10**17, data=b"",
                                       gas=21_000, max_fee_wei=10**9, priority_fee_wei=1)
    assert_equal(err.value.code.value, "output_mismatch")
    with pytest.raises(SigningRefused) as err:
        p.signer.sign_ethereum_payment(ebatch, out, hot_index=0, chain_id=31337, nonce=0, to=good, value=10**17, data=b"",
                                       gas=21_000, max_fee_wei=10**16, priority_fee_wei=1)
    assert_equal(err.value.code.value, "fee_above_ceiling")
    p.drop_from_batch(ebatch, we.id, reason="test", retry=False)
    assert_equal(ledger.balance(eth).held, 0)



def test_an_expired_decision_is_made_again_before_batching(custody, customer, bitcoind, engine, ledger, log):
    w, p = custody.withdrawals, custody.payouts
    [a] = fund(custody, customer, bitcoind, 1)
    dest = bitcoind.wallet("getnewaddress", "", "bech32")
    real = w.clock
    w.clock = lambda: real() - dt.timedelta(days=2)  # decided two days ago: expired by now
    try:
        old = w.request(client_withdrawal_id=f"expired-{a}", account_id=a, amount=1_500_000, destination=dest, requested_by="backend")
    finally:
        w.clock = real
    assert_equal(old.state, "approved")
    log.info("the batch job re-decides the expired approval, then the signer accepts it")
    batch = p.batch_bitcoin()
    assert batch is not None
    fresh = w.get(old.id)
    assert fresh.decision_id != old.decision_id
    [txid] = p.sign_open_batches()
    assert_equal(p.broadcast(), 1)
    bitcoind.mine(BTC_FINALITY)
    p.track()
    assert_equal(w.get(old.id).state, "final")
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT count(*) FROM policy_decision WHERE withdrawal_id = :w"), {"w": old.id}).scalar_one(), 2)
    assert txid
