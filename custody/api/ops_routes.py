"""Health and metrics: what a load balancer, an orchestrator and Prometheus ask the api process.

The health routes need no API key (a load balancer and an orchestrator ask them); what they answer
names dependencies and says ok or failed with the error's class only (never its message: it can name
hosts, ports and file paths). `/metrics` shows the firm's holdings per location, reconciliation
differences and incidents, so it needs an auditor's or an operator's key (`X-API-Key`; Prometheus
sends it with `http_headers` in its scrape config). Keep the api's port off the internet anyway:

- `GET /health/live`: 200 `{"status": "ok"}` while the process serves HTTP at all; nothing else is
  checked (a liveness probe that restarts the process must not fail because a node is down).
- `GET /health/ready`: 200 when every dependency answers, else 503 naming the failed ones;
  `{"status": "ready"|"not_ready", "checks": {name: {"ok": bool, "detail": str}}}`. Checks:
  `database` (`SELECT 1`), one per chain node (`bitcoin`, `ethereum`: the node's `tip()` through
  its network gate, so a node on the wrong chain fails too), `signer` (`ping()`, when the process
  has a signer client) and `broker` (when the configuration names a NATS server, as the worker
  resolves it: custody.broker_probe; reached from this process, cached 5 s, 2 s timeout).
  A check that raises is failed with the exception's class (the message goes to the log only; never a 500).
  The checks run at once, each in a thread of its own, and the answer waits for none longer than
  `READINESS_TIMEOUT_SECONDS` (default 3): a node that accepts connections and never answers
  (wedged, overloaded, SIGSTOPped) fails its check with `TimeoutError: no answer within 3 s`
  instead of holding the probe for the adapter's RPC timeout (60 s). The abandoned call finishes
  in its thread (the adapter's own timeout ends it); until it has, the same check is not started
  again but failed at once (`still waiting for the probe started N s ago`), so a hung node never
  piles up threads however often the orchestrator probes.
- `GET /health`: the same as `/health/live` (kept for existing probes and the launcher, which only
  ask whether the process serves; `/health/ready` is the one that checks dependencies).
- `GET /metrics` (auditor or operator key): Prometheus text format (custody.metrics: the api's
  request latencies, and the worker's numbers read from the database on each scrape; node tips are
  asked at most once per 5 s whatever the scrape rate).
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, wait
from typing import Any, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from sqlalchemy import text

from custody.api.deps import Auditor, ContainerDep
from custody.broker_probe import broker_url, probe_for

log = logging.getLogger(__name__)
router = APIRouter(tags=["ops"])


class Live(BaseModel):
    status: str


class Check(BaseModel):
    ok: bool
    detail: str


class Ready(BaseModel):
    status: str  # ready | not_ready
    checks: dict[str, Check]


def readiness_checks(container: Any) -> dict[str, Callable[[], object]]:
    """The checks `/health/ready` runs for this container, by name."""
    def database() -> object:
        with container.engine.connect() as conn:
            return conn.execute(text("SELECT 1")).scalar_one()

    checks: dict[str, Callable[[], object]] = {"database": database}
    for chain, adapter in sorted(getattr(container, "adapters", {}).items()):
        checks[chain] = lambda a=adapter: f"tip {a.tip().height}"
    signer = getattr(container, "signer", None)
    if signer is not None and hasattr(signer, "ping"):
        checks["signer"] = lambda: "pong" if signer.ping() is not None else "no answer"
    url = broker_url(container)  # custody.broker_probe: connect + JetStream account info, cached a few seconds
    if url is not None:
        checks["broker"] = probe_for(url)
    return checks


class Probes:
    """Runs readiness checks concurrently, each bounded by `timeout` seconds, at most one call of a
    check in flight (module docstring). One per app (`app.state.readiness`)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._lock = threading.Lock()
        self._inflight: dict[str, tuple[Future, float]] = {}

    def _start(self, name: str, check: Callable[[], object]) -> Future | float:
        """The call's future, or the start time of the call of this check still in flight."""
        with self._lock:
            running = self._inflight.get(name)
            if running is not None and not running[0].done():
                return running[1]
            future: Future = Future()
            self._inflight[name] = (future, time.monotonic())

        def call() -> None:
            try:
                future.set_result(check())
            except Exception as exc:  # noqa: BLE001 - handed to the waiting request
                future.set_exception(exc)

        threading.Thread(target=call, name=f"readiness-{name}", daemon=True).start()
        return future

    def run(self, checks: dict[str, Callable[[], object]]) -> dict[str, Check]:
        started = {name: self._start(name, check) for name, check in checks.items()}
        deadline = time.monotonic() + self.timeout
        out = {}
        for name, future in started.items():
            if not isinstance(future, Future):
                out[name] = _failed(name, f"TimeoutError: still waiting for the probe started "
                                          f"{time.monotonic() - future:.0f} s ago")
                continue
            wait([future], timeout=max(0.0, deadline - time.monotonic()))
            if not future.done():
                out[name] = _failed(name, f"TimeoutError: no answer within {self.timeout:g} s")
            elif (exc := future.exception()) is not None:  # a failed dependency is the answer, not an error
                log.warning("readiness: %s failed: %s: %s", name, type(exc).__name__, exc)
                out[name] = _failed(name, type(exc).__name__)
            else:
                result = future.result()
                out[name] = Check(ok=True, detail=str(result) if result is not None else "ok")
        return out


def _failed(name: str, detail: str) -> Check:
    log.warning("readiness: %s failed: %s", name, detail)
    return Check(ok=False, detail=detail[:300])


def run_checks(checks: dict[str, Callable[[], object]], timeout: float = 3.0) -> dict[str, Check]:
    """Run `checks` once, each bounded by `timeout` seconds (a `Probes` of its own)."""
    return Probes(timeout).run(checks)


@router.get("/health/live", response_model=Live)
def live() -> Live:
    return Live(status="ok")


@router.get("/health", response_model=Live)
def health() -> Live:
    """Liveness, as `/health/live` (dependencies: `/health/ready`)."""
    return Live(status="ok")


@router.get("/health/ready", response_model=Ready, responses={503: {"model": Ready, "description": "a dependency failed (`not_ready`)"}})
def ready(container: ContainerDep, request: Request) -> JSONResponse:
    probes = getattr(request.app.state, "readiness", None)
    if probes is None:
        probes = request.app.state.readiness = Probes(getattr(getattr(container, "settings", None), "readiness_timeout_seconds", 3.0))
    checks = probes.run(readiness_checks(container))
    ok = all(c.ok for c in checks.values())
    body = Ready(status="ready" if ok else "not_ready", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)


@router.get("/metrics", response_class=PlainTextResponse,
            responses={200: {"description": "Prometheus text exposition format (version 0.0.4 or 1.0.0, as "
                                            "prometheus-client writes it)",
                             "content": {"text/plain": {"schema": {"type": "string"},
                                                        "example": "# TYPE custody_kill_switch_engaged gauge\n"
                                                                   "custody_kill_switch_engaged 0.0\n"}}}})
def metrics(request: Request, _: Auditor) -> Response:
    return Response(generate_latest(request.app.state.metrics_registry), media_type=CONTENT_TYPE_LATEST)
