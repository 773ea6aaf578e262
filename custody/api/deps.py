"""Typed dependencies shared by the routers: the wired services and the caller's role."""
from __future__ import annotations

from typing import Annotated, Callable

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader

from custody.api.errors import SECURITY_SCHEME, ApiError
from custody.auth import Principal, Role, authenticate
from custody.container import Container


def get_container(request: Request) -> Container:
    return request.app.state.container


ContainerDep = Annotated[Container, Depends(get_container)]


# The security scheme every role dependency declares, so the OpenAPI document names it on exactly the
# routes that take a key (custody.api.errors.document adds their 401 and 403 from it).
API_KEY = APIKeyHeader(name="X-API-Key", scheme_name=SECURITY_SCHEME, auto_error=False,
                       description="an API key made by `custody create-api-key`; its role decides what it may do")


def _principal(container: ContainerDep, x_api_key: Annotated[str | None, Security(API_KEY)] = None) -> Principal:
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
