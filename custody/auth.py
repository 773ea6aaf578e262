"""API keys and roles: create, list, revoke, rotate, authenticate.

A key is shown once when created (`python -m custody create-api-key NAME ROLE`) or rotated, and
stored only as an HMAC-SHA256 of the key under the server's `API_KEY_PEPPER`, so a copy of the
database does not reveal usable keys. Roles: `backend` (the exchange backend), `operator`
(treasury), `auditor` (read-only books), `admin` (everything). `admin` passes every role check.

Guarantees:
- A name is created once, ever (migration 0025: `api_key_name_created_once`): it is the caller's
  idempotency namespace and hold owner, so it is never handed to another caller, even revoked
  (`api_key_name_taken`).
- Rotation makes a new key of the same name and role and revokes the old one, at once or after a
  grace period (its `revoked_at` is then in the future); a key is rotated at most once.
- Revocation takes effect within `AUTH_CACHE_SECONDS` (0.5 s) in every process, and at once in
  the process that revoked or rotated the key: `authenticate` remembers a live key's principal
  for at most that long (never past a rotation's grace period, never an unknown or revoked key),
  keyed by the key's HMAC, per engine; `revoke_api_key` and `rotate_api_key` forget the engine's
  entries. Nothing else about a key is cached.
- Revoking and rotating go through the database functions `custody_revoke_api_key` and
  `custody_rotate_api_key` (SECURITY DEFINER), which also write the audit event; the api role may
  not write `api_key` directly.

- A key in its rotation grace period may not revoke or rotate keys (migration 0031: the functions'
  `caller`; the api refuses first): a leaked key its owner rotated cannot take over its successor.

Errors (custody.errors): `api_key_not_found` (404), `api_key_not_live` (409: revoked already, or
rotated already), `api_key_in_grace_period` (403: the caller's key is in its grace period), `api_key_name_taken` (409); a name that is not 1-64 of `[A-Za-z0-9._-]` is a
ValueError (the CLI's exit 1; the API's schema refuses it first).
"""
from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
import threading
import time
import weakref
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from custody.errors import CustodyError, CustodyErrorCode


class Role(str, enum.Enum):
    backend = "backend"
    operator = "operator"
    auditor = "auditor"
    admin = "admin"


@dataclass(frozen=True)
class Principal:
    name: str
    role: Role
    key_id: int | None = None  # the authenticated key's id
    retiring: bool = False  # the key is in a rotation's grace period: it may not manage keys

    def has(self, *roles: Role) -> bool:
        return self.role is Role.admin or self.role in roles


def hash_key(key: str, pepper: str) -> str:
    return hmac.new(pepper.encode(), key.encode(), hashlib.sha256).hexdigest()


# Key names build each caller's idempotency namespace `api:<name>:` and hold owner `api:<name>`
# (custody.money_rules), so they carry no separator.
KEY_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


MAX_GRACE_SECONDS = 7 * 24 * 3600  # the database function refuses more


def new_key() -> str:
    return "csk_" + secrets.token_urlsafe(32)


def create_api_key(engine: Engine, name: str, role: Role | str, pepper: str) -> str:
    """Create a key and return it; it cannot be recovered later."""
    role = Role(role)
    if not KEY_NAME.match(name):
        raise ValueError("an API key name is 1-64 letters, digits, '.', '_' or '-'")
    key = new_key()
    try:
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
    except IntegrityError as exc:
        if getattr(exc.orig, "sqlstate", None) == "23505":
            raise CustodyError(CustodyErrorCode.api_key_name_taken,
                               f"an API key named {name!r} was created before; rotate it instead") from None
        raise
    return key


AUTH_CACHE_SECONDS = 0.5  # how long a live key's principal is remembered (a revocation's delay, at most)
_AUTH_CACHE_SIZE = 10_000
# engine -> {key hash: (monotonic deadline, principal)}; only live keys are entered
_live: weakref.WeakKeyDictionary[Engine, dict[str, tuple[float, Principal]]] = weakref.WeakKeyDictionary()
_live_lock = threading.Lock()


def authenticate(engine: Engine, key: str, pepper: str) -> Principal | None:
    """The key's principal while it is live (not revoked, or in a rotation's grace period), else
    None. Read from the database, then remembered for at most AUTH_CACHE_SECONDS (and never past
    the key's own `revoked_at`): a revocation counts from its commit plus that much."""
    return remembered(engine, key, pepper) or _read_principal(engine, hash_key(key, pepper), time.monotonic())


def remembered(engine: Engine, key: str, pepper: str) -> Principal | None:
    """The key's principal if `authenticate` remembers it as live right now, else None (not a
    refusal: the caller must then `authenticate`). No I/O, so the api answers it on its event loop
    without a thread hop; the same entries and deadlines as `authenticate`."""
    entry = _live.get(engine, {}).get(hash_key(key, pepper))
    if entry is not None and entry[0] > time.monotonic():
        return entry[1]
    return None


def _read_principal(engine: Engine, digest: str, now: float) -> Principal | None:
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT id, name, role, EXTRACT(EPOCH FROM revoked_at - now()) AS grace FROM api_key "
                 "WHERE key_hash = :h AND (revoked_at IS NULL OR revoked_at > now())"),
            {"h": digest},
        ).first()
    if row is None:
        return None
    principal = Principal(row.name, Role(row.role), key_id=row.id, retiring=row.grace is not None)
    ttl = AUTH_CACHE_SECONDS if row.grace is None else min(AUTH_CACHE_SECONDS, float(row.grace))
    with _live_lock:
        entries = _live.setdefault(engine, {})
        if len(entries) >= _AUTH_CACHE_SIZE:
            entries.clear()
        entries[digest] = (now + ttl, principal)
    return principal


def _forget_keys(engine: Engine) -> None:
    """Drop the engine's remembered keys: this process revoked or rotated one."""
    with _live_lock:
        _live.pop(engine, None)


@dataclass(frozen=True)
class ApiKeyView:
    """One stored key, without its secret: `prefix` is the key's first 10 characters (`csk_` and
    6 more), enough to tell keys apart. `live` is whether it authenticates now."""

    id: int
    name: str
    role: Role
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    revoked_by: str | None
    replaces: int | None
    live: bool


_KEY_SQL = """
SELECT id, name, role, key_prefix, created_at, revoked_at, revoked_by, replaces,
       (revoked_at IS NULL OR revoked_at > now()) AS live
  FROM api_key
"""


def _view(row) -> ApiKeyView:  # noqa: ANN001 - a SQLAlchemy Row of _KEY_SQL
    return ApiKeyView(row.id, row.name, Role(row.role), row.key_prefix, row.created_at, row.revoked_at,
                      row.revoked_by, row.replaces, row.live)


def list_api_keys(engine: Engine, *, include_revoked: bool = True, after_id: int | None = None,
                  limit: int | None = None) -> list[ApiKeyView]:
    """Every key, oldest first (revoked ones too unless `include_revoked` is False), from the one
    after `after_id`, at most `limit` of them."""
    live = "" if include_revoked else " AND (revoked_at IS NULL OR revoked_at > now())"
    with engine.connect() as conn:
        return [_view(r) for r in conn.execute(text(_KEY_SQL + " WHERE id > :after" + live + " ORDER BY id LIMIT :l"),
                                               {"after": after_id or 0, "l": limit})]


def get_api_key(engine: Engine, key_id: int) -> ApiKeyView:
    with engine.connect() as conn:
        row = conn.execute(text(_KEY_SQL + " WHERE id = :i"), {"i": key_id}).first()
    if row is None:
        raise CustodyError(CustodyErrorCode.api_key_not_found, f"no API key with id {key_id}")
    return _view(row)


def _refusal(exc: DBAPIError, key_id: int) -> CustodyError | None:
    state = getattr(exc.orig, "sqlstate", None)
    if state == "P0002":
        return CustodyError(CustodyErrorCode.api_key_not_found, f"no API key with id {key_id}")
    if state == "42501":
        return CustodyError(CustodyErrorCode.api_key_in_grace_period, "a key in its rotation grace period (or not an admin key) "
                                                        "may not revoke or rotate keys; use the key that replaced it")
    if state == "55000":
        return CustodyError(CustodyErrorCode.api_key_not_live, f"API key {key_id} is revoked or rotated already")
    return None


def revoke_api_key(engine: Engine, key_id: int, *, by: str, caller: int | None = None) -> ApiKeyView:
    """Revoke the key now (a rotated key in its grace period too); audited as `by`. `caller`: the
    id of the API key asking (the api passes it; it must be an admin key not in a grace period);
    None only for the database owner (the CLI)."""
    try:
        with engine.begin() as conn:
            if caller is None:
                conn.execute(text("SELECT custody_revoke_api_key(:i, :b)"), {"i": key_id, "b": by})
            else:
                conn.execute(text("SELECT custody_revoke_api_key(:i, :b, :c)"), {"i": key_id, "b": by, "c": caller})
    except DBAPIError as exc:
        refused = _refusal(exc, key_id)
        if refused is None:
            raise
        raise refused from None
    _forget_keys(engine)
    return get_api_key(engine, key_id)


def rotate_api_key(engine: Engine, key_id: int, pepper: str, *, by: str,
                   grace_seconds: int = 0, caller: int | None = None) -> tuple[ApiKeyView, str]:
    """A new key for the same name and role (returned once, with its view); the old one stops
    working after `grace_seconds` (0: at once). Audited as `by`; `caller` as in revoke_api_key."""
    if not 0 <= grace_seconds <= MAX_GRACE_SECONDS:
        raise ValueError(f"the grace period is 0..{MAX_GRACE_SECONDS} seconds")
    key = new_key()
    try:
        with engine.begin() as conn:
            args = {"i": key_id, "p": key[:10], "h": hash_key(key, pepper), "g": grace_seconds, "b": by, "c": caller}
            new_id = conn.execute(text("SELECT custody_rotate_api_key(:i, :p, :h, :g, :b)" if caller is None else
                                       "SELECT custody_rotate_api_key(:i, :p, :h, :g, :b, :c)"), args).scalar_one()
    except DBAPIError as exc:
        refused = _refusal(exc, key_id)
        if refused is None:
            raise
        raise refused from None
    _forget_keys(engine)
    return get_api_key(engine, new_id), key
