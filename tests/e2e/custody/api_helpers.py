"""Helpers the e2e scenarios share: API clients per role on the session's custody service (the typed
`custody.client`, as the exchange backend and the operators' tools use it), a customer balance
credited without touching any on-chain line, customers and hot coins funded on chain, a withdrawal
request, the answer status of a call (`answered`) and the error of a refused one (`refusal`,
`refused`).

A call through the client that succeeds has answered a 2xx with the route's declared model; where a
route has more than one success status (201 created or 200 replayed, 200 applied or 202 pending),
`answered(api, status, call_result)` asserts which one, as the raw tests asserted `status_code`."""
from __future__ import annotations

import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import TypeVar

from fastapi.testclient import TestClient

from custody.api.app import create_app
from custody.approve_cli import approve_with_client
from custody.auth import create_api_key
from custody.client import CustodyApiError, CustodyClient, ServiceUnavailable
from custody.client.models import Ready, WithdrawalOut
from custody.container import Container
from ledger.model import Transfer
from tests.approvers import key_id, operator_key, private_key
from tests.e2e.custody.conftest import BTC_FINALITY

T = TypeVar("T")

BASE = "http://custody.test"


def in_process(custody: Container, api_key: str | None) -> CustodyClient:
    """The typed client with `api_key` on the in-process API of `custody` (no retries: a test sees
    the first answer)."""
    http = TestClient(create_app(custody), base_url=BASE, raise_server_exceptions=False)
    return CustodyClient(BASE, api_key, http=http, retries=0)


def role_client(custody: Container, role: str, name: str) -> CustodyClient:
    """A typed client with a new API key of `role`, named `name-<run>`, on the in-process API."""
    return in_process(custody, create_api_key(custody.engine, f"{name}-{uuid.uuid4().hex[:8]}", role,
                                              custody.settings.api_key_pepper))


def backend_client(custody: Container, name: str) -> CustodyClient:
    """A `backend` API key's typed client on the in-process API of `custody`."""
    return role_client(custody, "backend", name)


def operator_api(custody: Container, operator: str) -> CustodyClient:
    """The typed client of the operator API key named exactly `operator` (tests.approvers'
    `operator_key`): what approves with that operator's registered test key."""
    return in_process(custody, operator_key(custody, operator))


def approve_as(api: CustodyClient, withdrawal_id: int, operator: str, comment: str = "checked") -> WithdrawalOut:
    """Approve as `operator` with their test key, as `custody approve` does (approve_with_client:
    the payload checked against its fields, then signed)."""
    return approve_with_client(api, withdrawal_id, private_key(operator), comment=comment, key_id=key_id(operator),
                               show=lambda line: None)


def answered(api: CustodyClient, status: int, result: T) -> T:
    """`result` (a call just made on `api`), after asserting the call's answer had `status`."""
    got = api.last_response.status_code if api.last_response is not None else None
    assert got == status, f"answered {got}, not {status}: {result!r}"
    return result


def credit(custody: Container, acct: int, asset: str, amount: int) -> None:
    """A treasury credit from equity: the customer has a balance without touching any on-chain line."""
    equity = custody.wallets.firm_account("equity", asset)
    custody.ledger.post(f"test-credit:{uuid.uuid4().hex}", [Transfer(equity, acct, amount)], kind="treasury_credit")


def withdraw(api: CustodyClient, acct: int, amount: str, destination: str) -> WithdrawalOut:
    """Request a withdrawal of `amount` (units, a decimal string) with a fresh client id; a refusal
    raises the client's `CustodyApiError`."""
    return api.request_withdrawal(client_withdrawal_id=uuid.uuid4().hex, account_id=acct, amount=Decimal(amount),
                                  destination=destination)


def readiness(api: CustodyClient) -> tuple[int, Ready]:
    """(HTTP status, body) of `/health/ready`: 200 when ready, 503 (which the client raises) when a
    dependency is not, both with the `Ready` body naming each check."""
    try:
        api.health_ready()
    except ServiceUnavailable:
        pass
    return api.last_response.status_code, Ready.model_validate_json(api.last_response.content)


def refusal(call: Callable[[], object]) -> CustodyApiError:
    """The error of a call the API refuses (its `status`, `code`, `message`, `detail`);
    AssertionError when it was accepted."""
    try:
        answer = call()
    except CustodyApiError as exc:
        return exc
    raise AssertionError(f"the API accepted: {answer!r}")


def refused(call: Callable[[], object]) -> tuple[int | None, str]:
    """(status, error code) of a call the API refuses; AssertionError when it was accepted."""
    error = refusal(call)
    return error.status, error.code


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
