"""Typed dependencies shared by the routers: the wired services and the caller's role.

The caller is an API key (`X-API-Key`) or, without one, a signed-in console session (the
`custody_console` cookie, custody.console.auth); a session's state changes need its CSRF token."""
from __future__ import annotations

from typing import Annotated, Callable

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader
from starlette.concurrency import run_in_threadpool

from custody.api.errors import SECURITY_SCHEME, ApiError
from custody.auth import Principal, Role, authenticate, remembered
from custody.console.auth import COOKIE, CSRF_HEADER, ConsoleAuth
from custody.container import Container
from custody.errors import CustodyError, CustodyErrorCode

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


# Every dependency here is `async def` and does no I/O on the event loop: FastAPI runs a plain
# `def` dependency on a worker thread, and each such hop (a thread wake-up and a handoff of the
# GIL) cost more CPU than the rest of the dependency; a route's own body still runs on a thread.
async def get_container(request: Request) -> Container:
    return request.app.state.container


ContainerDep = Annotated[Container, Depends(get_container)]


# The security scheme every role dependency declares, so the OpenAPI document names it on exactly the
# routes that take a key (custody.api.errors.document adds their 401 and 403 from it).
API_KEY = APIKeyHeader(name="X-API-Key", scheme_name=SECURITY_SCHEME, auto_error=False,
                       description="an API key made by `custody create-api-key`; its role decides what it may do")


async def _principal(request: Request, container: ContainerDep,
                     x_api_key: Annotated[str | None, Security(API_KEY)] = None) -> Principal:
    """The caller: a key `authenticate` remembers as live is answered on the event loop; any
    other key is read from the database on a worker thread (custody.auth); without a key, a console
    session (read on a worker thread too)."""
    if not x_api_key and request.cookies.get(COOKIE):
        return await run_in_threadpool(console_principal, request, container)
    if not x_api_key:
        raise ApiError(401, "unauthorized", "send an API key in the X-API-Key header")
    pepper = container.settings.api_key_pepper
    principal = remembered(container.engine, x_api_key, pepper) or await run_in_threadpool(
        authenticate, container.engine, x_api_key, pepper)
    if principal is None:
        raise ApiError(401, "unauthorized", "unknown or revoked API key")
    return principal


def console_principal(request: Request, container: Container) -> Principal:
    """The principal of the console session named by the request's cookie (custody.console.auth):
    on /v1 a dead session is `unauthorized` and a state change without the session's CSRF token
    `forbidden`, the codes every /v1 route documents; the reason is in the message."""
    auth = ConsoleAuth(container.engine, container.settings)
    token = request.cookies.get(COOKIE)
    try:
        session = auth.session(token)
        if request.method not in SAFE_METHODS:
            auth.check_csrf(token, request.headers.get(CSRF_HEADER))
    except CustodyError as exc:
        status, code = (403, "forbidden") if exc.code is CustodyErrorCode.console_csrf_invalid else (401, "unauthorized")
        raise ApiError(status, code, f"{exc.code.value}: {exc.message}") from None
    return session.principal()


def require(*roles: Role) -> Callable[..., Principal]:
    """A dependency admitting callers with one of `roles` (admin is always admitted)."""

    async def check(principal: Annotated[Principal, Depends(_principal)]) -> Principal:
        if not principal.has(*roles):
            allowed = ", ".join(r.value for r in roles) or "admin"
            raise ApiError(403, "forbidden", f"role {principal.role.value} may not do this (needs {allowed})")
        return principal

    return check


def require_exactly(role: Role) -> Callable[..., Principal]:
    """A dependency admitting callers of exactly `role`, not admin: for decisions that count as a
    person's approval of a money movement (maker-checker), which configuring the service is not."""

    async def check(principal: Annotated[Principal, Depends(_principal)]) -> Principal:
        if principal.role is not role:
            raise ApiError(403, "forbidden", f"role {principal.role.value} may not do this (needs {role.value}; "
                                             "admins configure, operators decide)")
        return principal

    return check


Backend = Annotated[Principal, Depends(require(Role.backend))]
Reader = Annotated[Principal, Depends(require(Role.backend, Role.operator, Role.auditor))]
Auditor = Annotated[Principal, Depends(require(Role.auditor, Role.operator))]
Operator = Annotated[Principal, Depends(require(Role.operator))]
OperatorOnly = Annotated[Principal, Depends(require_exactly(Role.operator))]
Admin = Annotated[Principal, Depends(require())]
