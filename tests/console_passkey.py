"""A software passkey for the console's tests: tests/approvers.py's SoftAuthenticator (a P-256 key,
deterministic per operator and label) that also answers `navigator.credentials.create()` (an
attestation of format "none") and `.get()` for sign-in, as the browser's JSON (binary fields
base64url), and signs approvals under the console's approver key id (`console:<credential id>`).

- `registration(options)`: the JSON `POST /console/enrol` takes, for the options it was handed;
- `sign_in(options, **overrides)`: the JSON `POST /console/sign-in` takes (overrides make a bad
  one: another origin, no user verification, another challenge);
- `approval(payload)`: the ApprovalSignature a console approval of `payload` carries.
TEST KEYS ONLY.
"""
from __future__ import annotations

import base64
import hashlib
import json

import cbor2
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from custody.console.auth import approver_key_id
from signer.approvals import ApprovalSignature, b64url
from tests.approvers import SoftAuthenticator

UP, UV, AT = 0x01, 0x04, 0x40


def unb64url(value: str) -> bytes:
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))


class SoftPasskey(SoftAuthenticator):
    def __init__(self, operator: str, *, rp_id: str = "localhost", origin: str = "http://localhost:8000",
                 label: str = "console") -> None:
        super().__init__(operator, rp_id=rp_id, origin=origin, label=label)
        self.credential_id = hashlib.sha256(f"console credential:{label}:{operator}".encode()).digest()
        self.key_id = approver_key_id(self.credential_id)

    def _client_data(self, kind: str, challenge: bytes, origin: str | None) -> bytes:
        return json.dumps({"type": kind, "challenge": b64url(challenge), "origin": origin or self.origin,
                           "crossOrigin": False}).encode()

    def registration(self, options: dict, *, origin: str | None = None, user_verified: bool = True) -> dict:
        challenge = unb64url(options["challenge"])
        flags = UP | AT | (UV if user_verified else 0)
        auth_data = (hashlib.sha256(options["rp"]["id"].encode()).digest() + bytes([flags]) + (0).to_bytes(4, "big")
                     + bytes(16) + len(self.credential_id).to_bytes(2, "big") + self.credential_id + self.public_key_cose)
        attestation = cbor2.dumps({"fmt": "none", "attStmt": {}, "authData": auth_data})
        return {"id": b64url(self.credential_id), "rawId": b64url(self.credential_id), "type": "public-key",
                "response": {"clientDataJSON": b64url(self._client_data("webauthn.create", challenge, origin)),
                             "attestationObject": b64url(attestation), "transports": ["usb"]},
                "clientExtensionResults": {}}

    def sign_in(self, options: dict, *, origin: str | None = None, user_verified: bool = True,
                challenge: bytes | None = None) -> dict:
        self.sign_count += 1
        flags = UP | (UV if user_verified else 0)
        auth_data = hashlib.sha256(self.rp_id.encode()).digest() + bytes([flags]) + self.sign_count.to_bytes(4, "big")
        client_data = self._client_data("webauthn.get", challenge or unb64url(options["challenge"]), origin)
        signature = self._key.sign(auth_data + hashlib.sha256(client_data).digest(), ec.ECDSA(hashes.SHA256()))
        return {"id": b64url(self.credential_id), "rawId": b64url(self.credential_id), "type": "public-key",
                "response": {"clientDataJSON": b64url(client_data), "authenticatorData": b64url(auth_data),
                             "signature": b64url(signature)},
                "clientExtensionResults": {}}

    def approval(self, payload: bytes) -> ApprovalSignature:
        return self.assertion(payload)
