"""Review of issue 12 (R1): a WebAuthn approval made inside a frame of another site is accepted.

`signer.approvals._verify_webauthn` checks type, challenge, origin, rp id hash and user presence
(all held in review), but not `crossOrigin`: an assertion whose client data says it was made in
an iframe (crossOrigin true, topOrigin another site) verifies. The operator console is never
embedded, so a cross-origin assertion means someone framed the console (clickjacking a "touch
your key" prompt). Low severity: the payload still binds what is paid. Fix: refuse client data
whose `crossOrigin` is true (and any `topOrigin`), in custody's and the signer's check alike.
"""
from __future__ import annotations

import hashlib
import json

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from signer.approvals import ApprovalInvalid, ApprovalSignature, ApproverRegistry, b64url, verify_approval, webauthn_challenge
from tests.approvers import SoftAuthenticator


def test_a_cross_origin_webauthn_assertion_is_refused():
    carol = SoftAuthenticator("op-carol")
    registry = ApproverRegistry.from_entries([carol.entry()])
    payload = b'{"kind":"withdrawal-approval","withdrawal_id":1}'
    auth_data = hashlib.sha256(carol.rp_id.encode()).digest() + bytes([0x01]) + (1).to_bytes(4, "big")
    client_data = json.dumps({"type": "webauthn.get", "challenge": b64url(webauthn_challenge(payload)), "origin": carol.origin,
                              "crossOrigin": True, "topOrigin": "https://evil.example"}).encode()
    signature = carol._key.sign(auth_data + hashlib.sha256(client_data).digest(), ec.ECDSA(hashes.SHA256()))
    sig = ApprovalSignature(carol.key_id, "webauthn", signature, auth_data, client_data)
    with pytest.raises(ApprovalInvalid) as refused:
        verify_approval(registry, sig.key_id, sig.scheme, payload, sig.signature, sig.authenticator_data, sig.client_data_json)
    assert refused.value.code == "approval_signature_invalid"
