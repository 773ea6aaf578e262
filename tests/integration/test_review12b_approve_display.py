"""Review of issue 12, round 2 (R3): `custody approve` shows what the payload bytes say, but prints
their free-text fields raw, so the bytes can redraw the operator's terminal.

Attacker: a compromised custody API process (custody_api may INSERT policy_decision and UPDATE
withdrawal_request). It points withdrawal 42 at the attacker's address for 20 BTC under a decision
whose `policy_version` (free text: no CHECK, the signer never compares it with anything, it only
rebuilds the payload from the row) carries ANSI escape sequences. The payload is canonical
(`read_payload` accepts it: JSON escapes ESC as \\u001b and the CLI decodes it back), names
withdrawal 42, and the API's JSON fields agree with it. When the CLI prints the second line
("... under policy <policy_version> ..."), the sequences move the cursor up, erase both lines and
write "pay 0.01000000 BTC ... to <the customer's address>". The operator approves what the screen
says; the signature is over 20 BTC to the attacker, and two operators fooled this way are a quorum.

Expected: nothing is signed or sent for a payload whose string fields hold control or format
characters (Unicode categories Cc/Cf: ESC, CR, bidi overrides), or at least nothing reaches the
terminal unescaped.
"""
from __future__ import annotations

import base64
import datetime as dt
import json
import unicodedata

import httpx

from custody.approve_cli import main, new_key_file
from signer.approvals import approval_payload, format_expiry, parse_payload, webauthn_challenge

EXPIRES = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
HONEST_DEST = "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080"
ATTACKER_DEST = "bcrt1que968zjtjkx890qdggg4pwjxgcmyyfy9r64a89"
COVER = ("v1\x1b[1A\r\x1b[2Kwithdrawal 42 (pending_approval): pay 0.01000000 BTC on bitcoin to " + HONEST_DEST
         + "\n\r\x1b[2Kamount 1000000 minor units; decision 7 under policy v1")
EVIL = dict(withdrawal_id=42, chain="bitcoin", asset="BTC", amount=2_000_000_000, destination=ATTACKER_DEST, decision_id=7,
            policy_version=COVER, expires_at=EXPIRES)


def test_approve_cli_prints_control_characters_of_the_payload_to_the_terminal(tmp_path, capsys):
    key_file = tmp_path / "op.pem"
    new_key_file(key_file)
    api_key = tmp_path / "api-key"
    api_key.write_text("op-key\n")
    evil = approval_payload(**EVIL)
    assert parse_payload(evil)["policy_version"] == COVER  # the bytes a compromised API can build and serve
    posts: list[dict] = []

    def compromised_api(request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path == "/v1/withdrawals/42/approval-payload":
            fields = {**EVIL, "expires_at": format_expiry(EXPIRES), "amount_minor": str(EVIL["amount"])}
            del fields["amount"]
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
    raw = sorted({f"U+{ord(ch):04X}" for ch in shown if ch != "\n" and unicodedata.category(ch) in ("Cc", "Cf")})
    assert posts == [] or not raw, (
        f"the CLI signed and sent an approval of {EVIL['amount']} sat to {ATTACKER_DEST} (exit {status}) after writing "
        f"{raw} raw to the operator's terminal, which then reads 'pay 0.01000000 BTC ... to {HONEST_DEST}': {shown!r}")
