"""The ledger over HTTP: roles, the error format, decimal strings at the edge, idempotent replays."""
from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient

from custody.api.app import create_app
from custody.auth import Role, create_api_key
from custody.container import Container
from custody.settings import Settings


@pytest.fixture(scope="module")
def api(engine, database_url):
    from ledger.service import Ledger

    settings = Settings(environment="test")
    container = Container(settings=settings, engine=engine, ledger=Ledger(engine))
    run = uuid.uuid4().hex[:8]
    keys = {role: create_api_key(engine, f"test-{role.value}-{run}", role, settings.api_key_pepper) for role in Role}
    client = TestClient(create_app(container), raise_server_exceptions=False)
    return client, keys, run


def call(api, role, method, path, **kw):
    client, keys, _ = api
    headers = {"X-API-Key": keys[role]} if role else {}
    return client.request(method, path, headers=headers, **kw)


def error_code(response) -> str:
    body = response.json()
    assert set(body) == {"error"}, body
    assert body["error"]["message"], body
    return body["error"]["code"]


def open_customer(api, run, who):
    owner = f"{run}-{who}"
    r = call(api, Role.backend, "POST", "/v1/accounts",
             json={"asset": "BTC", "kind": "customer", "name": f"customer:{owner}:BTC", "owner": owner})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def open_pair(api, ledger, *, fund: int = 0):
    """Two customer accounts opened over the API; `fund` minor units credited to the first by a
    subsystem (as custody credits a deposit: the API can never debit a firm account)."""
    run = uuid.uuid4().hex[:8]
    ledger.create_asset("BTC", 8)
    alice, bob = open_customer(api, run, "alice"), open_customer(api, run, "bob")
    if fund:
        pool = ledger.open_account("BTC", "asset_location", f"test:{run}:pool").id
        ledger.transfer(f"test:{run}:deposit", pool, alice, fund, kind="deposit")
    return alice, bob, run


def test_missing_or_unknown_key_is_401(api, ledger):
    r = call(api, None, "GET", "/v1/assets")
    assert r.status_code == 401 and error_code(r) == "unauthorized"
    client, _, _ = api
    r = client.get("/v1/assets", headers={"X-API-Key": "csk_not-a-key"})
    assert r.status_code == 401 and error_code(r) == "unauthorized"


@pytest.mark.parametrize(
    "role, method, path, allowed",
    [
        (Role.auditor, "POST", "/v1/transactions", False),
        (Role.operator, "POST", "/v1/holds", False),
        (Role.backend, "GET", "/v1/verify", False),
        (Role.backend, "POST", "/v1/assets", False),
        (Role.auditor, "GET", "/v1/verify", True),
        (Role.operator, "GET", "/v1/totals", True),
        (Role.admin, "GET", "/v1/verify", True),
    ],
)
def test_every_route_checks_its_role(api, ledger, role, method, path, allowed):
    r = call(api, role, method, path, json={} if method == "POST" else None)
    if allowed:
        assert r.status_code == 200, r.text
    else:
        assert r.status_code == 403 and error_code(r) == "forbidden"


def test_transfer_in_decimal_strings_and_replay(api, ledger):
    alice, bob, run = open_pair(api, ledger, fund=200_000_000)
    body = {"idempotency_key": f"api:{run}:dep", "kind": "transfer",
            "transfers": [{"debit_account_id": alice, "credit_account_id": bob, "amount": "1.5"}]}
    first = call(api, Role.backend, "POST", "/v1/transactions", json=body)
    assert first.status_code == 201 and first.json()["created"] is True
    replay = call(api, Role.backend, "POST", "/v1/transactions", json=body)
    assert replay.status_code == 200 and replay.json() == {**first.json(), "created": False}
    bal = call(api, Role.auditor, "GET", f"/v1/accounts/{bob}/balance").json()
    assert bal["posted"] == {"value": "1.50000000", "minor": "150000000"}
    conflict = call(api, Role.backend, "POST", "/v1/transactions",
                    json={**body, "transfers": [{**body["transfers"][0], "amount": "2"}]})
    assert conflict.status_code == 409 and error_code(conflict) == "idempotency_conflict"


@pytest.mark.parametrize(
    "amount, code",
    [("0.000000001", "excess_precision"), ("-1", "invalid_amount"), ("1e3", "invalid_amount"),
     ("0", "invalid_amount"), ("abc", "invalid_amount")],
)
def test_bad_amounts_are_4xx_with_a_code(api, ledger, amount, code):
    alice, bob, run = open_pair(api, ledger)
    r = call(api, Role.backend, "POST", "/v1/transactions", json={
        "idempotency_key": f"api:{run}:bad", "transfers": [{"debit_account_id": alice, "credit_account_id": bob, "amount": amount}]})
    assert r.status_code == 422 and error_code(r) == code


@pytest.mark.parametrize(
    "body",
    [{}, {"idempotency_key": "x", "transfers": []}, {"idempotency_key": "x", "transfers": [{"debit_account_id": "a"}]},
     {"idempotency_key": "x", "transfers": [{"debit_account_id": 1, "credit_account_id": 2, "amount": 5}]}],
)
def test_malformed_requests_are_422_never_500(api, ledger, body):
    r = call(api, Role.backend, "POST", "/v1/transactions", json=body)
    assert r.status_code == 422 and error_code(r) == "invalid_request"


def test_insufficient_funds_and_unknown_account(api, ledger):
    alice, bob, run = open_pair(api, ledger)
    r = call(api, Role.backend, "POST", "/v1/transactions", json={
        "idempotency_key": f"api:{run}:over", "transfers": [{"debit_account_id": alice, "credit_account_id": bob, "amount": "1"}]})
    assert r.status_code == 409 and error_code(r) == "insufficient_funds"
    r = call(api, Role.backend, "GET", "/v1/accounts/999999999/balance")
    assert r.status_code == 404 and error_code(r) == "account_not_found"


def test_hold_capture_release_only_by_owner(api, ledger):
    alice, pool, run = open_pair(api, ledger, fund=100_000_000)
    hold = call(api, Role.backend, "POST", "/v1/holds", json={
        "idempotency_key": f"api:{run}:h", "account_id": alice, "amount": "0.4", "reference": "w1"})
    assert hold.status_code == 201, hold.text
    hid = hold.json()["id"]
    other = call(api, Role.admin, "POST", f"/v1/holds/{hid}/release")
    assert other.status_code == 403 and error_code(other) == "hold_owner_mismatch"
    cap = call(api, Role.backend, "POST", f"/v1/holds/{hid}/capture", json={
        "idempotency_key": f"api:{run}:cap", "final": True, "transfers": [{"credit_account_id": pool, "amount": "0.25"}]})
    assert cap.status_code == 201, cap.text
    h = call(api, Role.backend, "GET", f"/v1/holds/{hid}").json()
    assert (h["state"], h["captured"]["value"], h["released"]["value"]) == ("released", "0.25000000", "0.15000000")
    bal = call(api, Role.backend, "GET", f"/v1/accounts/{alice}/balance").json()
    assert (bal["posted"]["value"], bal["held"]["value"], bal["available"]["value"]) == ("0.75000000", "0.00000000", "0.75000000")
    stmt = call(api, Role.backend, "GET", f"/v1/accounts/{alice}/statement", params={"limit": 1}).json()
    assert len(stmt["lines"]) == 1 and stmt["next_after"] is not None
    again = call(api, Role.backend, "GET", f"/v1/accounts/{alice}/statement", params={"after": stmt["next_after"]}).json()
    assert [l["balance_after"]["value"] for l in again["lines"]] == ["0.75000000"]


def test_totals_and_verify(api, ledger):
    totals = call(api, Role.auditor, "GET", "/v1/totals").json()
    assert totals and all(v["minor"] == "0" for v in totals.values())
    v = call(api, Role.auditor, "GET", "/v1/verify").json()
    assert v["ok"] is True and {c["name"] for c in v["checks"]} >= {"transactions_balanced", "totals_zero"}


def test_unknown_route_is_json_404(api):
    r = call(api, Role.admin, "GET", "/v1/nope")
    assert r.status_code == 404 and error_code(r) == "not_found"


def test_settings_refuse_default_secrets_in_production():
    with pytest.raises(ValueError, match="API_KEY_PEPPER"):
        Settings(environment="production", database_url="postgresql://x@y/z")
    assert Settings(environment="production", database_url="postgresql://x@y/z", api_key_pepper="p" * 40)


def test_console_page_is_served_and_uses_the_api(api):
    """The console is served with its script, which uses the API with its session (no API key:
    tests/integration/test_console_sessions.py, tests/integration/test_console_browser.py)."""
    client, _, _ = api
    r = client.get("/console")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "Custody console" in r.text and "/console/assets/console.js" in r.text
    script = client.get("/console/assets/console.js").text
    assert "/console/api/queue" in script and "/v1/withdrawals/${w.id}/approve" in script and "X-API-Key" not in script
    assert "/v1/reconciliation" in script and "/v1/verify" in script


@pytest.mark.parametrize("error, status, code", [
    ("DeadlockDetected", 503, "temporarily_unavailable"),
    ("SerializationFailure", 503, "temporarily_unavailable"),
    ("LockNotAvailable", 503, "temporarily_unavailable"),
    ("AdminShutdown", 503, "temporarily_unavailable"),
    # no SQLSTATE: libpq could not connect ("the database system is shutting down", connection
    # refused: a PostgreSQL restart, found by bench/soak.py), so nothing was sent at all
    ("OperationalError", 503, "temporarily_unavailable"),
    ("UniqueViolation", 409, "conflict"),
    ("NumericValueOutOfRange", 422, "invalid_request"),
    ("UndefinedTable", 500, "internal_error"),
])
def test_a_transient_database_failure_is_503_and_the_retry_posts_once(api, ledger, monkeypatch, error, status, code):
    """A deadlock victim, serialization failure, lock timeout or lost server rolled the request back:
    503 with Retry-After, and the same request (same idempotency key) then posts exactly once. A
    duplicate row is 409 `conflict`, a refused value 422 `invalid_request` (custody/api/errors.py);
    any other database error stays a 500 without details."""
    import psycopg
    from sqlalchemy.exc import DBAPIError

    from ledger.service import Ledger

    pool, alice, run = open_pair(api, ledger, fund=100_000_000)
    body = {"idempotency_key": f"api:{run}:retry", "kind": "transfer",
            "transfers": [{"debit_account_id": pool, "credit_account_id": alice, "amount": "0.5"}]}
    original = Ledger.post

    def fails(self, *args, **kw):
        raise DBAPIError.instance("SELECT ledger_post(...)", None, getattr(psycopg.errors, error)("injected"), psycopg.Error)

    monkeypatch.setattr(Ledger, "post", fails)
    r = call(api, Role.backend, "POST", "/v1/transactions", json=body)
    assert r.status_code == status and error_code(r) == code
    assert ("Retry-After" in r.headers) == (status == 503)
    assert "injected" not in r.text and "Traceback" not in r.text
    monkeypatch.setattr(Ledger, "post", original)
    again = call(api, Role.backend, "POST", "/v1/transactions", json=body)
    assert again.status_code == 201 and again.json()["created"] is True
    bal = call(api, Role.auditor, "GET", f"/v1/accounts/{alice}/balance").json()
    assert bal["posted"]["minor"] == "50000000"
