"""The JSON log formatter's own fast path for plain records writes exactly the line the
python-json-logger library writes for them (field names, order, escaping, nulls), and every other
record (a traceback, extra fields) is still the library's."""
from __future__ import annotations

import io
import json
import logging

import pytest
from pythonjsonlogger.json import JsonFormatter

from custody.observability import ContextFilter, configure_logging, json_formatter, request_id_var

pytestmark = pytest.mark.unit


def _library_line(record: logging.LogRecord) -> str:
    formatter = json_formatter()
    return JsonFormatter.format(formatter, record)  # the library's path, bypassing ours


def _record(msg: str, args: tuple = (), **extra: object) -> logging.LogRecord:
    record = logging.getLogger("custody.api.access").makeRecord(
        "custody.api.access", logging.INFO, __file__, 1, msg, args, None, extra=extra or None)
    ContextFilter().filter(record)
    return record


@pytest.mark.parametrize("msg, args", [
    ("%s %s %d %.1f ms", ("POST", "/v1/transactions", 201, 12.345)),
    ("quotes \" backslash \\ newline \n tab \t", ()),
    ("unicode é ü 中 \u2028 and a control \x01", ()),
])
def test_a_plain_record_is_written_as_the_library_writes_it(msg: str, args: tuple) -> None:
    token = request_id_var.set("req-1")
    try:
        record = _record(msg, args)
        assert json_formatter().format(record) == _library_line(record)
        assert json.loads(json_formatter().format(record))["request_id"] == "req-1"
    finally:
        request_id_var.reset(token)


def test_records_with_extra_fields_or_a_traceback_keep_the_library_output() -> None:
    extra = _record("with extra", color_message="x")
    assert json.loads(json_formatter().format(extra))["color_message"] == "x"
    try:
        raise ValueError("boom")
    except ValueError:
        failing = logging.getLogger("t").makeRecord("t", logging.ERROR, __file__, 1, "failed", (), __import__("sys").exc_info())
    ContextFilter().filter(failing)
    line = json.loads(json_formatter().format(failing))
    assert "ValueError: boom" in line["exc_info"]


def test_configured_handler_writes_one_line_per_record() -> None:
    stream = io.StringIO()
    handler = configure_logging("api", stream=stream)
    try:
        logging.getLogger("custody.api.access").info("%s %d", "GET", 200)
    finally:
        logging.getLogger().removeHandler(handler)
    [line] = stream.getvalue().splitlines()
    assert json.loads(line)["message"] == "GET 200"
