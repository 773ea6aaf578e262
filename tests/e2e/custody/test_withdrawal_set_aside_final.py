"""withdrawal_set_aside_final: two withdrawals in two batches are paid on chain; then a writer (a
bug, or anyone with the ledger's Python API) places a hold on the BTC in-flight account that leaves
only the first withdrawal's amount available, so the second batch's final booking is refused
(`insufficient_funds`). The payouts job does not stop: the first batch is booked final, the second
is set aside with a critical incident (its money is on chain), which engages the kill switch, and
is skipped from then on; reconciliation still explains it (mined, not booked: in transit). Once
the planted hold is released and an operator retries the batch over the API, it is booked final
exactly once; reconciliation at zero; verify() ok."""
from __future__ import annotations

import uuid

from sqlalchemy import text

from custody.auth import create_api_key
from custody.controls import kill_switch, set_kill_switch
from custody.jobs import payouts_once
from regtest.util import assert_equal
from tests.e2e.custody.api_helpers import answered, fund, in_process, refusal
from tests.e2e.custody.conftest import BTC_FINALITY

GOOD, BAD = 1_000_000, 2_000_000


def finals_of(engine, batch_id: int) -> int:
    with engine.connect() as c:
        return c.execute(text("SELECT count(*) FROM journal_transaction WHERE idempotency_key = :k"),
                         {"k": f"batch:{batch_id}:final"}).scalar_one()


def reconcile(custody) -> set[int]:
    custody.deposits.run_once(["bitcoin"])  # the scanner at the tip: every line is compared
    lines = custody.reconciliation.run(chains=["bitcoin"])
    assert {"deposit", "hot"} <= {ln.tier for ln in lines}
    return {ln.difference for ln in lines}


def test_refused_final_booking_is_set_aside_critical_and_retried_once(custody, customer, bitcoind, engine, ledger, log):
    w, p = custody.withdrawals, custody.payouts
    [a, b] = fund(custody, customer, bitcoind, 2)
    dest_a, dest_b = (bitcoind.wallet("getnewaddress", "", "bech32") for _ in range(2))
    good = w.request(client_withdrawal_id=f"good-{a}", account_id=a, amount=GOOD, destination=dest_a, requested_by="backend")
    good_batch = p.batch_bitcoin()
    bad = w.request(client_withdrawal_id=f"bad-{b}", account_id=b, amount=BAD, destination=dest_b, requested_by="backend")
    bad_batch = p.batch_bitcoin()
    assert good_batch is not None and bad_batch not in (None, good_batch)
    payouts_once(custody)
    assert_equal([w.get(x.id).state for x in (good, bad)], ["broadcast", "broadcast"])

    log.info("a writer holds all of in-flight BTC but the first withdrawal's amount")
    in_flight = custody.wallets.firm_account("in_flight", "BTC")
    base = ledger.balance(in_flight).posted - GOOD - BAD  # whatever other suites left in flight
    planted = ledger.place_hold(f"test:poison:{bad_batch}", in_flight, ledger.balance(in_flight).available - GOOD,
                                owner="test-intruder", reference="poison the final booking")

    log.info("both are mined to finality; the job books the first and sets the second aside as critical")
    bitcoind.mine(BTC_FINALITY)
    payouts_once(custody)
    assert_equal(w.get(good.id).state, "final")
    assert_equal(finals_of(engine, good_batch), 1)
    with engine.connect() as c:
        incident = c.execute(text("SELECT id, kind, severity, detail FROM incident WHERE detail ->> 'batch_id' = :b"),
                             {"b": str(bad_batch)}).one()
    assert_equal((incident.kind, incident.severity), ("batch_set_aside", "critical"))
    assert kill_switch(engine).engaged  # money on chain and not booked: withdrawals halt
    assert_equal((incident.detail["code"], incident.detail["step"], incident.detail["withdrawals"], incident.detail["on_chain"]),
                 ("insufficient_funds", "track", [bad.id], True))
    with engine.connect() as c:
        batch = c.execute(text("SELECT state, containment, set_aside_step FROM withdrawal_batch WHERE id = :b"), {"b": bad_batch}).one()
        txid = c.execute(text("SELECT txid FROM chain_transaction WHERE batch_id = :b"), {"b": bad_batch}).scalar_one()
    assert_equal(tuple(batch), ("broadcast", "set_aside", "track"))
    assert_equal(incident.detail["txid"], txid)
    assert_equal(finals_of(engine, bad_batch), 0)

    log.info("the job runs on and skips it; reconciliation explains its money as in transit")
    bitcoind.mine(1)
    payouts_once(custody)
    assert_equal((w.get(bad.id).state, finals_of(engine, bad_batch)), ("broadcast", 0))
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT count(*) FROM incident WHERE detail ->> 'batch_id' = :b"),
                               {"b": str(bad_batch)}).scalar_one(), 1)
    assert_equal(reconcile(custody), {0})

    log.info("the cause is removed (the planted hold released); the operator retries over the API")
    ledger.release_hold(planted.id, owner="test-intruder")
    run = uuid.uuid4().hex[:8]
    operator, backend = (in_process(custody, create_api_key(engine, f"{role}-{run}", role, custody.settings.api_key_pepper))
                         for role in ("operator", "backend"))
    assert_equal(refusal(lambda: backend.retry_batch(bad_batch, comment="hold released")).status, 403)
    answer = answered(operator, 200, operator.retry_batch(bad_batch, comment="planted hold released"))
    assert_equal((answer.state, answer.failed_step), ("broadcast", "track"))
    with engine.connect() as c:  # the operator's retry resolves the incident; the kill switch is the admin's
        assert_equal(c.execute(text("SELECT resolved_by FROM incident WHERE id = :i"), {"i": incident.id}).scalar_one(),
                     f"api:operator-{run}")
    assert kill_switch(engine).engaged

    log.info("the next run books it final, exactly once; in-flight is back where it was")
    payouts_once(custody)
    payouts_once(custody)
    assert_equal(w.get(bad.id).state, "final")
    assert_equal(finals_of(engine, bad_batch), 1)
    assert_equal(ledger.balance(in_flight).posted, base)
    assert_equal(int(round(bitcoind.wallet("getreceivedbyaddress", dest_b) * 100_000_000)), BAD)
    with engine.begin() as c:  # an admin's decision once the incident is explained
        set_kill_switch(c, False, "test: set-aside batch booked after retry", "op-test")
    assert_equal(reconcile(custody), {0})
