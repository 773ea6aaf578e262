"""Every error leaves the API as `{"error": {"code": ..., "message": ...}}` with a stable code.

Ledger, custody and matching codes map to HTTP statuses through their `ErrorCode.http_status`. The
API adds its own codes, listed here in the order a request meets them:

| code | HTTP | meaning |
| --- | --- | --- |
| invalid_request | 422 | the request is malformed: a missing or ill-typed field, an id outside 1..2^63-1, a string PostgreSQL cannot store (NUL, a lone surrogate; refused before any database work, `custody.api.text_guard`), or a value the database refused as data (SQLSTATE class 22, e.g. out of range, invalid JSON number) |
| invalid_cursor | 422 | a list's `cursor` that this list did not hand out: not decodable, edited (its checksum fails), or from another list (`custody.api.paging`); start again without a cursor |
| unauthorized | 401 | no API key, or an unknown or revoked one |
| forbidden | 403 | the key's role may not do this |
| not_found | 404 | no such route (or a resource without a code of its own) |
| method_not_allowed | 405 | the route exists, the method does not |
| conflict | 409 | the database refused a write that duplicates an existing row (SQLSTATE 23505 unique, 23P01 exclusion), e.g. two racing requests; any other integrity violation (23xxx: foreign key, check, not null) of a request's value is `invalid_request` |
| chains_not_configured | 503 | the route needs chain adapters (or a signer) that this service was started without |
| node_unavailable | 503 | a chain node (or the signer) the route reads could not be reached, or answered with a transport error; nothing was committed: send it again later (`Retry-After`) |
| wrong_network | 503 | the chain node the route reads answers for another chain than configured: its NetworkGate is closed (custody.roots.guards) until the node or the configuration is fixed and the process restarted; a critical incident names it |
| temporarily_unavailable | 503 | a transient database failure: a deadlock victim, a serialization failure, a lock or statement timeout, a lost connection; or a chain node busy with a call it runs once at a time (`NodeBusy`: a UTXO-set scan, a wallet rescan). Nothing was committed, and the same request with the same idempotency key may be sent again (`Retry-After`) |
| internal_error | 500 | anything unexpected, without a stack trace; this includes a refusal by the ledger's own guard triggers (their message starts with `ledger:`), which means a bug in the service, never bad input |

Database refusals mapped to 4xx (classes 22 and 23) are logged at error level with the request's
method, path and SQLSTATE, so a service bug that surfaces as one is still seen.

**The contract (OpenAPI).** Every route documents every status it can answer, each with the shared
error schema whose `code` is an enum of exactly the codes that status can carry on that route, so a
client (and `tests/integration/test_api_fuzz.py`, schemathesis with all its checks) can tell an
undocumented code from a documented one. A route declares its own codes once, by name:

    @router.get("/things/{id}", response_model=ThingOut, responses=errors.responses("thing_not_found"))

`responses()` groups the codes by the HTTP status their table gives them (ledger, custody, matching,
or this module's table). `document(app)` then adds what every route shares, when the served
document is built: `invalid_request` (422: any request can carry text PostgreSQL cannot store),
`internal_error` (500), `temporarily_unavailable` (503, with `Retry-After`), and, on a route that
takes an API key (a `custody.api.deps` role dependency), `unauthorized` (401), `forbidden` (403)
and the `ApiKey` security requirement. A 405 carries `Allow` (the methods the path has).
"""
from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from chain_adapters.errors import NodeBusy, NodeUnavailable, WrongNetwork
from custody.errors import CustodyError, CustodyErrorCode
from ledger.errors import ErrorCode as LedgerCode
from ledger.errors import LedgerError
from matching.errors import ErrorCode as MatchingCode
from matching.errors import MatchingError

log = logging.getLogger(__name__)

# SQLSTATEs after which the whole transaction was rolled back and a retry can succeed: deadlock
# victim, serialization failure, lock not available, query cancelled (statement or lock timeout),
# and the connection classes (the server went away or refused us).
_TRANSIENT_STATES = {"40P01", "40001", "55P03", "57014"}
_TRANSIENT_CLASSES = ("08", "57P")


# Integrity violations that mean "that row exists already" rather than "that value is wrong".
_DUPLICATE_STATES = {"23505", "23P01"}


def transient(exc: DBAPIError) -> bool:
    """True when a retry can succeed and nothing was committed. An OperationalError without a
    SQLSTATE is the driver's own: the connection could not be made (the server restarting or
    refusing connections) or was lost; it carries no server state and is transient too."""
    state = getattr(exc.orig, "sqlstate", None) or ""
    return (exc.connection_invalidated or state in _TRANSIENT_STATES or state.startswith(_TRANSIENT_CLASSES)
            or (isinstance(exc, OperationalError) and not state))


def refused_input(exc: DBAPIError) -> tuple[int, str] | None:
    """(status, code) for a database refusal of a request's value (SQLSTATE class 22 data exception,
    class 23 integrity violation; psycopg's client-side DataError too), or None when it is not one.
    The ledger's guard triggers also raise class-23 states, but their refusal is an invariant the
    service itself broke, so it stays a 500."""
    message = str(getattr(getattr(exc.orig, "diag", None), "message_primary", None) or "")
    if message.startswith("ledger:"):
        return None
    if isinstance(exc, IntegrityError):
        state = getattr(exc.orig, "sqlstate", None) or ""
        return (409, "conflict") if state in _DUPLICATE_STATES else (422, "invalid_request")
    if isinstance(exc, DataError):
        return 422, "invalid_request"
    return None


# The API's own codes, read from the table above (one place), then every context's codes.
API_CODES: dict[str, int] = {code: int(status) for code, status in re.findall(r"^\| (\w+) \| (\d{3}) \|", __doc__, re.M)}
CODE_STATUS: dict[str, int] = {
    **{c.value: c.http_status for c in MatchingCode},
    **{c.value: c.http_status for c in LedgerCode},
    **{c.value: c.http_status for c in CustodyErrorCode},
    **API_CODES,
}


class ErrorDetail(BaseModel):
    code: str = Field(description="a stable code: the README's error tables say what each means")
    message: str = Field(description="for people; never parse it")
    detail: dict[str, Any] | None = Field(default=None, description="values the code refers to (integers as strings)")


class ErrorOut(BaseModel):
    """Every 4xx and 5xx answer."""

    error: ErrorDetail


_REASONS = {401: "no API key, or an unknown or revoked one", 403: "the key's role (or the money rules) refuse this",
            404: "not found", 405: "method not allowed", 409: "conflict with the current state",
            422: "the request is malformed or refused by a rule", 500: "a bug; see the service log",
            503: "not available now; see the code"}


def _error_schema(codes: Iterable[str]) -> dict:
    return {"type": "object", "required": ["error"], "additionalProperties": False, "properties": {"error": {
        "type": "object", "required": ["code", "message"], "additionalProperties": False, "properties": {
            "code": {"type": "string", "enum": sorted(set(codes))},
            "message": {"type": "string"},
            "detail": {"anyOf": [{"type": "object"}, {"type": "null"}]}}}}}


def _error_response(status: int, codes: Iterable[str]) -> dict:
    codes = sorted(set(codes))
    response: dict = {"description": f"{_REASONS.get(status, 'error')}: " + ", ".join(f"`{c}`" for c in codes),
                      "content": {"application/json": {"schema": _error_schema(codes)}}}
    if status == 503 and {"temporarily_unavailable", "node_unavailable"} & set(codes):
        response["headers"] = {"Retry-After": {"description": "seconds to wait before sending the same request again "
                                                              "(temporarily_unavailable, node_unavailable)",
                                               "schema": {"type": "string"}}}
    return response


def responses(*codes: str) -> dict[int | str, dict[str, Any]]:
    """The `responses=` of a route that can answer `codes` (besides what every route answers, see
    `document`). Each code is grouped under the status its table gives it; an unknown code is a bug."""
    by_status: dict[int, list[str]] = {}
    for code in codes:
        value = getattr(code, "value", code)
        if value not in CODE_STATUS:
            raise KeyError(f"error code {value!r} is in no table (ledger, custody, matching, custody.api.errors)")
        by_status.setdefault(CODE_STATUS[value], []).append(value)
    return {status: {"x-error-codes": sorted(set(found))} for status, found in by_status.items()}


_SHARED = {422: ["invalid_request"], 500: ["internal_error"], 503: ["temporarily_unavailable"]}
_AUTHENTICATED = {401: ["unauthorized"], 403: ["forbidden"]}
SECURITY_SCHEME = "ApiKey"


def document(app: FastAPI) -> None:
    """Serve an OpenAPI document that states every status and code a route can answer (see the
    module docstring). Built once, on the first request for it."""

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes,
                          tags=app.openapi_tags, servers=app.servers)
        for path in doc.get("paths", {}).values():
            for operation in path.values():
                _complete(operation)
        schemas = doc.get("components", {}).get("schemas", {})
        for unused in ("HTTPValidationError", "ValidationError"):
            schemas.pop(unused, None)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


def _complete(operation: dict) -> None:
    answers = operation.setdefault("responses", {})
    wanted: dict[int, set[str]] = {}
    own: dict[int, dict] = {}  # a route's own body for an error status (e.g. /health/ready's 503)
    for status, response in list(answers.items()):
        codes = response.pop("x-error-codes", None)
        if codes is not None:
            wanted.setdefault(int(status), set()).update(codes)
            del answers[status]
        elif int(status) >= 400:  # FastAPI's own 422 (`{"detail": [...]}`) is not what the API sends
            schema = response.get("content", {}).get("application/json", {}).get("schema", {})
            if schema.get("$ref", "").endswith("/HTTPValidationError"):
                del answers[status]
            else:
                own[int(status)] = answers.pop(status)
    shared = dict(_SHARED)
    if any(SECURITY_SCHEME in requirement for requirement in operation.get("security", [])):
        shared.update(_AUTHENTICATED)
    for status, codes in shared.items():
        wanted.setdefault(status, set()).update(codes)
    for status in sorted(wanted):
        answers[str(status)] = _error_response(status, wanted[status])
        if status in own:  # either the route's own body or the error schema
            mine, error = own.pop(status), answers[str(status)]["content"]["application/json"]["schema"]
            answers[str(status)]["description"] = f"{mine.get('description', '')}; or {answers[str(status)]['description']}"
            answers[str(status)]["content"]["application/json"]["schema"] = {
                "anyOf": [mine["content"]["application/json"]["schema"], error]}
    for status, mine in own.items():
        answers[str(status)] = mine
    if any(p.get("name") == "cursor" and p.get("in") == "query" for p in operation.get("parameters", [])):
        answers.get("200", {}).setdefault("headers", {}).update({  # a list route (custody.api.paging)
            "X-Next-Cursor": {"description": "the next page's `cursor`; absent on the last page",
                              "schema": {"type": "string"}},
            "Link": {"description": 'the next page, `<path?query>; rel="next"`; absent on the last page',
                     "schema": {"type": "string"}}})


def _allowed(request: Request) -> str:
    """Every method the request's path has: FastAPI keeps one route per method, and the first one
    whose path matches would name only its own."""
    methods = [m for m in ("GET", "POST", "PUT", "PATCH", "DELETE")
               if any(route.matches({**request.scope, "method": m})[0] is Match.FULL for route in request.app.router.routes)]
    return ", ".join(methods)


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        self.status, self.code, self.message = status, code, message
        super().__init__(message)


def body(code: str, message: str, **detail: object) -> dict:
    err: dict = {"code": code, "message": message}
    if detail:
        err["detail"] = {k: (str(v) if isinstance(v, int) and not isinstance(v, bool) else v) for k, v in detail.items()}
    return {"error": err}


def install(app: FastAPI) -> None:
    @app.exception_handler(LedgerError)
    async def ledger_error(_: Request, exc: LedgerError) -> JSONResponse:
        return JSONResponse(body(exc.code.value, exc.message, **exc.detail), status_code=exc.code.http_status)

    @app.exception_handler(CustodyError)
    async def custody_error(_: Request, exc: CustodyError) -> JSONResponse:
        return JSONResponse(body(exc.code.value, exc.message, **exc.detail), status_code=exc.code.http_status)

    @app.exception_handler(MatchingError)
    async def matching_error(_: Request, exc: MatchingError) -> JSONResponse:
        return JSONResponse(body(exc.code.value, exc.message), status_code=exc.code.http_status)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(body(exc.code, exc.message), status_code=exc.status)

    @app.exception_handler(NodeUnavailable)  # WrongNetwork is one: its own code, no Retry-After (it stays closed)
    async def node_unavailable(request: Request, exc: NodeUnavailable) -> JSONResponse:
        wrong = isinstance(exc, WrongNetwork)
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        if wrong:
            return JSONResponse(body("wrong_network", f"a chain node answers for another chain than configured: {exc.detail}"),
                                status_code=503)
        return JSONResponse(body("node_unavailable", f"a chain node or the signer could not be reached: {exc.detail}"),
                            status_code=503, headers={"Retry-After": "5"})

    @app.exception_handler(NodeBusy)
    async def node_busy(request: Request, exc: NodeBusy) -> JSONResponse:
        log.warning("%s %s: node busy (%s): answered 503", request.method, request.url.path, exc.detail)
        return JSONResponse(body("temporarily_unavailable",
                                 "a chain node is busy with a call it runs one at a time (a scan or a rescan); nothing "
                                 "was committed: send the request again later"),
                            status_code=503, headers={"Retry-After": "5"})

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for e in exc.errors()[:5]:
            where = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
            parts.append(f"{where}: {e.get('msg')}" if where else str(e.get("msg")))
        return JSONResponse(body("invalid_request", "; ".join(parts) or "invalid request"), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:  # FastAPI could not parse the body (e.g. not UTF-8): one code, one status
            return JSONResponse(body("invalid_request", str(exc.detail)), status_code=422)
        code = {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed"}.get(
            exc.status_code, "http_error"
        )
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed(request)
        return JSONResponse(body(code, str(exc.detail)), status_code=exc.status_code, headers=headers or None)

    @app.exception_handler(DBAPIError)
    async def database_error(request: Request, exc: DBAPIError) -> JSONResponse:
        refused = refused_input(exc)
        if refused is not None:
            status, code = refused
            state = getattr(exc.orig, "sqlstate", None)
            log.error("database refused %s %s (SQLSTATE %s): answered %s %s: %s", request.method, request.url.path,
                      state, status, code, exc.orig)
            what = "a row like this exists already" if code == "conflict" else "a value of the request was refused"
            return JSONResponse(body(code, f"{what} (SQLSTATE {state or 'client-side'})"),
                                status_code=status)
        if not transient(exc):
            log.exception("unexpected database error")
            return JSONResponse(body("internal_error", "internal error; see the service log"), status_code=500)
        log.warning("transient database failure (%s): answered 503", getattr(exc.orig, "sqlstate", None) or exc)
        return JSONResponse(
            body("temporarily_unavailable",
                 "the database could not complete the request; nothing was committed: send it again "
                 "with the same idempotency key"),
            status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return JSONResponse(body("internal_error", "internal error; see the service log"), status_code=500)
