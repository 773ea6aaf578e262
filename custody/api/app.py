"""create_app(): the FastAPI application with every router and the uniform error format.

Its documentation pages are served by the service itself, with no CDN: `/docs` (Swagger UI) and
`/redoc` (ReDoc) load their scripts and styles from `/static-offline-docs/`, the static files of
the `fastapi-offline` package, and the document from `/openapi.json`; so they render on a machine
without internet. Middleware, outermost first: `RequestIdMiddleware` (custody.observability: a
request id on every log line and in the `X-Request-ID` answer header), `HttpMetricsMiddleware`
(custody.metrics: latency by route template), `RefuseUnstorableText`.
"""
from __future__ import annotations

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from custody.api import (
    adjustment_routes,
    api_key_routes,
    console_routes,
    containment_routes,
    convert_routes,
    deposit_routes,
    errors,
    ledger_routes,
    ops_routes,
    order_routes,
    treasury_routes,
    webhook_routes,
    withdrawal_routes,
)
from custody.api.text_guard import RefuseUnstorableText
from custody.container import Container
from custody.metrics import HttpMetricsMiddleware, build_registry
from custody.observability import RequestIdMiddleware


def create_app(container: Container) -> FastAPI:
    app = FastAPIOffline(
        title="Custody service",
        version="0.1.0",
        description="Internal API: ledger, orders, deposits, withdrawals and treasury. Amounts are decimal strings "
                    "in requests and {value, minor} in answers. Text PostgreSQL cannot store (a NUL character, a "
                    "lone surrogate) in any string or object key of a request is refused with invalid_request (422).",
    )
    app.state.container = container
    app.state.metrics_registry = build_registry(container)
    errors.install(app)
    errors.document(app)
    app.add_middleware(RefuseUnstorableText)  # before routing, authentication and any database work
    app.add_middleware(HttpMetricsMiddleware)
    app.add_middleware(RequestIdMiddleware)  # outermost: refused requests carry an id too
    app.include_router(ledger_routes.router)
    app.include_router(deposit_routes.router)
    app.include_router(order_routes.router)
    app.include_router(withdrawal_routes.router)
    app.include_router(treasury_routes.router)
    app.include_router(adjustment_routes.router)
    app.include_router(containment_routes.router)
    app.include_router(webhook_routes.router)
    app.include_router(api_key_routes.router)
    app.include_router(ops_routes.router)
    app.include_router(console_routes.router)  # the operators' page (custody.api.console_routes)
    app.include_router(convert_routes.router)
    return app
