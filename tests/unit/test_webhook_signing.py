"""custody.webhooks.signing: what a receiver's check accepts and refuses, the exact signed bytes,
the retry backoff, and the URL and event-type rules of an endpoint (pure functions, no database)."""
from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from custody.errors import CustodyError, CustodyErrorCode
from custody.webhooks import WebhookSignatureError, verify_signature
from custody.webhooks.delivery import backoff_seconds
from custody.webhooks.endpoints import check_event_types, check_url
from custody.webhooks.keys import SecretBox, SecretUnreadable, new_secret
from custody.webhooks.signing import delivery_headers, event_body
from regtest.util import assert_equal

SECRET = "whsec_" + "11" * 32
OTHER = "whsec_" + "22" * 32
NOW = 1_700_000_000


def signed(secrets=(SECRET,), body=None, at=NOW):
    body = body if body is not None else event_body("deposit.credited:7", "deposit.credited", "2024-01-01T00:00:00+00:00",
                                                    {"deposit_id": 7, "amount": "50000000"})
    return delivery_headers(secrets, "deposit.credited:7", "deposit.credited", at, body), body


def code_of(fn, *args, **kwargs) -> str:
    with pytest.raises(WebhookSignatureError) as info:
        fn(*args, **kwargs)
    return info.value.code


def test_a_signed_delivery_verifies_and_names_its_event():
    headers, body = signed()
    assert_equal(verify_signature(SECRET, headers, body, now=NOW), "deposit.credited:7")
    lower = {k.lower(): v for k, v in headers.items()}  # header names are case-insensitive
    assert_equal(verify_signature(SECRET, lower, body, now=NOW + 299), "deposit.credited:7")


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body_keyed_with_the_secret_string():
    headers, body = signed()
    expected = hmac.new(SECRET.encode(), f"{NOW}.".encode() + body, hashlib.sha256).hexdigest()
    assert_equal(headers["Custody-Signature"], f"v1={expected}")
    assert_equal(headers["Custody-Timestamp"], str(NOW))
    assert_equal(json.loads(body)["data"], {"amount": "50000000", "deposit_id": 7})
    assert body == event_body("deposit.credited:7", "deposit.credited", "2024-01-01T00:00:00+00:00",
                              {"amount": "50000000", "deposit_id": 7})  # key order does not change the bytes


def test_a_tampered_body_a_wrong_secret_or_a_moved_timestamp_is_refused():
    headers, body = signed()
    assert_equal(code_of(verify_signature, SECRET, headers, body.replace(b"50000000", b"90000000"), now=NOW), "signature_mismatch")
    assert_equal(code_of(verify_signature, OTHER, headers, body, now=NOW), "signature_mismatch")
    moved = {**headers, "Custody-Timestamp": str(NOW + 1)}
    assert_equal(code_of(verify_signature, SECRET, moved, body, now=NOW), "signature_mismatch")


def test_the_replay_window():
    headers, body = signed()
    assert_equal(code_of(verify_signature, SECRET, headers, body, now=NOW + 301), "timestamp_outside_tolerance")
    assert_equal(code_of(verify_signature, SECRET, headers, body, now=NOW - 301), "timestamp_outside_tolerance")
    assert_equal(verify_signature(SECRET, headers, body, now=NOW + 3000, tolerance=3600), "deposit.credited:7")


def test_missing_or_malformed_headers():
    headers, body = signed()
    assert_equal(code_of(verify_signature, SECRET, {k: v for k, v in headers.items() if k != "Custody-Signature"}, body,
                         now=NOW), "header_missing")
    assert_equal(code_of(verify_signature, SECRET, {**headers, "Custody-Timestamp": "soon"}, body, now=NOW), "timestamp_invalid")
    assert_equal(code_of(verify_signature, SECRET, {**headers, "Custody-Signature": "v0=abc"}, body, now=NOW), "signature_mismatch")


def test_during_a_rotation_either_secret_verifies():
    headers, body = signed(secrets=(OTHER, SECRET))
    assert headers["Custody-Signature"].count("v1=") == 2
    assert_equal(verify_signature(SECRET, headers, body, now=NOW), "deposit.credited:7")
    assert_equal(verify_signature(OTHER, headers, body, now=NOW), "deposit.credited:7")
    assert_equal(verify_signature([OTHER, SECRET], signed()[0], body, now=NOW), "deposit.credited:7")  # receiver rolling over


def test_the_event_id_and_type_come_from_the_signed_body_and_unsigned_headers_that_differ_are_refused():
    from custody.webhooks import verify_event
    headers, body = signed()
    event = verify_event(SECRET, headers, body, now=NOW)
    assert_equal((event["id"], event["type"], event["data"]), ("deposit.credited:7", "deposit.credited",
                                                              {"amount": "50000000", "deposit_id": 7}))
    assert_equal(code_of(verify_signature, SECRET, {**headers, "Custody-Event-Id": "deposit.credited:8"}, body, now=NOW),
                 "event_id_mismatch")
    assert_equal(code_of(verify_signature, SECRET, {**headers, "Custody-Event-Type": "fill.created"}, body, now=NOW),
                 "event_type_mismatch")
    bare = {k: v for k, v in headers.items() if k not in ("Custody-Event-Id", "Custody-Event-Type")}
    assert_equal(verify_signature(SECRET, bare, body, now=NOW), "deposit.credited:7")  # the body is enough


def test_a_signed_body_that_is_not_an_event_is_refused():
    for body in (b"not json", b"[1, 2]", b'{"id": 7, "type": "x"}', b'{"type": "x"}'):
        headers = delivery_headers([SECRET], "x", "x", NOW, body)
        assert_equal(code_of(verify_signature, SECRET, headers, body, now=NOW), "body_invalid")


def test_backoff_doubles_within_its_jitter_and_is_capped():
    assert_equal([backoff_seconds(n, base=10, cap=3600, jitter=1.0) for n in (1, 2, 3, 4)], [10, 20, 40, 80])
    assert_equal(backoff_seconds(3, base=10, cap=3600, jitter=0.0), 20)  # half of 40 at the least
    assert_equal(backoff_seconds(50, base=10, cap=3600, jitter=1.0), 3600)
    assert_equal(backoff_seconds(10_000, base=10, cap=3600, jitter=0.5), 2700)  # no overflow


@pytest.mark.parametrize("url", ["https://hooks.example.com/custody", "http://93.184.216.34:8080/in?x=1",
                                 "https://[2606:4700::1111]/in"])
def test_urls_accepted(url):
    assert_equal(check_url(url), url)


@pytest.mark.parametrize("url", ["http://localhost:8545/", "http://[::ffff:127.0.0.1]/", "http://0.0.0.0:5432/",
                                 "http://100.64.0.1/", "http://[fe80::1]/", "http://[fd00::5]/", "http://192.168.1.1/"])
def test_internal_addresses_and_names_resolving_to_them_are_refused(url):
    with pytest.raises(CustodyError) as info:
        check_url(url)
    assert info.value.code is CustodyErrorCode.webhook_url_invalid
    assert "internal address" in info.value.message


def test_the_allow_list_admits_only_its_networks():
    from custody.settings import Settings
    from custody.webhooks.egress import parse_allowed
    allowed = parse_allowed("10.0.0.0/8, 127.0.0.1")
    assert_equal(check_url("http://10.0.0.5:8080/in?x=1", allowed), "http://10.0.0.5:8080/in?x=1")
    assert_equal(check_url("http://127.0.0.1:9/", allowed), "http://127.0.0.1:9/")
    for still_refused in ("http://127.0.0.2/", "http://169.254.169.254/", "http://[::1]/"):
        with pytest.raises(CustodyError):
            check_url(still_refused, allowed)
    with pytest.raises(ValueError, match="WEBHOOK_ALLOW_PRIVATE_HOSTS"):
        Settings(environment="test", webhook_allow_private_hosts="10.0.0.0/8,intranet")


@pytest.mark.parametrize("url", ["ftp://example.com/x", "https://user:pw@example.com/", "https://user@example.com/",
                                 "https:///nohost", "example.com/path", "https://example.com/#frag", "https://exa mple.com/",
                                 "https://example.com:99999/", "http://ex\u0000ample.com", "https://" + "a" * 2050 + ".com", ""])
def test_urls_refused(url):
    with pytest.raises(CustodyError) as info:
        check_url(url)
    assert info.value.code is CustodyErrorCode.webhook_url_invalid


def test_event_types():
    assert_equal(check_event_types(["withdrawal.final", "deposit.credited", "deposit.credited"]),
                 ["deposit.credited", "withdrawal.final"])
    assert_equal(check_event_types(["*"]), ["*"])
    for bad in ([], ["Deposit.Credited"], ["deposit."], ["deposit.*"], ["x"] * 101):
        with pytest.raises(CustodyError) as info:
            check_event_types(bad)
        assert info.value.code is CustodyErrorCode.webhook_event_types_invalid


def test_a_secret_is_sealed_to_its_endpoint():
    box, secret = SecretBox(bytes(range(32))), new_secret()
    sealed = box.seal(5, secret)
    assert secret.encode() not in sealed
    assert_equal(box.open(5, sealed), secret)
    with pytest.raises(SecretUnreadable):
        box.open(6, sealed)  # copied onto another endpoint
    with pytest.raises(SecretUnreadable):
        SecretBox(bytes(32)).open(5, sealed)  # another key
