"""Helpers the withdrawal scenarios share: a backend API client on the session's custody service
(the typed `custody.client`, as the exchange backend uses it), a customer balance credited without
touching any on-chain line, customers and hot coins funded on chain, a withdrawal request, the
(status, code) of a refused call."""
from __future__ import annotations

import uuid
from collections.abc import Callable
from decimal import Decimal

from fastapi.testclient import TestClient

from custody.api.app import create_app
from custody.auth import create_api_key
from custody.client import CustodyApiError, CustodyClient
from custody.client.models import WithdrawalOut
from custody.container import Container
from ledger.model import Transfer
from tests.e2e.custody.conftest import BTC_FINALITY


BASE = "http://custody.test"


def backend_client(custody: Container, name: str) -> CustodyClient:
    """A `backend` API key's typed client on the in-process API of `custody` (no retries: a test
    sees the first answer)."""
    key = create_api_key(custody.engine, f"{name}-{uuid.uuid4().hex[:8]}", "backend", custody.settings.api_key_pepper)
    http = TestClient(create_app(custody), base_url=BASE, raise_server_exceptions=False)
    return CustodyClient(BASE, key, http=http, retries=0)


def credit(custody: Container, acct: int, asset: str, amount: int) -> None:
    """A treasury credit from equity: the customer has a balance without touching any on-chain line."""
    equity = custody.wallets.firm_account("equity", asset)
    custody.ledger.post(f"test-credit:{uuid.uuid4().hex}", [Transfer(equity, acct, amount)], kind="treasury_credit")


def withdraw(api: CustodyClient, acct: int, amount: str, destination: str) -> WithdrawalOut:
    """Request a withdrawal of `amount` (units, a decimal string) with a fresh client id; a refusal
    raises the client's `CustodyApiError`."""
    return api.request_withdrawal(client_withdrawal_id=uuid.uuid4().hex, account_id=acct, amount=Decimal(amount),
                                  destination=destination)


def refused(call: Callable[[], object]) -> tuple[int | None, str]:
    """(status, error code) of a call the API refuses; AssertionError when it was accepted."""
    try:
        answer = call()
    except CustodyApiError as exc:
        return exc.status, exc.code
    raise AssertionError(f"the API accepted: {answer!r}")


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
