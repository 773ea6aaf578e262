"""custody.client: a typed Python client for the custody service's internal HTTP API (sync and async).

    from decimal import Decimal
    from custody.client import CustodyClient, CustodyApiError, models

    with CustodyClient("http://127.0.0.1:8000", api_key) as api:
        account = api.open_account(asset="BTC", kind="customer", name="customer:alice:BTC", owner="alice")
        api.request_withdrawal(account_id=account.id, amount=Decimal("0.25"), destination="bcrt1q...")
        for w in api.iter_withdrawals(state="pending_approval"):
            print(w.id, w.amounts["amount"].minor)

One method per route (README "Client" lists how they are named); each takes a request model or its
fields as keywords and answers a response model. Amounts are `Decimal` (asset units) or `int`
(minor units), never float. Idempotency keys are filled with a uuid4 when not given and kept across
the call's retries. Failures raise `CustodyApiError` subclasses (custody.client.errors) carrying
`status`, `code` and `message`.

It imports httpx and pydantic only: nothing of the service (no SQLAlchemy, no ledger), so another
team installs the package and uses it against a running service.
"""
from __future__ import annotations

from custody.client import models
from custody.client._base import AsyncCore, SyncCore
from custody.client._methods import AsyncMethods, SyncMethods
from custody.client.errors import (
    ClientError,
    Conflict,
    CustodyApiError,
    CustodyConnectionError,
    Forbidden,
    InvalidRequest,
    NotFound,
    ServerError,
    ServiceUnavailable,
    Unauthorized,
)
from custody.client.types import Amount, Minor, Money


class CustodyClient(SyncMethods, SyncCore):
    """The blocking client: `CustodyClient(base_url, api_key, *, timeout=10.0, retries=3)`.

    `http=` takes an existing `httpx.Client` (e.g. FastAPI's TestClient for an in-process app); the
    client then does not close it."""


class AsyncCustodyClient(AsyncMethods, AsyncCore):
    """The awaitable client, same methods: `async with AsyncCustodyClient(base_url, api_key) as api:`."""


__all__ = ["Amount", "AsyncCustodyClient", "ClientError", "Conflict", "CustodyApiError", "CustodyClient",
           "CustodyConnectionError", "Forbidden", "InvalidRequest", "Minor", "Money", "NotFound", "ServerError",
           "ServiceUnavailable", "Unauthorized", "models"]
