"""signed_approvals (issue 12, must show 3): the signer counts signatures, not approval rows.

Each scenario requests a 5 BTC withdrawal (the two-operator tier of the default policy), gathers or
forges its approvals, batches it as the batcher does (a batch row, its output, one hot coin reserved
for it, all committed) and asks the real `Signer.sign_bitcoin_batch`, configured with its OWN
approver registry (the test keys of the two API operators, op-alice, op-bob and op-carol's WebAuthn
credential, NOT op-mallory, whom custody's registry also lists) and its own quorum table (the
default policy's tiers). A refusal must carry its code, leave a `signer_audit` row with that code
and no signed transaction; a withdrawal is never paid. Afterwards its hold is released, so the
ledger verifies with nothing left held.

The forgeries, each refused with its own code:
- an approval row inserted by SQL with a valid-looking operator and no signature: approval_unsigned;
- an approval custody accepted from op-mallory, whose key the signer does not know: approver_unknown;
- a valid signature over another amount, and two valid approvals of a withdrawal whose destination
  was rewritten afterwards: approval_payload_mismatch; a stored payload changed after it was signed:
  approval_signature_invalid;
- another withdrawal's valid approvals copied onto this one: approval_replayed;
- a decision row forged to "approve" with 0 approvals (or valid signatures by the requester's own
  key, or one operator's signature copied under a second name): decision_not_approved.
Two valid signatures (Ed25519, or one of them a WebAuthn assertion) are signed.
"""
from __future__ import annotations

import base64
import logging
import uuid
from dataclasses import dataclass

import pytest
from sqlalchemy import text

from custody.policy_config import default_policy
from custody.states import advance
from custody.withdrawals import HOLD_OWNER
from regtest.util import assert_equal
from signer.bitcoin_tx import address_to_script
from signer.approvals import ApprovalSignature, approval_payload, quorum_table_from_policy
from signer.keys import Secret, SignerKeys, seed_from_text
from signer.protocol import BatchOutput, BtcCoin, SigningRefused
from signer.service import Signer
from tests.approvers import SoftAuthenticator, approve_over_api, operator_client, registry, sign_approval, signature_json
from tests.integration.own_database import own_database
from ledger.service import Ledger
from tests.integration.withdrawal_api import WithdrawalApi

log = logging.getLogger(__name__)
KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
CAROL = SoftAuthenticator("op-carol")
COIN, FEE = 600_000_000, 2_000
ATTACKER = "bcrt1que968zjtjkx890qdggg4pwjxgcmyyfy9r64a89"  # P2WPKH of sha256("attacker")[:20]: nobody of ours


@pytest.fixture(scope="module")
def api(database_url) -> WithdrawalApi:
    """A database of this module's own: its forged batches stay open (refused), and the session
    database's payout jobs (the e2e suites share it) must not meet them."""
    with own_database(database_url, "signed_approvals") as eng:
        yield WithdrawalApi(eng, extra_approvers=(CAROL.entry(),))
        Ledger(eng).assert_verified()


@pytest.fixture(scope="module")
def signer(api) -> Signer:
    own = registry(api.operator_name(1), api.operator_name(2), "op-alice", "op-bob", extra=(CAROL.entry(),))
    return Signer(api.custody.engine, KEYS, bitcoin_network="regtest", approvers=own,
                  quorum=quorum_table_from_policy(default_policy()))


@dataclass
class Paid:
    """One withdrawal of 5 BTC waiting for two operators."""

    id: int
    account: int


def pending(api: WithdrawalApi) -> Paid:
    acct = api.open_customer(f"signed-{uuid.uuid4().hex[:8]}")
    w = api.withdraw(acct, "5")
    assert_equal(w["state"], "pending_approval")
    return Paid(int(w["id"]), acct)


def payload_of(api: WithdrawalApi, w: Paid, **change) -> bytes:
    """The withdrawal's approval payload as custody serves it, or with `change`d fields."""
    p = api.custody.withdrawals.approval_payload(w.id)
    if not change:
        return p.payload
    fields = dict(withdrawal_id=p.withdrawal_id, chain=p.chain, asset=p.asset, amount=p.amount, destination=p.destination,
                  decision_id=p.decision_id, policy_version=p.policy_version, expires_at=p.expires_at)
    return approval_payload(**{**fields, **change})


def insert_approval(api: WithdrawalApi, w: Paid, operator: str, sig: ApprovalSignature | None = None,
                    payload: bytes | None = None) -> None:
    """An approval row written straight into the table, as a process with database access could."""
    with api.custody.engine.begin() as c:
        c.execute(text("INSERT INTO approval (withdrawal_id, decision_id, operator, action, comment, key_id, scheme, "
                       "signed_payload, signature) SELECT id, decision_id, :o, 'approve', 'forged', :k, :s, :p, :sig "
                       "FROM withdrawal_request WHERE id = :w"),
                  {"w": w.id, "o": operator, "k": sig.key_id if sig else None, "s": sig.scheme if sig else None,
                   "p": payload, "sig": sig.signature if sig else None})


def forge_state_approved(api: WithdrawalApi, w: Paid) -> None:
    with api.custody.engine.begin() as c:
        c.execute(text("UPDATE withdrawal_request SET state = 'approved' WHERE id = :w"), {"w": w.id})


def both_operators_approve(api: WithdrawalApi, w: Paid) -> None:
    assert_equal(api.approve(1, w.id).json()["state"], "pending_approval")
    assert_equal(api.approve(2, w.id).json()["state"], "approved")


def sign(api: WithdrawalApi, signer: Signer, w: Paid) -> str:
    """Batch the withdrawal as the batcher does and ask the signer: "signed" or its refusal code,
    checked against the audit row it wrote. The hold is released afterwards either way."""
    engine = api.custody.engine
    with engine.begin() as c:
        batch = c.execute(text("INSERT INTO withdrawal_batch (chain, asset, state, fee_rate) "
                               "VALUES ('bitcoin', 'BTC', 'open', 1000) RETURNING id")).scalar_one()
        advance(c, "withdrawal", w.id, "approved", "batched", batch_id=batch)
        row = c.execute(text("SELECT destination, destination_script, amount FROM withdrawal_request WHERE id = :w"),
                        {"w": w.id}).one()
        c.execute(text("INSERT INTO batch_output (batch_id, withdrawal_id, amount) VALUES (:b, :w, :a)"),
                  {"b": batch, "w": w.id, "a": row.amount})
        coin = BtcCoin(uuid.uuid4().hex * 2, 0, COIN, 0, 0)
        c.execute(text("INSERT INTO wallet_utxo (txid, vout, address, derivation_change, derivation_index, amount, reserved_by) "
                       "VALUES (:t, 0, :a, 0, 0, :m, :b)"), {"t": coin.txid, "a": signer._hot_address(0, 0), "m": COIN, "b": batch})
    amount = int(row.amount)
    try:
        signed = signer.sign_bitcoin_batch(batch, [coin], [BatchOutput(w.id, row.destination, amount, bytes(row.destination_script))],
                                           (signer._hot_address(1, batch), COIN - amount - FEE))
        outcome = "signed"
        log.info("signer signed %s", signed.txid)
    except SigningRefused as refused:
        outcome = refused.code.value
        log.info("signer refused: %s", refused)
    with engine.begin() as c:
        audit = c.execute(text("SELECT outcome, code FROM signer_audit WHERE batch_id = :b ORDER BY id"), {"b": batch}).all()
        hold = c.execute(text("SELECT hold_id FROM withdrawal_request WHERE id = :w"), {"w": w.id}).scalar_one()
        api.custody.ledger.release_hold(hold, owner=HOLD_OWNER, conn=c)
        c.execute(text("UPDATE withdrawal_request SET state = 'rejected', reject_reasons = '{test_cleanup}' WHERE id = :w"),
                  {"w": w.id})
        c.execute(text("DELETE FROM wallet_utxo WHERE reserved_by = :b"), {"b": batch})
    expected = [("signed", None)] if outcome == "signed" else [("refused", outcome)]
    assert_equal([tuple(a) for a in audit], expected)  # one audit row with the code; nothing signed on a refusal
    return outcome


def test_an_approval_row_inserted_by_sql_is_refused_as_unsigned(api, signer, ledger):
    w = pending(api)
    log.info("one operator approves with a signature; a second approval is a row written by SQL as api:op-alice")
    assert_equal(api.approve(1, w.id).json()["state"], "pending_approval")
    insert_approval(api, w, "api:op-alice")
    forge_state_approved(api, w)
    assert_equal(sign(api, signer, w), "approval_unsigned")


def test_a_signature_by_a_key_the_signer_does_not_know_is_refused(api, signer, ledger):
    w = pending(api)
    log.info("custody's registry lists op-mallory's key (a compromised custody config); the signer's does not")
    assert_equal(api.approve(1, w.id).json()["state"], "pending_approval")
    r = approve_over_api(operator_client(api.custody, "op-mallory"), w.id, "op-mallory")
    assert_equal((r.status_code, r.json()["state"]), (200, "approved"))
    assert_equal(sign(api, signer, w), "approver_unknown")


def test_a_signature_over_another_amount_is_refused(api, signer, ledger):
    w = pending(api)
    other = payload_of(api, w, amount=api.custody.withdrawals.approval_payload(w.id).amount + 100_000_000)
    log.info("op-alice's valid signature over the same withdrawal for 1 BTC more, stored as signed")
    assert_equal(api.approve(1, w.id).json()["state"], "pending_approval")
    insert_approval(api, w, "api:op-alice", sign_approval(other, "op-alice"), other)
    with api.custody.engine.connect() as c:
        stored = c.execute(text("SELECT signed_payload FROM approval WHERE withdrawal_id = :w AND operator = 'api:op-alice'"),
                           {"w": w.id}).scalar_one()
    assert_equal(bytes(stored), other)
    forge_state_approved(api, w)
    assert_equal(sign(api, signer, w), "approval_payload_mismatch")


def test_approvals_of_a_destination_rewritten_afterwards_are_refused(api, signer, ledger):
    w = pending(api)
    both_operators_approve(api, w)
    log.info("after two valid approvals the row is rewritten to pay %s", ATTACKER)
    with api.custody.engine.begin() as c:
        c.execute(text("UPDATE withdrawal_request SET destination = :d, destination_script = :s WHERE id = :w"),
                  {"d": ATTACKER, "s": address_to_script(ATTACKER, "regtest"), "w": w.id})
    assert_equal(sign(api, signer, w), "approval_payload_mismatch")


def test_a_payload_changed_after_it_was_signed_is_refused(api, signer, ledger):
    w = pending(api)
    assert_equal(api.approve(1, w.id).json()["state"], "pending_approval")
    signed = payload_of(api, w)
    changed = payload_of(api, w, destination=ATTACKER)
    log.info("op-alice's signature over the real payload, stored beside a payload naming another destination")
    insert_approval(api, w, "api:op-alice", sign_approval(signed, "op-alice"), changed)
    forge_state_approved(api, w)
    assert_equal(sign(api, signer, w), "approval_signature_invalid")


def test_another_withdrawals_approvals_replayed_are_refused(api, signer, ledger):
    first, second = pending(api), pending(api)
    both_operators_approve(api, first)
    log.info("withdrawal %d's two valid approvals are copied onto withdrawal %d", first.id, second.id)
    with api.custody.engine.begin() as c:
        c.execute(text("INSERT INTO approval (withdrawal_id, decision_id, operator, action, comment, key_id, scheme, "
                       "signed_payload, signature) SELECT :w, (SELECT decision_id FROM withdrawal_request WHERE id = :w), "
                       "operator, 'approve', 'replayed', key_id, scheme, signed_payload, signature FROM approval "
                       "WHERE withdrawal_id = :f AND action = 'approve'"), {"w": second.id, "f": first.id})
    forge_state_approved(api, second)
    assert_equal(sign(api, signer, second), "approval_replayed")
    assert_equal(sign(api, signer, first), "signed")  # the originals are good where they belong


def forge_automatic_decision(api: WithdrawalApi, w: Paid) -> None:
    with api.custody.engine.begin() as c:
        forged = c.execute(text("INSERT INTO policy_decision (withdrawal_id, outcome, required_approvals, reasons, policy_version, "
                                "record, decided_at, expires_at) SELECT id, 'approve', 0, '{}', 'forged', '{}', now(), "
                                "now() + interval '1 day' FROM withdrawal_request WHERE id = :w RETURNING id"),
                           {"w": w.id}).scalar_one()
        c.execute(text("UPDATE withdrawal_request SET decision_id = :d, state = 'approved' WHERE id = :w"), {"d": forged, "w": w.id})


def test_a_decision_forged_to_approve_still_needs_the_signers_quorum(api, signer, ledger):
    w = pending(api)
    log.info("withdrawal %d's decision is replaced by a forged automatic approval: 0 approvals for 5 BTC", w.id)
    forge_automatic_decision(api, w)
    assert_equal(sign(api, signer, w), "decision_not_approved")

    w = pending(api)
    log.info("a forged automatic decision with one valid approval: the signer's table asks two for 5 BTC")
    forge_automatic_decision(api, w)
    payload = payload_of(api, w)
    insert_approval(api, w, f"api:{api.operator_name(1)}", sign_approval(payload, api.operator_name(1)), payload)
    assert_equal(sign(api, signer, w), "decision_not_approved")


def test_the_requesters_own_key_and_a_copied_signature_do_not_count(api, ledger):
    engine = api.custody.engine
    requester = f"backend-1-{api.run}"  # WithdrawalApi's backend key requests every withdrawal
    own = registry(api.operator_name(1), api.operator_name(2), requester)
    signer = Signer(engine, KEYS, bitcoin_network="regtest", approvers=own, quorum=quorum_table_from_policy(default_policy()))
    w = pending(api)
    assert_equal(api.approve(1, w.id).json()["state"], "pending_approval")
    payload = payload_of(api, w)
    log.info("a second approval signed with the requester's own key (%s) is valid but does not count", requester)
    insert_approval(api, w, "api:someone-else", sign_approval(payload, requester), payload)
    forge_state_approved(api, w)
    assert_equal(sign(api, signer, w), "decision_not_approved")

    w = pending(api)
    assert_equal(api.approve(1, w.id).json()["state"], "pending_approval")
    log.info("operator 1's valid signature copied into a second row under another operator's name counts once")
    with engine.begin() as c:
        c.execute(text("INSERT INTO approval (withdrawal_id, decision_id, operator, action, comment, key_id, scheme, "
                       "signed_payload, signature) SELECT withdrawal_id, decision_id, :o, 'approve', 'copied', key_id, scheme, "
                       "signed_payload, signature FROM approval WHERE withdrawal_id = :w"),
                  {"w": w.id, "o": f"api:{api.operator_name(2)}"})
    forge_state_approved(api, w)
    assert_equal(sign(api, signer, w), "decision_not_approved")


def test_two_valid_signatures_are_signed(api, signer, ledger):
    w = pending(api)
    both_operators_approve(api, w)
    with api.custody.engine.connect() as c:
        rows = c.execute(text("SELECT operator, key_id, scheme, signed_payload FROM approval WHERE withdrawal_id = :w ORDER BY id"),
                         {"w": w.id}).all()
    assert_equal([(r.operator, r.key_id, r.scheme, bytes(r.signed_payload)) for r in rows],
                 [(f"api:{api.operator_name(n)}", f"test-ed25519:{api.operator_name(n)}", "ed25519", payload_of(api, w))
                  for n in (1, 2)])
    assert_equal(sign(api, signer, w), "signed")


def test_a_webauthn_approval_and_an_ed25519_one_are_signed(api, signer, ledger):
    w = pending(api)
    assert_equal(api.approve(1, w.id).json()["state"], "pending_approval")
    carol = operator_client(api.custody, "op-carol")
    p = carol.get(f"/v1/withdrawals/{w.id}/approval-payload").json()
    assertion = CAROL.assertion(base64.b64decode(p["payload_base64"]))
    r = carol.post(f"/v1/withdrawals/{w.id}/approve", json={"comment": "security key", "signature": signature_json(assertion)})
    assert_equal((r.status_code, r.json()["state"]), (200, "approved"))
    assert_equal(sign(api, signer, w), "signed")
