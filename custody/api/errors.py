"""Every error leaves the API as `{"error": {"code": ..., "message": ...}}` with a stable code.

Ledger codes map to HTTP statuses through `ErrorCode.http_status`; the API adds its own codes for
authentication (`unauthorized` 401, `forbidden` 403), unknown routes (`not_found` 404), malformed
requests (`invalid_request` 422), transient database failures (`temporarily_unavailable` 503: a
deadlock victim, a serialization failure, a lock or statement timeout, a lost connection; nothing
was committed, and the same request with the same idempotency key may be sent again) and
unexpected failures (`internal_error` 500, no stack trace).
"""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException

from custody.errors import CustodyError
from ledger.errors import LedgerError
from matching.errors import MatchingError

log = logging.getLogger(__name__)

# SQLSTATEs after which the whole transaction was rolled back and a retry can succeed: deadlock
# victim, serialization failure, lock not available, query cancelled (statement or lock timeout),
# and the connection classes (the server went away or refused us).
_TRANSIENT_STATES = {"40P01", "40001", "55P03", "57014"}
_TRANSIENT_CLASSES = ("08", "57P")


def transient(exc: DBAPIError) -> bool:
    state = getattr(exc.orig, "sqlstate", None) or ""
    return exc.connection_invalidated or state in _TRANSIENT_STATES or state.startswith(_TRANSIENT_CLASSES)


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

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for e in exc.errors()[:5]:
            where = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
            parts.append(f"{where}: {e.get('msg')}" if where else str(e.get("msg")))
        return JSONResponse(body("invalid_request", "; ".join(parts) or "invalid request"), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed"}.get(
            exc.status_code, "http_error"
        )
        return JSONResponse(body(code, str(exc.detail)), status_code=exc.status_code)

    @app.exception_handler(DBAPIError)
    async def database_error(_: Request, exc: DBAPIError) -> JSONResponse:
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
