"""API keys and roles.

A key is shown once when created (`python -m custody create-api-key NAME ROLE`) and stored only as
an HMAC-SHA256 of the key under the server's `API_KEY_PEPPER`, so a copy of the database does not
reveal usable keys. Roles: `backend` (the exchange backend), `operator` (treasury), `auditor`
(read-only books), `admin` (everything). `admin` passes every role check.
"""
from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from sqlalchemy import Engine, text


class Role(str, enum.Enum):
    backend = "backend"
    operator = "operator"
    auditor = "auditor"
    admin = "admin"


@dataclass(frozen=True)
class Principal:
    name: str
    role: Role

    def has(self, *roles: Role) -> bool:
        return self.role is Role.admin or self.role in roles


def hash_key(key: str, pepper: str) -> str:
    return hmac.new(pepper.encode(), key.encode(), hashlib.sha256).hexdigest()


# Key names build each caller's idempotency namespace `api:<name>:` and hold owner `api:<name>`
# (custody.money_rules), so they carry no separator.
KEY_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def create_api_key(engine: Engine, name: str, role: Role | str, pepper: str) -> str:
    """Create a key and return it; it cannot be recovered later."""
    role = Role(role)
    if not KEY_NAME.match(name):
        raise ValueError("an API key name is 1-64 letters, digits, '.', '_' or '-'")
    key = "csk_" + secrets.token_urlsafe(32)
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO api_key (name, role, key_prefix, key_hash) VALUES (:n, :r, :p, :h)"),
            {"n": name, "r": role.value, "p": key[:10], "h": hash_key(key, pepper)},
        )
        conn.execute(
            text("INSERT INTO audit_event (actor, action, subject, detail) VALUES ('cli', 'api_key.create', :n, "
                 "jsonb_build_object('role', CAST(:r AS text)))"),
            {"n": name, "r": role.value},
        )
    return key


def authenticate(engine: Engine, key: str, pepper: str) -> Principal | None:
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT name, role FROM api_key WHERE key_hash = :h AND revoked_at IS NULL"),
            {"h": hash_key(key, pepper)},
        ).first()
    return Principal(row.name, Role(row.role)) if row else None
