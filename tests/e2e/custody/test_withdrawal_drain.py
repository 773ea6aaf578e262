"""withdrawal_drain: while the kill switch is on nothing is batched; once it is lifted the backlog
leaves in value tiers (smallest first) at the configured rate, each withdrawal rescreened."""
from __future__ import annotations

import dataclasses

from sqlalchemy import text

from custody.controls import flag, set_kill_switch
from regtest.util import assert_equal
from tests.e2e.custody.conftest import BTC_FINALITY
from tests.e2e.custody.test_withdrawal_signer_refusals import fund


def test_backlog_drains_in_tiers(custody, customer, bitcoind, engine, ledger, log):
    w, p = custody.withdrawals, custody.payouts
    accounts = fund(custody, customer, bitcoind, 5)
    for _ in range(2):  # several confirmed coins: two batches are signed before either confirms
        bitcoind.fund(p.hot_address("bitcoin"), 100_000_000)
    bitcoind.mine(1)
    p.sync_hot_wallet()
    dests = [bitcoind.wallet("getnewaddress", "", "bech32") for _ in accounts]
    amounts = [5_000_000, 1_000_000, 4_000_000, 2_000_000, 3_000_000]
    reqs = [w.request(client_withdrawal_id=f"drain-{a}", account_id=a, amount=m, destination=d, requested_by="backend")
            for a, m, d in zip(accounts, amounts, dests)]
    log.info("kill switch on: the batch job takes nothing")
    with engine.begin() as c:
        set_kill_switch(c, True, "test: outage", "op-test")
    assert_equal(p.batch_bitcoin(), None)
    log.info("a destination is denylisted during the outage")
    with engine.begin() as c:
        c.execute(text("INSERT INTO denylist_address (address, reason) VALUES (:a, 'test: listed during outage')"), {"a": dests[3]})
        set_kill_switch(c, False, "test: outage over", "op-test")
        assert flag(c, "withdrawal_drain")

    saved = p.config
    p.config = dataclasses.replace(saved, drain_per_run=2)
    try:
        order = []
        while True:
            batch = p.batch_bitcoin()
            if batch is None:
                break
            with engine.connect() as c:
                order.append(sorted(int(x) for x in c.execute(text("SELECT amount FROM batch_output WHERE batch_id = :b"), {"b": batch}).scalars()))
    finally:
        p.config = saved
    log.info("batches during the drain: %s", order)
    # two per run, smallest first; 2,000,000 counted in the first run but was rescreened out
    assert_equal(order, [[1_000_000], [3_000_000, 4_000_000], [5_000_000]])
    assert_equal(w.get(reqs[3].id).state, "rejected")
    assert_equal(ledger.balance(accounts[3]).held, 0)
    with engine.connect() as c:
        assert not flag(c, "withdrawal_drain")
    p.sign_open_batches()
    assert_equal(p.broadcast(), 3)
    bitcoind.mine(BTC_FINALITY)
    p.track()
    assert_equal(sorted(w.get(r.id).state for r in reqs), ["final"] * 4 + ["rejected"])
