"""Small helpers shared by the launchers, the e2e tests and the bench (Bitcoin Core test style).

`wait_until` replaces every sleep; `assert_equal` / `assert_raises_code` give readable failures.
"""
from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any


class WaitTimeout(AssertionError):
    """A `wait_until` predicate stayed false until the deadline."""


def wait_until(predicate: Callable[[], Any], *, timeout: float = 30.0, interval: float = 0.05,
               what: str = "") -> Any:
    """Poll `predicate` until it returns a truthy value (which is returned) or `timeout` passes.

    Exceptions raised by the predicate count as "not yet" (a node that is still starting refuses
    connections); the last one is chained into the timeout error.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - "not ready yet" has many shapes
            last_exc = exc
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout}s waiting for {what or predicate}") from last_exc
        time.sleep(interval)


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_equal(actual: Any, expected: Any, *more: Any) -> None:
    values = (actual, expected, *more)
    if any(v != actual for v in values):
        raise AssertionError("not all equal: " + " != ".join(repr(v) for v in values))


def assert_raises_code(code: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> BaseException:
    """Call fn and assert it raises an exception whose `.code` equals `code`; return it."""
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        if getattr(exc, "code", None) != code:
            raise AssertionError(f"expected error code {code!r}, got {exc!r}") from exc
        return exc
    raise AssertionError(f"expected error code {code!r}, nothing was raised")
