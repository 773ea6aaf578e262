"""signed_approvals_api: custody's door for approvals. `GET /v1/withdrawals/{id}/approval-payload`
serves the exact bytes to sign; `POST /v1/withdrawals/{id}/approve` refuses, each with its code and
never a 500, an approval without a signature, with bytes that are not base64, by a key custody does
not know, under the wrong scheme, over another payload, or with another operator's key; a refusal
writes nothing. An accepted approval stores the signature and the exact bytes that were signed."""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import uuid

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from custody.auth import Role, create_api_key
from custody.errors import CustodyErrorCode
from regtest.util import assert_equal, assert_raises_code
from signer.approvals import b64url
from tests.approvers import sign_approval, signature_json
from tests.integration.withdrawal_api import WithdrawalApi

log = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def api(engine) -> WithdrawalApi:
    return WithdrawalApi(engine)


def error(r) -> tuple[int, str | None]:
    return r.status_code, (r.json().get("error") or {}).get("code")


def test_the_payload_route_serves_the_bytes_to_sign(api, engine, ledger):
    acct = api.open_customer(f"payload-{uuid.uuid4().hex[:8]}")
    w = api.withdraw(acct, "5")
    p = api.operator().get(f"/v1/withdrawals/{w['id']}/approval-payload")
    assert_equal(p.status_code, 200)
    body = p.json()
    raw = base64.b64decode(body["payload_base64"])
    log.info("payload: %s", body["payload"])
    assert_equal(raw, body["payload"].encode(), api.custody.withdrawals.approval_payload(int(w["id"])).payload)
    fields = json.loads(raw)
    assert_equal((fields["withdrawal_id"], fields["amount"], fields["asset"], fields["destination"], fields["kind"]),
                 (int(w["id"]), "500000000", "BTC", w["destination"], "withdrawal-approval"))
    assert_equal((body["amount"], body["amount_minor"], body["decision_id"]), ("5.00000000", "500000000", fields["decision_id"]))
    assert_equal(body["challenge"], b64url(hashlib.sha256(raw).digest()))
    auditor = TestClient(api.operator().app, raise_server_exceptions=False)
    auditor.headers["X-API-Key"] = create_api_key(engine, f"auditor-{api.run}", Role.auditor, api.custody.settings.api_key_pepper)
    assert_equal(auditor.get(f"/v1/withdrawals/{w['id']}/approval-payload").status_code, 200)
    assert_equal(api.admin.get(f"/v1/withdrawals/{w['id']}/approval-payload").status_code, 200)
    assert_equal(error(api.backend.get(f"/v1/withdrawals/{w['id']}/approval-payload")), (403, "forbidden"))
    assert_equal(error(api.operator().get("/v1/withdrawals/987654321/approval-payload")), (404, "withdrawal_not_found"))
    api.reject_all(acct)


def test_approvals_without_a_valid_own_signature_are_refused_and_write_nothing(api, engine, ledger):
    acct = api.open_customer(f"approve-{uuid.uuid4().hex[:8]}")
    w = api.withdraw(acct, "5")
    wid = int(w["id"])
    url = f"/v1/withdrawals/{wid}/approve"
    payload = api.custody.withdrawals.approval_payload(wid).payload
    me = api.operator_name(1)
    good = signature_json(sign_approval(payload, me))
    other_amount = payload.replace(b'"amount":"500000000"', b'"amount":"500000001"')
    assert other_amount != payload
    attempts = {
        "no signature": ({"comment": "ok"}, (422, "approval_signature_required")),
        "signature not base64": ({"comment": "ok", "signature": {**good, "signature": "%%%"}}, (422, "approval_signature_malformed")),
        "client data not base64": ({"comment": "ok", "signature": {**good, "client_data_json": "*"}},
                                   (422, "approval_signature_malformed")),
        "unknown scheme": ({"comment": "ok", "signature": {**good, "scheme": "rsa"}}, (422, "invalid_request")),
        "a key custody does not know": ({"comment": "ok", "signature": signature_json(sign_approval(payload, "op-zed"))},
                                        (403, "approver_unknown")),
        "the wrong scheme": ({"comment": "ok", "signature": {**good, "scheme": "webauthn"}}, (403, "approval_scheme_mismatch")),
        "a signature over another amount": ({"comment": "ok", "signature": signature_json(sign_approval(other_amount, me))},
                                            (403, "approval_signature_invalid")),
        "a signature not of this key": ({"comment": "ok", "signature": signature_json(
            sign_approval(payload, "op-bob", as_key=f"test-ed25519:{me}"))}, (403, "approval_signature_invalid")),
        "another operator's key": ({"comment": "ok", "signature": signature_json(sign_approval(payload, api.operator_name(2)))},
                                   (403, "approver_not_caller")),
        "a webauthn claim without its data": ({"comment": "ok", "signature": {**good, "scheme": "webauthn",
                                                                               "key_id": "test-ed25519:op-alice"}},
                                              (403, "approval_scheme_mismatch")),
    }
    for what, (body, expected) in attempts.items():
        r = api.operator(1).post(url, json=body)
        log.info("%s -> %d %s", what, r.status_code, r.text[:120])
        assert_equal((what, error(r)), (what, expected))
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT count(*) FROM approval WHERE withdrawal_id = :w"), {"w": wid}).scalar(), 0)
    assert_equal(api.custody.withdrawals.get(wid).state, "pending_approval")

    log.info("the backend and the admin may not approve at all, signature or not")
    assert_equal(error(api.backend.post(url, json={"comment": "mine", "signature": good})), (403, "forbidden"))
    assert_equal(error(api.admin.post(url, json={"comment": "admin", "signature": good})), (403, "forbidden"))

    log.info("operator 1's own valid signature is accepted and stored with the exact bytes signed")
    r = api.operator(1).post(url, json={"comment": "ok", "signature": good})
    assert_equal((r.status_code, r.json()["state"]), (200, "pending_approval"))
    assert_equal(error(api.approve(1, wid)), (409, "already_acted"))
    with engine.connect() as c:
        row = c.execute(text("SELECT operator, key_id, scheme, signed_payload, signature FROM approval WHERE withdrawal_id = :w"),
                        {"w": wid}).one()
    assert_equal((row.operator, row.key_id, row.scheme, bytes(row.signed_payload), base64.b64encode(bytes(row.signature)).decode()),
                 (f"api:{me}", f"test-ed25519:{me}", "ed25519", payload, good["signature"]))
    api.reject_all(acct)


def test_a_service_call_without_registry_accepts_no_approval(engine, ledger):
    """A container given no approver keys: every approval is approver_unknown (nobody's counts)."""
    from custody.container import Container
    from custody.settings import Settings
    from ledger.service import Ledger

    api = WithdrawalApi(engine)
    bare = Container(settings=Settings(environment="test"), engine=engine, ledger=Ledger(engine)).with_chains({})
    acct = api.open_customer(f"bare-{uuid.uuid4().hex[:8]}")
    wid = int(api.withdraw(acct, "5")["id"])
    payload = bare.withdrawals.approval_payload(wid).payload
    assert_raises_code(CustodyErrorCode.approver_unknown, bare.withdrawals.approve, wid, operator="op-alice", comment="ok",
                       signature=sign_approval(payload, "op-alice"))
    api.reject_all(acct)
