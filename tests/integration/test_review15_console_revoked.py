"""Adversarial review of issue 15, R15-5: revoking a console credential ends its sessions, but its key
stays an approver. Custody's door (`approvers`, the setting the approver entry was copied into)
never asks whether a `console:` key's credential was revoked, and nothing in the revoke answer or
the README says the entry must also leave the signer's and custody's configuration: a withdrawal
approval signed with the revoked key is accepted and counted.

The operator re-enrols a new key (K2, approved) after K1 was revoked (lost or cloned); a request
made with the K2 session but signed with K1 went through. Fixed: custody's door refuses a `console:`
key whose credential is not active (`approver_unknown`), and the revoke answer says to remove the entry.
"""
from __future__ import annotations

import base64

import pytest
from sqlalchemy import text

from custody.container import Container
from custody.settings import Settings
from ledger.service import Ledger
from regtest.util import assert_equal
from tests.approvers import signature_json
from tests.console_passkey import SoftPasskey
from tests.integration.console_helpers import ORIGIN, Console
from tests.integration.own_database import own_database
from tests.integration.test_signed_approvals import pending
from tests.integration.withdrawal_api import WithdrawalApi


@pytest.fixture(scope="module")
def world(database_url):
    with own_database(database_url, "review15_revoked") as eng:
        enrolling = Console(Container(settings=Settings(environment="test"), engine=eng, ledger=Ledger(eng)))
        _, k1, session = enrolling.person("r155-anna", "operator")
        entry = enrolling.admin_key.get(f"/console/api/credentials/{session['credential_id']}/approver-entry")
        assert entry.status_code == 200, entry.text
        api = WithdrawalApi(eng, extra_approvers=(entry.json()["entry"],))
        yield api, Console(api.custody), k1, session
        Ledger(eng).assert_verified()


def test_a_revoked_console_credential_no_longer_approves(world):
    api, console, k1, session = world
    username = session["username"]
    r = console.admin_key.post(f"/console/api/credentials/{session['credential_id']}/revoke")
    assert_equal((r.status_code, r.json()["state"]), (200, "revoked"))
    k2 = SoftPasskey(username, origin=ORIGIN, label="new key")
    client = console.client()
    console.approve_enrolment(console.enrol(client, username, k2)["id"], "operator")
    signed_in = console.sign_in(client, username, k2)
    assert signed_in.status_code == 200, signed_in.text

    w = pending(api)
    shown = client.get(f"/v1/withdrawals/{w.id}/approval-payload").json()
    payload = base64.b64decode(shown["payload_base64"])
    r = client.post(f"/v1/withdrawals/{w.id}/approve", headers={"X-CSRF-Token": signed_in.json()["csrf_token"]},
                    json={"comment": "signed with the revoked key", "signature": signature_json(k1.approval(payload))})
    with api.custody.engine.connect() as c:
        counted = c.execute(text("SELECT count(*) FROM approval WHERE withdrawal_id = :w AND key_id = :k"),
                            {"w": w.id, "k": k1.key_id}).scalar_one()
    api.reject_all(w.account)
    assert_equal((r.status_code >= 400, counted), (True, 0))
