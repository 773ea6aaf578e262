"""Webhook endpoints and their deliveries, as an admin manages them (the admin API's service).

Guarantees:
- A secret leaves the service exactly twice: in the answer to create and to rotate. It is
  stored only encrypted (custody.webhooks.keys).
- A URL is http:// or https:// with a host, at most 2,048 characters, with no user, password or
  fragment, whose host is not an internal address (loopback, private, link-local, ...: a literal
  one, or a name resolving to one; `WEBHOOK_ALLOW_PRIVATE_HOSTS` lists exceptions;
  custody.webhooks.egress) (`webhook_url_invalid`); event types are 1-100 dotted lowercase names or `*`
  (`webhook_event_types_invalid`). A URL never changes: register a new endpoint instead.
- Rotating keeps the previous secret signing beside the new one until `grace_seconds` have
  passed (both `v1` values in the header); rotating again within the grace drops the older one.
- Deleting sets `deleted_at` and disables the endpoint: it gets no new deliveries and its
  pending ones are not sent; its history stays.
- Replay makes a delivery `pending` again, due now, with its attempt count reset (it gets
  WEBHOOK_MAX_ATTEMPTS more), whatever its state; the event id is the same, so receivers that
  de-duplicate see it once. Every change is an audit event.

Errors, in the order they are checked: `webhook_url_invalid`, `webhook_event_types_invalid`
(422), `webhook_endpoint_not_found`, `webhook_delivery_not_found` (404), `webhook_key_unavailable`
(503).
"""
from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from sqlalchemy import Connection, Engine, text

from custody.controls import audit
from custody.errors import CustodyError, CustodyErrorCode
from custody.events import EVENT_TYPES
from custody.settings import Settings
from custody.webhooks import delivery, egress
from custody.webhooks.keys import SecretBox, load_key, new_secret

MAX_URL = 2048
MAX_TYPES = 100
EVERY_TYPE = "*"
_EVENT_TYPE = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*")
DELIVERY_STATES = ("pending", "delivered", "dead")


def check_url(url: str, allowed: tuple[egress.IPNetwork, ...] = ()) -> str:
    """The URL as given, or CustodyError(webhook_url_invalid) saying why. `allowed`: the internal
    networks it may name anyway (Settings.webhook_allow_private_hosts, parsed)."""
    def bad(why: str) -> CustodyError:
        return CustodyError(CustodyErrorCode.webhook_url_invalid, why)

    if not url or len(url) > MAX_URL or any(ch.isspace() or ord(ch) < 0x20 for ch in url):
        raise bad(f"a webhook URL is 1 to {MAX_URL} characters without spaces or control characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port outside 0..65535 or not a number
    except ValueError as exc:
        raise bad(f"not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise bad("a webhook URL must be http:// or https://")
    if not parts.hostname:
        raise bad("a webhook URL needs a host")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise bad("a webhook URL must not carry a user or password: the delivery's signature authenticates it")
    if parts.fragment or url.endswith("#"):
        raise bad("a webhook URL must not have a fragment (#...)")
    try:
        egress.check_host(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), allowed)
    except egress.EgressRefused as exc:
        raise bad(str(exc)) from None
    return url


def check_event_types(types: list[str]) -> list[str]:
    """Sorted, without duplicates, or CustodyError(webhook_event_types_invalid)."""
    if not 1 <= len(types) <= MAX_TYPES:
        raise CustodyError(CustodyErrorCode.webhook_event_types_invalid, f"give 1 to {MAX_TYPES} event types")
    for t in types:
        if t != EVERY_TYPE and (len(t) > 100 or not _EVENT_TYPE.fullmatch(t) or t not in EVENT_TYPES):
            raise CustodyError(CustodyErrorCode.webhook_event_types_invalid,
                               f"{t[:100]!r} is not an event type of the catalogue (custody.events, e.g. "
                               f"deposit.credited) nor {EVERY_TYPE!r}")
    return sorted(set(types))


@dataclass(frozen=True)
class EndpointView:
    id: int
    url: str
    description: str
    event_types: list[str]
    enabled: bool
    created_by: str
    created_at: dt.datetime
    updated_at: dt.datetime
    previous_secret_expires_at: dt.datetime | None  # the old secret signs too until then


@dataclass(frozen=True)
class EndpointWithSecret:
    endpoint: EndpointView
    secret: str  # shown once


@dataclass(frozen=True)
class DeliveryView:
    id: int
    endpoint_id: int
    event_id: str
    event_type: str
    state: str
    attempts: int
    next_attempt_at: dt.datetime
    last_status: int | None
    last_error: str | None
    created_at: dt.datetime
    delivered_at: dt.datetime | None


_ENDPOINT_SQL = """
SELECT id, url, description, event_types, enabled, created_by, created_at, updated_at,
       CASE WHEN previous_secret_expires_at > now() THEN previous_secret_expires_at END AS previous_secret_expires_at
  FROM webhook_endpoint
 WHERE deleted_at IS NULL
"""

_DELIVERY_SQL = """
SELECT d.id, d.endpoint_id, o.event_key, o.topic, d.state, d.attempts, d.next_attempt_at, d.last_status,
       d.last_error, d.created_at, d.delivered_at
  FROM webhook_delivery d
  JOIN outbox o ON o.id = d.outbox_id
"""


def _endpoint(row) -> EndpointView:  # noqa: ANN001 - a Row of _ENDPOINT_SQL
    return EndpointView(row.id, row.url, row.description, list(row.event_types), row.enabled, row.created_by,
                        row.created_at, row.updated_at, row.previous_secret_expires_at)


def _delivery(row) -> DeliveryView:  # noqa: ANN001 - a Row of _DELIVERY_SQL
    return DeliveryView(row.id, row.endpoint_id, row.event_key, row.topic, row.state, row.attempts,
                        row.next_attempt_at, row.last_status, row.last_error, row.created_at, row.delivered_at)


class Webhooks:
    """The admin side (create, list, update, delete, rotate, replay) and the worker's job
    (`run_once`: custody.webhooks.delivery)."""

    def __init__(self, engine: Engine, settings: Settings, *, box: SecretBox | None = None) -> None:
        self.engine = engine
        self.settings = settings
        self._box = box

    def box(self) -> SecretBox:
        if self._box is None:
            key = self.settings.webhook_secret_key
            self._box = SecretBox(load_key(key.get_secret_value() if key else None, self.settings.state_dir))
        return self._box

    # ---- endpoints -----------------------------------------------------------------------------

    def create(self, url: str, event_types: list[str], description: str, *, by: str) -> EndpointWithSecret:
        url = check_url(url, egress.parse_allowed(self.settings.webhook_allow_private_hosts))
        types = check_event_types(event_types)
        box, secret = self.box(), new_secret()
        with self.engine.begin() as c:
            endpoint_id = c.execute(text("SELECT nextval(pg_get_serial_sequence('webhook_endpoint', 'id'))")).scalar_one()
            c.execute(text("INSERT INTO webhook_endpoint (id, url, description, event_types, secret_enc, created_by) "
                           "VALUES (:i, :u, :d, :t, :s, :b)"),
                      {"i": endpoint_id, "u": url, "d": description, "t": types, "s": box.seal(endpoint_id, secret), "b": by})
            audit(c, by, "webhook_endpoint.create", f"webhook_endpoint:{endpoint_id}", {"url": url, "event_types": types})
            view = self._get(c, endpoint_id)
        return EndpointWithSecret(view, secret)

    def list(self, *, after_id: int | None = None, limit: int | None = None) -> list[EndpointView]:
        """Endpoints by id, oldest first: those after `after_id`, at most `limit` (None: all)."""
        with self.engine.connect() as c:
            return [_endpoint(r) for r in c.execute(text(_ENDPOINT_SQL + " AND (CAST(:a AS bigint) IS NULL OR id > :a) "
                                                         "ORDER BY id LIMIT :l"), {"a": after_id, "l": limit})]

    def get(self, endpoint_id: int) -> EndpointView:
        with self.engine.connect() as c:
            return self._get(c, endpoint_id)

    def update(self, endpoint_id: int, *, by: str, event_types: list[str] | None = None, enabled: bool | None = None,
               description: str | None = None) -> EndpointView:
        types = check_event_types(event_types) if event_types is not None else None
        with self.engine.begin() as c:
            self._lock(c, endpoint_id)
            c.execute(text("UPDATE webhook_endpoint SET event_types = coalesce(:t, event_types), "
                           "enabled = coalesce(:e, enabled), description = coalesce(:d, description), updated_at = now() "
                           "WHERE id = :i"), {"i": endpoint_id, "t": types, "e": enabled, "d": description})
            audit(c, by, "webhook_endpoint.update", f"webhook_endpoint:{endpoint_id}",
                  {"event_types": types, "enabled": enabled, "description": description})
            return self._get(c, endpoint_id)

    def delete(self, endpoint_id: int, *, by: str) -> EndpointView:
        with self.engine.begin() as c:
            view = self._lock(c, endpoint_id)
            updated_at = c.execute(text("UPDATE webhook_endpoint SET enabled = false, deleted_at = now(), updated_at = now() "
                                        "WHERE id = :i RETURNING updated_at"), {"i": endpoint_id}).scalar_one()
            audit(c, by, "webhook_endpoint.delete", f"webhook_endpoint:{endpoint_id}", {"url": view.url})
        return EndpointView(**{**view.__dict__, "enabled": False, "updated_at": updated_at})

    def rotate_secret(self, endpoint_id: int, *, by: str, grace_seconds: int | None = None) -> EndpointWithSecret:
        grace = self.settings.webhook_rotation_grace_seconds if grace_seconds is None else grace_seconds
        with self.engine.begin() as c:
            self._lock(c, endpoint_id)  # a missing endpoint is webhook_endpoint_not_found before the key is needed
            box, secret = self.box(), new_secret()
            current = c.execute(text("SELECT secret_enc FROM webhook_endpoint WHERE id = :i"), {"i": endpoint_id}).scalar_one()
            c.execute(text("UPDATE webhook_endpoint SET secret_enc = :s, updated_at = now(), "
                           "previous_secret_enc = CASE WHEN :g > 0 THEN CAST(:p AS bytea) END, "
                           "previous_secret_expires_at = CASE WHEN :g > 0 THEN now() + make_interval(secs => :g) END "
                           "WHERE id = :i"),
                      {"i": endpoint_id, "s": box.seal(endpoint_id, secret), "p": bytes(current), "g": grace})
            audit(c, by, "webhook_endpoint.rotate_secret", f"webhook_endpoint:{endpoint_id}", {"grace_seconds": grace})
            view = self._get(c, endpoint_id)
        return EndpointWithSecret(view, secret)

    # ---- deliveries ----------------------------------------------------------------------------

    def deliveries(self, endpoint_id: int, *, state: str | None = None, after: int = 0, limit: int = 100) -> list[DeliveryView]:
        with self.engine.connect() as c:
            self._get(c, endpoint_id)
            rows = c.execute(text(_DELIVERY_SQL + " WHERE d.endpoint_id = :e AND (CAST(:s AS text) IS NULL OR d.state = :s) "
                                  "AND d.id > :a ORDER BY d.id LIMIT :l"),
                             {"e": endpoint_id, "s": state, "a": after, "l": limit})
            return [_delivery(r) for r in rows]

    def get_delivery(self, delivery_id: int) -> DeliveryView:
        with self.engine.connect() as c:
            row = c.execute(text(_DELIVERY_SQL + " WHERE d.id = :i"), {"i": delivery_id}).first()
        if row is None:
            raise CustodyError(CustodyErrorCode.webhook_delivery_not_found, f"no webhook delivery {delivery_id}")
        return _delivery(row)

    def replay(self, delivery_id: int, *, by: str) -> DeliveryView:
        """Send one delivery again (dead, delivered or pending): pending, due now, attempts reset."""
        with self.engine.begin() as c:
            row = c.execute(text("UPDATE webhook_delivery SET state = 'pending', attempts = 0, next_attempt_at = now(), "
                                 "updated_at = now() WHERE id = :i RETURNING state"), {"i": delivery_id}).first()
            if row is None:
                raise CustodyError(CustodyErrorCode.webhook_delivery_not_found, f"no webhook delivery {delivery_id}")
            audit(c, by, "webhook_delivery.replay", f"webhook_delivery:{delivery_id}", {})
        return self.get_delivery(delivery_id)

    def replay_dead(self, endpoint_id: int, *, by: str) -> int:
        """Send every dead-lettered delivery of the endpoint again; returns how many."""
        with self.engine.begin() as c:
            self._lock(c, endpoint_id)
            ids = c.execute(text("UPDATE webhook_delivery SET state = 'pending', attempts = 0, next_attempt_at = now(), "
                                 "updated_at = now() WHERE endpoint_id = :e AND state = 'dead' RETURNING id"),
                            {"e": endpoint_id}).scalars().all()
            audit(c, by, "webhook_endpoint.replay_dead", f"webhook_endpoint:{endpoint_id}", {"deliveries": len(ids)})
        return len(ids)

    # ---- the worker's job ----------------------------------------------------------------------

    def run_once(self) -> delivery.RunResult:
        """Fan new outbox events out to deliveries, then send what is due (custody.webhooks.delivery)."""
        return delivery.run_once(self.engine, self.box, self.settings)

    # ---- helpers -------------------------------------------------------------------------------

    @staticmethod
    def _get(c: Connection, endpoint_id: int) -> EndpointView:
        row = c.execute(text(_ENDPOINT_SQL + " AND id = :i"), {"i": endpoint_id}).first()
        if row is None:
            raise CustodyError(CustodyErrorCode.webhook_endpoint_not_found, f"no webhook endpoint {endpoint_id}")
        return _endpoint(row)

    @classmethod
    def _lock(cls, c: Connection, endpoint_id: int) -> EndpointView:
        c.execute(text("SELECT id FROM webhook_endpoint WHERE id = :i FOR UPDATE"), {"i": endpoint_id})
        return cls._get(c, endpoint_id)
