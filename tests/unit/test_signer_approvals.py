"""signer.approvals: the canonical payload, Ed25519 and WebAuthn verification (good and each bad
case), the registry's refusals of bad configuration, and the quorum table; the refusal table pinned
to the RefusalCode enum."""
from __future__ import annotations

import base64
import datetime as dt
import json
import re

import pytest

import signer.service as service_module
from custody.policy_config import default_policy
from regtest.util import assert_equal, assert_raises_code
from signer.approvals import (AdjustmentPayloadFields, ApprovalInvalid, ApprovalSignature, ApproverRegistry, PayloadFields,
                              QuorumTable, adjustment_approval_payload, approval_payload, format_expiry, operator_identity, parse_payload, quorum_table_from_policy, read_payload,
                              read_adjustment_payload, unprintable_fields, verify_approval, webauthn_challenge)
from signer.protocol import RefusalCode
from tests.approvers import SoftAuthenticator, entry, private_key, registry, sign_approval

EXPIRES = dt.datetime(2026, 11, 29, 12, 0, 0, 5, tzinfo=dt.timezone.utc)
FIELDS = dict(withdrawal_id=42, chain="bitcoin", asset="BTC", amount=250_000_000,
              destination="bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080", decision_id=7, policy_version="regtest-1",
              expires_at=EXPIRES)


def payload(**change) -> bytes:
    return approval_payload(**{**FIELDS, **change})


def verify(reg, sig: ApprovalSignature, signed: bytes):
    return verify_approval(reg, sig.key_id, sig.scheme, signed, sig.signature, sig.authenticator_data, sig.client_data_json)


def test_the_payload_is_canonical_json_with_the_amount_as_a_string():
    expected = ('{"amount":"250000000","asset":"BTC","chain":"bitcoin","decision_id":7,'
                '"destination":"bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080",'
                '"expires_at":"2026-11-29T12:00:00.000005Z","kind":"withdrawal-approval","policy_version":"regtest-1",'
                '"v":1,"withdrawal_id":42}').encode()
    assert_equal(payload(), expected)
    assert_equal(parse_payload(expected)["amount"], "250000000")
    later_zone = EXPIRES.astimezone(dt.timezone(dt.timedelta(hours=5)))
    assert_equal(payload(expires_at=later_zone), expected)  # the same instant in another zone: the same bytes
    assert_equal(parse_payload(b"\xff"), None)
    assert_equal(parse_payload(b"[1]"), None)


def test_the_payload_refuses_what_is_not_exact():
    with pytest.raises(ValueError):
        payload(amount=2.5)
    with pytest.raises(ValueError):
        payload(amount=True)
    with pytest.raises(ValueError):
        payload(expires_at=dt.datetime(2026, 11, 29, 12, 0))
    assert_equal(format_expiry(dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)), "2026-01-02T03:04:05.000000Z")
    assert_equal(payload(destination="bc1qé").decode("utf-8").count("é"), 1)  # UTF-8, not \\u escapes


def test_an_ed25519_signature_verifies_and_every_change_breaks_it():
    reg = registry("op-alice", "op-bob")
    sig = sign_approval(payload(), "op-alice")
    assert_equal(verify(reg, sig, payload()).operator, "op-alice")
    assert_raises_code("approval_signature_invalid", verify, reg, sig, payload(amount=250_000_001))
    assert_raises_code("approval_signature_invalid", verify, reg, sig, payload(destination="bcrt1qother"))
    assert_raises_code("approval_signature_invalid", verify, reg, sign_approval(payload(), "op-bob", as_key="test-ed25519:op-alice"),
                       payload())
    assert_raises_code("approval_signature_invalid", verify, reg, ApprovalSignature(sig.key_id, "ed25519", b"short"), payload())
    assert_raises_code("approver_unknown", verify, reg, sign_approval(payload(), "op-mallory"), payload())
    assert_raises_code("approver_unknown", verify, None, sig, payload())
    assert_raises_code("approval_scheme_mismatch", verify, reg, ApprovalSignature(sig.key_id, "webauthn", sig.signature), payload())


def test_a_webauthn_assertion_verifies_and_each_bad_one_is_refused():
    token = SoftAuthenticator("op-carol")
    reg = registry("op-alice", extra=(token.entry(),))
    assert_equal(verify(reg, token.assertion(payload()), payload()).operator, "op-carol")
    assert_equal(verify(reg, token.assertion(payload()), payload()).key_id, token.key_id)  # sign count not tracked
    bad = {
        "another payload": (token.assertion(payload(amount=1)), payload()),
        "another challenge": (token.assertion(payload(), challenge=b"\x00" * 32), payload()),
        "another origin": (token.assertion(payload(), origin="https://evil.example"), payload()),
        "another relying party": (token.assertion(payload(), rp_id="evil.example"), payload()),
        "no user presence": (token.assertion(payload(), user_present=False), payload()),
        "presence without verification (no PIN or biometric)": (token.assertion(payload(), user_verified=False), payload()),
        "a registration, not an assertion": (token.assertion(payload(), kind="webauthn.create"), payload()),
        "another authenticator": (SoftAuthenticator("op-carol", label="other").assertion(payload()), payload()),
    }
    for what, (sig, signed) in bad.items():
        sig = ApprovalSignature(token.key_id, sig.scheme, sig.signature, sig.authenticator_data, sig.client_data_json)
        assert_raises_code("approval_signature_invalid", verify, reg, sig, signed), what
    good = token.assertion(payload())
    for broken in (ApprovalSignature(good.key_id, "webauthn", good.signature),
                   ApprovalSignature(good.key_id, "webauthn", good.signature, b"\x01", good.client_data_json),
                   ApprovalSignature(good.key_id, "webauthn", good.signature, good.authenticator_data, b"{not json"),
                   ApprovalSignature(good.key_id, "webauthn", b"\x30\x00", good.authenticator_data, good.client_data_json)):
        assert_raises_code("approval_signature_invalid", verify, reg, broken, payload())
    assert_equal(len(webauthn_challenge(payload())), 32)


def test_a_webauthn_assertion_made_in_a_frame_of_another_site_is_refused():
    """Otherwise valid (UP and UV, right origin and challenge): only the client data says it was made
    cross-origin. Each is refused by the cross-origin check itself, not by another one."""
    token = SoftAuthenticator("op-carol")
    reg = registry(extra=(token.entry(),))
    framed = ({"crossOrigin": True, "topOrigin": "https://evil.example"}, {"crossOrigin": True},
              {"topOrigin": "https://evil.example"}, {"crossOrigin": "false"}, {"crossOrigin": 0})
    for members in framed:
        with pytest.raises(ApprovalInvalid) as refused:
            verify(reg, token.assertion(payload(), client_data=members), payload())
        assert_equal(refused.value.code, "approval_signature_invalid")
        assert "cross-origin" in refused.value.message, (members, refused.value.message)
    assert_equal(verify(reg, token.assertion(payload(), client_data={"crossOrigin": False}), payload()).key_id, token.key_id)
    without = token.assertion(payload(), client_data={"crossOrigin": None})  # older browsers leave it out: same-origin
    assert "crossOrigin" not in json.loads(without.client_data_json)
    assert_equal(verify(reg, without, payload()).operator, "op-carol")
    with pytest.raises(ApprovalInvalid) as refused:
        verify(reg, token.assertion(payload(), user_verified=False), payload())
    assert "verif" in refused.value.message, refused.value.message


def test_read_payload_gives_the_fields_of_canonical_bytes_only():
    assert_equal(read_payload(payload()), PayloadFields(**FIELDS))
    assert_equal(approval_payload(**read_payload(payload(destination="bc1qé")).as_kwargs()), payload(destination="bc1qé"))
    canonical = json.loads(payload())
    not_canonical = {
        "spaced": json.dumps(canonical, sort_keys=True).encode(),
        "keys out of order": json.dumps(dict(reversed(canonical.items())), separators=(",", ":")).encode(),
        "an extra field": payload()[:-1] + b',"zz":"pay 99 instead"}',
        "a duplicate key (parsers disagree on which wins)": payload()[:-1] + b',"withdrawal_id":99}',
        "escaped non-ASCII": json.dumps(json.loads(payload(destination="bc1qé")), sort_keys=True, separators=(",", ":")).encode(),
        "a zero-padded amount": payload().replace(b'"250000000"', b'"0250000000"'),
        "a numeric amount": payload().replace(b'"250000000"', b"250000000"),
        "a float id": payload().replace(b'"withdrawal_id":42', b'"withdrawal_id":42.0'),
        "a boolean id": payload(withdrawal_id=1).replace(b'"withdrawal_id":1', b'"withdrawal_id":true'),
        "an expiry with an offset": payload().replace(b"000005Z", b"000005+00:00"),
        "another version": payload().replace(b'"v":1', b'"v":2'),
        "another kind": payload().replace(b"withdrawal-approval", b"sweep-approval"),
        "a trailing newline": payload() + b"\n",
        "not JSON": b"\xff",
        "a list": b"[1]",
    }
    for what, data in not_canonical.items():
        try:
            read_payload(data)
        except ValueError:
            continue
        pytest.fail(f"read_payload accepted {what}: {data!r}")


def test_the_registry_refuses_bad_configuration():
    good = entry("op-alice")
    token = SoftAuthenticator("op-bob")
    bad_entries = [
        [good, good],  # the same key id twice
        [{**good, "scheme": "rsa"}],
        [{**good, "public_key": "not base64!"}],
        [{**good, "public_key": base64.b64encode(b"\x01" * 31).decode()}],
        [{**good, "operator": " "}],
        [{**good, "rp_id": "localhost"}],
        [{**good, "colour": "blue"}],
        [{k: v for k, v in good.items() if k != "key_id"}],
        [{**token.entry(), "origin": None}],
        [{**token.entry(), "public_key": base64.b64encode(b"\xa0").decode()}],
        ["not a table"],
    ]
    for entries in bad_entries:
        with pytest.raises(ValueError):
            ApproverRegistry.from_entries(entries)
    reg = ApproverRegistry.from_entries([good, token.entry()])
    assert_equal((len(reg), reg.get("test-ed25519:op-alice").operator, reg.get("nobody")), (2, "op-alice", None))
    raw = private_key("op-alice").public_key().public_bytes_raw()
    assert_equal(reg.get("test-ed25519:op-alice").public_key, raw)


def test_operator_identity_merges_the_forms_custody_writes():
    assert_equal(operator_identity("api:Op-Alice "), operator_identity("op-alice"), operator_identity(" OP-ALICE"), "op-alice")
    assert operator_identity("api:op-alice") != operator_identity("op-bob")


def test_the_quorum_table_takes_the_first_tier_that_covers_the_amount():
    table = QuorumTable.from_entries({"BTC": [[50_000_000, 0], [200_000_000, 1], [100_000_000_000, 2]],
                                      "ETH": [[10, 0], ["unbounded", 3]]})
    assert_equal([table.required("BTC", a) for a in (1, 50_000_000, 50_000_001, 200_000_000, 200_000_001, 100_000_000_000)],
                 [0, 0, 1, 1, 2, 2])
    assert_raises_code("quorum_amount_above_table", table.required, "BTC", 100_000_000_001)
    assert_raises_code("quorum_asset_unknown", table.required, "DOGE", 1)
    assert_equal(table.required("ETH", 10**30), 3)
    for bad in ({"BTC": []}, {"BTC": [[2, 0], [1, 1]]}, {"BTC": [[1, 2], [2, 1]]}, {"BTC": [["unbounded", 1], [5, 1]]},
                {"BTC": [[1.5, 0]]}, {"BTC": [[1, -1]]}, {"BTC": [[1, True]]}, {"BTC": [[1]]}):
        with pytest.raises(ValueError):
            QuorumTable.from_entries(bad)


def test_the_quorum_table_of_the_default_policy_is_its_amount_tiers():
    table = quorum_table_from_policy(default_policy())
    assert_equal([table.required("BTC", a) for a in (50_000_000, 50_000_001, 200_000_001)], [0, 1, 2])
    assert_raises_code("quorum_amount_above_table", table.required, "BTC", 100_000_000_001)
    assert_equal(table.required("USDT", 10**13), 2)


def test_the_signer_refusal_table_matches_the_enum():
    rows = re.findall(r"^\| (\w+) \| .+ \|$", service_module.__doc__, re.M)
    codes = [r for r in rows if r != "code"]
    assert_equal(sorted(codes), sorted(c.value for c in RefusalCode))
    order = [c for c in codes if c.startswith("approv") or c in ("no_decision", "decision_not_approved")]
    assert_equal(order, ["no_decision", "approval_unsigned", "approver_unknown", "approval_signature_invalid",
                         "approval_replayed", "approval_payload_mismatch", "decision_not_approved"])


def test_read_payload_refuses_control_and_format_characters_in_every_text_field():
    """A payload is printed to approvers: ESC and CR redraw a terminal's lines, a bidi override or a
    zero-width character reorders or hides text, a line separator breaks a line (issue 12, R3)."""
    assert_equal(unprintable_fields(read_payload(payload())), [])
    for field in ("chain", "asset", "destination", "policy_version"):
        for ch in ("\x1b", "\r", "\n", "\x00", "\x7f", "\x9b", "\u202e", "\u200b", "\u2066", "\ufeff", "\u2028", "\u2029"):
            bad = payload(**{field: FIELDS[field] + ch + "[2K"})
            with pytest.raises(ValueError, match=f"control or format characters.*{field} \\(U\\+{ord(ch):04X}\\)"):
                read_payload(bad)
    assert_equal(unprintable_fields({"chain": "bitcoin", "asset": "BTC", "destination": "a\u202eb", "policy_version": "v\x1b"}),
                 ["destination (U+202E)", "policy_version (U+001B)"])
    assert_equal(read_payload(payload(destination="bc1qé")).destination, "bc1qé")  # printable non-ASCII is text, not control


# ---- treasury adjustments ------------------------------------------------------------------------

ADJUSTMENT = dict(adjustment_id=9, legs=[(3, 7, 100_000), (3, 8, 5)], reason="refund, ticket 4713", quorum=2,
                  proposed_by="api:ann")


def test_the_adjustment_payload_is_canonical_json_with_its_legs_in_order():
    expected = ('{"adjustment_id":9,"kind":"adjustment-approval","legs":['
                '{"amount":"100000","credit_account_id":7,"debit_account_id":3},'
                '{"amount":"5","credit_account_id":8,"debit_account_id":3}],'
                '"proposed_by":"api:ann","quorum":2,"reason":"refund, ticket 4713","v":1}').encode()
    assert_equal(adjustment_approval_payload(**ADJUSTMENT), expected)
    swapped = adjustment_approval_payload(**{**ADJUSTMENT, "legs": list(reversed(ADJUSTMENT["legs"]))})
    assert swapped != expected  # the order of the legs is part of what is signed
    for bad in ({"adjustment_id": -1}, {"quorum": True}, {"legs": [(3, 7, -1)]}, {"legs": [(3, 7)]},
                {"legs": [(3, 7, 1.0)]}):
        with pytest.raises(ValueError):
            adjustment_approval_payload(**{**ADJUSTMENT, **bad})


def test_read_adjustment_payload_gives_the_fields_of_canonical_bytes_only():
    signed = adjustment_approval_payload(**ADJUSTMENT)
    assert_equal(read_adjustment_payload(signed), AdjustmentPayloadFields(9, ((3, 7, 100_000), (3, 8, 5)),
                                                                          "refund, ticket 4713", 2, "api:ann"))
    fields = json.loads(signed)
    for bad in (payload(), signed.replace(b'"quorum":2', b'"quorum":2 '),
                json.dumps({**fields, "extra": 1}, sort_keys=True, separators=(",", ":")).encode(),
                json.dumps({**fields, "legs": [{"amount": "05", "credit_account_id": 7, "debit_account_id": 3}]},
                           sort_keys=True, separators=(",", ":")).encode()):
        with pytest.raises(ValueError):
            read_adjustment_payload(bad)


def test_an_adjustment_approval_verifies_only_over_its_own_payload():
    reg = registry("op-alice")
    signed = adjustment_approval_payload(**ADJUSTMENT)
    sig = sign_approval(signed, "op-alice")
    assert_equal(verify(reg, sig, signed).operator, "op-alice")
    for change in ({"adjustment_id": 10}, {"legs": [(3, 9, 100_000), (3, 8, 5)]}, {"reason": "other"},
                   {"quorum": 1}, {"proposed_by": "api:bob"}):
        assert_raises_code("approval_signature_invalid", verify, reg, sig, adjustment_approval_payload(**{**ADJUSTMENT, **change}))
