"""In-process API requests run as custody_api: the privileges the api process has in deployment.

Most API tests build the app in-process (`create_app(container)`) on the session's engine, which
connects as the database owner, so a route that writes a table the api role may not write
(migration 0022_api_role_narrowed: wallets' keys, chain transactions, coins, nonces, cursors,
deposits...) would pass every such test and fail only in deployment. This plugin closes that gap:
while an app made by FastAPI handles an HTTP request, every connection the request checks out of
any pool is switched to `SET ROLE custody_api` (committed, so it holds across the request's
transactions) and switched back (`RESET ROLE`) when it is checked in. The request marks its
context with a contextvar, which Starlette copies into the thread pool that runs sync routes, so
the route, the services it calls and the ledger's functions (SECURITY INVOKER) all run as
custody_api; the test's own code around the requests (fixtures funding accounts, jobs run by
hand) keeps the owner's connections. A write the api may not make therefore fails as in
deployment: a 500, or the route's own error, in the test that makes it.

It is on for every test that has the `engine` or `database_url` fixture (the suite's database,
where migration 0020 created the role), unless the test is marked `api_as_owner` with a reason:
the in-process `Container` serves the API and runs the jobs at once, so a route that in
deployment only the worker's wiring reaches can be exempted there, never silently. Work a
route hands to another thread the request did not start (a thread of its own) is not covered.
"""
from __future__ import annotations

import contextvars
from typing import Any

import fastapi
import pytest
from sqlalchemy import event
from sqlalchemy.pool import Pool

API_ROLE = "custody_api"
_in_request: contextvars.ContextVar[bool] = contextvars.ContextVar("in_api_request", default=False)
_enabled = False  # for the running test
_original_call = fastapi.FastAPI.__call__


async def _call(self: fastapi.FastAPI, scope: Any, receive: Any, send: Any) -> None:
    if scope.get("type") != "http" or not _enabled:
        return await _original_call(self, scope, receive, send)
    token = _in_request.set(True)
    try:
        return await _original_call(self, scope, receive, send)
    finally:
        _in_request.reset(token)


def _checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    if not (_enabled and _in_request.get()):
        return
    if "may_be_api" not in record.info:  # an engine logged in as another process's role may not
        with dbapi_connection.cursor() as cur:
            cur.execute("SELECT pg_has_role(session_user, %s, 'MEMBER')", (API_ROLE,))
            record.info["may_be_api"] = bool(cur.fetchone()[0])
        dbapi_connection.commit()
    if record.info["may_be_api"]:
        with dbapi_connection.cursor() as cur:
            cur.execute(f"SET ROLE {API_ROLE}")
        dbapi_connection.commit()
        record.info["as_api"] = True


def _checkin(dbapi_connection: Any, record: Any) -> None:
    if dbapi_connection is None or not record.info.pop("as_api", False):
        return
    dbapi_connection.rollback()
    with dbapi_connection.cursor() as cur:
        cur.execute("RESET ROLE")
    dbapi_connection.commit()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "api_as_owner(reason): in-process API requests keep the owner's connection "
                                       "(tests/api_role.py); say why")
    fastapi.FastAPI.__call__ = _call  # type: ignore[method-assign]
    event.listen(Pool, "checkout", _checkout)
    event.listen(Pool, "checkin", _checkin)


def pytest_unconfigure(config: pytest.Config) -> None:
    fastapi.FastAPI.__call__ = _original_call  # type: ignore[method-assign]
    event.remove(Pool, "checkout", _checkout)
    event.remove(Pool, "checkin", _checkin)


@pytest.fixture(autouse=True)
def _api_requests_as_custody_api(request: pytest.FixtureRequest):
    global _enabled
    marker = request.node.get_closest_marker("api_as_owner")
    if marker is not None and not (marker.args or marker.kwargs.get("reason")):
        pytest.fail("@pytest.mark.api_as_owner needs a reason")
    _enabled = marker is None and bool({"engine", "database_url"} & set(request.fixturenames))
    try:
        yield
    finally:
        _enabled = False


def api_requests_as_role() -> bool:
    """Whether the running test's in-process API requests run as custody_api."""
    return _enabled
