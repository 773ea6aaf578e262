"""Adversarial review of issue 15 (the operator console): enrolment, sign-in and the approver entry.

Each test is a finding; each was marked xfail(strict) until its fix (branch fix-console) landed:

- R15-1: a database writer with custody_api's rights (the api process's role) activates a console
  credential holding ITS OWN key under an operator's name (the guard trigger only refuses
  `decided_by = username`); the admin's "Approver entry" export then serves that key as the
  operator's `[[approvers]]` entry, and with it in the signer's registry an assertion of the
  attacker's key verifies as the operator's approval. Nothing binds the exported key to an admin's
  decision, so "what it cannot forge is an approval of a payment" (0034_console) does not hold for
  approvals that reach the signer through the export.
- R15-2: console usernames are case-sensitive and self-chosen ("anna" and "Anna" are two
  credentials); the README says a name is one operator across its forms, and withdrawals compare
  case-folded, but treasury adjustments compare `proposed_by == by` exactly: one operator with a
  second, case-variant enrolment (which the Enrolments page does not flag: its check is `===`)
  proposes and approves an adjustment alone, minting customer money from equity. Fixed twice over:
  a case-variant enrolment is refused (`console_username_taken`), and adjustments compare
  operators case-folded (one that exists anyway, or two API keys named alike, cannot self-approve).
- R15-3: "nobody approves their own enrolment" is a username comparison only: an admin signed in to
  the console enrols a key under another name from the same browser (the enrol request carries
  their session cookie) and approves it as an operator from that same session.
- R15-4: unauthenticated sign-in options tell whether a username has an approved key and list its
  credential ids (user enumeration).
- R15-6: console enrolment and sign-in accept client data made in a cross-origin frame
  (`crossOrigin: true`, a `topOrigin`), which signer.approvals refuses for approvals as
  clickjacking; today only the page's `frame-ancestors 'none'` stands in the way.
"""
from __future__ import annotations

import base64
import datetime as dt
import json
import uuid

import pytest
from sqlalchemy import text

from custody.auth import create_api_key
from custody.container import Container
from custody.settings import Settings
from ledger.service import Ledger
from regtest.util import assert_equal
from signer.approvals import ApprovalInvalid, ApproverRegistry, approval_payload, b64url, verify_approval
from tests.console_passkey import SoftPasskey
from tests.integration.console_helpers import ORIGIN, Console, code
from tests.integration.test_money_boundaries import Api, firm


@pytest.fixture(scope="module")
def console(engine) -> Console:
    return Console(Container(settings=Settings(environment="test"), engine=engine, ledger=Ledger(engine)))


# ---- R15-1 ------------------------------------------------------------------------------------

def test_a_credential_activated_by_a_database_writer_gets_no_approver_entry(console, engine):
    victim = console.name("r151-anna")
    console.person("r151-anna", "operator")  # the real operator, enrolled and approved properly
    attacker = SoftPasskey(victim, origin=ORIGIN, label="attacker")
    with engine.connect() as c:
        tx = c.begin()
        c.execute(text("SET LOCAL ROLE custody_api"))
        cid = c.execute(text("INSERT INTO console_credential (username, credential_id, public_key, rp_id, origin) "
                             "VALUES (:u, :i, :k, 'localhost', :o) RETURNING id"),
                        {"u": victim, "i": attacker.credential_id, "k": attacker.public_key_cose, "o": ORIGIN}).scalar_one()
        c.execute(text("UPDATE console_credential SET state = 'active', role = 'operator', decided_by = 'an-admin', "
                       "decided_at = now() WHERE id = :i"), {"i": cid})
        tx.commit()
    r = console.admin_key.get(f"/console/api/credentials/{cid}/approver-entry")
    forged_entry_served = r.status_code == 200
    if forged_entry_served:  # what the signer would then accept as the victim's approval
        registry = ApproverRegistry.from_entries([r.json()])
        payload = approval_payload(withdrawal_id=1, chain="bitcoin", asset="BTC", amount=10**8, destination="bcrt1qattacker",
                                   decision_id=1, policy_version="v1",
                                   expires_at=dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc))
        sig = attacker.approval(payload)
        key = verify_approval(registry, sig.key_id, sig.scheme, payload, sig.signature, sig.authenticator_data,
                              sig.client_data_json)
        assert_equal(key.operator, victim)  # the attacker's key approves as the victim
    assert not forged_entry_served, "an approver entry for a key no admin approved"


def test_an_activation_counts_only_from_a_configured_admin_for_that_credential_and_role(console, engine):
    """R15-1's fix, each way around it: an admin key that is not in CONSOLE_ADMINS, a configured
    admin's signature over another role or another credential, a proof written after activation."""
    console.person("r151-admin", "admin")  # active admin, but not in CONSOLE_ADMINS
    outsider = SoftPasskey(console.name("r151-admin"), origin=ORIGIN)
    names = [console.name(f"r151-op{i}") for i in range(2)]
    ids = [console.enrol(console.client(), n, SoftPasskey(n, origin=ORIGIN))["id"] for n in names]

    def approve(body):
        return console.admin_key.post(f"/console/api/credentials/{ids[0]}/approve", json=body)

    for activation in (console.activation(ids[0], "operator", admin=outsider),  # not a configured admin
                       console.activation(ids[0], "admin"),  # the root's, for another role
                       console.activation(ids[1], "operator")):  # the root's, for another credential
        r = approve({"role": "operator", "activation": activation})
        assert_equal((r.status_code, code(r)), (403, "console_activation_invalid"))
    assert_equal(approve({"role": "operator"}).status_code, 200)  # unsigned: signs in, no approver entry
    r = console.admin_key.get(f"/console/api/credentials/{ids[0]}/approver-entry")
    assert_equal((r.status_code, code(r)), (403, "console_activation_invalid"))
    proof = console.activation(ids[1], "operator")  # a real proof of another row, copied underneath
    with pytest.raises(Exception) as late:
        with engine.begin() as c:
            c.execute(text("SET LOCAL ROLE custody_api"))
            c.execute(text("UPDATE console_credential SET activation_key_id = :k, activation_signature = :s WHERE id = :i"),
                      {"k": proof["key_id"], "s": base64.b64decode(proof["signature"]), "i": ids[0]})
    assert "never after" in str(late.value)
    console.approve_enrolment(ids[1], "operator")
    r = console.admin_key.get(f"/console/api/credentials/{ids[1]}/approver-entry")
    assert_equal((r.status_code, r.json()["entry"]["operator"], r.json()["activated_by"]["key_id"]),
                 (200, names[1], console.root.key_id))


# ---- R15-2 ------------------------------------------------------------------------------------

def _propose_and_approve(api: Api, ledger, proposer: tuple, approver: tuple) -> tuple:
    """`proposer` proposes equity -> alice (1 sat), `approver` approves (each: a client and its
    headers); (the approval's status, its code, what alice got), the ledger verified."""
    alice = api.customer("alice")
    equity = firm(api, "equity:BTC")
    proposed = proposer[0].post("/v1/treasury/adjustments", headers=proposer[1], json={
        "idempotency_key": uuid.uuid4().hex, "reason": "bonus",
        "transfers": [{"debit_account_id": equity, "credit_account_id": alice, "amount": "1"}]})
    assert proposed.status_code == 201, proposed.text
    approved = approver[0].post(f"/v1/treasury/adjustments/{proposed.json()['id']}/approve", headers=approver[1],
                                json={"comment": "ok"})
    minted = ledger.balance(alice).posted
    ledger.assert_verified()
    return approved.status_code, code(approved), minted


def test_a_case_variant_console_user_does_not_approve_their_own_adjustment(engine, ledger):
    api = Api(engine, quorum=1)
    api.client.post("/v1/assets", headers={"X-API-Key": api.keys["admin"]}, json={"code": "BTC", "decimals": 8})
    console = Console(api.container)
    lower, _, lower_session = console.person("r152-anna", "operator")
    upper_name = lower_session["username"].upper()
    passkey = SoftPasskey(upper_name, origin=ORIGIN)
    upper = console.client()
    refused = upper.post("/console/enrol/options", json={"username": upper_name})
    assert_equal((refused.status_code, code(refused)), (409, "console_username_taken"))
    # a case variant that exists anyway (enrolled before this check): it is still the same operator
    with engine.begin() as c:
        cid = c.execute(text("INSERT INTO console_credential (username, credential_id, public_key, rp_id, origin) "
                             "VALUES (:u, :i, :k, 'localhost', :o) RETURNING id"),
                        {"u": upper_name, "i": passkey.credential_id, "k": passkey.public_key_cose, "o": ORIGIN}).scalar_one()
    console.approve_enrolment(cid, "operator")
    r = console.sign_in(upper, upper_name, passkey)
    assert r.status_code == 200, r.text
    upper_session = r.json()
    outcome = _propose_and_approve(api, ledger, (lower, {"X-CSRF-Token": lower_session["csrf_token"]}),
                                   (upper, {"X-CSRF-Token": upper_session["csrf_token"]}))
    assert_equal(outcome, (403, "proposer_cannot_approve", 0))


def test_api_keys_named_alike_but_for_letter_case_do_not_approve_their_own_adjustment(engine, ledger):
    """The same defect without the console (it predates it): API keys `ann-x` and `ANN-X`."""
    api = Api(engine, quorum=1)
    api.client.post("/v1/assets", headers={"X-API-Key": api.keys["admin"]}, json={"code": "BTC", "decimals": 8})
    upper = create_api_key(engine, api.names["ann"].upper(), "operator", api.container.settings.api_key_pepper)
    outcome = _propose_and_approve(api, ledger, (api.client, {"X-API-Key": api.keys["ann"]}),
                                   (api.client, {"X-API-Key": upper}))
    assert_equal(outcome, (403, "proposer_cannot_approve", 0))


# ---- R15-3 ------------------------------------------------------------------------------------

def test_an_admin_does_not_approve_an_enrolment_made_from_their_own_session(console):
    admin, _, admin_session = console.person("r153-root", "admin")
    alias = console.name("r153-ops")
    enrolled = console.enrol(admin, alias, SoftPasskey(alias, origin=ORIGIN))  # same browser: the admin's cookie goes along
    r = admin.post(f"/console/api/credentials/{enrolled['id']}/approve", json={"role": "operator"},
                   headers={"X-CSRF-Token": admin_session["csrf_token"]})
    assert_equal((r.status_code, code(r)), (403, "console_self_approval"))


# ---- R15-4 ------------------------------------------------------------------------------------

def test_sign_in_options_do_not_tell_enrolled_users_from_strangers(console):
    _, _, session = console.person("r154-op", "operator")
    client = console.client()
    known = client.post("/console/sign-in/options", json={"username": session["username"]}).json()
    stranger = client.post("/console/sign-in/options", json={"username": console.name("r154-nobody")}).json()
    assert_equal(len(known["allowCredentials"]) > 0, len(stranger["allowCredentials"]) > 0)


def test_the_passkey_helper_signs_what_it_is_asked(console):
    """Control for R15-1: the attacker's passkey is the helper's ordinary one (its assertion does not
    verify under another key), so R15-1's verification is about the exported entry, not the helper."""
    other = SoftPasskey("someone-else", origin=ORIGIN, label="attacker")
    mine = SoftPasskey("someone", origin=ORIGIN, label="attacker")
    payload = approval_payload(withdrawal_id=1, chain="bitcoin", asset="BTC", amount=1, destination="x", decision_id=1,
                               policy_version="v1", expires_at=dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc))
    registry = ApproverRegistry.from_entries([{"key_id": mine.key_id, "operator": "someone", "scheme": "webauthn",
                                               "public_key": base64.b64encode(mine.public_key_cose).decode(),
                                               "rp_id": "localhost", "origin": ORIGIN}])
    sig = other.approval(payload)
    with pytest.raises(ApprovalInvalid):
        verify_approval(registry, mine.key_id, sig.scheme, payload, sig.signature, sig.authenticator_data,
                        sig.client_data_json)


# ---- R15-6 ------------------------------------------------------------------------------------

class FramedPasskey(SoftPasskey):
    """Answers as a browser does inside a cross-origin frame: `crossOrigin: true` and the framing page's
    `topOrigin` (WebAuthn level 3)."""

    def _client_data(self, kind: str, challenge: bytes, origin: str | None) -> bytes:
        return json.dumps({"type": kind, "challenge": b64url(challenge), "origin": origin or self.origin,
                           "crossOrigin": True, "topOrigin": "https://evil.example"}).encode()


def test_enrolment_and_sign_in_refuse_responses_made_in_a_cross_origin_frame(console):
    username = console.name("r156-op")
    framed = FramedPasskey(username, origin=ORIGIN)
    client = console.client()
    options = client.post("/console/enrol/options", json={"username": username}).json()
    r = client.post("/console/enrol", json={"credential": framed.registration(options)})
    assert_equal((r.status_code, code(r)), (401, "console_assertion_invalid"))
    # the same key enrolled from the console's own page, then used for sign-in from inside a frame
    console.approve_enrolment(console.enrol(client, username, SoftPasskey(username, origin=ORIGIN))["id"], "operator")
    r = console.sign_in(client, username, framed)
    assert_equal((r.status_code, code(r), "set-cookie" in r.headers), (401, "console_assertion_invalid", False))
    assert_equal(console.sign_in(client, username, SoftPasskey(username, origin=ORIGIN)).status_code, 200)  # control
