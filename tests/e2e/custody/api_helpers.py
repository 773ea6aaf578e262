"""Helpers the withdrawal scenarios share: a backend API client on the session's custody service,
a customer balance credited without touching any on-chain line, a withdrawal request, its answer."""
from __future__ import annotations

import uuid

from fastapi.testclient import TestClient

from custody.api.app import create_app
from custody.auth import create_api_key
from custody.container import Container
from ledger.model import Transfer


def backend_client(custody: Container, name: str) -> TestClient:
    key = create_api_key(custody.engine, f"{name}-{uuid.uuid4().hex[:8]}", "backend", custody.settings.api_key_pepper)
    client = TestClient(create_app(custody), raise_server_exceptions=False)
    client.headers["X-API-Key"] = key
    return client


def credit(custody: Container, acct: int, asset: str, amount: int) -> None:
    """A treasury credit from equity: the customer has a balance without touching any on-chain line."""
    equity = custody.wallets.firm_account("equity", asset)
    custody.ledger.post(f"test-credit:{uuid.uuid4().hex}", [Transfer(equity, acct, amount)], kind="treasury_credit")


def withdraw(api: TestClient, acct: int, amount: str, destination: str):
    return api.post("/v1/withdrawals", json={"client_withdrawal_id": uuid.uuid4().hex, "account_id": acct, "amount": amount,
                                             "destination": destination})


def refused(r) -> tuple[int, str | None]:
    """(status, error code); the code is None when the request was accepted."""
    return r.status_code, r.json().get("error", {}).get("code")
