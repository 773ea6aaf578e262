"""Is the events broker reachable? The `broker` check of `/health/ready` (custody.api.ops_routes),
asked from any process, the api included, which never publishes.

- `broker_url(container)`: the NATS URL this process's configuration names, or None when events go
  to no broker. A deployment file's `[events]` decides (`sink = "log"`: none; `nats_url`, else
  `NATS_URL`, else the embedded server the worker started under `STATE_DIR/nats`, found by its
  port file: `embedded:absent` when there is none yet). A container without a deployment file
  (the in-process app) has a broker only when `NATS_URL` is set.
- `probe_for(url)`: the process's one `BrokerProbe` for that URL. A probe connects, asks JetStream
  for the account's info (so a server without JetStream fails too) and disconnects, all within
  `timeout_s` (2 s); the answer, good or bad, is kept `cache_s` (5 s), so a readiness probe every
  second costs one connection every five. Concurrent callers wait for the one probe in flight.
- Errors: a failed probe raises `BrokerUnavailable("<url>: <why>")` (custody.broker); the
  readiness route reports it as `{"ok": false, "detail": ...}` under `broker` with status 503.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Callable

import nats

from custody.broker import BrokerUnavailable, configured_nats_url, running_embedded_url

log = logging.getLogger(__name__)
NO_EMBEDDED = "embedded:absent"


def broker_url(container: Any) -> str | None:
    """The NATS URL the container's configuration names (see the module docstring)."""
    events = getattr(getattr(container, "config", None), "events", None)
    settings = container.settings
    if events is None:
        return settings.nats_url
    if events.sink == "log":
        return None
    return configured_nats_url(events, settings) or running_embedded_url(settings.state_dir) or NO_EMBEDDED


class BrokerProbe:
    """One URL's cached reachability check (see the module docstring)."""

    def __init__(self, url: str, *, timeout_s: float = 2.0, cache_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.cache_s = cache_s
        self.clock = clock
        self._lock = threading.Lock()
        self._at: float | None = None
        self._answer: str = ""
        self._failure: str | None = None

    def __call__(self) -> str:
        """A short description when reachable; BrokerUnavailable otherwise (both cached)."""
        with self._lock:
            now = self.clock()
            if self._at is None or now - self._at >= self.cache_s:
                try:
                    self._answer, self._failure = self._probe(), None
                except Exception as exc:  # noqa: BLE001 - every way of not answering is the same answer
                    self._failure = f"{type(exc).__name__}{': ' + str(exc) if str(exc) else ''}"
                self._at = self.clock()
            if self._failure is not None:
                raise BrokerUnavailable(f"{self.url}: {self._failure}")
            return self._answer

    def _probe(self) -> str:
        if self.url == NO_EMBEDDED:
            raise ConnectionError("no NATS_URL or [events] nats_url, and no embedded server under STATE_DIR/nats "
                                  "(the worker starts it)")
        return asyncio.run(asyncio.wait_for(self._account_info(), self.timeout_s))

    async def _account_info(self) -> str:
        async def quiet(exc: Exception) -> None:  # nats-py logs every failed attempt with a traceback
            log.debug("nats %s: %s", self.url, exc)

        nc = await nats.connect(self.url, connect_timeout=self.timeout_s, allow_reconnect=False,
                                max_reconnect_attempts=0, error_cb=quiet, name="custody-readiness")
        try:
            info = await nc.jetstream(timeout=self.timeout_s).account_info()
            return f"jetstream: {info.streams} stream(s)"
        finally:
            await nc.close()


_probes: dict[str, BrokerProbe] = {}
_probes_lock = threading.Lock()


def probe_for(url: str) -> BrokerProbe:
    """This process's probe for `url` (made once, so its cache is shared by every request)."""
    with _probes_lock:
        return _probes.setdefault(url, BrokerProbe(url))
