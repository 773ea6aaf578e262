"""Endpoint secrets: generated here, shown once, stored encrypted.

A secret is `whsec_` + 64 hex digits (32 bytes from `secrets.token_bytes`). The database keeps it
only as AES-256-GCM ciphertext (`nonce || ciphertext+tag`) under the webhook key, with the
endpoint's id as associated data (a ciphertext copied onto another endpoint does not decrypt).
So a database reader (a leaked backup, the signer's or an auditor's SELECT) cannot sign a
delivery a receiver would accept; whoever holds the key and the database can.

The key (32 bytes) is `WEBHOOK_SECRET_KEY` (64 hex digits) when set; otherwise the file
`STATE_DIR/webhook-secret.key`, created (mode 600) by the first process that needs it. The api
(which encrypts on create and rotate) and the worker (which decrypts to sign) must use the same
key: give both the same `WEBHOOK_SECRET_KEY` when they do not share a state directory (compose).
Changing the key makes every stored secret unreadable: rotate every endpoint's secret afterwards.

Errors: `CustodyError(webhook_key_unavailable)` (503) when the key cannot be read or created or is
malformed; `SecretUnreadable` when a stored secret does not decrypt under the key (another key).
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from custody.errors import CustodyError, CustodyErrorCode

SECRET_PREFIX = "whsec_"
KEY_FILE_NAME = "webhook-secret.key"
_NONCE = 12


class SecretUnreadable(Exception):
    """A stored endpoint secret does not decrypt under this key (the api and worker use different keys?)."""


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_bytes(32).hex()


def _aad(endpoint_id: int) -> bytes:
    return f"custody-webhook-endpoint:{endpoint_id}".encode()


class SecretBox:
    """Encrypts and decrypts endpoint secrets under one 32-byte key."""

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise CustodyError(CustodyErrorCode.webhook_key_unavailable, "the webhook key must be 32 bytes (64 hex digits)")
        self._aead = AESGCM(key)

    def seal(self, endpoint_id: int, secret: str) -> bytes:
        nonce = os.urandom(_NONCE)
        return nonce + self._aead.encrypt(nonce, secret.encode(), _aad(endpoint_id))

    def open(self, endpoint_id: int, sealed: bytes) -> str:
        try:
            return self._aead.decrypt(bytes(sealed[:_NONCE]), bytes(sealed[_NONCE:]), _aad(endpoint_id)).decode()
        except (InvalidTag, ValueError) as exc:
            raise SecretUnreadable(f"webhook endpoint {endpoint_id}: its secret does not decrypt under this webhook key") from exc


def load_key(configured: str | None, state_dir: Path) -> bytes:
    """The webhook key: `configured` (hex) when given, else the state directory's key file,
    created atomically (write a temporary file, then link it: two processes racing agree)."""
    try:
        if configured:
            return bytes.fromhex(configured.strip())
        path = state_dir / KEY_FILE_NAME
        if not path.exists():
            state_dir.mkdir(parents=True, exist_ok=True)
            tmp = state_dir / f".{KEY_FILE_NAME}.{os.getpid()}.{secrets.token_hex(4)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_bytes(32).hex() + "\n")
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # another process made it first: use theirs
            finally:
                tmp.unlink()
        return bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError) as exc:
        raise CustodyError(CustodyErrorCode.webhook_key_unavailable,
                           f"the webhook key could not be read or created ({type(exc).__name__}); set WEBHOOK_SECRET_KEY") from None
