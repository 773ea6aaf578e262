"""Brief H2 item 2: a withdrawal approval whose console key is revoked afterwards no longer makes up the
quorum. Refills counted only live approver keys at signing time (custody.rebalances
`counted_refill_approvals`); withdrawals counted the approvals recorded, and the signer, which knows
only its configured `[[approvers]]`, cannot see a console revocation. So a withdrawal approved with a
key revoked afterwards was batched and signed on that key's word.

Now custody counts live keys (`custody.withdrawals.live_approvers`) when an approval completes a
quorum, before an approved withdrawal is batched and before its batch is signed; one short of its
quorum goes back to the operators under a fresh decision. Played with the real Payouts and Signer on
the stand-in bitcoin node of tests/integration/test_payout_step_races.py; every scenario ends with
the ledger verified.
"""
from __future__ import annotations

import logging
import uuid

from sqlalchemy import text

from ledger.model import AccountKind, Transfer
from regtest.util import assert_equal
from tests.approvers import approve, registry
from tests.integration.console_helpers import Console
from tests.integration.own_database import own_database
from tests.integration.test_payout_step_races import DEST, World, make_world
from tests.integration.test_signer_refusal_drop import second_customer

log = logging.getLogger(__name__)


def with_console_approver(w: World) -> tuple[Console, object, dict]:
    """An operator enrolled on the console, whose approver entry custody and the signer are given (as
    operations would add it to both configurations): (the console, their passkey, their session)."""
    console = Console(w.container)
    _, passkey, session = console.person("lapse-anna", "operator")
    r = console.admin_key.get(f"/console/api/credentials/{session['credential_id']}/approver-entry")
    assert r.status_code == 200, r.text
    approvers = registry(extra=(r.json()["entry"],))
    w.container.withdrawals.approvers = approvers
    w.container.payouts.signer.approvers = approvers
    return console, passkey, session


def approve_with_passkey(w: World, wid: int, passkey, username: str):
    payload = w.container.withdrawals.approval_payload(wid).payload
    return w.container.withdrawals.approve(wid, operator=username, comment="checked on the console",
                                           signature=passkey.approval(payload))


def revoke(console: Console, session: dict) -> None:
    r = console.admin_key.post(f"/console/api/credentials/{session['credential_id']}/revoke")
    assert_equal((r.status_code, r.json()["state"]), (200, "revoked"))


def audited(eng, action: str) -> list[dict]:
    with eng.connect() as c:
        return list(c.execute(text("SELECT detail FROM audit_event WHERE action = :a ORDER BY id"), {"a": action}).scalars())


def test_a_withdrawal_approved_with_a_key_revoked_before_batching_is_not_batched(database_url):
    with own_database(database_url, "lapse_batch") as eng:
        w = make_world(eng, "bitcoin", amounts=(60_000_000,))  # 0.6 BTC: one operator
        [wid] = w.withdrawal_ids
        console, passkey, session = with_console_approver(w)
        log.info("anna approves on the console; the quorum of one is met")
        assert_equal(approve_with_passkey(w, wid, passkey, session["username"]).state, "approved")
        old_decision = w.container.withdrawals.get(wid).decision_id
        log.info("anna's credential is revoked (a lost key); her entry is still in both configurations")
        revoke(console, session)
        p = w.container.payouts
        assert_equal(p.batch_bitcoin(), None)  # nothing else is approved: no batch at all
        back = w.container.withdrawals.get(wid)
        assert_equal((back.state, back.batch_id, back.decision_id != old_decision), ("pending_approval", None, True))
        assert_equal(w.ledger.get_hold(back.hold_id).state.value, "pending")  # still held for the customer
        assert_equal(audited(eng, "withdrawal.quorum_lapsed"), [{"state": "pending_approval", "batch_id": None}])
        log.info("another operator approves the fresh decision: batched, signed and sent")
        approve(w.container.withdrawals, wid, "op-bob")
        assert p.batch_bitcoin() is not None
        assert_equal(len(p.sign_open_batches()), 1)
        assert_equal(p.broadcast(), 1)
        assert_equal(w.container.withdrawals.get(wid).state, "broadcast")
        w.ledger.assert_verified()


def test_a_withdrawal_whose_key_is_revoked_after_batching_leaves_the_batch_unsigned(database_url):
    with own_database(database_url, "lapse_sign") as eng:
        w = make_world(eng, "bitcoin", amounts=(60_000_000,))
        [big] = w.withdrawal_ids
        small = second_customer(w, 10_000_000, DEST)  # auto-approved: no operator
        console, passkey, session = with_console_approver(w)
        approve_with_passkey(w, big, passkey, session["username"])
        p = w.container.payouts
        batch = p.batch_bitcoin()
        assert_equal({w.container.withdrawals.get(i).batch_id for i in (big, small)}, {batch})
        log.info("anna's credential is revoked after batching, before signing")
        revoke(console, session)
        assert_equal(len(p.sign_open_batches()), 1)  # the batch, without her withdrawal
        gone = w.container.withdrawals.get(big)
        assert_equal((gone.state, gone.batch_id), ("pending_approval", None))
        assert_equal(w.container.withdrawals.get(small).state, "signed")
        with eng.connect() as c:
            paid = c.execute(text("SELECT withdrawal_id FROM batch_output WHERE batch_id = :b"), {"b": batch}).scalars().all()
            asked = c.execute(text("SELECT count(*) FROM signer_signature WHERE withdrawal_id = :w"), {"w": big}).scalar_one()
        assert_equal((paid, asked), ([small], 0))
        assert_equal(audited(eng, "batch.drop_lapsed"), [{"withdrawals": [big], "abandoned": False}])
        assert_equal(w.ledger.get_hold(gone.hold_id).state.value, "pending")
        w.container.withdrawals.reject(big, operator="op-carol", comment="test cleanup")
        w.ledger.assert_verified()


def test_an_approval_by_a_revoked_key_does_not_complete_a_quorum_of_two(database_url):
    with own_database(database_url, "lapse_two") as eng:
        w = make_world(eng, "bitcoin")
        equity = w.container.wallets.firm_account("equity", "BTC")
        acct = w.ledger.open_account("BTC", AccountKind.customer, f"lapse:{uuid.uuid4().hex[:8]}", owner="lapse-bea").id
        w.ledger.post(f"lapse-fund:{acct}", [Transfer(equity, acct, 1_000_000_000)], kind="treasury_credit")
        v = w.container.withdrawals.request(client_withdrawal_id=f"lapse-{acct}", account_id=acct, amount=250_000_000,
                                            destination=DEST, requested_by="backend-test")  # 2.5 BTC: two operators
        assert_equal(v.state, "pending_approval")
        console, passkey, session = with_console_approver(w)
        approve_with_passkey(w, v.id, passkey, session["username"])
        revoke(console, session)
        log.info("a second operator approves: anna's approval no longer counts, one of two")
        assert_equal(approve(w.container.withdrawals, v.id, "op-alice").state, "pending_approval")
        assert_equal(approve(w.container.withdrawals, v.id, "op-bob").state, "approved")
        w.container.withdrawals.reject(v.id, operator="op-carol", comment="test cleanup")
        for wid in w.withdrawal_ids:
            w.container.withdrawals.reject(wid, operator="op-carol", comment="test cleanup")
        w.ledger.assert_verified()
