"""create_app(): the FastAPI application with every router and the uniform error format."""
from __future__ import annotations

from fastapi import FastAPI

from custody.api import deposit_routes, errors, ledger_routes, order_routes, withdrawal_routes
from custody.container import Container


def create_app(container: Container) -> FastAPI:
    app = FastAPI(
        title="Custody service",
        version="0.1.0",
        description="Internal API: ledger, orders, deposits and withdrawals. Amounts are decimal strings.",
    )
    app.state.container = container
    errors.install(app)
    app.include_router(ledger_routes.router)
    app.include_router(deposit_routes.router)
    app.include_router(order_routes.router)
    app.include_router(withdrawal_routes.router)

    @app.get("/health", tags=["ops"])
    def health() -> dict:
        return {"status": "ok"}

    return app
