"""Review of issue 12 (R1): `custody approve` signs whatever bytes the API hands it.

Attacker: a compromised custody API process (threat 1). The honest operator runs
`custody approve --key FILE 42`. The CLI shows what the API's JSON FIELDS say (withdrawal 42, the
customer's destination) but signs `payload_base64`, which it never parses: the API serves the
payload of withdrawal 99 paying the attacker. The operator's valid signature is then a valid
approval of withdrawal 99 at the signer; two operators fooled this way are a quorum nobody gave.

A correct CLI parses the bytes it signs (signer.approvals.parse_payload), refuses a payload that
names another withdrawal than the one asked for (or is not canonical: approval_payload of its
fields must give the same bytes), and shows what the BYTES say. No POST may carry a signature over
a payload the operator was not shown.
"""
from __future__ import annotations

import base64
import datetime as dt
import json

import httpx

from custody.approve_cli import main, new_key_file
from signer.approvals import approval_payload, format_expiry, webauthn_challenge

EXPIRES = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
HONEST = dict(withdrawal_id=42, chain="bitcoin", asset="BTC", amount=500_000_000,
              destination="bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080", decision_id=7, policy_version="v1", expires_at=EXPIRES)
EVIL = {**HONEST, "withdrawal_id": 99, "decision_id": 8, "amount": 2_000_000_000,
        "destination": "bcrt1que968zjtjkx890qdggg4pwjxgcmyyfy9r64a89"}


def test_approve_cli_refuses_a_payload_for_another_withdrawal(tmp_path, capsys):
    key_file = tmp_path / "op.pem"
    new_key_file(key_file)
    api_key = tmp_path / "api-key"
    api_key.write_text("op-key\n")
    evil = approval_payload(**EVIL)
    posts: list[dict] = []

    def compromised_api(request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path == "/v1/withdrawals/42/approval-payload":
            fields = {**HONEST, "expires_at": format_expiry(EXPIRES), "amount": "5.00000000"}
            return httpx.Response(200, json={**fields, "state": "pending_approval",
                                             "payload_base64": base64.b64encode(evil).decode(),
                                             "challenge": base64.urlsafe_b64encode(webauthn_challenge(evil)).decode()})
        if request.method == "POST":
            posts.append(json.loads(request.content))
            return httpx.Response(200, json={"id": 42, "state": "approved"})
        return httpx.Response(404, json={"error": {"code": "not_found", "message": str(request.url)}})

    client = httpx.Client(base_url="http://custody.test", transport=httpx.MockTransport(compromised_api))
    status = main(["approve", "--key", str(key_file), "--api-key-file", str(api_key), "42"], http=client)
    shown = capsys.readouterr().out
    assert posts == [], (f"the CLI signed and sent a payload for withdrawal 99 paying {EVIL['destination']} while "
                         f"showing the operator: {shown.strip()!r}")
    assert status != 0
