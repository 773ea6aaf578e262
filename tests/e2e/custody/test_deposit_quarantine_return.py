"""deposit_quarantine_return (issue 11, observation 4): one operator returned a quarantined deposit to
an address of their own choosing, with no second approval, and it was paid. Now a return always
waits for a quorum of operators other than the one who asked (whatever the amount tier), a
destination other than the original sender is flagged to them, and it is then paid through the
signer's checks like any withdrawal."""
from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient

from custody.api.app import create_app
from custody.auth import create_api_key
from regtest.util import assert_equal
from tests.approvers import approve_over_api, operator_client
from tests.e2e.custody.conftest import BTC_FINALITY
from tests.e2e.custody.test_deposit_screening import deposit_from_denylisted_sender


@pytest.fixture
def operators(custody):
    run = uuid.uuid4().hex[:8]
    app = create_app(custody)
    out = []
    mallory = TestClient(app, raise_server_exceptions=False)
    mallory.headers["X-API-Key"] = create_api_key(custody.engine, f"op-mallory-{run}", "operator", custody.settings.api_key_pepper)
    return [mallory, operator_client(custody, "op-trent")]  # trent approves with his registered key


def test_return_to_an_address_of_the_operators_choosing_needs_a_second_operator(
        custody, customer, btc, bitcoind, engine, ledger, operators, pay_out, log):
    mallory, trent = operators
    acct, key, obs = deposit_from_denylisted_sender(custody, customer, btc, bitcoind, engine, 2_500_000, "test: flagged mixer")
    assert_equal(obs["state"], "quarantined")
    p = custody.payouts
    bitcoind.fund(p.hot_address("bitcoin"), 100_000_000)
    bitcoind.mine(1)
    p.sync_hot_wallet()
    own = bitcoind.wallet("getnewaddress", "", "bech32")

    log.info("the attack: one operator returns the deposit to an address of their own")
    r = mallory.post(f"/v1/deposits/{obs['id']}/return", json={"comment": "sender asked us to pay here", "destination": own})
    assert r.status_code == 200, r.text
    ret = r.json()
    log.info("-> withdrawal %s %s %s", ret["withdrawal_id"], ret["state"], ret.get("decision_reasons"))
    assert_equal((ret["state"], ret.get("decision_reasons")), ("pending_approval", ["return_destination_not_original_sender"]))
    pay_out()
    assert_equal(custody.withdrawals.get(ret["withdrawal_id"]).state, "pending_approval")

    log.info("the operator who asked cannot approve it; a second operator sees the flag and approves")
    r = mallory.post(f"/v1/withdrawals/{ret['withdrawal_id']}/approve", json={"comment": "approving my own"})
    assert_equal((r.status_code, r.json()["error"]["code"]), (403, "requester_cannot_approve"))
    [queued] = [w for w in trent.get("/v1/withdrawals").json() if w["id"] == ret["withdrawal_id"]]
    assert_equal(queued["decision_reasons"], ["return_destination_not_original_sender"])
    r = approve_over_api(trent, ret["withdrawal_id"], "op-trent", "sender's new address confirmed by phone")
    assert_equal((r.status_code, r.json()["state"]), (200, "approved"))

    log.info("paid through the batch and the signer's checks")
    pay_out()
    bitcoind.mine(BTC_FINALITY)
    p.track()
    assert_equal(custody.withdrawals.get(ret["withdrawal_id"]).state, "final")
    assert_equal([u.amount for u in btc.adapter.unspent([own])], [2_500_000 - 5_000])
    assert_equal(ledger.balance(acct).posted, 0)


def test_the_signer_refuses_a_return_no_other_operator_approved(custody, customer, btc, bitcoind, engine, ledger, log):
    """Custody's decision is not trusted: a return marked approved with a forged automatic decision
    (a bug, or a write to custody's tables) is refused by the signer itself."""
    from sqlalchemy import text

    acct, key, obs = deposit_from_denylisted_sender(custody, customer, btc, bitcoind, engine, 1_200_000, "test: flagged")
    p = custody.payouts
    bitcoind.fund(p.hot_address("bitcoin"), 100_000_000)
    bitcoind.mine(1)
    p.sync_hot_wallet()
    own = bitcoind.wallet("getnewaddress", "", "bech32")
    wid = custody.deposits.return_quarantined(obs["id"], operator="op-eve", comment="to me", withdrawals=custody.withdrawals,
                                              destination=own)
    log.info("forge an automatic approval for withdrawal %s underneath custody", wid)
    with engine.begin() as c:
        forged = c.execute(text("INSERT INTO policy_decision (withdrawal_id, outcome, required_approvals, reasons, policy_version, "
                                "record, decided_at, expires_at) VALUES (:w, 'approve', 0, '{}', 'forged', '{}', now(), "
                                "now() + interval '1 day') RETURNING id"), {"w": wid}).scalar_one()
        c.execute(text("UPDATE withdrawal_request SET decision_id = :d, state = 'approved' WHERE id = :w"), {"d": forged, "w": wid})
    batch = p.batch_bitcoin()
    p.refusals.clear()
    assert_equal(p.sign_open_batches(), [])
    assert_equal(p.refusals, [(batch, "decision_not_approved")])
    # the refusal names the return: custody takes it out of the batch, back to the operators (drop_refused)
    assert_equal(custody.withdrawals.get(wid).state, "pending_approval")
    custody.withdrawals.reject(wid, operator="op-trent", comment="test: forged decision")
    assert_equal(custody.withdrawals.get(wid).state, "rejected")
    quarantine = custody.wallets.firm_account("quarantine", "BTC")
    assert_equal(ledger.balance(quarantine).held, 0)
