"""console approvals (issue 15, must show 2): an approval made in the console is a WebAuthn signature
over exactly the payload the page showed, and the SIGNER verifies it against its own configuration.

Two operators enrol a passkey in the console (tests/console_passkey.py answers as the browser's
authenticator would), an admin approves their enrolments and exports each credential's approver
entry (`GET /console/api/credentials/{id}/approver-entry`); the signer is configured with those two
entries only (not custody's table: it never reads one) and custody's early check with the same
entries, as an operations team would. Each operator then approves as the page does: read the
approval payload, have the authenticator sign SHA-256 of its bytes, POST it with the session cookie
and CSRF token. The signer signs the withdrawal; the stored signed bytes are the payload shown.
A withdrawal whose amount, or destination, is rewritten in the database after both approved is
refused by the signer (`approval_payload_mismatch`), and the requester's own withdrawal shows as
theirs in the queue and is refused to them.
"""
from __future__ import annotations

import base64
import json
import tomllib
import uuid

import pytest
from sqlalchemy import text

from custody.config import ApproverEntry as CustodyApproverEntry
from custody.container import Container
from custody.settings import Settings
from ledger.service import Ledger
from regtest.util import assert_equal
from signer.approvals import ApproverRegistry, quorum_table_from_policy, verify_approval, webauthn_challenge
from signer.bitcoin_tx import address_to_script
from signer.config import ApproverEntry as SignerApproverEntry
from signer.service import Signer
from custody.policy_config import default_policy
from tests.approvers import signature_json
from tests.integration.console_helpers import Console, code
from tests.integration.own_database import own_database
from tests.integration.test_signed_approvals import ATTACKER, KEYS, Paid, pending, sign
from tests.integration.withdrawal_api import DEST, WithdrawalApi


@pytest.fixture(scope="module")
def world(database_url):
    with own_database(database_url, "console_approvals") as eng:
        enrolling = Console(Container(settings=Settings(environment="test"), engine=eng, ledger=Ledger(eng)))
        people = {}
        for who in ("anna", "ben"):
            client, passkey, session = enrolling.person(who, "operator")
            r = enrolling.admin_key.get(f"/console/api/credentials/{session['credential_id']}/approver-entry")
            assert r.status_code == 200, r.text
            people[who] = (passkey, session, r.json()["entry"])
        entries = tuple(entry for _, _, entry in people.values())
        # the entries as TOML in each process's configuration: the signer's [[approvers]] (its own
        # model), custody's `approvers` (the early check at the door)
        toml = "".join("[[approvers]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in e.items()) for e in entries)
        signer_entries = [SignerApproverEntry(**e).model_dump(exclude_none=True) for e in tomllib.loads(toml)["approvers"]]
        custody_entries = [CustodyApproverEntry(**e).model_dump(exclude_none=True) for e in tomllib.loads(toml)["approvers"]]
        api = WithdrawalApi(eng, extra_approvers=tuple(custody_entries))
        signer = Signer(eng, KEYS, bitcoin_network="regtest", approvers=ApproverRegistry.from_entries(signer_entries),
                        quorum=quorum_table_from_policy(default_policy()))
        console = Console(api.custody)
        signed_in = {}
        for who, (passkey, session, _) in people.items():
            client = console.client()
            r = console.sign_in(client, session["username"], passkey)
            assert r.status_code == 200, r.text
            signed_in[who] = (client, passkey, r.json())
        yield api, signer, console, signed_in
        Ledger(eng).assert_verified()


def approve_in_page(world, who: str, wid: int):
    """What the page does: show the payload, sign its challenge, send it with the session."""
    _, _, _, people = world
    client, passkey, session = people[who]
    shown = client.get(f"/v1/withdrawals/{wid}/approval-payload")
    assert shown.status_code == 200, shown.text
    payload = base64.b64decode(shown.json()["payload_base64"])
    assert_equal(shown.json()["challenge"], base64.urlsafe_b64encode(webauthn_challenge(payload)).rstrip(b"=").decode())
    r = client.post(f"/v1/withdrawals/{wid}/approve", headers={"X-CSRF-Token": session["csrf_token"]},
                    json={"comment": "checked in the console", "signature": signature_json(passkey.approval(payload))})
    return r, payload


def queue_row(world, who: str, wid: int) -> dict:
    _, _, _, people = world
    rows = people[who][0].get("/console/api/queue").json()
    return next(r for r in rows if r["id"] == wid)


def both_approve(world, w: Paid) -> list[bytes]:
    api, _, _, _ = world
    shown = []
    r, payload = approve_in_page(world, "anna", w.id)
    assert_equal((r.status_code, r.json()["state"]), (200, "pending_approval"))
    row = queue_row(world, "ben", w.id)
    assert_equal((row["required_approvals"], row["approvals"], row["mine"]), (2, [people_name(world, "anna")], False))
    shown.append(payload)
    r, payload = approve_in_page(world, "ben", w.id)
    assert_equal((r.status_code, r.json()["state"]), (200, "approved"))
    shown.append(payload)
    return shown


def people_name(world, who: str) -> str:
    return world[3][who][2]["username"]


def test_an_approval_in_the_page_is_verified_by_the_signer_over_the_payload_shown(world):
    api, signer, _, people = world
    w = pending(api)
    row = queue_row(world, "anna", w.id)
    assert_equal((row["amount"], row["asset"], row["destination"], row["customer"] is not None),
                 ("5.00000000", "BTC", DEST, True))
    assert row["policy_reasons"] and row["expires_at"] and row["allowlist"]
    shown = both_approve(world, w)
    with api.custody.engine.connect() as c:
        stored = c.execute(text("SELECT operator, key_id, scheme, signed_payload, signature, authenticator_data, "
                                "client_data_json FROM approval WHERE withdrawal_id = :w ORDER BY id"), {"w": w.id}).all()
    assert_equal([bytes(s.signed_payload) for s in stored], shown)
    for s in stored:
        key = verify_approval(signer.approvers, s.key_id, s.scheme, bytes(s.signed_payload), bytes(s.signature),
                              bytes(s.authenticator_data), bytes(s.client_data_json))
        assert_equal(f"api:{key.operator}", s.operator)
    assert_equal(sign(api, signer, w), "signed")


@pytest.mark.parametrize("rewrite", ["amount", "destination"])
def test_a_withdrawal_rewritten_after_approval_is_refused_by_the_signer(world, rewrite):
    api, signer, _, _ = world
    w = pending(api)
    both_approve(world, w)
    with api.custody.engine.begin() as c:
        if rewrite == "amount":
            c.execute(text("UPDATE withdrawal_request SET amount = amount + 100000000 WHERE id = :w"), {"w": w.id})
        else:
            c.execute(text("UPDATE withdrawal_request SET destination = :d, destination_script = :s WHERE id = :w"),
                      {"d": ATTACKER, "s": address_to_script(ATTACKER, "regtest"), "w": w.id})
    assert_equal(sign(api, signer, w), "approval_payload_mismatch")


def test_the_requesters_own_withdrawal_is_theirs_and_not_approvable(world):
    api, _, _, people = world
    anna = people_name(world, "anna")
    acct = api.open_customer(f"own-{uuid.uuid4().hex[:8]}")
    w = api.custody.withdrawals.request(client_withdrawal_id=uuid.uuid4().hex, account_id=acct, amount=500_000_000,
                                        destination=DEST, requested_by=f"api:{anna}")  # as a quarantine return by anna
    assert_equal(w.state, "pending_approval")
    assert_equal((queue_row(world, "anna", w.id)["mine"], queue_row(world, "ben", w.id)["mine"]), (True, False))
    r, _ = approve_in_page(world, "anna", w.id)
    assert_equal((r.status_code, code(r)), (403, "requester_cannot_approve"))
    api.reject_all(acct)
