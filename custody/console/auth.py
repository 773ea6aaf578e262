"""Console sign-in with WebAuthn (passkeys, security keys) and the server-side sessions it opens.

No API key ever reaches the console page. An operator enrols a credential once and signs in with it:

1. Enrolment: `enrol_options(username)` hands out registration options (a fresh 32-byte challenge,
   stored with its expiry, user verification required); the browser's `navigator.credentials.create`
   answers; `enrol(response)` consumes the challenge (once) and verifies the attestation with the
   `webauthn` package (origin `CONSOLE_ORIGIN`, relying party `CONSOLE_RP_ID`, UV required). The
   credential is stored `pending`, without a role, and its fingerprint (first 16 hex digits of the
   SHA-256 of its COSE public key, in groups of four) is shown to the operator.
2. An admin (console session or admin API key) compares the fingerprint with the operator out of
   band and approves it with a role (`decide_enrolment`); nobody approves their own enrolment,
   nor one made from their own signed-in session (`enrolled_by`). A username that differs from
   another console user's or API key's only by letter case is refused (`console_username_taken`):
   custody compares operators case-folded (signer.approvals.operator_identity).
3. Sign-in: `sign_in_options(username)` lists the user's active credentials with a fresh challenge;
   `sign_in(response)` consumes the challenge (a replayed assertion finds it used:
   `console_challenge_invalid`), verifies the assertion (UV required; a sign count that does not
   grow, when the authenticator keeps one, is refused as a cloned authenticator) and opens a session.
   A user with no active credential gets the same shape of options: one credential id derived from
   the username with an HMAC under API_KEY_PEPPER, so the options do not tell who is enrolled.
   Client data made in a cross-origin frame (`crossOrigin` true, a `topOrigin`) is refused in both
   ceremonies, as signer.approvals refuses it for approvals.

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
approvals with `approver_unknown`. The signer never reads `console_credential`; custody refuses a
`console:` key whose credential is not active (`refuse_inactive_console_key`: withdrawal and refill
approvals alike, custody.withdrawals `verify_operator_approval`), and a refill approval already
stored stops counting towards its quorum once its credential is revoked (`inactive_console_keys`,
custody.withdrawals `live_approvers`), but the entry must still be removed from both
configurations when a credential is revoked: that is how the signer learns it.

Activation is signed (the root of trust is configuration, not a row): an operator's enrolment is
approved with the approving admin's WebAuthn assertion over `activation_payload` (credential id,
SHA-256 of its public key, username, role; challenge = SHA-256 of the payload), by a key listed in
`CONSOLE_ADMINS` (Settings.console_admins: approver-style entries of admin console credentials,
each confirmed in person by its fingerprint before it is added). The assertion is verified when the
approval is made and stored with the credential; `approver_entry` verifies it again, against
`CONSOLE_ADMINS` and with the signing admin's credential not revoked, and refuses
(`console_activation_invalid`) a credential activated without one: a custody_api database writer
can activate a row, but cannot make the export hand out its own key as an operator's. An admin's
own entry (for `CONSOLE_ADMINS`) is exported with its fingerprint only: that root is confirmed in
person, never by a row.

Errors (custody.errors): console_sign_in_required, console_session_expired, console_csrf_invalid,
console_challenge_invalid, console_assertion_invalid, console_credential_unknown,
console_credential_not_found, console_self_approval, console_activation_invalid,
console_username_taken; a username that is not 1-64 of
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
from signer.approvals import ApprovalInvalid, ApprovalSignature, ApproverKey, ApproverRegistry, b64url, operator_identity, \
    verify_approval

COOKIE = "custody_console"
CSRF_HEADER = "X-CSRF-Token"
CONSOLE_ROLES = ("operator", "auditor", "admin")
ACTIVATION_KIND = "console-activation"


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
    enrolled_by: str | None
    activated_by_key: str | None


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


def activation_payload(*, credential_id: bytes, public_key: bytes, username: str, role: str) -> bytes:
    """The canonical bytes an admin's assertion signs to activate a credential with a role: JSON,
    sorted keys, no whitespace: `v` 1, `kind` "console-activation", `credential_id` (base64url),
    `public_key_sha256` (hex), `username`, `role`. It names one key of one person in one role, so an
    activation can never be moved to another row."""
    fields = {"v": 1, "kind": ACTIVATION_KIND, "credential_id": b64url(credential_id),
              "public_key_sha256": hashlib.sha256(public_key).hexdigest(), "username": username, "role": role}
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def console_admins(settings: Settings) -> ApproverRegistry:
    """The configured console admin keys (`CONSOLE_ADMINS`, validated when the settings load)."""
    return ApproverRegistry.from_entries(settings.console_admins)


def _approver_fields(key_id: str, username: str, public_key: bytes, rp_id: str, origin: str) -> dict:
    return {"key_id": key_id, "operator": username, "scheme": "webauthn",
            "public_key": base64.b64encode(public_key).decode("ascii"), "rp_id": rp_id, "origin": origin}


def refuse_inactive_console_key(c, key_id: str) -> None:
    """A `console:` approver key whose credential is not active now (revoked, or unknown to this
    database) approves nothing, whatever the configured approver entries say: `approver_unknown`."""
    if key_id in inactive_console_keys(c, [key_id]):
        raise CustodyError(CustodyErrorCode.approver_unknown,
                           f"console credential {key_id!r} is not active: its approver entry must be removed "
                           "from the signer's and custody's configuration", key_id=key_id)


def inactive_console_keys(c, key_ids) -> set[str]:
    """The `console:` key ids among `key_ids` whose credential is not active now (revoked, pending,
    unknown to this database, or not a credential id at all). Other key ids (ed25519 approvers) are
    never in it: they stop counting when their entry leaves the approver registry."""
    wanted: dict[bytes, str] = {}
    bad = set()
    for key_id in {k for k in key_ids if k and k.startswith("console:")}:
        try:
            wanted[_b64url_decode(key_id[len("console:"):], "the key id")] = key_id
        except CustodyError:
            bad.add(key_id)
    if not wanted:
        return bad
    active = set(c.execute(text("SELECT credential_id FROM console_credential WHERE credential_id = ANY(:i) "
                                "AND state = 'active'"), {"i": list(wanted)}).scalars())
    return bad | {key_id for raw, key_id in wanted.items() if raw not in {bytes(a) for a in active}}


def _b64url_decode(value: object, what: str) -> bytes:
    if not isinstance(value, str) or len(value) > 65536:
        raise CustodyError(CustodyErrorCode.console_assertion_invalid, f"{what} is missing")
    try:
        return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        raise CustodyError(CustodyErrorCode.console_assertion_invalid, f"{what} is not base64url") from None


def _challenge_of(response: Any) -> bytes:
    """The challenge the browser signed, read from the response's clientDataJSON (verified later).
    Client data made in a cross-origin frame (`crossOrigin` true, a `topOrigin`) is refused here,
    before anything is verified: the console is never embedded in another site (signer.approvals
    refuses such approvals for the same reason)."""
    inner = response.get("response") if isinstance(response, dict) else None
    if not isinstance(inner, dict):
        raise CustodyError(CustodyErrorCode.console_assertion_invalid, "the WebAuthn response has no `response` object")
    try:
        client_data = json.loads(_b64url_decode(inner.get("clientDataJSON"), "clientDataJSON"))
    except (UnicodeDecodeError, ValueError):
        raise CustodyError(CustodyErrorCode.console_assertion_invalid, "clientDataJSON is not JSON") from None
    if not isinstance(client_data, dict):
        raise CustodyError(CustodyErrorCode.console_assertion_invalid, "clientDataJSON is not a JSON object")
    if client_data.get("crossOrigin", False) is not False or "topOrigin" in client_data:
        raise CustodyError(CustodyErrorCode.console_assertion_invalid,
                           "the response was made in a cross-origin frame: the console is never embedded in another site")
    return _b64url_decode(client_data.get("challenge"), "the challenge")


def _check_username(username: object) -> str:
    if not isinstance(username, str) or not KEY_NAME.match(username):
        raise LedgerError(ErrorCode.invalid_request, "a console username is 1-64 letters, digits, '.', '_' or '-'")
    return username


def _refuse_case_variant(c, username: str) -> None:
    """One person, one name: a username that another console user or an API key has in another
    letter case is refused (operators are compared case-folded everywhere money is decided).
    Serialised per folded name by an advisory lock, so two racing enrolments cannot both pass."""
    c.execute(text("SELECT pg_advisory_xact_lock(hashtext('console-user:' || lower(:u)))"), {"u": username})
    clash = c.execute(text("SELECT username FROM console_credential WHERE lower(username) = lower(:u) AND username <> :u "
                           "UNION ALL SELECT name FROM api_key WHERE lower(name) = lower(:u) AND name <> :u LIMIT 1"),
                      {"u": username}).scalar()
    if clash is not None:
        raise CustodyError(CustodyErrorCode.console_username_taken,
                           f"{clash!r} is enrolled already: a name differing only by letter case is the same operator")


_CRED_SQL = ("SELECT id, username, role, state, public_key, credential_id, requested_at, decided_by, decided_at, last_used_at, "
             "sign_count, rp_id, origin, enrolled_by, activation_key_id, activation_signature, activation_authenticator_data, "
             "activation_client_data FROM console_credential")


def _credential(row) -> CredentialView:
    return CredentialView(row.id, row.username, row.role, row.state, fingerprint(bytes(row.public_key)),
                          approver_key_id(bytes(row.credential_id)), row.requested_at, row.decided_by, row.decided_at,
                          row.last_used_at, row.enrolled_by, row.activation_key_id)


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
        with self.engine.begin() as c:
            _refuse_case_variant(c, username)  # early: the same check runs again when the credential is stored
        challenge = self._new_challenge("enrol", username)
        options = generate_registration_options(
            rp_id=self.settings.console_rp_id, rp_name="Custody console", user_name=username,
            user_id=hashlib.sha256(b"custody-console-user:" + username.encode()).digest()[:16], challenge=challenge,
            timeout=self.settings.console_challenge_seconds * 1000,
            authenticator_selection=AuthenticatorSelectionCriteria(resident_key=ResidentKeyRequirement.DISCOURAGED,
                                                                   user_verification=UserVerificationRequirement.REQUIRED))
        return json.loads(options_to_json(options))

    def enrol(self, response: dict, *, enrolled_by: str | None = None) -> CredentialView:
        """A new pending credential from a registration response; `enrolled_by`: the user of the
        console session the request came with (who may then never approve it)."""
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
            _refuse_case_variant(c, username)
            row = c.execute(text("INSERT INTO console_credential (username, credential_id, public_key, sign_count, rp_id, origin, "
                                 "enrolled_by) VALUES (:u, :i, :k, :n, :rp, :o, :by) "
                                 "ON CONFLICT (credential_id) DO NOTHING RETURNING id"),
                            {"u": username, "i": verified.credential_id, "k": verified.credential_public_key,
                             "n": verified.sign_count, "rp": self.settings.console_rp_id,
                             "o": self.settings.console_origin, "by": enrolled_by}).first()
            if row is None:
                raise CustodyError(CustodyErrorCode.console_assertion_invalid, "this credential is enrolled already")
            audit(c, f"console:{username}", "console.enrol", f"console_credential:{row.id}",
                  {"fingerprint": fingerprint(verified.credential_public_key), "enrolled_by": enrolled_by})
            return _credential(c.execute(text(f"{_CRED_SQL} WHERE id = :i"), {"i": row.id}).one())

    def credentials(self, *, state: str | None = None) -> list[CredentialView]:
        with self.engine.connect() as c:
            rows = c.execute(text(f"{_CRED_SQL} WHERE (CAST(:s AS text) IS NULL OR state = :s) ORDER BY id"), {"s": state})
            return [_credential(r) for r in rows]

    def activation(self, credential_id: int, role: str) -> bytes:
        """The payload an admin signs to approve a pending credential as `role` (activation_payload)."""
        if role not in CONSOLE_ROLES:
            raise LedgerError(ErrorCode.invalid_request, "role is operator, auditor or admin")
        with self.engine.connect() as c:
            row = c.execute(text(f"{_CRED_SQL} WHERE id = :i"), {"i": credential_id}).first()
        if row is None:
            raise CustodyError(CustodyErrorCode.console_credential_not_found, f"no console credential {credential_id}")
        if row.state != "pending":
            raise CustodyError(CustodyErrorCode.invalid_state, f"console credential {credential_id} is {row.state}",
                               state=row.state)
        return activation_payload(credential_id=bytes(row.credential_id), public_key=bytes(row.public_key),
                                  username=row.username, role=role)

    def _verify_activation(self, c, row, role: str, signature: ApprovalSignature) -> ApproverKey:
        """The configured admin key whose assertion over the row's activation payload `signature`
        is; console_activation_invalid otherwise (unknown key, bad assertion, a revoked admin
        credential, or the admin is the credential's own user or its enroller)."""
        payload = activation_payload(credential_id=bytes(row.credential_id), public_key=bytes(row.public_key),
                                     username=row.username, role=role)
        try:
            key = verify_approval(console_admins(self.settings), signature.key_id, signature.scheme, payload,
                                  signature.signature, signature.authenticator_data, signature.client_data_json)
        except ApprovalInvalid as exc:
            raise CustodyError(CustodyErrorCode.console_activation_invalid,
                               f"the activation is not a configured console admin's (CONSOLE_ADMINS) assertion over this "
                               f"credential's activation payload: {exc.message}") from None
        admin_state = c.execute(text("SELECT state FROM console_credential WHERE credential_id = :i"),
                                {"i": _b64url_decode(key.key_id[len("console:"):], "the key id")}).scalar() \
            if key.key_id.startswith("console:") else None
        if admin_state == "revoked":
            raise CustodyError(CustodyErrorCode.console_activation_invalid, f"the activating admin key {key.key_id!r} is revoked")
        if operator_identity(key.operator) in {operator_identity(row.username), operator_identity(row.enrolled_by or "")}:
            raise CustodyError(CustodyErrorCode.console_self_approval, "nobody approves their own enrolment")
        return key

    def decide_enrolment(self, credential_id: int, *, decision: str, role: str | None, by: str,
                         activation: ApprovalSignature | None = None) -> CredentialView:
        """An admin (`by`: their name) approves a pending credential with a role, or revokes one
        (pending or active). `activation`: the approving admin's assertion over `activation(id,
        role)`, verified against CONSOLE_ADMINS and stored; without it the credential signs in but
        gets no approver entry. Audited as `console.enrolment.approve` / `console.credential.revoke`."""
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
                if operator_identity(by) in {operator_identity(row.username), operator_identity(row.enrolled_by or "")}:
                    raise CustodyError(CustodyErrorCode.console_self_approval,
                                       "nobody approves their own enrolment, nor one made from their own session")
                key = self._verify_activation(c, row, role, activation) if activation is not None else None
                c.execute(text("UPDATE console_credential SET state = 'active', role = :r, decided_by = :b, decided_at = :t, "
                               "activation_key_id = :k, activation_signature = :s, activation_authenticator_data = :ad, "
                               "activation_client_data = :cd WHERE id = :i"),
                          {"r": role, "b": by, "t": self.clock(), "i": credential_id, "k": key and key.key_id,
                           "s": activation and activation.signature, "ad": activation and activation.authenticator_data,
                           "cd": activation and activation.client_data_json})
            else:
                if row.state == "revoked":
                    raise CustodyError(CustodyErrorCode.invalid_state, f"console credential {credential_id} is revoked",
                                       state=row.state)
                c.execute(text("UPDATE console_credential SET state = 'revoked', decided_by = :b, decided_at = :t WHERE id = :i"),
                          {"b": by, "t": self.clock(), "i": credential_id})
                c.execute(text("UPDATE console_session SET ended_at = :t, ended_reason = 'credential revoked' "
                               "WHERE credential = :i AND ended_at IS NULL"), {"t": self.clock(), "i": credential_id})
            action = "console.enrolment.approve" if decision == "approve" else "console.credential.revoke"
            audit(c, by, action, f"console_credential:{credential_id}",
                  {"username": row.username, "role": role, **({"activated_by_key": activation.key_id} if activation else {})})
            return _credential(c.execute(text(f"{_CRED_SQL} WHERE id = :i"), {"i": credential_id}).one())

    def approver_entry(self, credential_id: int) -> dict:
        """What operations add to configuration for an active credential, with its fingerprint (to
        confirm with the person) and what vouches for it:
        - an operator's: `entry`, the signer's `[[approvers]]` table (module docstring), exported only
          when its stored activation verifies now against CONSOLE_ADMINS (console_activation_invalid
          otherwise: revoke it and enrol again, approved by a configured admin in the page);
        - an admin's: `entry` for CONSOLE_ADMINS, vouched for by nothing but the person confirming the
          fingerprint (the root of trust).
        `invalid_state` for any other (pending, revoked, an auditor's)."""
        with self.engine.connect() as c:
            row = c.execute(text(f"{_CRED_SQL} WHERE id = :i"), {"i": credential_id}).first()
            if row is None:
                raise CustodyError(CustodyErrorCode.console_credential_not_found, f"no console credential {credential_id}")
            if row.state != "active" or row.role not in ("operator", "admin"):
                raise CustodyError(CustodyErrorCode.invalid_state, f"console credential {credential_id} is {row.state} "
                                   f"({row.role or 'no role'}): only an active operator's key approves payments",
                                   state=row.state)
            entry = _approver_fields(approver_key_id(bytes(row.credential_id)), row.username, bytes(row.public_key),
                                     row.rp_id, row.origin)
            out = {"entry": entry, "fingerprint": fingerprint(bytes(row.public_key)), "username": row.username,
                   "role": row.role}
            if row.role == "admin":
                return {**out, "config": "CONSOLE_ADMINS", "activated_by": None}
            if row.activation_key_id is None:
                raise CustodyError(CustodyErrorCode.console_activation_invalid,
                                   f"console credential {credential_id} was activated without a configured admin's signed "
                                   "approval: revoke it and enrol again, approved in the page by an admin in CONSOLE_ADMINS")
            key = self._verify_activation(c, row, row.role, ApprovalSignature(
                row.activation_key_id, "webauthn", bytes(row.activation_signature or b""),
                bytes(row.activation_authenticator_data or b""), bytes(row.activation_client_data or b"")))
        return {**out, "config": "approvers",
                "activated_by": {"operator": key.operator, "key_id": key.key_id, "fingerprint": fingerprint(key.public_key)}}

    # ---- sign-in --------------------------------------------------------------------------

    def sign_in_options(self, username: str) -> dict:
        from webauthn import generate_authentication_options, options_to_json
        from webauthn.helpers.structs import PublicKeyCredentialDescriptor, UserVerificationRequirement

        username = _check_username(username)
        with self.engine.connect() as c:
            ids = c.execute(text("SELECT credential_id FROM console_credential WHERE username = :u AND state = 'active' "
                                 "ORDER BY id"), {"u": username}).scalars().all()
        if not ids:  # the same shape for a stranger: a stable id derived from the name, which nothing holds
            ids = [hmac.new(self.settings.api_key_pepper.encode(), b"console-decoy-credential:" + username.encode(),
                            hashlib.sha256).digest()]
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
