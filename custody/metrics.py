"""Prometheus metrics of the service, served by the api process at `GET /metrics` (prometheus-client;
an auditor's or operator's API key: the figures include the firm's holdings).

The worker has no HTTP server, so its numbers reach Prometheus through the database: each job run
is counted in `job_stat` by the worker (custody.jobs), and everything else the worker moves
(cursors, deposits, withdrawals, balances, reconciliation lines, the kill switch) is a row already.
`StateCollector` reads them on every scrape, so one scrape of the api shows the whole service, the
counters survive a worker restart, and two workers add up. A scrape costs a handful of queries
(some are GROUP BY counts over whole tables: scrape every 15-60 s, not faster) and at most one
`tip()` per chain node per 5 s (`StateCollector.TIP_TTL`); a query or node that fails is reported in
`custody_scrape_errors{source}` instead of failing the scrape.

| metric | type | labels | what |
| --- | --- | --- | --- |
| `custody_http_request_duration_seconds` | histogram | method, route, status | API latency (a method outside the usual seven is `other`); `route` is the route's template (`/v1/withdrawals/{withdrawal_id}`), `<unmatched>` for no route: bounded cardinality |
| `custody_chain_scan_height` | gauge | chain | the deposit scanner's cursor (`chain_cursor.height`) |
| `custody_chain_node_height` | gauge | chain | the node's tip at the scrape |
| `custody_chain_scan_lag_blocks` | gauge | chain | node tip - cursor |
| `custody_chain_node_up` | gauge | chain | 1 when the node answered `tip()` at the scrape, else 0 |
| `custody_deposits` | gauge | chain, asset, state | deposit observations in each state (`seen` ... `credited`, `orphaned`, `quarantined`, ...) |
| `custody_withdrawals` | gauge | asset, state | withdrawal requests in each state |
| `custody_location_balance_minor` | gauge | chain, tier, asset | what the books say the firm holds at each asset location (hot, deposit, cold...): minus the location account's posted balance, in minor units |
| `custody_reconciliation_difference_minor` | gauge | chain, tier, asset | on chain - books - in transit at the line's last pass (`reconciliation_line`); 0 is the only good value |
| `custody_node_view_missed_passes` | gauge | chain | consecutive worker reconciliation passes that could not read the node's own view (`node_view_health`; their lines answer `node` = null) |
| `custody_node_view_blind_seconds` | gauge | chain | how long that run has lasted; 0 once a pass reads the view (a warning incident at `NODE_VIEW_WARN_AFTER_SECONDS`, critical at `NODE_VIEW_CRITICAL_AFTER_SECONDS`) |
| `custody_kill_switch_engaged` | gauge | - | 1 while withdrawals are halted |
| `custody_incidents_open` | gauge | severity | open incidents |
| `custody_job_runs_total` | counter | job | runs that took the job's lock |
| `custody_job_failures_total` | counter | job | runs that raised, or one of whose steps raised |
| `custody_job_skipped_total` | counter | job | ticks another worker held the job |
| `custody_job_duration_seconds` | summary | job | `_count` runs and `_sum` seconds of them |
| `custody_job_last_run_timestamp_seconds` | gauge | job | when the job last finished a run (Unix time) |
| `custody_scrape_errors` | gauge | source | 1 for each source that failed at this scrape |

Amounts are exact integers in the database; Prometheus carries float64, so a balance above 2^53
minor units (0.009 ETH in wei) is rounded in the metric. Metrics are for watching, never for
accounting: the books and `GET /v1/totals` are.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Iterable

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import text
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)
access_log = logging.getLogger("custody.api.access")

HTTP_LATENCY = Histogram("custody_http_request_duration_seconds", "HTTP request latency by route template",
                         ("method", "route", "status"), registry=None,
                         buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))

_DEPOSITS_SQL = "SELECT chain, asset, state, count(*) AS n FROM deposit_observation GROUP BY chain, asset, state"
_WITHDRAWALS_SQL = "SELECT asset, state, count(*) AS n FROM withdrawal_request GROUP BY asset, state"
_CURSORS_SQL = "SELECT chain, height FROM chain_cursor"
_LOCATIONS_SQL = """
SELECT a.name, a.asset, coalesce(sum(b.posted), 0) AS posted
  FROM account a
  LEFT JOIN account_balance b ON b.account_id = a.id
 WHERE a.kind = 'asset_location'
 GROUP BY a.id, a.name, a.asset
"""
_RECONCILIATION_SQL = "SELECT chain, tier, asset, difference FROM reconciliation_line"
_NODE_VIEW_SQL = ("SELECT chain, missed_passes, extract(epoch FROM now() - blind_since) AS blind_seconds "
                  "FROM node_view_health")
_INCIDENTS_SQL = "SELECT severity, count(*) AS n FROM incident WHERE resolved_at IS NULL GROUP BY severity"
_JOBS_SQL = "SELECT name, runs, failures, skipped, seconds_total, last_run_at FROM job_stat"


class StateCollector(Collector):
    """The service's state, read from the database (and the chain nodes' tips) on each scrape."""

    TIP_TTL = 5.0  # seconds a node's tip is reused: scrapes (however frequent) ask each node at most this often

    def __init__(self, container: Any) -> None:
        self.container = container
        self._tips: dict[str, tuple[float, int | None]] = {}  # chain -> (monotonic time asked, height or None)

    def _tip(self, chain: str, adapter: Any) -> int | None:
        """The node's tip height (None: it did not answer), asked at most once per TIP_TTL."""
        asked = self._tips.get(chain)
        if asked is not None and time.monotonic() - asked[0] < self.TIP_TTL:
            return asked[1]
        try:
            height: int | None = int(adapter.tip().height)
        except Exception as exc:  # noqa: BLE001 - unreachable or refused: the node is down for us
            log.warning("metrics: %s node did not answer tip() (%s)", chain, exc)
            height = None
        self._tips[chain] = (time.monotonic(), height)
        return height

    def collect(self) -> Iterable[Metric]:
        errors: list[str] = []
        engine = self.container.engine

        def query(source: str, sql: str) -> list:
            try:
                with engine.connect() as conn:
                    return list(conn.execute(text(sql)))
            except Exception as exc:  # noqa: BLE001 - a failed source is reported, the scrape goes on
                log.warning("metrics: %s not read (%s)", source, exc)
                errors.append(source)
                return []

        scan = GaugeMetricFamily("custody_chain_scan_height", "deposit scanner cursor height", labels=["chain"])
        node = GaugeMetricFamily("custody_chain_node_height", "chain node tip height", labels=["chain"])
        lag = GaugeMetricFamily("custody_chain_scan_lag_blocks", "node tip minus scanner cursor", labels=["chain"])
        up = GaugeMetricFamily("custody_chain_node_up", "1 when the node answered at this scrape", labels=["chain"])
        cursors = {r.chain: int(r.height) for r in query("chain_cursor", _CURSORS_SQL)}
        for chain, height in sorted(cursors.items()):
            scan.add_metric([chain], height)
        for chain, adapter in sorted(getattr(self.container, "adapters", {}).items()):
            tip = self._tip(chain, adapter)
            if tip is None:
                up.add_metric([chain], 0)
                continue
            up.add_metric([chain], 1)
            node.add_metric([chain], tip)
            if chain in cursors:
                lag.add_metric([chain], max(tip - cursors[chain], 0))
        yield from (scan, node, lag, up)

        deposits = GaugeMetricFamily("custody_deposits", "deposit observations per state",
                                     labels=["chain", "asset", "state"])
        for r in query("deposit_observation", _DEPOSITS_SQL):
            deposits.add_metric([r.chain, r.asset, r.state], r.n)
        yield deposits
        withdrawals = GaugeMetricFamily("custody_withdrawals", "withdrawal requests per state", labels=["asset", "state"])
        for r in query("withdrawal_request", _WITHDRAWALS_SQL):
            withdrawals.add_metric([r.asset, r.state], r.n)
        yield withdrawals

        balances = GaugeMetricFamily("custody_location_balance_minor",
                                     "what the books say the firm holds at an asset location (minor units)",
                                     labels=["chain", "tier", "asset"])
        for r in query("asset_location", _LOCATIONS_SQL):
            parts = r.name.split(":")  # location:<chain>:<tier>:<asset>
            if len(parts) == 4:
                balances.add_metric([parts[1], parts[2], r.asset], float(-int(r.posted)))
        yield balances

        difference = GaugeMetricFamily("custody_reconciliation_difference_minor",
                                       "on chain - books - in transit at the line's last pass (minor units)",
                                       labels=["chain", "tier", "asset"])
        for r in query("reconciliation_line", _RECONCILIATION_SQL):
            difference.add_metric([r.chain, r.tier, r.asset], float(int(r.difference)))
        yield difference

        missed = GaugeMetricFamily("custody_node_view_missed_passes",
                                   "consecutive reconciliation passes without the node's own view (node = null)",
                                   labels=["chain"])
        blind = GaugeMetricFamily("custody_node_view_blind_seconds",
                                  "seconds since the first of those passes (0 when the last pass read the node's view)",
                                  labels=["chain"])
        for r in query("node_view_health", _NODE_VIEW_SQL):
            missed.add_metric([r.chain], float(r.missed_passes))
            blind.add_metric([r.chain], float(r.blind_seconds or 0))
        yield missed
        yield blind

        kill = GaugeMetricFamily("custody_kill_switch_engaged", "1 while withdrawals are halted")
        try:
            from custody.controls import kill_switch

            kill.add_metric([], 1 if kill_switch(engine).engaged else 0)
        except Exception as exc:  # noqa: BLE001
            log.warning("metrics: kill switch not read (%s)", exc)
            errors.append("kill_switch")
        yield kill
        incidents = GaugeMetricFamily("custody_incidents_open", "open incidents", labels=["severity"])
        open_by = {r.severity: r.n for r in query("incident", _INCIDENTS_SQL)}
        for severity in ("warning", "critical"):
            incidents.add_metric([severity], open_by.get(severity, 0))
        yield incidents

        runs = CounterMetricFamily("custody_job_runs_total", "job runs", labels=["job"])
        failures = CounterMetricFamily("custody_job_failures_total", "job runs that failed", labels=["job"])
        skipped = CounterMetricFamily("custody_job_skipped_total", "ticks another worker held the job", labels=["job"])
        duration = SummaryMetricFamily("custody_job_duration_seconds", "job run durations", labels=["job"])
        last = GaugeMetricFamily("custody_job_last_run_timestamp_seconds", "when the job last ran", labels=["job"])
        for r in query("job_stat", _JOBS_SQL):
            runs.add_metric([r.name], r.runs)
            failures.add_metric([r.name], r.failures)
            skipped.add_metric([r.name], r.skipped)
            duration.add_metric([r.name], count_value=r.runs, sum_value=r.seconds_total)
            if r.last_run_at is not None:
                last.add_metric([r.name], r.last_run_at.timestamp())
        yield from (runs, failures, skipped, duration, last)

        scrape = GaugeMetricFamily("custody_scrape_errors", "1 for a source that failed at this scrape", labels=["source"])
        for source in errors:
            scrape.add_metric([source], 1)
        yield scrape


def build_registry(container: Any) -> CollectorRegistry:
    """The api's registry: HTTP latency, the state collector and the process's own numbers."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HTTP_LATENCY)
    registry.register(StateCollector(container))
    ProcessCollector(registry=registry)
    return registry


def route_template(scope: Scope) -> str:
    """The template of the route that served `scope` (`/v1/holds/{hold_id}`), a mount's prefix for
    its files, or `<unmatched>`: never the raw path, so the label's values are bounded by the app's
    routes."""
    route = scope.get("route")
    if route is None:  # routes FastAPI adds itself (/openapi.json) and mounts do not record it
        for candidate in getattr(scope.get("router"), "routes", ()):
            if candidate.matches(scope)[0] is Match.FULL:
                route = candidate
                break
    return getattr(route, "path", None) or "<unmatched>"


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})  # any other: "other"


class HttpMetricsMiddleware:
    """Times every HTTP request and records it under its route's template (pure ASGI); writes one
    access line per request (`custody.api.access`: method, route template, status, milliseconds;
    the template, not the path, so no customer id or address is logged)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 500}

        async def send_recording(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_recording)
        finally:
            template = route_template(scope)
            method = scope.get("method", "")
            seconds = time.perf_counter() - started
            HTTP_LATENCY.labels(method if method in _METHODS else "other", template, str(status["code"])).observe(seconds)
            access_log.info("%s %s %d %.1f ms", method[:16], template, status["code"], seconds * 1000)
