"""Typed dependencies shared by the routers: the wired services and the caller's role."""
from __future__ import annotations

from typing import Annotated, Callable

from fastapi import Depends, Header, Request

from custody.api.errors import ApiError
from custody.auth import Principal, Role, authenticate
from custody.container import Container


def get_container(request: Request) -> Container:
    return request.app.state.container


ContainerDep = Annotated[Container, Depends(get_container)]


def _principal(container: ContainerDep, x_api_key: Annotated[str | None, Header()] = None) -> Principal:
    if not x_api_key:
        raise ApiError(401, "unauthorized", "send an API key in the X-API-Key header")
    principal = authenticate(container.engine, x_api_key, container.settings.api_key_pepper)
    if principal is None:
        raise ApiError(401, "unauthorized", "unknown or revoked API key")
    return principal


def require(*roles: Role) -> Callable[..., Principal]:
    """A dependency admitting callers with one of `roles` (admin is always admitted)."""

    def check(principal: Annotated[Principal, Depends(_principal)]) -> Principal:
        if not principal.has(*roles):
            allowed = ", ".join(r.value for r in roles) or "admin"
            raise ApiError(403, "forbidden", f"role {principal.role.value} may not do this (needs {allowed})")
        return principal

    return check


def require_exactly(role: Role) -> Callable[..., Principal]:
    """A dependency admitting callers of exactly `role`, not admin: for decisions that count as a
    person's approval of a money movement (maker-checker), which configuring the service is not."""

    def check(principal: Annotated[Principal, Depends(_principal)]) -> Principal:
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
