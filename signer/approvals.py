"""Operator approvals as signatures: the canonical payload an approver signs, and its verification.

An approval is not a row: it is a signature, by a key only the approver holds, over exactly what is
paid. Custody builds the payload for an operator to sign (`approval_payload`), verifies the
signature at the door and stores the signed bytes beside it; the signer rebuilds the payload itself
from the withdrawal and its decision and verifies every stored signature against the approver keys
IT is configured with (`ApproverRegistry`), never against keys read from a table a custody process
can write. This module holds no key material and no I/O: custody and the signer both import it.

The payload (`approval_payload`) is JSON with sorted keys, no whitespace (`,` and `:` separators),
UTF-8 without escaping non-ASCII characters, and these fields:
`v` = 1, `kind` = "withdrawal-approval", `withdrawal_id` (number), `chain`, `asset`, `amount` (a
decimal STRING of integer minor units: "250000000", never a float), `destination` (as stored),
`decision_id` (number), `policy_version`, `expires_at` (the decision's expiry, ISO-8601 UTC with
microseconds and a `Z`: "2026-11-29T12:00:00.000000Z").
A refill between the firm's own tiers (warm -> hot, custody.rebalances) is approved the same way
over `rebalance_approval_payload`: `v` = 1, `kind` = "rebalance-approval", `rebalance_id`, `chain`,
`asset`, `amount` (decimal string), `source_tier`, `destination_tier`, `destination`.
A treasury adjustment (custody.adjustments: a journal entry on firm accounts, maker-checker) is
approved over `adjustment_approval_payload`: `v` = 1, `kind` = "adjustment-approval",
`adjustment_id`, `legs` (in the order they are posted, each {`debit_account_id`, `credit_account_id`,
`amount` as a decimal string of minor units}), `reason`, `quorum` and `proposed_by`, as stored at
proposal. The worker that posts it rebuilds it from the row and verifies every stored signature
against its own registry before anything moves.
An operator's convert price (custody.convert.prices) is set over `convert_price_payload`: `v` = 1,
`kind` = "convert-price", `change_id`, `base_asset`, `quote_asset`, `price` (decimal string of
quote-asset minor units per whole base unit), `proposed_by`, `expires_at`; the worker rebuilds it
from the stored change and verifies the signature against its own registry before the price counts.

Schemes (`ApproverKey.scheme`):
- `ed25519`, for scripted approvers (`custody approve --key FILE`): the signature is Ed25519 over
  the payload bytes; `public_key` is the raw 32-byte key.
- `webauthn`, for security keys and passkeys (the operator console): the signature is a WebAuthn
  assertion whose challenge is SHA-256 of the payload bytes, checked by the `webauthn` package's
  `verify_authentication_response` against the key's `rp_id` and `origin`; `public_key` is the
  credential's COSE key as registration returned it. Two checks beyond the package's defaults:
  - user VERIFICATION (the UV flag: the authenticator checked a PIN or biometric), not only user
    presence (UP: someone touched it). An approval moves money, so a stolen or unattended security
    key alone must not approve. It is required of every webauthn key, with no opt-out: the console
    must ask for `userVerification: "required"`, and a security key without a PIN set cannot
    approve until one is set.
  - same-origin client data: `crossOrigin` absent or false and no `topOrigin`. The console is never
    embedded in another page; an assertion made inside a frame of another site means someone framed
    the console to get a "touch your key" prompt answered (clickjacking).
  The authenticator's sign count is NOT tracked (passed as 0): a cloned authenticator is not
  detected by its counter. What stops a replayed assertion is the payload itself, which names one
  withdrawal, one decision and an expiry.

`read_payload(bytes)` is the other direction, for whoever is about to sign bytes they were handed
(`custody approve`): the typed fields, or ValueError unless the bytes are exactly the canonical
payload of those fields (`approval_payload(**fields)` gives the same bytes back), so what is shown
to the approver is what the signature binds. It also refuses a payload whose text fields (chain,
asset, destination, policy_version) hold a character of Unicode category Cc, Cf, Zl or Zp
(`UNPRINTABLE_CATEGORIES`: ESC, CR and the other C0/C1 controls, bidi overrides and zero-width
characters, line and paragraph separators): printed, such characters can move a terminal's cursor
and redraw what the approver reads, or reorder it, so what is shown would not be what is signed.
`unprintable_fields(fields)` names the offending fields; the signer applies the same rule to the
payload it rebuilds (signer.service, `payload_unprintable`), so such a withdrawal is never signed
whatever its approvals. `approval_payload` itself still encodes any text (it is also the signer's
way to rebuild what custody stored): refusing is the reader's job.

Codes (`ApprovalInvalid.code`), in the order `verify_approval` checks them:
| code | meaning |
| --- | --- |
| approver_unknown | the key id is not in the registry (or there is no registry: nobody's approval is valid) |
| approval_scheme_mismatch | the scheme named with the signature is not the key's registered scheme |
| approval_signature_invalid | the signature does not verify over the payload with the key (ed25519), or the WebAuthn assertion fails (missing authenticator data or client data; client data made cross-origin, i.e. `crossOrigin` true or a `topOrigin`; type, challenge, origin, rp id, user presence, user verification, signature) |

`QuorumTable.required(asset, amount)` raises, in this order:
| code | meaning |
| --- | --- |
| quorum_asset_unknown | the table has no tiers for the asset: no amount of it may be paid |
| quorum_amount_above_table | the amount is above every tier of the asset: it may not be paid at all |

Configuration errors (a registry entry or a quorum table that cannot be right) raise ValueError when
the registry or table is built, so a process fails at start, never at the first approval.
"""
from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

if TYPE_CHECKING:
    from policies import PolicySet

PAYLOAD_VERSION = 1
UNPRINTABLE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})  # refused in a payload's text fields (module docstring)
TEXT_FIELDS = ("chain", "asset", "destination", "policy_version")  # the payload's free-text fields
PAYLOAD_KIND = "withdrawal-approval"
SCHEMES = ("ed25519", "webauthn")
Scheme = Literal["ed25519", "webauthn"]


class ApprovalInvalid(Exception):
    """An approval that does not count, or a quorum that cannot be computed (codes in the module table)."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{code}: {message}")


# ---- the payload --------------------------------------------------------------------------------

def format_expiry(expires_at: dt.datetime) -> str:
    """ISO-8601 UTC with microseconds and `Z`; a naive datetime is refused (it has no zone to convert)."""
    if expires_at.tzinfo is None or expires_at.utcoffset() is None:
        raise ValueError("expires_at must be timezone-aware")
    return expires_at.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def approval_payload(*, withdrawal_id: int, chain: str, asset: str, amount: int, destination: str, decision_id: int,
                     policy_version: str, expires_at: dt.datetime) -> bytes:
    """The canonical bytes an approver signs for one withdrawal under one decision (module docstring)."""
    for name, value in (("withdrawal_id", withdrawal_id), ("decision_id", decision_id), ("amount", amount)):
        if type(value) is not int or value < 0:
            raise ValueError(f"{name} must be a non-negative int")
    fields = {"v": PAYLOAD_VERSION, "kind": PAYLOAD_KIND, "withdrawal_id": withdrawal_id, "chain": chain, "asset": asset,
              "amount": str(amount), "destination": destination, "decision_id": decision_id,
              "policy_version": policy_version, "expires_at": format_expiry(expires_at)}
    return canonical_json(fields)


REBALANCE_PAYLOAD_KIND = "rebalance-approval"


def rebalance_approval_payload(*, rebalance_id: int, chain: str, asset: str, amount: int, source_tier: str,
                               destination_tier: str, destination: str) -> bytes:
    """The canonical bytes an approver signs for one refill between the firm's own tiers (warm ->
    hot): `kind` "rebalance-approval", the rebalance id, chain, asset, amount (decimal string of
    minor units), the tiers and the destination, encoded like a withdrawal's payload. It names one
    rebalance, so a signature can never count for another; the signer rebuilds it from the row."""
    for name, value in (("rebalance_id", rebalance_id), ("amount", amount)):
        if type(value) is not int or value < 0:
            raise ValueError(f"{name} must be a non-negative int")
    fields = {"v": PAYLOAD_VERSION, "kind": REBALANCE_PAYLOAD_KIND, "rebalance_id": rebalance_id, "chain": chain,
              "asset": asset, "amount": str(amount), "source_tier": source_tier, "destination_tier": destination_tier,
              "destination": destination}
    return canonical_json(fields)


ADJUSTMENT_PAYLOAD_KIND = "adjustment-approval"


def adjustment_approval_payload(*, adjustment_id: int, legs: Sequence[tuple[int, int, int]], reason: str, quorum: int,
                                proposed_by: str) -> bytes:
    """The canonical bytes an approver signs for one treasury adjustment: `kind`
    "adjustment-approval", its id, its legs in posting order as (debit account id, credit account
    id, amount in minor units) each written {debit_account_id, credit_account_id, amount (decimal
    string)}, the reason, the quorum and the proposer, encoded like a withdrawal's payload. It names
    one adjustment and exactly what it moves, so a signature counts for nothing else."""
    for name, value in (("adjustment_id", adjustment_id), ("quorum", quorum)):
        if type(value) is not int or value < 0:
            raise ValueError(f"{name} must be a non-negative int")
    written = []
    for leg in legs:
        if len(leg) != 3 or any(type(v) is not int or v < 0 for v in leg):
            raise ValueError("each leg is (debit account id, credit account id, amount): non-negative ints")
        debit, credit, amount = leg
        written.append({"debit_account_id": debit, "credit_account_id": credit, "amount": str(amount)})
    fields = {"v": PAYLOAD_VERSION, "kind": ADJUSTMENT_PAYLOAD_KIND, "adjustment_id": adjustment_id, "legs": written,
              "reason": reason, "quorum": quorum, "proposed_by": proposed_by}
    return canonical_json(fields)


PRICE_PAYLOAD_KIND = "convert-price"


def convert_price_payload(*, change_id: int, base_asset: str, quote_asset: str, price_minor: int, proposed_by: str,
                          expires_at: dt.datetime) -> bytes:
    """The canonical bytes an operator signs to set convert's price of a pair (custody.convert.prices):
    `kind` "convert-price", the change's id, the pair, the price (a decimal string of quote-asset
    minor units per whole base unit), the proposer and the change's expiry (ISO-8601 UTC, as a
    withdrawal's). It names one stored change, applied once and not after its expiry, so a
    signature never sets a price again later."""
    for name, value in (("change_id", change_id), ("price_minor", price_minor)):
        if type(value) is not int or value < 0:
            raise ValueError(f"{name} must be a non-negative int")
    fields = {"v": PAYLOAD_VERSION, "kind": PRICE_PAYLOAD_KIND, "change_id": change_id, "base_asset": base_asset,
              "quote_asset": quote_asset, "price": str(price_minor), "proposed_by": proposed_by,
              "expires_at": format_expiry(expires_at)}
    return canonical_json(fields)


@dataclass(frozen=True)
class AdjustmentPayloadFields:
    """The fields of a canonical adjustment approval payload, typed as `adjustment_approval_payload` takes them."""

    adjustment_id: int
    legs: tuple[tuple[int, int, int], ...]
    reason: str
    quorum: int
    proposed_by: str


def read_adjustment_payload(payload: bytes) -> AdjustmentPayloadFields:
    """The fields `payload` binds, or ValueError unless it is exactly the canonical adjustment
    payload of those fields (what `read_payload` is for a withdrawal's)."""
    fields = parse_payload(bytes(payload))
    if fields is None or fields.get("v") != PAYLOAD_VERSION or fields.get("kind") != ADJUSTMENT_PAYLOAD_KIND:
        raise ValueError(f"the payload is not a version {PAYLOAD_VERSION} {ADJUSTMENT_PAYLOAD_KIND!r} payload")
    try:
        legs = tuple((leg["debit_account_id"], leg["credit_account_id"], int(leg["amount"])) for leg in fields["legs"])
        parsed = AdjustmentPayloadFields(fields["adjustment_id"], legs, fields["reason"], fields["quorum"],
                                         fields["proposed_by"])
        canonical = adjustment_approval_payload(adjustment_id=parsed.adjustment_id, legs=parsed.legs, reason=parsed.reason,
                                                quorum=parsed.quorum, proposed_by=parsed.proposed_by)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"the payload's fields are not valid: {exc}") from None
    if canonical != bytes(payload):
        raise ValueError("the payload is not in canonical form: its bytes could say more than its fields")
    return parsed


def canonical_json(fields: Mapping[str, object]) -> bytes:
    """`fields` as every payload here is written: JSON with sorted keys (nested too), no
    whitespace, UTF-8 without escaping non-ASCII characters."""
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def parse_payload(payload: bytes) -> dict | None:
    """The fields of a stored payload, or None when it is not a JSON object (what the signer uses to
    tell a replay, which names another withdrawal, from a payload that differs in another field)."""
    try:
        fields = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return fields if isinstance(fields, dict) else None


@dataclass(frozen=True)
class PayloadFields:
    """The fields of a canonical approval payload, typed as `approval_payload` takes them."""

    withdrawal_id: int
    chain: str
    asset: str
    amount: int
    destination: str
    decision_id: int
    policy_version: str
    expires_at: dt.datetime

    def as_kwargs(self) -> dict:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


def read_payload(payload: bytes) -> PayloadFields:
    """The fields `payload` binds, or ValueError (with what is wrong) unless it is exactly the
    canonical payload of those fields: what a signer of handed-over bytes must check before showing
    them to anyone (module docstring)."""
    fields = parse_payload(bytes(payload))
    if fields is None:
        raise ValueError("the payload is not a UTF-8 JSON object")
    if fields.get("v") != PAYLOAD_VERSION or fields.get("kind") != PAYLOAD_KIND:
        raise ValueError(f"the payload is not a version {PAYLOAD_VERSION} {PAYLOAD_KIND!r} payload")
    amount, expires = fields.get("amount"), fields.get("expires_at")
    if not isinstance(amount, str) or not amount.isascii() or not amount.isdigit():
        raise ValueError("the payload's amount is not a string of minor units")
    if not isinstance(expires, str):
        raise ValueError("the payload's expires_at is not a string")
    try:
        expires_at = dt.datetime.strptime(expires, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        raise ValueError(f"the payload's expires_at {expires[:40]!r} is not ISO-8601 UTC with microseconds") from None
    for name, kind in (("withdrawal_id", int), ("decision_id", int), ("chain", str), ("asset", str), ("destination", str),
                       ("policy_version", str)):
        if type(fields.get(name)) is not kind:
            raise ValueError(f"the payload's {name} is not a {kind.__name__}")
    if len(amount) > 78:
        raise ValueError("the payload's amount exceeds 10^78-1 minor units")
    unprintable = unprintable_fields(fields)
    if unprintable:
        raise ValueError("the payload's text holds control or format characters, which could redraw or reorder what is "
                         f"shown: {'; '.join(unprintable)}")
    parsed = PayloadFields(fields["withdrawal_id"], fields["chain"], fields["asset"], int(amount), fields["destination"],
                           fields["decision_id"], fields["policy_version"], expires_at)
    try:
        canonical = approval_payload(**parsed.as_kwargs())
    except ValueError as exc:
        raise ValueError(f"the payload's fields are not valid: {exc}") from None
    if canonical != bytes(payload):
        raise ValueError("the payload is not in canonical form (key order, spacing, escapes, extra fields or a "
                         "non-canonical number): its bytes could say more than its fields")
    return parsed


def unprintable_fields(fields: "PayloadFields | Mapping[str, object]") -> list[str]:
    """The text fields of a payload (TEXT_FIELDS) holding a character of UNPRINTABLE_CATEGORIES,
    each as `name (U+XXXX, ...)`; empty when all are clean. Values are never echoed raw."""
    get = fields.get if isinstance(fields, Mapping) else (lambda name: getattr(fields, name))
    out = []
    for name in TEXT_FIELDS:
        value = get(name)
        bad = sorted({f"U+{ord(ch):04X}" for ch in value if unicodedata.category(ch) in UNPRINTABLE_CATEGORIES}) \
            if isinstance(value, str) else []
        if bad:
            out.append(f"{name} ({', '.join(bad)})")
    return out


def webauthn_challenge(payload: bytes) -> bytes:
    """The WebAuthn challenge for a payload: its SHA-256 (the browser signs over it, base64url-encoded)."""
    return hashlib.sha256(payload).digest()


def b64url(data: bytes) -> str:
    """base64url without padding, as WebAuthn writes challenges and credential ids."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def operator_identity(name: str) -> str:
    """One operator across the forms custody writes: `api:<key name>` (approval rows, requesters)
    and the bare name (approver keys), trimmed and case-folded as policies.quorum compares ids."""
    name = name.strip().casefold()
    return name[4:].strip() if name.startswith("api:") else name


# ---- approver keys ------------------------------------------------------------------------------

@dataclass(frozen=True)
class ApproverKey:
    """One approver's public key. `operator` is the person it belongs to (for custody's API, their API
    key name); quorum counts distinct operators, so two keys of one operator count once."""

    key_id: str
    operator: str
    scheme: Scheme
    public_key: bytes
    rp_id: str | None = None  # webauthn: the relying party id the credential is scoped to
    origin: str | None = None  # webauthn: the console origin the assertion must come from


@dataclass(frozen=True)
class ApprovalSignature:
    """What an approver sends with an approval: which key, which scheme, the signature, and for
    WebAuthn the authenticator data and client data JSON the signature covers."""

    key_id: str
    scheme: str
    signature: bytes
    authenticator_data: bytes | None = None
    client_data_json: bytes | None = None


class ApproverRegistry:
    """The approver keys a process trusts, by key id. Built once from configuration; immutable."""

    def __init__(self, keys: Sequence[ApproverKey]) -> None:
        by_id: dict[str, ApproverKey] = {}
        for key in keys:
            if key.key_id in by_id:
                raise ValueError(f"approver key id {key.key_id!r} is listed twice")
            _check_key(key)
            by_id[key.key_id] = key
        self._keys: Mapping[str, ApproverKey] = by_id

    @classmethod
    def from_entries(cls, entries: Sequence[Mapping]) -> "ApproverRegistry":
        """Entries as written in TOML: {key_id, operator, scheme, public_key (base64), rp_id?, origin?}."""
        keys = []
        for n, entry in enumerate(entries):
            where = f"approver entry {n} ({entry.get('key_id', '?')!r})" if isinstance(entry, Mapping) else f"approver entry {n}"
            if not isinstance(entry, Mapping):
                raise ValueError(f"{where}: not a table")
            unknown = set(entry) - {"key_id", "operator", "scheme", "public_key", "rp_id", "origin"}
            if unknown:
                raise ValueError(f"{where}: unknown setting(s) {sorted(unknown)}")
            for field in ("key_id", "operator", "scheme", "public_key"):
                if not isinstance(entry.get(field), str) or not entry[field].strip():
                    raise ValueError(f"{where}: {field} is required (a non-empty string)")
            try:
                public_key = base64.b64decode(entry["public_key"], validate=True)
            except ValueError:
                raise ValueError(f"{where}: public_key is not base64") from None
            keys.append(ApproverKey(entry["key_id"], entry["operator"].strip(), entry["scheme"], public_key,
                                    entry.get("rp_id"), entry.get("origin")))
        return cls(keys)

    def get(self, key_id: str) -> ApproverKey | None:
        return self._keys.get(key_id)

    def keys(self) -> tuple[ApproverKey, ...]:
        return tuple(self._keys.values())

    def __len__(self) -> int:
        return len(self._keys)


def _check_key(key: ApproverKey) -> None:
    where = f"approver key {key.key_id!r}"
    if key.scheme not in SCHEMES:
        raise ValueError(f"{where}: scheme must be one of {SCHEMES}, not {key.scheme!r}")
    if not key.operator or not key.operator.strip():
        raise ValueError(f"{where}: operator is required")
    if key.scheme == "ed25519":
        if len(key.public_key) != 32:
            raise ValueError(f"{where}: an ed25519 public key is 32 bytes, not {len(key.public_key)}")
        Ed25519PublicKey.from_public_bytes(key.public_key)
        if key.rp_id or key.origin:
            raise ValueError(f"{where}: rp_id and origin belong to webauthn keys only")
        return
    if not key.rp_id or not key.origin:
        raise ValueError(f"{where}: a webauthn key needs rp_id and origin")
    from webauthn.helpers import decode_credential_public_key, decoded_public_key_to_cryptography

    try:
        decoded_public_key_to_cryptography(decode_credential_public_key(key.public_key))
    except Exception as exc:  # noqa: BLE001 - any failure to read the COSE key is a configuration error
        raise ValueError(f"{where}: public_key is not a COSE credential public key ({exc.__class__.__name__})") from None


# ---- verification -------------------------------------------------------------------------------

def verify_stored_approval(registry: ApproverRegistry | None, row: Any, signed_payload: bytes) -> ApproverKey:
    """`verify_approval` of a stored approval: `row` has `key_id`, `scheme`, `signature`,
    `authenticator_data` and `client_data_json` as the database returns them (bytea as
    memoryview, NULLs as None). A row with no signature is ApprovalInvalid like any other
    failure: callers that tell the two apart check `signature` first."""
    if row.signature is None:
        raise ApprovalInvalid("approval_signature_invalid", f"approval by {row.key_id!r} carries no signature")
    return verify_approval(registry, row.key_id, row.scheme, signed_payload, bytes(row.signature),
                           None if row.authenticator_data is None else bytes(row.authenticator_data),
                           None if row.client_data_json is None else bytes(row.client_data_json))


def verify_approval(registry: ApproverRegistry | None, key_id: str, scheme: str, signed_payload: bytes, signature: bytes,
                    authenticator_data: bytes | None, client_data_json: bytes | None) -> ApproverKey:
    """The key that signed `signed_payload`, or ApprovalInvalid (codes in the module table). Every
    failure of attacker-supplied bytes is an ApprovalInvalid, never another exception."""
    key = registry.get(key_id) if registry is not None and isinstance(key_id, str) else None
    if key is None:
        raise ApprovalInvalid("approver_unknown", f"approver key {key_id!r} is not configured")
    if scheme != key.scheme:
        raise ApprovalInvalid("approval_scheme_mismatch", f"key {key_id!r} is a {key.scheme} key, not {scheme!r}")
    if key.scheme == "ed25519":
        try:
            Ed25519PublicKey.from_public_bytes(key.public_key).verify(bytes(signature), bytes(signed_payload))
        except (InvalidSignature, ValueError, TypeError):
            raise ApprovalInvalid("approval_signature_invalid", f"the ed25519 signature of {key_id!r} does not verify") from None
        return key
    _verify_webauthn(key, signed_payload, signature, authenticator_data, client_data_json)
    return key


def _verify_webauthn(key: ApproverKey, payload: bytes, signature: bytes, authenticator_data: bytes | None,
                     client_data_json: bytes | None) -> None:
    from webauthn import verify_authentication_response
    from webauthn.helpers.structs import AuthenticationCredential, AuthenticatorAssertionResponse

    if not authenticator_data or not client_data_json:
        raise ApprovalInvalid("approval_signature_invalid", "a webauthn approval needs authenticator_data and client_data_json")
    _refuse_cross_origin(key, bytes(client_data_json))
    raw_id = key.key_id.encode("utf-8")
    credential = AuthenticationCredential(id=b64url(raw_id), raw_id=raw_id, response=AuthenticatorAssertionResponse(
        client_data_json=bytes(client_data_json), authenticator_data=bytes(authenticator_data), signature=bytes(signature)))
    try:
        verify_authentication_response(credential=credential, expected_challenge=webauthn_challenge(bytes(payload)),
                                       expected_rp_id=key.rp_id, expected_origin=key.origin,
                                       credential_public_key=key.public_key, credential_current_sign_count=0,
                                       require_user_verification=True)
    except Exception as exc:  # noqa: BLE001 - malformed client data or signatures raise several types: all refusals
        raise ApprovalInvalid("approval_signature_invalid",
                              f"the webauthn assertion of {key.key_id!r} does not verify: {str(exc)[:160]}") from None


def _refuse_cross_origin(key: ApproverKey, client_data_json: bytes) -> None:
    """The assertion must have been made by the console's own top-level page (module docstring):
    `crossOrigin` absent or exactly false, no `topOrigin`. Client data that is not a JSON object is
    left to the package, which refuses it."""
    try:
        client_data = json.loads(client_data_json.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return
    if not isinstance(client_data, dict):
        return
    if client_data.get("crossOrigin", False) is not False or "topOrigin" in client_data:
        raise ApprovalInvalid("approval_signature_invalid",
                              f"the webauthn assertion of {key.key_id!r} was made cross-origin (crossOrigin "
                              f"{client_data.get('crossOrigin')!r}, topOrigin {str(client_data.get('topOrigin'))[:80]!r}): "
                              "the console is never embedded in another site")


# ---- quorum -------------------------------------------------------------------------------------

UNBOUNDED = "unbounded"  # how TOML writes a last tier without a limit (TOML has no null)


@dataclass(frozen=True)
class QuorumTable:
    """Approvals required per asset by amount: `tiers[asset]` is ((limit, approvals), ...), limits
    strictly ascending (None: unbounded, last only), approvals never fewer for a larger amount. An
    amount needs the approvals of the first tier whose limit is >= the amount."""

    tiers: Mapping[str, tuple[tuple[int | None, int], ...]]

    def __post_init__(self) -> None:
        clean: dict[str, tuple[tuple[int | None, int], ...]] = {}
        for asset, rows in dict(self.tiers).items():
            rows = tuple((None if limit is None or limit == UNBOUNDED else limit, approvals) for limit, approvals in rows)
            if not rows:
                raise ValueError(f"quorum table: {asset} has no tiers")
            for limit, approvals in rows:
                if limit is not None and (type(limit) is not int or limit < 1):
                    raise ValueError(f"quorum table: {asset} limit {limit!r} must be a positive integer (minor units)")
                if type(approvals) is not int or approvals < 0:
                    raise ValueError(f"quorum table: {asset} approvals {approvals!r} must be a non-negative integer")
            for (lower, k_lower), (upper, k_upper) in zip(rows, rows[1:]):
                if lower is None or (upper is not None and upper <= lower):
                    raise ValueError(f"quorum table: {asset} limits must be strictly ascending, unbounded only last")
                if k_upper < k_lower:
                    raise ValueError(f"quorum table: {asset}: a larger amount may not need fewer approvals")
            clean[asset] = rows
        object.__setattr__(self, "tiers", clean)

    @classmethod
    def from_entries(cls, entries: Mapping[str, Sequence[Sequence]]) -> "QuorumTable":
        """TOML form: {"BTC": [[50000000, 0], [200000000, 1], ["unbounded", 2]], ...}."""
        rows = {}
        for asset, tiers in entries.items():
            if not all(isinstance(t, (list, tuple)) and len(t) == 2 for t in tiers):
                raise ValueError(f"quorum table: {asset} tiers are [limit, approvals] pairs")
            rows[asset] = tuple((t[0], t[1]) for t in tiers)
        return cls(rows)

    def required(self, asset: str, amount: int) -> int:
        rows = self.tiers.get(asset)
        if rows is None:
            raise ApprovalInvalid("quorum_asset_unknown", f"the quorum table has no tiers for {asset}")
        for limit, approvals in rows:
            if limit is None or amount <= limit:
                return approvals
        raise ApprovalInvalid("quorum_amount_above_table", f"{amount} {asset} is above every tier of the quorum table")


def quorum_table_from_policy(policy: "PolicySet") -> QuorumTable:
    """The amount tiers of a policy version as a quorum table (velocity, allowlists and the other
    rules that can only ask for approvals are custody's decision and not part of it)."""
    return QuorumTable({asset: tuple((t.up_to, t.approvals) for t in p.tiers) for asset, p in policy.assets.items()})
