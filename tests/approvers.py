"""Approver keys for the tests: deterministic Ed25519 keys per operator name, registries of them,
signing helpers, and a software WebAuthn authenticator.

TEST KEYS ONLY: each private key is SHA-256 of a fixed label and the operator's name, so anyone can
recompute it. `registry(*names)` is what a test hands to `Container.with_chains(approvers=...)`
(custody's check and, in-process, the signer's); `TEST_OPERATORS` are the fixed names the e2e suites
approve as (`op-alice`, `op-bob`, ...). An operator approving over HTTP must have an API key of the
same name (`operator_client`), since custody requires the key to be the caller's own.

- `sign_approval(payload, operator)` -> ApprovalSignature (Ed25519 over the payload bytes)
- `signature_json(sig)` -> the `signature` object of `POST /v1/withdrawals/{id}/approve`
- `approve(withdrawals, wid, operator, comment)`: the service call with a fresh signature
- `approve_over_api(client, wid, operator, comment)`: GET the payload, sign it, POST the approval
  (`resource=ADJUSTMENTS`: a treasury adjustment's, the same two routes under its path)
- `operator_key(custody, name)` / `operator_client(custody, name)`: the operator API key named
  `name` (once per database) / a TestClient with it
- `SoftAuthenticator(operator)`: a P-256 credential that answers WebAuthn assertions like a
  security key (authenticatorData, clientDataJSON, DER signature), for the webauthn scheme
"""
from __future__ import annotations

import base64
import hashlib
import json

import cbor2
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from signer.approvals import ApprovalSignature, ApproverRegistry, b64url, webauthn_challenge

TEST_OPERATORS = ("op-alice", "op-bob", "op-carol", "op-dave", "op-eve", "op-mallory", "op-trent")
_LABEL = b"custody test approver key (never real):"
_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


def private_key(operator: str) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(_LABEL + operator.encode()).digest())


def key_id(operator: str) -> str:
    return f"test-ed25519:{operator}"


def entry(operator: str) -> dict:
    """The operator's registry entry as a TOML file writes it."""
    raw = private_key(operator).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return {"key_id": key_id(operator), "operator": operator, "scheme": "ed25519", "public_key": base64.b64encode(raw).decode()}


def registry(*operators: str, extra: tuple[dict, ...] = ()) -> ApproverRegistry:
    """A registry of the named operators' test keys (default: TEST_OPERATORS) plus `extra` entries."""
    return ApproverRegistry.from_entries([entry(o) for o in (operators or TEST_OPERATORS)] + list(extra))


def sign_approval(payload: bytes, operator: str, *, as_key: str | None = None) -> ApprovalSignature:
    """`operator`'s Ed25519 signature over `payload`; `as_key` names another key id (a forgery)."""
    return ApprovalSignature(as_key or key_id(operator), "ed25519", private_key(operator).sign(payload))


def signature_json(sig: ApprovalSignature) -> dict:
    out = {"key_id": sig.key_id, "scheme": sig.scheme, "signature": base64.b64encode(sig.signature).decode()}
    if sig.authenticator_data is not None:
        out["authenticator_data"] = base64.b64encode(sig.authenticator_data).decode()
    if sig.client_data_json is not None:
        out["client_data_json"] = base64.b64encode(sig.client_data_json).decode()
    return out


def approve(withdrawals, wid: int, operator: str, comment: str = "checked"):
    """Approve as `operator` through the service, signing the current payload with their test key."""
    payload = withdrawals.approval_payload(wid).payload
    return withdrawals.approve(wid, operator=operator, comment=comment, signature=sign_approval(payload, operator))


WITHDRAWALS, ADJUSTMENTS = "/v1/withdrawals", "/v1/treasury/adjustments"


def approve_over_api(client, wid: int | str, operator: str, comment: str = "checked", *, resource: str = WITHDRAWALS,
                     headers: dict | None = None):
    """GET `resource`/<id>/approval-payload, sign it as `operator`, POST the approval; the response."""
    r = client.get(f"{resource}/{wid}/approval-payload", headers=headers)
    assert r.status_code == 200, r.text
    payload = base64.b64decode(r.json()["payload_base64"])
    return client.post(f"{resource}/{wid}/approve", headers=headers,
                       json={"comment": comment, "signature": signature_json(sign_approval(payload, operator))})


_CLIENT_KEYS: dict[tuple[str, str], str] = {}


def operator_key(custody, name: str) -> str:
    """An operator API key named `name` (created once per database and process, so a fixed name such
    as `op-trent` can be used by several tests of one session)."""
    from custody.auth import create_api_key

    cache = (str(custody.engine.url), name)
    if cache not in _CLIENT_KEYS:
        _CLIENT_KEYS[cache] = create_api_key(custody.engine, name, "operator", custody.settings.api_key_pepper)
    return _CLIENT_KEYS[cache]


def operator_client(custody, name: str):
    """A TestClient with the operator API key named `name` (`operator_key`)."""
    from fastapi.testclient import TestClient

    from custody.api.app import create_app

    client = TestClient(create_app(custody), raise_server_exceptions=False)
    client.headers["X-API-Key"] = operator_key(custody, name)
    return client


class SoftAuthenticator:
    """A software WebAuthn credential (ES256 on P-256), deterministic per operator and label."""

    def __init__(self, operator: str, *, rp_id: str = "localhost", origin: str = "http://localhost:8000",
                 label: str = "webauthn") -> None:
        seed = int.from_bytes(hashlib.sha256(_LABEL + f"{label}:{operator}".encode()).digest(), "big")
        self._key = ec.derive_private_key(seed % _P256_ORDER or 1, ec.SECP256R1())
        self.operator, self.rp_id, self.origin = operator, rp_id, origin
        self.key_id = f"test-{label}:{operator}"
        self.sign_count = 0

    @property
    def public_key_cose(self) -> bytes:
        numbers = self._key.public_key().public_numbers()
        return cbor2.dumps({1: 2, 3: -7, -1: 1, -2: numbers.x.to_bytes(32, "big"), -3: numbers.y.to_bytes(32, "big")})

    def entry(self) -> dict:
        return {"key_id": self.key_id, "operator": self.operator, "scheme": "webauthn",
                "public_key": base64.b64encode(self.public_key_cose).decode(), "rp_id": self.rp_id, "origin": self.origin}

    def assertion(self, payload: bytes, *, challenge: bytes | None = None, origin: str | None = None,
                  rp_id: str | None = None, user_present: bool = True, user_verified: bool = True,
                  kind: str = "webauthn.get", client_data: dict | None = None) -> ApprovalSignature:
        """What navigator.credentials.get(userVerification: "required") returns for `payload`'s
        challenge: flags UP and UV (the PIN or biometric was checked). Each override makes a bad
        assertion (another challenge, origin, relying party, no user presence, no user verification,
        another type); `client_data` adds or replaces client data members (crossOrigin, topOrigin), and
        removes those it maps to None."""
        self.sign_count += 1
        flags = (0x01 if user_present else 0x00) | (0x04 if user_verified else 0x00)
        auth_data = hashlib.sha256((rp_id or self.rp_id).encode()).digest() + bytes([flags]) + self.sign_count.to_bytes(4, "big")
        members = {"type": kind, "challenge": b64url(challenge or webauthn_challenge(payload)), "origin": origin or self.origin,
                   "crossOrigin": False, **(client_data or {})}
        client_data_json = json.dumps({k: v for k, v in members.items() if v is not None}).encode()
        signature = self._key.sign(auth_data + hashlib.sha256(client_data_json).digest(), ec.ECDSA(hashes.SHA256()))
        return ApprovalSignature(self.key_id, "webauthn", signature, auth_data, client_data_json)
