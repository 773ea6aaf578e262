"""create_app(): the FastAPI application with every router and the uniform error format."""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from custody.api import (
    adjustment_routes,
    containment_routes,
    deposit_routes,
    errors,
    ledger_routes,
    order_routes,
    treasury_routes,
    webhook_routes,
    withdrawal_routes,
)
from custody.api.text_guard import RefuseUnstorableText
from custody.container import Container


def create_app(container: Container) -> FastAPI:
    app = FastAPI(
        title="Custody service",
        version="0.1.0",
        description="Internal API: ledger, orders, deposits, withdrawals and treasury. Amounts are decimal strings "
                    "in requests and {value, minor} in answers. Text PostgreSQL cannot store (a NUL character, a "
                    "lone surrogate) in any string or object key of a request is refused with invalid_request (422).",
    )
    app.state.container = container
    errors.install(app)
    errors.document(app)
    app.add_middleware(RefuseUnstorableText)  # before routing, authentication and any database work
    app.include_router(ledger_routes.router)
    app.include_router(deposit_routes.router)
    app.include_router(order_routes.router)
    app.include_router(withdrawal_routes.router)
    app.include_router(treasury_routes.router)
    app.include_router(adjustment_routes.router)
    app.include_router(containment_routes.router)
    app.include_router(webhook_routes.router)

    console = Path(__file__).resolve().parents[1] / "console" / "index.html"

    @app.get("/console", include_in_schema=False)
    def operator_console() -> HTMLResponse:
        """The treasury operators' page: a thin client of the /v1 API (every action is authorised
        and audited there, with the operator's own API key)."""
        return HTMLResponse(console.read_text())

    @app.get("/health", tags=["ops"])
    def health() -> dict:
        return {"status": "ok"}

    return app
