"""Orders over HTTP: roles, the error format, exact decimal conversion, a place / fill / cancel round trip."""
from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient

from custody.api.app import create_app
from custody.auth import Role, create_api_key
from custody.container import Container
from custody.settings import Settings
from tests.integration.test_matching_support import USDT, fund


@pytest.fixture(scope="module")
def api(engine):
    from ledger.service import Ledger

    settings = Settings(environment="test")
    container = Container(settings=settings, engine=engine, ledger=Ledger(engine))
    run = uuid.uuid4().hex[:8]
    keys = {role: create_api_key(engine, f"mtest-{role.value}-{run}", role, settings.api_key_pepper) for role in Role}
    return TestClient(create_app(container), raise_server_exceptions=False), keys


def call(api, role, method, path, **kw):
    client, keys = api
    return client.request(method, path, headers={"X-API-Key": keys[role]} if role else {}, **kw)


def code_of(r) -> str:
    body = r.json()
    assert set(body) == {"error"} and body["error"]["message"], body
    return body["error"]["code"]


@pytest.fixture()
def market(api, ledger):
    ledger.create_asset("BTC", 8)
    ledger.create_asset("USDT", 6)
    run = uuid.uuid4().hex[:8]
    body = {"symbol": f"BTC-USDT-{run}", "base_asset": "BTC", "quote_asset": "USDT", "lot_size": 10_000,
            "quote_per_tick_lot": 1, "min_notional": 1_000_000,
            "fees": {"default": {"maker_ppm": 1_000, "taker_ppm": 2_000}}}
    r = call(api, Role.backend, "POST", "/v1/markets", json=body)
    assert r.status_code == 403 and code_of(r) == "forbidden"
    r = call(api, Role.admin, "POST", "/v1/markets", json=body)
    assert r.status_code == 201, r.text
    for name in ("seller", "buyer"):
        fund(ledger, run, f"{run}-{name}", "BTC" if name == "seller" else "USDT",
             100_000_000 if name == "seller" else 100_000 * USDT)
    return body["symbol"], run


def test_place_fill_cancel_round_trip_in_decimal_strings(api, market, ledger):
    symbol, run = market
    base = f"/v1/markets/{symbol}"
    ask = call(api, Role.backend, "POST", f"{base}/orders", json={
        "account": f"{run}-seller", "client_order_id": "a1", "side": "sell", "qty": "0.2", "price": "59900"})
    assert ask.status_code == 201, ask.text
    assert ask.json()["state"] == "working" and ask.json()["qty_lots"] == 2_000
    assert ask.json()["price_ticks"] == 5_990_000 and ask.json()["price"] == "59900.000000"

    depth = call(api, Role.auditor, "GET", f"{base}/depth").json()
    assert depth["asks"] == [{"price": "59900.000000", "price_ticks": 5_990_000, "qty": "0.20000000", "qty_lots": 2_000}]
    assert depth["seq"] == 1

    order = {"account": f"{run}-buyer", "client_order_id": "b1", "side": "buy", "qty": "0.5", "price": "60000"}
    bid = call(api, Role.backend, "POST", f"{base}/orders", json=order)
    assert bid.status_code == 201 and bid.json()["state"] == "partially_filled", bid.text
    assert bid.json()["filled"] == "0.20000000" and bid.json()["quote_traded"] == "11980.000000"
    again = call(api, Role.backend, "POST", f"{base}/orders", json=order)
    assert again.status_code == 200 and again.json()["order_id"] == bid.json()["order_id"]

    by_client = call(api, Role.operator, "GET", f"{base}/orders",
                     params={"account": f"{run}-buyer", "client_order_id": "b1"})
    assert by_client.status_code == 200 and by_client.json()["order_id"] == bid.json()["order_id"]
    fills = call(api, Role.backend, "GET", f"{base}/fills", params={"order_id": bid.json()["order_id"]}).json()
    assert [(f["qty"], f["price"], f["taker_fee"]) for f in fills["fills"]] == [("0.20000000", "59900.000000", "23.960000")]

    # the same figures in the one amount format, {value, minor}, beside the older fields
    assert bid.json()["amounts"] == {
        "qty": {"value": "0.50000000", "minor": "50000000"}, "filled": {"value": "0.20000000", "minor": "20000000"},
        "remaining": {"value": "0.30000000", "minor": "30000000"}, "price": {"value": "60000.000000", "minor": "60000000000"},
        "quote_traded": {"value": "11980.000000", "minor": "11980000000"}, "fees_paid": {"value": "23.960000", "minor": "23960000"}}
    [fill] = fills["fills"]
    assert fill["amounts"] == {
        "qty": {"value": "0.20000000", "minor": "20000000"}, "price": {"value": "59900.000000", "minor": "59900000000"},
        "quote_amount": {"value": "11980.000000", "minor": "11980000000"},
        "maker_fee": {"value": "11.980000", "minor": "11980000"}, "taker_fee": {"value": "23.960000", "minor": "23960000"}}
    assert fills["next_after"] is None and fills["next_cursor"] is None

    oid = bid.json()["order_id"]
    cancel = call(api, Role.backend, "POST", f"{base}/orders/{oid}/cancel", json={"account": f"{run}-buyer"})
    assert cancel.status_code == 200 and cancel.json()["state"] == "cancelled"
    again = call(api, Role.backend, "POST", f"{base}/orders/{oid}/cancel", json={"account": f"{run}-buyer"})
    assert again.status_code == 409 and code_of(again) == "order_not_open"
    got = call(api, Role.auditor, "GET", f"{base}/orders/{oid}")
    assert got.status_code == 200 and got.json()["close_reason"] == "cancelled_by_owner"


def test_amounts_must_be_exact_multiples_of_lot_and_tick(api, market):
    symbol, run = market
    url = f"/v1/markets/{symbol}/orders"
    base = {"account": f"{run}-buyer", "side": "buy"}
    r = call(api, Role.backend, "POST", url, json={**base, "client_order_id": "x1", "qty": "0.00001", "price": "100"})
    assert r.status_code == 422 and code_of(r) == "invalid_quantity"
    r = call(api, Role.backend, "POST", url, json={**base, "client_order_id": "x2", "qty": "1", "price": "100.001"})
    assert r.status_code == 422 and code_of(r) == "invalid_price"
    r = call(api, Role.backend, "POST", url, json={**base, "client_order_id": "x3", "qty": "1e-1", "price": "100"})
    assert r.status_code == 422 and code_of(r) == "invalid_quantity"
    r = call(api, Role.backend, "POST", url, json={**base, "client_order_id": "x4", "qty": "1", "price": 100})
    assert r.status_code == 422 and code_of(r) == "invalid_request"


def test_roles_and_unknown_things(api, market):
    symbol, run = market
    body = {"account": f"{run}-buyer", "client_order_id": "r1", "side": "buy", "qty": "1", "price": "100"}
    r = call(api, Role.auditor, "POST", f"/v1/markets/{symbol}/orders", json=body)
    assert r.status_code == 403 and code_of(r) == "forbidden"
    r = call(api, None, "GET", f"/v1/markets/{symbol}/depth")
    assert r.status_code == 401 and code_of(r) == "unauthorized"
    r = call(api, Role.backend, "POST", "/v1/markets/NOPE/orders", json=body)
    assert r.status_code == 404 and code_of(r) == "market_not_found"
    r = call(api, Role.backend, "GET", f"/v1/markets/{symbol}/orders/not-an-order")
    assert r.status_code == 404 and code_of(r) == "order_not_found"
    poor = {**body, "client_order_id": "r2", "qty": "1000"}
    r = call(api, Role.backend, "POST", f"/v1/markets/{symbol}/orders", json=poor)
    assert r.status_code == 201 and r.json()["state"] == "rejected" and r.json()["reject_code"] == "insufficient_funds"


def test_api_starts_without_any_market(engine):
    from ledger.service import Ledger

    container = Container(settings=Settings(environment="test"), engine=engine, ledger=Ledger(engine))
    client = TestClient(create_app(container))
    assert client.get("/health").status_code == 200
