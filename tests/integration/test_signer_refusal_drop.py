"""A signer refusal that names ONE withdrawal of an unsigned batch (custody.payouts `drop_refused`).

The signer names the withdrawal a refusal is about (`SigningRefused.withdrawal_id`); custody takes
that one out of the batch (by code: approval problems back to the operators under a fresh
decision, a denylisted destination rejected with its hold released), opens a warning incident (no
kill switch: nothing left the firm) and signs the rest on the next run. Played with the real
Payouts and Signer on the stand-in bitcoin node of tests/integration/test_payout_step_races.py.
tests/integration/test_review12c_poisoned_batch.py is the reviewer's case (an approver removed).
"""
from __future__ import annotations

import os
import uuid

from bip_utils import SegwitBech32Encoder
from sqlalchemy import text

from custody.controls import kill_switch
from ledger.model import AccountKind, Transfer
from regtest.util import assert_equal
from signer.protocol import RefusalCode
from tests.approvers import TEST_OPERATORS, approve, registry
from tests.integration.own_database import own_database
from tests.integration.test_payout_step_races import DEST, World, make_world

OTHER_DEST = SegwitBech32Encoder.Encode("bcrt", 0, os.urandom(20))  # nobody's: denylisted once batched


def second_customer(w: World, amount: int, destination: str) -> int:
    """Another customer's approved withdrawal of `amount` to `destination`."""
    equity = w.container.wallets.firm_account("equity", "BTC")
    acct = w.ledger.open_account("BTC", AccountKind.customer, f"drop:{uuid.uuid4().hex[:8]}", owner="drop-carol").id
    w.ledger.post(f"drop-fund:{acct}", [Transfer(equity, acct, 100_000_000)], kind="treasury_credit")
    v = w.container.withdrawals.request(client_withdrawal_id=f"drop-{acct}", account_id=acct, amount=amount,
                                        destination=destination, requested_by="backend-test")
    assert_equal(v.state, "approved")
    return v.id


def incidents(eng) -> list[tuple]:
    with eng.connect() as c:
        return [(r.kind, r.severity, r.detail["withdrawal_id"], r.detail["code"], r.detail["state"])
                for r in c.execute(text("SELECT kind, severity, detail FROM incident WHERE kind = 'withdrawal_refused_by_signer' "
                                        "ORDER BY id"))]


def test_a_destination_denylisted_after_batching_is_rejected_and_released_and_the_rest_is_paid(database_url):
    with own_database(database_url, "drop_denied") as eng:
        w = make_world(eng, "bitcoin")
        [first] = w.withdrawal_ids
        denied = second_customer(w, 10_000_000, OTHER_DEST)
        p = w.container.payouts
        batch = p.batch_bitcoin()
        assert_equal({w.container.withdrawals.get(i).batch_id for i in (first, denied)}, {batch})
        with eng.begin() as c:  # a sanctions list update after batching: only the signer sees it now
            c.execute(text("INSERT INTO denylist_address (address, reason) VALUES (:a, 'sanctioned after batching')"),
                      {"a": OTHER_DEST})
        assert_equal(p.sign_open_batches(), [])  # refused, naming `denied`: taken out
        assert_equal(p.refusals, [(batch, RefusalCode.destination_denied.value)])
        gone = w.container.withdrawals.get(denied)
        assert_equal((gone.state, gone.batch_id, list(gone.reject_reasons)), ("rejected", None, ["destination_sanctioned"]))
        assert_equal(w.ledger.get_hold(gone.hold_id).state.value, "released")  # the customer has the money back
        assert_equal(incidents(eng), [("withdrawal_refused_by_signer", "warning", denied, "destination_denied", "rejected")])
        assert not kill_switch(eng).engaged
        assert_equal(len(p.sign_open_batches()), 1)  # the same batch, without it
        assert_equal(p.broadcast(), 1)
        assert_equal((w.container.withdrawals.get(first).state, w.container.withdrawals.get(first).batch_id), ("broadcast", batch))
        with eng.connect() as c:
            paid = c.execute(text("SELECT withdrawal_id FROM batch_output WHERE batch_id = :b"), {"b": batch}).scalars().all()
        assert_equal(paid, [first])
        w.ledger.assert_verified()


def test_a_withdrawal_whose_approver_the_signer_no_longer_knows_goes_back_to_the_operators(database_url):
    with own_database(database_url, "drop_approver") as eng:
        w = make_world(eng, "bitcoin", amounts=(60_000_000,))  # 0.6 BTC: one operator
        [big] = w.withdrawal_ids
        approve(w.container.withdrawals, big, "op-alice")
        small = second_customer(w, 10_000_000, DEST)
        p = w.container.payouts
        p.signer.approvers = registry(*(o for o in TEST_OPERATORS if o != "op-alice"))  # op-alice left the signer
        old_decision = w.container.withdrawals.get(big).decision_id
        batch = p.batch_bitcoin()
        assert_equal(p.sign_open_batches(), [])
        back = w.container.withdrawals.get(big)
        assert_equal((back.state, back.batch_id), ("pending_approval", None))
        assert back.decision_id != old_decision  # a fresh decision: op-alice's approval signed the old one
        with eng.connect() as c:
            d = c.execute(text("SELECT outcome, required_approvals FROM policy_decision WHERE id = :d"),
                          {"d": back.decision_id}).one()
            audit = c.execute(text("SELECT detail FROM audit_event WHERE action = 'batch.drop_refused'")).scalar_one()
        assert_equal((d.outcome, d.required_approvals >= 1), ("needs_approval", True))
        assert_equal((audit["withdrawal_id"], audit["code"]), (big, "approver_unknown"))
        assert_equal(w.ledger.get_hold(back.hold_id).state.value, "pending")  # still the customer's, still held
        assert_equal(incidents(eng), [("withdrawal_refused_by_signer", "warning", big, "approver_unknown", "pending_approval")])
        assert_equal(len(p.sign_open_batches()), 1)  # the rest of the batch, without it
        assert_equal(w.container.withdrawals.get(small).batch_id, batch)
        approve(w.container.withdrawals, big, "op-bob")  # an approver the signer knows: the operators' route
        again = p.batch_bitcoin()
        assert again not in (None, batch)
        assert_equal(len(p.sign_open_batches()), 1)
        assert_equal(p.broadcast(), 2)
        assert_equal({w.container.withdrawals.get(i).state for i in (big, small)}, {"broadcast"})
        assert not kill_switch(eng).engaged
        w.ledger.assert_verified()
