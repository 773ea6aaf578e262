"""custody approve trusts the payload BYTES, not the API's JSON: against a stub API (httpx
MockTransport) it shows what the bytes say, signs exactly those bytes, and refuses (exit 3, no POST)
bytes that are not canonical, that name another withdrawal, or that the API's own fields contradict.
The review's case (another withdrawal's payload) is tests/integration/test_review12_approve_cli.py."""
from __future__ import annotations

import base64
import datetime as dt
import json

import httpx
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from custody.approve_cli import main, new_key_file, shown
from regtest.util import assert_equal
from signer.approvals import approval_payload, format_expiry, webauthn_challenge

EXPIRES = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
FIELDS = dict(withdrawal_id=42, chain="bitcoin", asset="BTC", amount=250_000_000,
              destination="bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080", decision_id=7, policy_version="v1", expires_at=EXPIRES)


def api_answer(payload: bytes, **fields) -> dict:
    """What the honest API answers for `payload`'s withdrawal (FIELDS), with `fields` changed."""
    honest = {**FIELDS, "expires_at": format_expiry(EXPIRES), "amount": "2.50000000", "amount_minor": str(FIELDS["amount"]),
              "state": "pending_approval", "payload": payload.decode(), "payload_base64": base64.b64encode(payload).decode(),
              "challenge": base64.urlsafe_b64encode(webauthn_challenge(payload)).decode()}
    return {**honest, **fields}


def run(tmp_path, answer: dict, *extra: str) -> tuple[int, list[dict], object]:
    """`custody approve 42` against a stub API serving `answer`; (exit status, POSTed bodies, key)."""
    key_file = tmp_path / "op.pem"
    if not key_file.exists():
        new_key_file(key_file)
    (tmp_path / "api-key").write_text("op-key\n")
    posts: list[dict] = []

    def api(request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path == "/v1/withdrawals/42/approval-payload":
            return httpx.Response(200, json=answer)
        if request.method == "POST" and request.url.path == "/v1/withdrawals/42/approve":
            posts.append(json.loads(request.content))
            return httpx.Response(200, json={"id": 42, "state": "pending_approval"})
        return httpx.Response(404, json={"error": {"code": "not_found", "message": str(request.url)}})

    client = httpx.Client(base_url="http://custody.test", transport=httpx.MockTransport(api))
    status = main(["approve", "--key", str(key_file), "--api-key-file", str(tmp_path / "api-key"), *extra, "42"], http=client)
    return status, posts, load_pem_private_key(key_file.read_bytes(), None)


def test_what_is_shown_and_signed_are_the_payload_bytes(tmp_path, capsys):
    payload = approval_payload(**FIELDS)
    status, [post], key = run(tmp_path, api_answer(payload, amount="0.00000001"))  # a lying display field is not shown
    out = capsys.readouterr().out
    assert_equal(status, 0)
    key.public_key().verify(base64.b64decode(post["signature"]["signature"]), payload)  # exactly the bytes shown
    assert f"withdrawal 42 (pending_approval): pay 2.50000000 BTC on bitcoin to {FIELDS['destination']}" in out, out
    assert "amount 250000000 minor units; decision 7 under policy v1, valid until 2030-01-01T00:00:00.000000Z" in out, out
    assert "0.00000001" not in out


def test_an_asset_whose_decimals_are_not_known_here_is_shown_in_minor_units(tmp_path, capsys):
    usdt = {**FIELDS, "chain": "ethereum", "asset": "USDT", "amount": 2_500_000, "destination": "0x" + "ab" * 20}
    payload = approval_payload(**usdt)
    answer = api_answer(payload, **{**usdt, "expires_at": format_expiry(EXPIRES), "amount": "2.500000", "amount_minor": "2500000"})
    assert_equal(run(tmp_path, answer)[0], 0)
    assert "pay 2500000 minor units of USDT (decimals unknown here: pass --decimals USDT=N) on ethereum" in capsys.readouterr().out
    assert_equal(run(tmp_path, answer, "--decimals", "USDT=6")[0], 0)
    assert "pay 2.500000 USDT on ethereum" in capsys.readouterr().out
    assert_equal(run(tmp_path, answer, "--decimals", "USDT")[:2], (2, []))


def test_bytes_that_are_not_canonical_or_that_the_api_contradicts_are_not_signed(tmp_path, capsys):
    payload = approval_payload(**FIELDS)
    spaced = json.dumps(json.loads(payload), sort_keys=True).encode()
    smuggled = payload[:-1] + b',"withdrawal_id":99}'  # a parser that keeps the first key shows 42, another pays 99
    refused = {
        "not canonical": api_answer(spaced),
        "a duplicate key": api_answer(smuggled),
        "not base64": {**api_answer(payload), "payload_base64": "%%%"},
        "no payload": {k: v for k, v in api_answer(payload).items() if k != "payload_base64"},
        "another destination than the JSON says": api_answer(approval_payload(**{**FIELDS, "destination": "bcrt1qattacker"})),
        "another amount than the JSON says": api_answer(approval_payload(**{**FIELDS, "amount": 25_000_000_000})),
        "another decision than the JSON says": api_answer(approval_payload(**{**FIELDS, "decision_id": 8})),
        "another expiry than the JSON says": api_answer(approval_payload(**{**FIELDS, "expires_at": EXPIRES + dt.timedelta(days=1)})),
    }
    for what, answer in refused.items():
        status, posts, _ = run(tmp_path, answer)
        err = capsys.readouterr().err
        assert (status, posts) == (3, []), (what, status, posts)
        assert "NOT SIGNED" in err, (what, err)


def test_nothing_the_api_sends_reaches_the_terminal_raw(tmp_path, capsys):
    """Terminal control sequences in the API's strings (issue 12, R3): a payload whose text holds them
    is not signed (exit 3); the JSON's `state` and an error's message, which no payload covers, are
    printed escaped, so they cannot move the cursor or erase what the operator reads."""
    redraw = "\x1b[1A\r\x1b[2Kwithdrawal 42: pay 0.01000000 BTC \u202e"
    status, posts, _ = run(tmp_path, api_answer(approval_payload(**{**FIELDS, "policy_version": "v1" + redraw}),
                                                policy_version="v1" + redraw))
    err = capsys.readouterr().err
    assert_equal((status, posts), (3, []))
    assert "policy_version (U+000D, U+001B, U+202E)" in err, err
    status, [post], _ = run(tmp_path, api_answer(approval_payload(**FIELDS), state="pending_approval" + redraw))
    out, err = capsys.readouterr()
    assert_equal(status, 0)
    assert "withdrawal 42 (pending_approval\\x1b[1A\\x0d\\x1b[2Kwithdrawal 42: pay 0.01000000 BTC \\u202e): pay 2.50000000 BTC" in out, out
    for text in (out, err):
        assert all(ch == "\n" or " " <= ch <= "~" for ch in text), repr(text)
    assert_equal(shown("a\\x1b\x1b\u202eé\U0001f600~"), "a\\\\x1b\\x1b\\u202e\\xe9\\U0001f600~")  # a literal backslash is doubled


def test_an_api_refusal_is_printed_escaped(tmp_path, capsys):
    def api(request: httpx.Request) -> httpx.Response:
        return httpx.Response(409, json={"error": {"code": "conflict\x1b[2K", "message": "no\r\x1b[1Aapproved: ok\u2028"}})

    key_file = tmp_path / "op.pem"
    new_key_file(key_file)
    (tmp_path / "api-key").write_text("op-key\n")
    client = httpx.Client(base_url="http://custody.test", transport=httpx.MockTransport(api))
    status = main(["approve", "--key", str(key_file), "--api-key-file", str(tmp_path / "api-key"), "42"], http=client)
    err = capsys.readouterr().err
    assert_equal(status, 1)
    assert_equal(err, "refused: 409 conflict\\x1b[2K: no\\x0d\\x1b[1Aapproved: ok\\u2028\n")
