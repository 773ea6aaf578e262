"""withdrawal_set_aside_capture: a writer (a bug, or anyone with the ledger's Python API) posts first
under custody's capture key `batch:<id>:capture`, so the ledger refuses that batch's capture at
signing (`idempotency_conflict`). The payouts job does not raise: that batch is set aside with a
warning incident (nothing is on chain; the kill switch stays off) naming the code, the batch and
its withdrawal, and skipped from then on, while another customer's withdrawal in its own batch is
signed, broadcast and booked final. An operator retries the set-aside batch over the API (roles,
404, 409 checked): it is abandoned and its withdrawal re-batched under a new id, paid on chain and
captured exactly once. The planted transaction balances (suspense <- equity, 1 sat) and touches no
asset location, so reconciliation stays at zero; it is reversed at the end; verify() ok."""
from __future__ import annotations

from sqlalchemy import text

from custody.controls import kill_switch
from custody.jobs import payouts_once
from ledger.model import Transfer
from regtest.util import assert_equal
from tests.e2e.custody.api_helpers import answered, fund, refusal, refused, role_client
from tests.e2e.custody.conftest import BTC_FINALITY

FEE = 5_000  # quoted per withdrawal (normal priority)


def captures_of(engine, withdrawal_id: int) -> int:
    with engine.connect() as c:
        return c.execute(text("SELECT count(*) FROM journal_transaction WHERE kind = 'withdrawal_capture' "
                              "AND metadata -> 'withdrawals' @> CAST(:w AS jsonb)"), {"w": f"[{withdrawal_id}]"}).scalar_one()


def test_refused_capture_is_set_aside_and_retried_once(custody, customer, bitcoind, engine, ledger, log):
    w, p = custody.withdrawals, custody.payouts
    [a, b] = fund(custody, customer, bitcoind, 2)
    dest_a, dest_b = (bitcoind.wallet("getnewaddress", "", "bech32") for _ in range(2))
    good = w.request(client_withdrawal_id=f"good-{a}", account_id=a, amount=1_000_000, destination=dest_a, requested_by="backend")
    good_batch = p.batch_bitcoin()
    bad = w.request(client_withdrawal_id=f"bad-{b}", account_id=b, amount=2_000_000, destination=dest_b, requested_by="backend")
    bad_batch = p.batch_bitcoin()
    assert good_batch is not None and bad_batch not in (None, good_batch)

    log.info("a writer posts first under custody's capture key for batch %d (balanced: 1 sat equity -> suspense)", bad_batch)
    suspense, equity = custody.wallets.firm_account("suspense", "BTC"), custody.wallets.firm_account("equity", "BTC")
    planted = ledger.post(f"batch:{bad_batch}:capture", [Transfer(suspense, equity, 1)], kind="test_planted")

    log.info("the payouts job runs: the good batch is signed and broadcast, the poisoned one set aside")
    payouts_once(custody)
    assert_equal(w.get(good.id).state, "broadcast")
    with engine.connect() as c:
        incident = c.execute(text("SELECT id, kind, severity, detail FROM incident WHERE detail ->> 'batch_id' = :b"),
                             {"b": str(bad_batch)}).one()
        batch = c.execute(text("SELECT state, containment, set_aside_step, set_aside_incident_id FROM withdrawal_batch "
                               "WHERE id = :b"), {"b": bad_batch}).one()
        signed_before = c.execute(text("SELECT count(*) FROM signer_audit WHERE batch_id = :b"), {"b": bad_batch}).scalar_one()
    assert_equal((incident.kind, incident.severity), ("batch_set_aside", "warning"))
    assert_equal((incident.detail["code"], incident.detail["step"], incident.detail["withdrawals"], incident.detail["on_chain"]),
                 ("idempotency_conflict", "sign", [bad.id], False))
    assert not kill_switch(engine).engaged  # nothing left the firm: withdrawals go on
    assert_equal(tuple(batch), ("open", "set_aside", "sign", incident.id))
    assert_equal(w.get(bad.id).state, "batched")
    assert_equal(ledger.balance(b).held, 2_000_000 + FEE)  # still held, not captured
    assert_equal(captures_of(engine, bad.id), 0)

    log.info("the job runs on: the set-aside batch is skipped (not signed again), the good one goes final")
    bitcoind.mine(BTC_FINALITY)
    payouts_once(custody)
    assert_equal(w.get(good.id).state, "final")
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT count(*) FROM signer_audit WHERE batch_id = :b"), {"b": bad_batch}).scalar_one(),
                     signed_before)
        assert_equal(c.execute(text("SELECT count(*) FROM incident WHERE detail ->> 'batch_id' = :b"),
                               {"b": str(bad_batch)}).scalar_one(), 1)

    log.info("the operator retries it over the API (the backend and the auditor may not)")
    api = {role: role_client(custody, role, role) for role in ("auditor", "operator", "backend")}
    listed = api["auditor"].list_set_aside()
    assert {"kind": "batch", "id": bad_batch, "state": "open", "failed_step": "sign", "incident_id": incident.id,
            "times_set_aside": 1} in [item.model_dump() for item in listed]
    for role in ("backend", "auditor"):
        assert_equal(refusal(lambda: api[role].retry_batch(bad_batch, comment="cause fixed")).status, 403)
    assert_equal(refused(lambda: api["operator"].retry_batch(999999999, comment="x"))[1], "retry_unknown")
    answer = answered(api["operator"], 200, api["operator"].retry_batch(bad_batch, comment="capture key was squatted; re-batch"))
    assert_equal((answer.state, answer.failed_step, answer.containment), ("open", "sign", "active"))
    assert_equal(refused(lambda: api["operator"].retry_batch(bad_batch, comment="twice")), (409, "retry_not_set_aside"))
    assert_equal(w.get(bad.id).state, "approved")
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT state FROM withdrawal_batch WHERE id = :b"), {"b": bad_batch}).scalar_one(), "abandoned")

    log.info("re-batched under a new id: signed, captured once, paid on chain and booked final")
    payouts_once(custody)
    new_batch = w.get(bad.id).batch_id
    assert new_batch not in (None, bad_batch)
    assert_equal(w.get(bad.id).state, "broadcast")
    bitcoind.mine(BTC_FINALITY)
    payouts_once(custody)
    assert_equal(w.get(bad.id).state, "final")
    assert_equal(captures_of(engine, bad.id), 1)
    assert_equal(ledger.balance(b).posted, 100_000_000 - 2_000_000 - FEE)
    assert_equal(ledger.balance(b).held, 0)
    assert_equal(int(round(bitcoind.wallet("getreceivedbyaddress", dest_b) * 100_000_000)), 2_000_000)

    log.info("the planted entry is reversed; reconciliation at zero (it never touched an asset location)")
    ledger.reverse(planted.transaction_id, f"test:planted:{bad_batch}:reversal")
    custody.deposits.run_once(["bitcoin"])
    lines = custody.reconciliation.run(chains=["bitcoin"])
    assert {"deposit", "hot"} <= {ln.tier for ln in lines}
    assert_equal({ln.difference for ln in lines}, {0})
