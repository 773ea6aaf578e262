"""Console sign-in with WebAuthn (passkeys, security keys) and the server-side sessions it opens.

No API key ever reaches the console page. An operator enrols a credential once and signs in with it:

1. Enrolment: `enrol_options(username)` hands out registration options (a fresh 32-byte challenge,
   stored with its expiry, user verification required); the browser's `navigator.credentials.create`
   answers; `enrol(response)` consumes the challenge (once) and verifies the attestation with the
   `webauthn` package (origin `CONSOLE_ORIGIN`, relying party `CONSOLE_RP_ID`, UV required). The
   credential is stored `pending`, without a role, and its fingerprint (first 16 hex digits of the
   SHA-256 of its COSE public key, in groups of four) is shown to the operator.
2. An admin (console session or admin API key) compares the fingerprint with the operator out of
   band and approves it with a role (`decide_enrolment`); nobody approves their own enrolment.
3. Sign-in: `sign_in_options(username)` lists the user's active credentials with a fresh challenge;
   `sign_in(response)` consumes the challenge (a replayed assertion finds it used:
   `console_challenge_invalid`), verifies the assertion (UV required; a sign count that does not
   grow, when the authenticator keeps one, is refused as a cloned authenticator) and opens a session.

Sessions: a random 32-byte token in the `custody_console` cookie (HttpOnly, SameSite=Strict,
Secure when CONSOLE_ORIGIN is https); the database keeps its SHA-256 only. A session ends after
`CONSOLE_IDLE_SECONDS` without a request, `CONSOLE_SESSION_MAX_SECONDS` after sign-in, at sign-out,
or when its credential is revoked. Every state change made with a session carries the session's
CSRF token in `X-CSRF-Token` (a synchronizer token: HMAC-SHA256 under API_KEY_PEPPER of the session
token, so it is bound to the session and needs no storage; the page reads it from
`GET /console/session`).

Approving is signing (signer.approvals, scheme `webauthn`): an active credential's approver entry
(`approver_entry`: key id `console:<credential id, base64url>`, the username as operator, its COSE
key, rp id and origin) is what an admin adds to the signer's `[[approvers]]` (and custody's
`approvers` setting, for the early check at the door); until then custody refuses the console's
approvals with `approver_unknown`. The signer never reads `console_credential`.

Errors (custody.errors): console_sign_in_required, console_session_expired, console_csrf_invalid,
console_challenge_invalid, console_assertion_invalid, console_credential_unknown,
console_credential_not_found, console_self_approval; a username that is not 1-64 of
`[A-Za-z0-9._-]` or a role that is not operator, auditor or admin is `invalid_request`.
"""
from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Any, Callable

from sqlalchemy import Engine, text

from custody.auth import KEY_NAME, Principal, Role
from custody.controls import audit
from custody.errors import CustodyError, CustodyErrorCode
from custody.settings import Settings
from ledger.errors import ErrorCode, LedgerError
from signer.approvals import b64url

COOKIE = "custody_console"
CSRF_HEADER = "X-CSRF-Token"
CONSOLE_ROLES = ("operator", "auditor", "admin")


@dataclass(frozen=True)
class CredentialView:
    id: int
    username: str
    role: str | None
    state: str
    fingerprint: str
    key_id: str
    requested_at: dt.datetime
    decided_by: str | None
    decided_at: dt.datetime | None
    last_used_at: dt.datetime | None


@dataclass(frozen=True)
class ConsoleSession:
    """A live session: who, with which role and credential, and its CSRF token."""

    id: int
    username: str
    role: Role
    credential: int
    key_id: str
    csrf: str
    expires_at: dt.datetime
    idle_seconds: int

    def principal(self) -> Principal:
        return Principal(self.username, self.role)


def fingerprint(public_key: bytes) -> str:
    digest = hashlib.sha256(public_key).hexdigest()[:16]
    return " ".join(digest[i:i + 4] for i in range(0, 16, 4))


def approver_key_id(credential_id: bytes) -> str:
    return f"console:{b64url(credential_id)}"


def _b64url_decode(value: object, what: str) -> bytes:
    if not isinstance(value, str) or len(value) > 65536:
        raise CustodyError(CustodyErrorCode.console_assertion_invalid, f"{what} is missing")
    try:
        return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        raise CustodyError(CustodyErrorCode.console_assertion_invalid, f"{what} is not base64url") from None


def _challenge_of(response: Any) -> bytes:
    """The challenge the browser signed, read from the response's clientDataJSON (verified later)."""
    inner = response.get("response") if isinstance(response, dict) else None
    if not isinstance(inner, dict):
        raise CustodyError(CustodyErrorCode.console_assertion_invalid, "the WebAuthn response has no `response` object")
    try:
        client_data = json.loads(_b64url_decode(inner.get("clientDataJSON"), "clientDataJSON"))
    except (UnicodeDecodeError, ValueError):
        raise CustodyError(CustodyErrorCode.console_assertion_invalid, "clientDataJSON is not JSON") from None
    if not isinstance(client_data, dict):
        raise CustodyError(CustodyErrorCode.console_assertion_invalid, "clientDataJSON is not a JSON object")
    return _b64url_decode(client_data.get("challenge"), "the challenge")


def _check_username(username: object) -> str:
    if not isinstance(username, str) or not KEY_NAME.match(username):
        raise LedgerError(ErrorCode.invalid_request, "a console username is 1-64 letters, digits, '.', '_' or '-'")
    return username


_CRED_SQL = ("SELECT id, username, role, state, public_key, credential_id, requested_at, decided_by, decided_at, last_used_at, "
             "sign_count FROM console_credential")


def _credential(row) -> CredentialView:
    return CredentialView(row.id, row.username, row.role, row.state, fingerprint(bytes(row.public_key)),
                          approver_key_id(bytes(row.credential_id)), row.requested_at, row.decided_by, row.decided_at,
                          row.last_used_at)


class ConsoleAuth:
    def __init__(self, engine: Engine, settings: Settings, *, clock: Callable[[], dt.datetime] | None = None) -> None:
        self.engine = engine
        self.settings = settings
        self.clock = clock or (lambda: dt.datetime.now(dt.timezone.utc))

    @property
    def secure_cookie(self) -> bool:
        return self.settings.console_origin.startswith("https://")

    # ---- challenges -----------------------------------------------------------------------

    def _new_challenge(self, purpose: str, username: str | None) -> bytes:
        challenge = secrets.token_bytes(32)
        expires = self.clock() + dt.timedelta(seconds=self.settings.console_challenge_seconds)
        with self.engine.begin() as c:
            c.execute(text("DELETE FROM console_challenge WHERE expires_at < now() - interval '1 day'"))
            c.execute(text("INSERT INTO console_challenge (challenge, purpose, username, expires_at) VALUES (:c, :p, :u, :e)"),
                      {"c": challenge, "p": purpose, "u": username, "e": expires})
        return challenge

    def _consume(self, c, challenge: bytes, purpose: str) -> str | None:
        """Mark the challenge used, once; its username. A challenge unknown, used, expired or of
        another purpose is console_challenge_invalid (the caller's transaction is rolled back)."""
        row = c.execute(text("UPDATE console_challenge SET used_at = :now WHERE challenge = :c AND purpose = :p "
                             "AND used_at IS NULL AND expires_at > :now RETURNING username"),
                        {"c": challenge, "p": purpose, "now": self.clock()}).first()
        if row is None:
            raise CustodyError(CustodyErrorCode.console_challenge_invalid,
                               "the challenge is unknown, used already or expired: ask for new options")
        return row.username

    # ---- enrolment ------------------------------------------------------------------------

    def enrol_options(self, username: str) -> dict:
        from webauthn import generate_registration_options, options_to_json
        from webauthn.helpers.structs import AuthenticatorSelectionCriteria, ResidentKeyRequirement, UserVerificationRequirement

        username = _check_username(username)
        challenge = self._new_challenge("enrol", username)
        options = generate_registration_options(
            rp_id=self.settings.console_rp_id, rp_name="Custody console", user_name=username,
            user_id=hashlib.sha256(b"custody-console-user:" + username.encode()).digest()[:16], challenge=challenge,
            timeout=self.settings.console_challenge_seconds * 1000,
            authenticator_selection=AuthenticatorSelectionCriteria(resident_key=ResidentKeyRequirement.DISCOURAGED,
                                                                   user_verification=UserVerificationRequirement.REQUIRED))
        return json.loads(options_to_json(options))

    def enrol(self, response: dict) -> CredentialView:
        from webauthn import verify_registration_response

        challenge = _challenge_of(response)
        with self.engine.begin() as c:
            username = self._consume(c, challenge, "enrol")
            try:
                verified = verify_registration_response(
                    credential=response, expected_challenge=challenge, expected_rp_id=self.settings.console_rp_id,
                    expected_origin=self.settings.console_origin, require_user_verification=True)
            except Exception as exc:  # noqa: BLE001 - the package raises several types for a bad response
                raise CustodyError(CustodyErrorCode.console_assertion_invalid,
                                   f"the registration does not verify: {str(exc)[:200]}") from None
            row = c.execute(text("INSERT INTO console_credential (username, credential_id, public_key, sign_count, rp_id, origin) "
                                 "VALUES (:u, :i, :k, :n, :rp, :o) ON CONFLICT (credential_id) DO NOTHING RETURNING id"),
                            {"u": username, "i": verified.credential_id, "k": verified.credential_public_key,
                             "n": verified.sign_count, "rp": self.settings.console_rp_id,
                             "o": self.settings.console_origin}).first()
            if row is None:
                raise CustodyError(CustodyErrorCode.console_assertion_invalid, "this credential is enrolled already")
            audit(c, f"console:{username}", "console.enrol", f"console_credential:{row.id}",
                  {"fingerprint": fingerprint(verified.credential_public_key)})
            return _credential(c.execute(text(f"{_CRED_SQL} WHERE id = :i"), {"i": row.id}).one())

    def credentials(self, *, state: str | None = None) -> list[CredentialView]:
        with self.engine.connect() as c:
            rows = c.execute(text(f"{_CRED_SQL} WHERE (CAST(:s AS text) IS NULL OR state = :s) ORDER BY id"), {"s": state})
            return [_credential(r) for r in rows]

    def decide_enrolment(self, credential_id: int, *, decision: str, role: str | None, by: str) -> CredentialView:
        """An admin (`by`: their name) approves a pending credential with a role, or revokes one
        (pending or active). Audited as `console.enrolment.approve` / `console.credential.revoke`."""
        if decision not in ("approve", "revoke") or (decision == "approve" and role not in CONSOLE_ROLES):
            raise LedgerError(ErrorCode.invalid_request, "decision is approve (with role operator, auditor or admin) or revoke")
        with self.engine.begin() as c:
            row = c.execute(text(f"{_CRED_SQL} WHERE id = :i FOR UPDATE"), {"i": credential_id}).first()
            if row is None:
                raise CustodyError(CustodyErrorCode.console_credential_not_found, f"no console credential {credential_id}")
            if decision == "approve":
                if row.state != "pending":
                    raise CustodyError(CustodyErrorCode.invalid_state, f"console credential {credential_id} is {row.state}",
                                       state=row.state)
                if row.username.casefold() == by.casefold():
                    raise CustodyError(CustodyErrorCode.console_self_approval, "nobody approves their own enrolment")
                c.execute(text("UPDATE console_credential SET state = 'active', role = :r, decided_by = :b, decided_at = :t "
                               "WHERE id = :i"), {"r": role, "b": by, "t": self.clock(), "i": credential_id})
            else:
                if row.state == "revoked":
                    raise CustodyError(CustodyErrorCode.invalid_state, f"console credential {credential_id} is revoked",
                                       state=row.state)
                c.execute(text("UPDATE console_credential SET state = 'revoked', decided_by = :b, decided_at = :t WHERE id = :i"),
                          {"b": by, "t": self.clock(), "i": credential_id})
                c.execute(text("UPDATE console_session SET ended_at = :t, ended_reason = 'credential revoked' "
                               "WHERE credential = :i AND ended_at IS NULL"), {"t": self.clock(), "i": credential_id})
            action = "console.enrolment.approve" if decision == "approve" else "console.credential.revoke"
            audit(c, by, action, f"console_credential:{credential_id}", {"username": row.username, "role": role})
            return _credential(c.execute(text(f"{_CRED_SQL} WHERE id = :i"), {"i": credential_id}).one())

    def approver_entry(self, credential_id: int) -> dict:
        """The signer's `[[approvers]]` entry for an active operator's credential (module docstring);
        `invalid_state` for any other (pending, revoked, an auditor's or admin's)."""
        with self.engine.connect() as c:
            row = c.execute(text("SELECT username, role, state, credential_id, public_key, rp_id, origin FROM console_credential "
                                 "WHERE id = :i"), {"i": credential_id}).first()
        if row is None:
            raise CustodyError(CustodyErrorCode.console_credential_not_found, f"no console credential {credential_id}")
        if row.state != "active" or row.role != "operator":
            raise CustodyError(CustodyErrorCode.invalid_state, f"console credential {credential_id} is {row.state} "
                               f"({row.role or 'no role'}): only an active operator's key approves payments", state=row.state)
        return {"key_id": approver_key_id(bytes(row.credential_id)), "operator": row.username, "scheme": "webauthn",
                "public_key": base64.b64encode(bytes(row.public_key)).decode("ascii"), "rp_id": row.rp_id,
                "origin": row.origin}

    # ---- sign-in --------------------------------------------------------------------------

    def sign_in_options(self, username: str) -> dict:
        from webauthn import generate_authentication_options, options_to_json
        from webauthn.helpers.structs import PublicKeyCredentialDescriptor, UserVerificationRequirement

        username = _check_username(username)
        with self.engine.connect() as c:
            ids = c.execute(text("SELECT credential_id FROM console_credential WHERE username = :u AND state = 'active' "
                                 "ORDER BY id"), {"u": username}).scalars().all()
        challenge = self._new_challenge("sign_in", username)
        options = generate_authentication_options(
            rp_id=self.settings.console_rp_id, challenge=challenge, timeout=self.settings.console_challenge_seconds * 1000,
            allow_credentials=[PublicKeyCredentialDescriptor(id=bytes(i)) for i in ids],
            user_verification=UserVerificationRequirement.REQUIRED)
        return json.loads(options_to_json(options))

    def sign_in(self, response: dict) -> tuple[str, ConsoleSession]:
        """Verify a sign-in assertion and open a session: (the cookie's token, the session)."""
        from webauthn import verify_authentication_response

        challenge = _challenge_of(response)
        raw_id = _b64url_decode(response.get("rawId") or response.get("id"), "rawId")
        now = self.clock()
        with self.engine.begin() as c:
            username = self._consume(c, challenge, "sign_in")
            cred = c.execute(text(f"{_CRED_SQL} WHERE credential_id = :i AND state = 'active' FOR UPDATE"),
                             {"i": raw_id}).first()
            if cred is None or cred.username != username:
                raise CustodyError(CustodyErrorCode.console_credential_unknown,
                                   "the credential is not an active console credential of this user")
            try:
                verified = verify_authentication_response(
                    credential=response, expected_challenge=challenge, expected_rp_id=self.settings.console_rp_id,
                    expected_origin=self.settings.console_origin, credential_public_key=bytes(cred.public_key),
                    credential_current_sign_count=int(cred.sign_count), require_user_verification=True)
            except Exception as exc:  # noqa: BLE001 - the package raises several types for a bad assertion
                raise CustodyError(CustodyErrorCode.console_assertion_invalid,
                                   f"the assertion does not verify: {str(exc)[:200]}") from None
            c.execute(text("UPDATE console_credential SET sign_count = :n, last_used_at = :t WHERE id = :i"),
                      {"n": verified.new_sign_count, "t": now, "i": cred.id})
            token = secrets.token_urlsafe(32)
            expires = now + dt.timedelta(seconds=self.settings.console_session_max_seconds)
            sid = c.execute(text("INSERT INTO console_session (token_hash, credential, username, role, created_at, last_seen_at, "
                                 "expires_at) VALUES (:h, :c, :u, :r, :t, :t, :e) RETURNING id"),
                            {"h": _token_hash(token), "c": cred.id, "u": cred.username, "r": cred.role, "t": now,
                             "e": expires}).scalar_one()
            audit(c, cred.username, "console.sign_in", f"console_session:{sid}", {"credential": cred.id})
        return token, self._session(sid, cred.username, cred.role, cred.id, bytes(cred.credential_id), token, expires)

    def _session(self, sid: int, username: str, role: str, credential: int, credential_id: bytes, token: str,
                 expires: dt.datetime) -> ConsoleSession:
        return ConsoleSession(sid, username, Role(role), credential, approver_key_id(credential_id), self.csrf_token(token),
                              expires, self.settings.console_idle_seconds)

    def csrf_token(self, token: str) -> str:
        return hmac.new(self.settings.api_key_pepper.encode(), b"console-csrf:" + token.encode(), hashlib.sha256).hexdigest()

    def check_csrf(self, token: str, sent: str | None) -> None:
        if not sent or not hmac.compare_digest(self.csrf_token(token), sent):
            raise CustodyError(CustodyErrorCode.console_csrf_invalid,
                               f"a state change with a console session needs the session's CSRF token in {CSRF_HEADER}")

    def session(self, token: str | None) -> ConsoleSession:
        """The live session of a cookie's token (and its idle clock restarted), or an error:
        console_sign_in_required (no token, or no such session), console_session_expired."""
        if not token:
            raise CustodyError(CustodyErrorCode.console_sign_in_required, "sign in to the console first")
        now = self.clock()
        with self.engine.begin() as c:
            row = c.execute(text("SELECT s.id, s.username, s.role, s.credential, s.last_seen_at, s.expires_at, s.ended_at, "
                                 "k.state AS credential_state, k.credential_id FROM console_session s "
                                 "JOIN console_credential k ON k.id = s.credential WHERE s.token_hash = :h FOR UPDATE OF s"),
                            {"h": _token_hash(token)}).first()
            if row is None:
                raise CustodyError(CustodyErrorCode.console_sign_in_required, "sign in to the console first")
            reason = None
            if row.ended_at is not None:
                reason = "ended"
            elif row.credential_state != "active":
                reason = "credential revoked"
            elif now >= row.expires_at:
                reason = "maximum session length"
            elif (now - row.last_seen_at).total_seconds() > self.settings.console_idle_seconds:
                reason = "idle timeout"
            if reason is not None:
                if row.ended_at is None:
                    c.execute(text("UPDATE console_session SET ended_at = :t, ended_reason = :r WHERE id = :i"),
                              {"t": now, "r": reason, "i": row.id})
                # committed: the session stays ended whatever the caller does next
            else:
                c.execute(text("UPDATE console_session SET last_seen_at = :t WHERE id = :i"), {"t": now, "i": row.id})
        if reason is not None:
            raise CustodyError(CustodyErrorCode.console_session_expired, f"the console session ended ({reason}): sign in again")
        return self._session(row.id, row.username, row.role, row.credential, bytes(row.credential_id), token, row.expires_at)

    def sign_out(self, token: str) -> None:
        with self.engine.begin() as c:
            row = c.execute(text("UPDATE console_session SET ended_at = :t, ended_reason = 'signed out' "
                                 "WHERE token_hash = :h AND ended_at IS NULL RETURNING id, username"),
                            {"t": self.clock(), "h": _token_hash(token)}).first()
            if row is not None:
                audit(c, row.username, "console.sign_out", f"console_session:{row.id}", {})


def _token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
