"""How a webhook delivery is signed, and the check a receiver runs (stdlib only, no database).

Every delivery is an HTTP POST whose body is the event as JSON (UTF-8, keys sorted, no spaces):
`{"created_at": ..., "data": {...}, "id": "<event key>", "type": "<event type>"}`, with headers

| header | value |
| --- | --- |
| `Custody-Event-Id` | the event key: the same on every attempt and replay of one event (a copy of the body's `id`) |
| `Custody-Event-Type` | the event type (`deposit.credited`, ...) (a copy of the body's `type`) |
| `Custody-Timestamp` | the attempt's time, whole seconds since the Unix epoch |
| `Custody-Signature` | `v1=<hex>`, or `v1=<hex>,v1=<hex>` while a rotated secret's grace period runs |

Each `v1` value is `hex(HMAC-SHA256(key, f"{timestamp}.".encode() + raw_body))`, keyed with the
endpoint's secret string exactly as the service showed it (its UTF-8 bytes, `whsec_` prefix
included), one value per secret that is valid for signing. The receiver:

1. reads the raw body bytes before any JSON parsing (re-serialising changes them);
2. recomputes the HMAC with its secret and compares in constant time with each `v1` value; one
   match is enough (after a rotation, a receiver that still has the old secret keeps verifying
   until the grace period ends, one that has the new one verifies at once);
3. refuses a timestamp more than `tolerance` seconds (default 300) from its own clock, so a
   captured delivery cannot be replayed later;
4. takes the event id and type from the signed body (`id`, `type`), never from the headers: the
   signature covers the body and the timestamp only, so `Custody-Event-Id` and `Custody-Event-Type`
   are conveniences for routing that a replayer could change; a header that differs from the
   body's value is refused;
5. de-duplicates on that signed id: delivery is at least once (a receiver that answered 2xx too
   late, or an operator's replay, sends the same event again).

    from custody.webhooks import verify_signature, WebhookSignatureError
    try:
        event_id = verify_signature(secret, request.headers, raw_body)
    except WebhookSignatureError as exc:
        return 400, exc.code

`verify_signature` raises `WebhookSignatureError` with `code`: `header_missing` (no timestamp or
signature header), `timestamp_invalid` (not an integer), `timestamp_outside_tolerance` (too old or
too far in the future), `signature_mismatch` (no `v1` value matches any of the given secrets: the
body or timestamp was changed, or the secret is wrong), `body_invalid` (signed, but not a JSON
object with a string `id` and `type`), `event_id_mismatch` (a `Custody-Event-Id` header that is not
the signed body's `id`: a captured delivery re-sent under another id), `event_type_mismatch` (the
same for `Custody-Event-Type`). It returns the id read from the signed body; `verify_event` returns
the whole parsed body.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Iterable, Mapping

ID_HEADER = "Custody-Event-Id"
TYPE_HEADER = "Custody-Event-Type"
TIMESTAMP_HEADER = "Custody-Timestamp"
SIGNATURE_HEADER = "Custody-Signature"
SCHEME = "v1"
DEFAULT_TOLERANCE_SECONDS = 300


class WebhookSignatureError(ValueError):
    """A delivery failed the receiver's check; `code` says which step (module docstring)."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(f"{code}: {message}")


def event_body(event_id: str, event_type: str, created_at: str, data: Mapping[str, object]) -> bytes:
    """The exact bytes POSTed (and signed) for one event: the same on every attempt."""
    envelope = {"id": event_id, "type": event_type, "created_at": created_at, "data": data}
    return json.dumps(envelope, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """hex HMAC-SHA256 of `<timestamp>.<body>` keyed with the secret string's UTF-8 bytes."""
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def signature_header(secrets: Iterable[str], timestamp: int, body: bytes) -> str:
    """`v1=<hex>` per secret, comma-separated (the current secret first)."""
    return ",".join(f"{SCHEME}={sign(s, timestamp, body)}" for s in secrets)


def delivery_headers(secrets: Iterable[str], event_id: str, event_type: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {"Content-Type": "application/json", ID_HEADER: event_id, TYPE_HEADER: event_type,
            TIMESTAMP_HEADER: str(timestamp), SIGNATURE_HEADER: signature_header(secrets, timestamp, body)}


def verify_signature(secret: str | Iterable[str], headers: Mapping[str, str], body: bytes, *,
                     tolerance: int = DEFAULT_TOLERANCE_SECONDS, now: float | None = None) -> str:
    """Check one delivery as a receiver: returns its event id (the signed body's `id`), or raises
    WebhookSignatureError. `secret` is the endpoint's secret, or several (old and new, while rolling
    over); `headers` any mapping (matched case-insensitively); `body` the raw request body bytes."""
    return str(verify_event(secret, headers, body, tolerance=tolerance, now=now)["id"])


def verify_event(secret: str | Iterable[str], headers: Mapping[str, str], body: bytes, *,
                 tolerance: int = DEFAULT_TOLERANCE_SECONDS, now: float | None = None) -> dict[str, object]:
    """Like `verify_signature`, but returns the parsed, signed event (`id`, `type`, `created_at`,
    `data`): parse the body only after it is verified, and only with this."""
    lower = {k.lower(): v for k, v in headers.items()}
    stamp, signatures = lower.get(TIMESTAMP_HEADER.lower()), lower.get(SIGNATURE_HEADER.lower())
    if not stamp or not signatures:
        raise WebhookSignatureError("header_missing", f"{TIMESTAMP_HEADER} and {SIGNATURE_HEADER} are required")
    try:
        timestamp = int(stamp.strip())
    except ValueError:
        raise WebhookSignatureError("timestamp_invalid", f"{TIMESTAMP_HEADER} is not whole seconds") from None
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        raise WebhookSignatureError("timestamp_outside_tolerance",
                                    f"{TIMESTAMP_HEADER} is {int(current - timestamp)} s from now (tolerance {tolerance} s)")
    secrets = [secret] if isinstance(secret, str) else list(secret)
    offered = [v.strip() for part in signatures.split(",") for k, _, v in [part.strip().partition("=")] if k == SCHEME]
    if not any(hmac.compare_digest(sign(s, timestamp, body), candidate) for s in secrets for candidate in offered):
        raise WebhookSignatureError("signature_mismatch", "no v1 signature matches the body, timestamp and secret")
    try:
        event = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise WebhookSignatureError("body_invalid", "the signed body is not JSON") from None
    if not isinstance(event, dict) or not isinstance(event.get("id"), str) or not isinstance(event.get("type"), str):
        raise WebhookSignatureError("body_invalid", "the signed body has no string `id` and `type`")
    for header, field, code in ((ID_HEADER, "id", "event_id_mismatch"), (TYPE_HEADER, "type", "event_type_mismatch")):
        claimed = lower.get(header.lower())
        if claimed is not None and claimed != event[field]:
            raise WebhookSignatureError(code, f"{header} is not the signed body's `{field}`: the header is not signed")
    return event
