"""GET /v1/transactions/{id}: a journal transaction with its legs and metadata, and who may read it.

A backend posts a transfer between two customer accounts and reads it back: the idempotency key in
its namespace, the metadata it sent, one debit and one credit leg with signed amounts as
{value, minor}. A firm-only movement (a subsystem's transfer between firm accounts) answers a
backend `transaction_not_found`, exactly as an id that does not exist, while an auditor reads it
(custody.money_rules.may_read_transaction). The ledger is verified at the end.
"""
from __future__ import annotations

import logging
import uuid

from fastapi.testclient import TestClient

from custody.api.app import create_app
from custody.auth import Role, create_api_key
from custody.container import Container
from custody.settings import Settings
from ledger.model import AccountKind
from regtest.util import assert_equal

log = logging.getLogger(__name__)


def test_a_backend_reads_its_customers_transactions_and_not_the_firms(engine, ledger):
    settings = Settings(environment="test")
    run = uuid.uuid4().hex[:8]
    client = TestClient(create_app(Container(settings=settings, engine=engine, ledger=ledger)),
                        raise_server_exceptions=False)
    keys = {role: create_api_key(engine, f"txread-{role.value}-{run}", role, settings.api_key_pepper) for role in Role}

    def call(role, method, path, **kw):
        return client.request(method, path, headers={"X-API-Key": keys[role]}, **kw)

    asset = f"T{run[:6].upper()}"
    ledger.create_asset(asset, 8)
    alice = ledger.open_account(asset, AccountKind.customer, f"customer:{run}-alice:{asset}", owner=f"{run}-alice").id
    bob = ledger.open_account(asset, AccountKind.customer, f"customer:{run}-bob:{asset}", owner=f"{run}-bob").id
    pool = ledger.open_account(asset, AccountKind.asset_location, f"test:{run}:pool").id
    equity = ledger.open_account(asset, AccountKind.equity, f"test:{run}:equity").id
    ledger.transfer(f"test:{run}:deposit", pool, alice, 100_000_000, kind="deposit")
    firm_only = ledger.transfer(f"test:{run}:firm", equity, pool, 5_000, kind="test_funding").transaction_id

    log.info("the backend posts a transfer between two customers and reads it back")
    r = call(Role.backend, "POST", "/v1/transactions", json={
        "idempotency_key": "t1", "kind": "transfer", "metadata": {"trade": "42"},
        "transfers": [{"debit_account_id": alice, "credit_account_id": bob, "amount": "0.25"}]})
    assert_equal(r.status_code, 201)
    tid = r.json()["transaction_id"]
    r = call(Role.backend, "GET", f"/v1/transactions/{tid}")
    assert_equal(r.status_code, 200)
    t = r.json()
    assert_equal((t["id"], t["kind"], t["metadata"], t["idempotency_key"]),
                 (tid, "transfer", {"trade": "42"}, f"api:txread-backend-{run}:t1"))
    assert_equal([(e["account_id"], e["account_kind"], e["amount"]) for e in t["entries"]],
                 [(alice, "customer", {"value": "-0.25000000", "minor": "-25000000"}),
                  (bob, "customer", {"value": "0.25000000", "minor": "25000000"})])

    log.info("a firm-only movement is not the backend's to read; an auditor reads it")
    r = call(Role.backend, "GET", f"/v1/transactions/{firm_only}")
    assert_equal((r.status_code, r.json()["error"]["code"]), (404, "transaction_not_found"))
    r = call(Role.auditor, "GET", f"/v1/transactions/{firm_only}")
    assert_equal((r.status_code, [e["account_id"] for e in r.json()["entries"]]), (200, [equity, pool]))

    log.info("an id that does not exist answers the same code")
    r = call(Role.auditor, "GET", f"/v1/transactions/{2**62}")
    assert_equal((r.status_code, r.json()["error"]["code"]), (404, "transaction_not_found"))
