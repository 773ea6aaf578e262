"""deposit_quarantine_return (issue 11, observation 4): one operator returned a quarantined deposit to
an address of their own choosing, with no second approval, and it was paid. Now a return always
waits for a quorum of operators other than the one who asked (whatever the amount tier), a
destination other than the original sender is flagged to them, and it is then paid through the
signer's checks like any withdrawal. The operators act over the API through the typed custody.client,
trent approving with his registered key as `custody approve` does."""
from __future__ import annotations

import pytest

from regtest.util import assert_equal
from tests.e2e.custody.api_helpers import answered, approve_as, operator_api, refused, role_client
from tests.e2e.custody.conftest import BTC_FINALITY
from tests.e2e.custody.test_deposit_screening import deposit_from_denylisted_sender


@pytest.fixture
def operators(custody):
    return [role_client(custody, "operator", "op-mallory"),
            operator_api(custody, "op-trent")]  # trent approves with his registered key


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
    ret = answered(mallory, 200, mallory.return_deposit(obs["id"], comment="sender asked us to pay here", destination=own))
    wid = ret.withdrawal_id
    log.info("-> withdrawal %s %s %s", wid, ret.state, ret.decision_reasons)
    assert_equal((ret.state, ret.decision_reasons), ("pending_approval", ["return_destination_not_original_sender"]))
    pay_out()
    assert_equal(custody.withdrawals.get(wid).state, "pending_approval")

    log.info("the operator who asked cannot approve it; a second operator sees the flag and approves")
    assert_equal(refused(lambda: mallory.approve_withdrawal(wid, comment="approving my own")),
                 (403, "requester_cannot_approve"))
    [queued] = [w for w in trent.list_withdrawals() if w.id == wid]
    assert_equal(queued.decision_reasons, ["return_destination_not_original_sender"])
    approved = approve_as(trent, wid, "op-trent", "sender's new address confirmed by phone")
    assert_equal((trent.last_response.status_code, approved.state), (200, "approved"))

    log.info("paid through the batch and the signer's checks")
    pay_out()
    bitcoind.mine(BTC_FINALITY)
    p.track()
    assert_equal(custody.withdrawals.get(wid).state, "final")
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
