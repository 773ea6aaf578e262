"""Helpers the withdrawal scenarios share: a backend API client on the session's custody service,
a customer balance credited without touching any on-chain line, customers and hot coins funded on
chain, a withdrawal request, its answer."""
from __future__ import annotations

import uuid

from fastapi.testclient import TestClient

from custody.api.app import create_app
from custody.auth import create_api_key
from custody.container import Container
from ledger.model import Transfer
from tests.e2e.custody.conftest import BTC_FINALITY


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


def fund(custody: Container, customer, bitcoind, n: int) -> list[int]:
    """`n` customers credited 1 BTC each through the real deposit pipeline, and two hot coins of
    5 BTC (each batch reserves its own)."""
    accounts = [customer("BTC") for _ in range(n)]
    bitcoind.wallet("sendmany", "", {custody.wallets.issue_address(f"addr:{a}", a).address: "1" for a in accounts})
    for _ in range(2):
        bitcoind.fund(custody.payouts.hot_address("bitcoin"), 5 * 100_000_000)
    bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    custody.payouts.sync_hot_wallet()
    return accounts
