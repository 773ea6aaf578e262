"""The webhooks job: fan outbox events out to deliveries, then POST the due ones, signed.

Run by the worker (custody.jobs, job `webhooks`, every second) as `Webhooks.run_once()`:

1. **Fan-out**: the outbox events not yet fanned out (`outbox.webhooks_fanned_out_at IS NULL`,
   oldest first, up to 500) get one `webhook_delivery` per enabled endpoint that wants their
   type and existed when the event was written, and are marked, in one transaction. The pair
   (endpoint, event) is unique, so running it again makes nothing twice. An endpoint disabled
   at that moment gets no delivery for the event.
2. **Delivery**: due pending deliveries of enabled endpoints (up to 500, at most 20 per endpoint)
   are POSTed, each endpoint's in id order, `WEBHOOK_CONCURRENCY` endpoints at once; an endpoint's
   first failure ends its turn (the rest wait for the next run, without an attempt counted), so a
   receiver that is down or hangs costs one attempt of `WEBHOOK_TIMEOUT_SECONDS` per run and never
   holds up the others. The body and headers are custody.webhooks.signing's; success is any 2xx
   answer. Redirects are not followed (a 3xx is a failure). Each failure counts an attempt and
   sets `next_attempt_at` by `backoff_seconds`; at `WEBHOOK_MAX_ATTEMPTS` the delivery is `dead`
   until an operator replays it.

Order: an endpoint's deliveries are attempted in event order, but one that failed waits for its
backoff while later ones go out, so receivers must not rely on order (each event names its
subject; compare the state it carries with what you have). Delivery is at least once: a receiver
that answered after the timeout, or a worker that stopped between the POST and recording it, gets
the event again; de-duplicate on the event id.

SSRF: the worker POSTs to whatever URL an admin registered, from inside the network (it can
reach the database, the nodes and the signer's host). Before each POST the URL's host is resolved
again and every address checked (custody.webhooks.egress: internal addresses are refused unless
`WEBHOOK_ALLOW_PRIVATE_HOSTS` lists them), and the POST goes to the checked address (DNS rebinding
cannot redirect it). Redirects are not followed and the answer's body is never read. A failed
attempt stores only its status and a coarse class in `last_error` (`timeout`, `connect_failed`,
`tls_failed`, `request_failed`, `address_refused`, `resolve_failed`, `http_status`), never the
exception's text, so the API does not become a port scanner; the detail is logged at info level by
the worker. Running the worker behind an egress proxy or firewall that allows only the receivers'
hosts remains good practice (httpx honours `HTTPS_PROXY` / `HTTP_PROXY` / `NO_PROXY`).

A secret that does not decrypt (the worker's webhook key differs from the api's) sends nothing
for that endpoint and counts no attempt: it is logged at error level on every run until fixed.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import httpx
from sqlalchemy import Engine, text

from custody.settings import Settings
from custody.webhooks import egress
from custody.webhooks.keys import SecretBox, SecretUnreadable
from custody.webhooks.signing import delivery_headers, event_body

log = logging.getLogger(__name__)

FAN_OUT_BATCH = 500
DUE_BATCH = 500
PER_ENDPOINT = 20


@dataclass(frozen=True)
class RunResult:
    fanned_out: int  # outbox events marked
    delivered: int
    failed: int  # attempts that failed and will be retried
    dead: int  # deliveries dead-lettered by this run


@dataclass(frozen=True)
class Attempt:
    delivery_id: int
    endpoint_id: int
    attempts_before: int
    url: str
    event_id: str
    event_type: str
    body: bytes
    secrets: tuple[str, ...]  # the current secret first, then the previous one during its grace


@dataclass(frozen=True)
class Outcome:
    attempt: Attempt
    status: int | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


def backoff_seconds(failures: int, *, base: float, cap: float, jitter: float) -> float:
    """The wait after the `failures`-th failure (1, 2, ...): base * 2^(failures-1), capped at
    `cap`, scaled by 0.5 + jitter/2 with `jitter` in [0, 1] (so 50% to 100% of it: receivers that
    failed together do not all come back at once)."""
    delay = min(cap, base * 2 ** min(failures - 1, 60))
    return delay * (0.5 + max(0.0, min(1.0, jitter)) / 2)


def fan_out(engine: Engine, *, limit: int = FAN_OUT_BATCH) -> int:
    with engine.begin() as c:
        ids = c.execute(text("SELECT id FROM outbox WHERE webhooks_fanned_out_at IS NULL ORDER BY id LIMIT :l "
                             "FOR UPDATE SKIP LOCKED"), {"l": limit}).scalars().all()
        if not ids:
            return 0
        c.execute(text("""
            INSERT INTO webhook_delivery (endpoint_id, outbox_id)
            SELECT e.id, o.id
              FROM outbox o
              JOIN webhook_endpoint e
                ON e.enabled
               AND e.deleted_at IS NULL
               AND e.created_at <= o.created_at
               AND (o.topic = ANY (e.event_types) OR '*' = ANY (e.event_types))
             WHERE o.id = ANY (:ids)
             ORDER BY o.id, e.id
            ON CONFLICT (endpoint_id, outbox_id) DO NOTHING"""), {"ids": list(ids)})
        c.execute(text("UPDATE outbox SET webhooks_fanned_out_at = now() WHERE id = ANY (:ids)"), {"ids": list(ids)})
    return len(ids)


_DUE_SQL = """
SELECT d.id, d.endpoint_id, d.attempts, o.event_key, o.topic, o.payload, o.created_at, e.url, e.secret_enc,
       CASE WHEN e.previous_secret_expires_at > now() THEN e.previous_secret_enc END AS previous_secret_enc
  FROM webhook_delivery d
  JOIN webhook_endpoint e ON e.id = d.endpoint_id
  JOIN outbox o ON o.id = d.outbox_id
 WHERE d.state = 'pending'
   AND d.next_attempt_at <= now()
   AND e.enabled
   AND e.deleted_at IS NULL
 ORDER BY d.id
 LIMIT :l
"""


def due_attempts(engine: Engine, box: SecretBox, *, limit: int = DUE_BATCH, per_endpoint: int = PER_ENDPOINT) -> list[list[Attempt]]:
    """Due deliveries grouped by endpoint (each group in id order, at most `per_endpoint`)."""
    with engine.connect() as c:
        rows = c.execute(text(_DUE_SQL), {"l": limit}).all()
    groups: OrderedDict[int, list[Attempt]] = OrderedDict()
    secrets: dict[int, tuple[str, ...] | None] = {}
    for r in rows:
        if r.endpoint_id not in secrets:
            try:
                current = box.open(r.endpoint_id, r.secret_enc)
                previous = box.open(r.endpoint_id, r.previous_secret_enc) if r.previous_secret_enc is not None else None
                secrets[r.endpoint_id] = (current,) if previous is None else (current, previous)
            except SecretUnreadable as exc:
                log.error("webhooks: %s; nothing is sent to it (is WEBHOOK_SECRET_KEY the same for api and worker?)", exc)
                secrets[r.endpoint_id] = None
        keys = secrets[r.endpoint_id]
        group = groups.setdefault(r.endpoint_id, [])
        if keys is None or len(group) >= per_endpoint:
            continue
        body = event_body(r.event_key, r.topic, r.created_at.isoformat(), r.payload)
        group.append(Attempt(r.id, r.endpoint_id, r.attempts, r.url, r.event_key, r.topic, body, keys))
    return [g for g in groups.values() if g]


def _error_class(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        cause = exc.__cause__ or exc.__context__
        return "tls_failed" if "ssl" in type(cause).__module__.lower() or "SSL" in str(exc) else "connect_failed"
    return "request_failed"


async def _post(client: httpx.AsyncClient, a: Attempt, timeout: float, allowed: tuple[egress.IPNetwork, ...]) -> Outcome:
    headers = delivery_headers(a.secrets, a.event_id, a.event_type, int(time.time()), a.body)

    async def send() -> int:
        target = await egress.pinned_target(a.url, allowed)  # resolved and checked now, then used as is
        extensions = {"sni_hostname": target.sni_hostname} if target.sni_hostname else {}
        async with client.stream("POST", target.url, content=a.body, headers={**headers, "Host": target.host_header},
                                 extensions=extensions) as response:
            return response.status_code  # the body is never read

    try:
        status = await asyncio.wait_for(send(), timeout)
    except asyncio.TimeoutError:
        log.info("webhook delivery %s to endpoint %s: no answer within %g s", a.delivery_id, a.endpoint_id, timeout)
        return Outcome(a, None, "timeout")
    except egress.EgressRefused as exc:
        log.warning("webhook delivery %s to endpoint %s refused: %s", a.delivery_id, a.endpoint_id, exc)
        return Outcome(a, None, exc.reason)
    except httpx.HTTPError as exc:
        log.info("webhook delivery %s to endpoint %s failed: %s: %s", a.delivery_id, a.endpoint_id,
                 type(exc).__name__, exc)
        return Outcome(a, None, _error_class(exc))
    if 200 <= status < 300:
        return Outcome(a, status, None)
    return Outcome(a, status, "http_status")


async def _send_all(groups: list[list[Attempt]], *, timeout: float, concurrency: int,
                    allowed: tuple[egress.IPNetwork, ...] = ()) -> list[Outcome]:
    limit = asyncio.Semaphore(concurrency)
    transport_timeout = httpx.Timeout(timeout + 1.0)  # the wait_for below is the deadline; this only backs it up
    async with httpx.AsyncClient(follow_redirects=False, timeout=transport_timeout) as client:
        async def endpoint(group: list[Attempt]) -> list[Outcome]:
            outcomes: list[Outcome] = []
            async with limit:
                for a in group:
                    outcomes.append(await _post(client, a, timeout, allowed))
                    if not outcomes[-1].ok:
                        break  # this endpoint's turn ends; the rest wait for the next run, unattempted
            return outcomes

        results = await asyncio.gather(*(endpoint(g) for g in groups))
    return [o for group in results for o in group]


def record(engine: Engine, outcomes: list[Outcome], settings: Settings, *, rng: random.Random | None = None) -> tuple[int, int, int]:
    """Write each outcome; a delivery replayed meanwhile (its attempts changed) is left as the replay set it."""
    rng = rng or random.Random()
    delivered = failed = dead = 0
    with engine.begin() as c:
        for o in outcomes:
            a = o.attempt
            if o.ok:
                n = c.execute(text("UPDATE webhook_delivery SET state = 'delivered', attempts = attempts + 1, "
                                   "last_status = :st, last_error = NULL, delivered_at = now(), updated_at = now() "
                                   "WHERE id = :i AND state = 'pending' AND attempts = :seen"),
                              {"i": a.delivery_id, "st": o.status, "seen": a.attempts_before}).rowcount
                delivered += n
                continue
            failures = a.attempts_before + 1
            is_dead = failures >= settings.webhook_max_attempts
            wait = backoff_seconds(failures, base=settings.webhook_backoff_seconds,
                                   cap=settings.webhook_backoff_max_seconds, jitter=rng.random())
            n = c.execute(text("UPDATE webhook_delivery SET attempts = attempts + 1, last_status = :st, last_error = :er, "
                               "state = CASE WHEN :dead THEN 'dead' ELSE 'pending' END, "
                               "next_attempt_at = now() + make_interval(secs => :w), updated_at = now() "
                               "WHERE id = :i AND state = 'pending' AND attempts = :seen"),
                          {"i": a.delivery_id, "st": o.status, "er": o.error, "dead": is_dead, "w": wait,
                           "seen": a.attempts_before}).rowcount
            if n and is_dead:
                dead += 1
                log.warning("webhook delivery %s (event %s to endpoint %s) is dead after %d attempts: %s",
                            a.delivery_id, a.event_id, a.endpoint_id, failures, o.error)
            elif n:
                failed += 1
    return delivered, failed, dead


def run_once(engine: Engine, box: Callable[[], SecretBox], settings: Settings) -> RunResult:
    """One run of the job. `box` is called only when a delivery is due, so a worker with no
    endpoints never needs the webhook key."""
    fanned = fan_out(engine)
    with engine.connect() as c:
        anything_due = c.execute(text("SELECT EXISTS (SELECT 1 FROM webhook_delivery WHERE state = 'pending' "
                                      "AND next_attempt_at <= now())")).scalar_one()
    if not anything_due:
        return RunResult(fanned, 0, 0, 0)
    groups = due_attempts(engine, box())
    if not groups:
        return RunResult(fanned, 0, 0, 0)
    outcomes = asyncio.run(_send_all(groups, timeout=settings.webhook_timeout_seconds,
                                     concurrency=settings.webhook_concurrency,
                                     allowed=egress.parse_allowed(settings.webhook_allow_private_hosts)))
    delivered, failed, dead = record(engine, outcomes, settings)
    return RunResult(fanned, delivered, failed, dead)
