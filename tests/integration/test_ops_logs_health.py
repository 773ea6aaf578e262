"""ops_logs_health: JSON log lines carry the request id or the job; readiness names what failed;
job runs are counted for /metrics.

- a request with a well-formed `X-Request-ID` gets it echoed and on every log line written while it
  was handled (its readiness warning and its access line); an ill-formed one is replaced by a new
  id; every line parses as one JSON object with the documented fields;
- a scheduled job's lines carry its name; APScheduler's per-run lines are DEBUG, not INFO;
- `/health/ready` is 503 naming the node that does not answer (a real bitcoind adapter pointed at
  a port nothing listens on), 200 when every check passes; `/health/live` stays 200;
- `/health/ready` reaches the configured NATS server from the api itself: 503 naming `broker` on a
  dead port, 200 on the live one (NATS_URL, else the embedded server); one probe per 5 s;
- `job_stat` counts runs, failures and skips, and `/metrics` shows them with the other families.
"""
from __future__ import annotations

import io
import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from chain_adapters.bitcoin import BitcoinAdapter
from custody.api.app import create_app
from custody.auth import Role, create_api_key
from custody.broker import BrokerUnavailable, embedded_nats_url
from custody.broker_probe import BrokerProbe
from custody.container import Container
from custody.jobs import JobLocks, build_scheduler, exclusive_job, failing_when_steps_fail, run_steps
from custody.launch import free_port
from custody.observability import configure_logging
from custody.settings import Settings
from ledger.service import Ledger
from regtest.util import assert_equal, wait_until

FIELDS = {"time", "level", "logger", "message", "process", "request_id", "job"}


@pytest.fixture
def captured():
    """The root logger writing JSON into a buffer, as `python -m custody api` configures it; the
    previous handlers are put back after the test."""
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    stream = io.StringIO()
    configure_logging("api", fmt="json", level="INFO", stream=stream)
    yield stream
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in before:
        root.addHandler(h)
    root.setLevel(level)


def lines(stream: io.StringIO) -> list[dict]:
    out = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
    for entry in out:
        assert FIELDS <= set(entry), entry
    return out


@pytest.fixture(scope="module")
def live_nats_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return os.environ.get("NATS_URL") or embedded_nats_url(Path(tmp_path_factory.mktemp("state")))


def dead_node() -> BitcoinAdapter:
    return BitcoinAdapter(f"http://u:p@127.0.0.1:{free_port()}", network="regtest", timeout=2)


def test_every_line_of_a_request_carries_its_id(engine, captured):
    container = Container(settings=Settings(environment="test"), engine=engine, ledger=Ledger(engine),
                          adapters={"bitcoin": dead_node()})
    client = TestClient(create_app(container), raise_server_exceptions=False)
    rid = f"req-{uuid.uuid4().hex[:12]}"
    r = client.get("/health/ready", headers={"X-Request-ID": rid})
    assert_equal(r.headers["x-request-id"], rid)
    assert_equal(r.status_code, 503)
    ours = [e for e in lines(captured) if e["request_id"] == rid]
    loggers = {e["logger"] for e in ours}
    assert {"custody.api.ops_routes", "custody.api.access"} <= loggers, ours
    assert all(e["process"] == "api" and e["job"] is None for e in ours)
    # every line written while the request ran is one of ours: nothing else runs in this test
    assert_equal([e for e in lines(captured) if e["request_id"] is None and e["logger"].startswith("custody")], [])

    bad = client.get("/health/live", headers={"X-Request-ID": "no spaces allowed"})
    generated = bad.headers["x-request-id"]
    assert generated != "no spaces allowed" and len(generated) == 32
    assert any(e["request_id"] == generated for e in lines(captured))
    assert client.get("/health/live").headers["x-request-id"] != generated


def test_readiness_names_the_failed_dependency(engine):
    down = Container(settings=Settings(environment="test"), engine=engine, ledger=Ledger(engine),
                     adapters={"bitcoin": dead_node()})
    client = TestClient(create_app(down), raise_server_exceptions=False)
    r = client.get("/health/ready")
    assert_equal(r.status_code, 503)
    body = r.json()
    assert_equal((body["status"], body["checks"]["database"]["ok"], body["checks"]["bitcoin"]["ok"]),
                 ("not_ready", True, False))
    assert_equal(client.get("/health/live").status_code, 200)
    assert_equal(client.get("/health").status_code, 200)
    # no broker configured (nats_url=None overrides a NATS_URL in the environment): no broker check
    up = TestClient(create_app(Container(settings=Settings(environment="test", nats_url=None), engine=engine,
                                         ledger=Ledger(engine))))
    r = up.get("/health/ready")
    assert_equal((r.status_code, r.json()["status"], set(r.json()["checks"])), (200, "ready", {"database"}))


def test_readiness_reaches_the_broker_from_this_process(engine, live_nats_url):
    """The api process never publishes, yet its readiness connects to the configured NATS server
    itself: a dead port is 503 naming `broker`; the live server (JetStream) is ready."""
    dead = f"nats://127.0.0.1:{free_port()}"
    client = TestClient(create_app(Container(settings=Settings(environment="test", nats_url=dead), engine=engine,
                                             ledger=Ledger(engine))), raise_server_exceptions=False)
    started = time.monotonic()
    r = client.get("/health/ready")
    assert time.monotonic() - started < 5  # a short timeout, never the request's whole budget
    assert_equal(r.status_code, 503)
    checks = r.json()["checks"]
    assert_equal((checks["database"]["ok"], checks["broker"]["ok"]), (True, False))
    assert_equal(checks["broker"]["detail"], "BrokerUnavailable")  # the class only: the message names hosts

    live = TestClient(create_app(Container(settings=Settings(environment="test", nats_url=live_nats_url), engine=engine,
                                           ledger=Ledger(engine))))
    r = live.get("/health/ready")
    assert_equal((r.status_code, r.json()["checks"]["broker"]["ok"]), (200, True))
    assert r.json()["checks"]["broker"]["detail"].startswith("jetstream: "), r.json()


def test_a_broker_probe_is_cached_for_a_few_seconds():
    """Each probe is one connection; within `cache_s` the answer is reused, after it asked again.
    The 'server' is a TCP listener that counts connections and speaks no NATS (so each probe fails)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    now = [1000.0]
    probe = BrokerProbe(f"nats://127.0.0.1:{port}", timeout_s=1.0, cache_s=5.0, clock=lambda: now[0])
    try:
        for _ in range(3):
            with pytest.raises(BrokerUnavailable, match=f"127.0.0.1:{port}"):
                probe()
        assert_equal(len(accepted), 1)
        now[0] += 5.0
        with pytest.raises(BrokerUnavailable):
            probe()
        wait_until(lambda: len(accepted) == 2, timeout=5, what="the second probe's connection")
    finally:
        listener.close()


def test_jobs_are_named_in_their_lines_and_counted(engine, captured):
    locks = JobLocks(engine)
    name = f"probe-{uuid.uuid4().hex[:8]}"

    def failing_step() -> None:
        logging.getLogger("custody.test").info("inside the step")
        raise RuntimeError("planted failure")

    try:
        assert exclusive_job(name, lambda: logging.getLogger("custody.test").info("working"), locks)() is True
        assert exclusive_job(name, failing_when_steps_fail(lambda: run_steps(name, [failing_step])), locks)() is None
        other = JobLocks(engine)
        try:
            with other.hold(name):
                assert exclusive_job(name, lambda: None, locks)() is False
        finally:
            other.dispose()
    finally:
        locks.dispose()
    mine = [e for e in lines(captured) if e["logger"] == "custody.test"]
    assert_equal([(e["message"], e["job"]) for e in mine], [("working", name), ("inside the step", name)])
    failed = [e for e in lines(captured) if e["job"] == name and e["level"] in ("WARNING", "ERROR")]
    assert any("planted failure" in json.dumps(e) for e in failed), failed

    container = Container(settings=Settings(environment="test"), engine=engine, ledger=Ledger(engine))
    client = TestClient(create_app(container), headers={"X-API-Key": create_api_key(
        engine, f"metrics-auditor-{uuid.uuid4().hex[:8]}", Role.auditor, container.settings.api_key_pepper)})
    assert_equal(TestClient(create_app(container)).get("/metrics").status_code, 401)  # the firm's holdings: a key
    text = client.get("/metrics").text
    assert f'custody_job_runs_total{{job="{name}"}} 2.0' in text
    assert f'custody_job_failures_total{{job="{name}"}} 1.0' in text
    assert f'custody_job_skipped_total{{job="{name}"}} 1.0' in text
    assert f'custody_job_duration_seconds_count{{job="{name}"}} 2.0' in text
    for family in ("custody_deposits", "custody_withdrawals", "custody_kill_switch_engaged", "custody_incidents_open",
                   "custody_location_balance_minor", "custody_reconciliation_difference_minor",
                   "custody_http_request_duration_seconds"):
        assert f"# TYPE {family} " in text, family


def test_scheduler_chatter_is_debug(engine, captured):
    container = Container(settings=Settings(environment="test"), engine=engine, ledger=Ledger(engine))
    scheduler = build_scheduler(container, scale=0.05)
    scheduler.start()
    try:
        time.sleep(1.5)
    finally:
        scheduler.shutdown(wait=True)
    chatter = [e for e in lines(captured) if e["logger"].startswith("apscheduler")]
    assert_equal([e for e in chatter if e["level"] != "DEBUG" and "Running job" in e["message"]], [])
    assert_equal(chatter, [])  # at INFO they are not written at all

    stream = io.StringIO()
    configure_logging("worker", fmt="json", level="DEBUG", stream=stream)
    scheduler = build_scheduler(container, scale=0.05)
    scheduler.start()
    try:
        time.sleep(1.0)
    finally:
        scheduler.shutdown(wait=True)
    running = [e for e in lines(stream) if "Running job" in e["message"]]
    assert running and {e["level"] for e in running} == {"DEBUG"}
    assert any('"outbox' in e["message"] for e in running), running[:3]
