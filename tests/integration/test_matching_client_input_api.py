"""No client input leaves a market needing a rebuild (issue 11, observation 12).

Anything the ledger could refuse for a fill is refused or decided before the engine commits to
it; before the fix each of these was matched or journaled first, failed the unit of work (500 or
the ledger's 4xx) and forced a market rebuild:
- text PostgreSQL cannot store (a NUL character) in a client order id, an STP group, an account
  or an order id: refused `invalid_request` before it reaches the ledger or the journal;
- the account a fill would credit was closed after the order rested (an admin closed the buyer's
  empty BTC account): the resting bid is cancelled first (`account_closed`, its hold released)
  and the crossing ask rests instead of trading;
- the account a fill would credit is the incoming order's own and closed: refused `account_closed`;
- that account's name (or the name of the account an order holds from) was taken by another
  owner before the trader's first trade: refused `idempotency_conflict` at placement, not at the
  fill, and in a group commit only that order is refused;
- the market's fee income account was closed: a crossing order is refused `account_closed`.
Each step checks that no rebuild happened; the ledger fixture verifies the books at the end.
"""
from __future__ import annotations

import logging

from custody.auth import Role
from ledger.model import AccountKind
from matching.model import Place, Side
from matching.service import order_id_for
from matching.settlement import customer_account_name
from tests.integration.test_matching_api import api, call, code_of, market  # noqa: F401 - fixtures
from tests.integration.test_matching_support import USDT, fund

log = logging.getLogger(__name__)


def order(run: str, who: str, cid: str, side: str, **kw) -> dict:
    return {"account": f"{run}-{who}", "client_order_id": cid, "side": side, "qty": "0.1",
            "price": "60000", **kw}


def test_unstorable_text_is_refused_before_the_ledger_or_the_journal(api, market):
    symbol, run = market
    client, _ = api
    url = f"/v1/markets/{symbol}/orders"
    call(api, Role.auditor, "GET", f"/v1/markets/{symbol}/depth")
    trading = client.app.state.container.trading
    rebuilds = trading.rebuilds
    for body in (order(run, "buyer", "n\x001", "buy"), order(run, "buyer", "n2", "buy", stp_group="g\x00"),
                 order(run, "buy\x00er", "n3", "buy")):
        r = call(api, Role.backend, "POST", url, json=body)
        assert (r.status_code, code_of(r)) == (422, "invalid_request"), (body, r.text)
    r = call(api, Role.backend, "POST", f"{url}/x%00y/cancel", json={"account": f"{run}-buyer"})
    assert r.status_code == 422, r.text
    r = call(api, Role.backend, "POST", f"{url}/x%00y/amend", json={"account": f"{run}-buyer", "price": "1"})
    assert r.status_code == 422, r.text
    assert call(api, Role.backend, "POST", url, json=order(run, "buyer", "n4", "buy")).status_code == 201
    assert trading.rebuilds == rebuilds


def test_a_resting_order_whose_owner_cannot_be_paid_is_cancelled_before_a_trade(api, market, ledger):
    symbol, run = market
    client, _ = api
    url = f"/v1/markets/{symbol}/orders"
    call(api, Role.auditor, "GET", f"/v1/markets/{symbol}/depth")
    trading = client.app.state.container.trading
    rebuilds = trading.rebuilds

    log.info("The buyer's BTC account exists, empty; the buyer rests a bid")
    btc = ledger.open_account("BTC", AccountKind.customer, customer_account_name(f"{run}-buyer", "BTC"),
                              owner=f"{run}-buyer")
    bid = call(api, Role.backend, "POST", url, json=order(run, "buyer", "b1", "buy"))
    assert bid.status_code == 201 and bid.json()["state"] == "working", bid.text

    log.info("An admin closes that BTC account; a seller then crosses the bid")
    r = call(api, Role.admin, "POST", f"/v1/accounts/{btc.id}/close")
    assert r.status_code == 200, r.text
    ask = call(api, Role.backend, "POST", url, json=order(run, "seller", "s1", "sell"))
    assert ask.status_code == 201, ask.text
    assert ask.json()["state"] == "working" and ask.json()["filled_lots"] == 0

    got = call(api, Role.auditor, "GET", f"/v1/markets/{symbol}/orders/{bid.json()['order_id']}").json()
    assert (got["state"], got["close_reason"]) == ("cancelled", "account_closed")
    assert call(api, Role.auditor, "GET", f"/v1/markets/{symbol}/fills").json()["fills"] == []
    usdt = ledger.account_by_name(customer_account_name(f"{run}-buyer", "USDT"))
    assert ledger.balance(usdt.id).held == 0  # the bid's hold was released

    log.info("The buyer's next bid is refused at once: a fill could not pay it")
    r = call(api, Role.backend, "POST", url, json=order(run, "buyer", "b2", "buy"))
    assert (r.status_code, code_of(r)) == (409, "account_closed"), r.text
    assert trading.rebuilds == rebuilds


def test_an_account_name_taken_by_another_owner_refuses_the_order_at_placement(api, market, ledger):
    symbol, run = market
    client, _ = api
    url = f"/v1/markets/{symbol}/orders"
    call(api, Role.auditor, "GET", f"/v1/markets/{symbol}/depth")
    trading = client.app.state.container.trading
    rebuilds = trading.rebuilds
    fund(ledger, run, f"{run}-third", "USDT", 100_000 * USDT)

    log.info("Someone opened customer:<third>:BTC for another owner before the third's first trade")
    ledger.open_account("BTC", AccountKind.customer, customer_account_name(f"{run}-third", "BTC"),
                        owner=f"{run}-squatter")
    r = call(api, Role.backend, "POST", url, json=order(run, "third", "t1", "buy"))
    assert (r.status_code, code_of(r)) == (409, "idempotency_conflict"), r.text
    ask = call(api, Role.backend, "POST", url, json=order(run, "seller", "s1", "sell"))
    assert ask.status_code == 201 and ask.json()["state"] == "working", ask.text

    log.info("The same for the account an order holds from, in a group commit of two orders")
    ledger.open_account("USDT", AccountKind.customer, customer_account_name(f"{run}-fourth", "USDT"),
                        owner=f"{run}-squatter")
    def place(who: str, cid: str) -> Place:
        owner = f"{run}-{who}"
        return Place(order_id_for(symbol, owner, cid), owner, cid, Side.buy, qty=1_000, price=5_000_000)

    outcomes = trading.submit_batch(symbol, [place("fourth", "f1"), place("buyer", "b1")])
    assert [o.code for o in outcomes] == ["idempotency_conflict", None]
    assert trading.rebuilds == rebuilds


def test_a_closed_fee_account_refuses_crossing_orders(api, market, ledger):
    symbol, run = market
    client, _ = api
    url = f"/v1/markets/{symbol}/orders"
    markets = {m["symbol"]: m for m in call(api, Role.auditor, "GET", "/v1/markets").json()}
    trading = client.app.state.container.trading
    rebuilds = trading.rebuilds
    ask = call(api, Role.backend, "POST", url, json=order(run, "seller", "s1", "sell"))
    assert ask.status_code == 201, ask.text

    log.info("The API refuses to close the market's fee account (a firm account); closed anyway underneath "
             "(a database writer), a bid crosses the ask")
    fee_account = markets[symbol]["fee_account_id"]
    r = call(api, Role.admin, "POST", f"/v1/accounts/{fee_account}/close")
    assert (r.status_code, code_of(r)) == (403, "kind_not_permitted"), r.text
    ledger.close_account(fee_account)
    r = call(api, Role.backend, "POST", url, json=order(run, "buyer", "b1", "buy"))
    assert (r.status_code, code_of(r)) == (409, "account_closed"), r.text
    r = call(api, Role.backend, "POST", url, json=order(run, "buyer", "b2", "buy", price="50000"))
    assert r.status_code == 201 and r.json()["state"] == "working", r.text  # not crossing: rests
    assert trading.rebuilds == rebuilds


def test_an_amend_that_would_trade_is_refused_when_its_owner_cannot_be_paid(api, market, ledger):
    symbol, run = market
    client, _ = api
    url = f"/v1/markets/{symbol}/orders"
    call(api, Role.auditor, "GET", f"/v1/markets/{symbol}/depth")
    trading = client.app.state.container.trading
    rebuilds = trading.rebuilds
    btc = ledger.open_account("BTC", AccountKind.customer, customer_account_name(f"{run}-buyer", "BTC"),
                              owner=f"{run}-buyer")
    bid = call(api, Role.backend, "POST", url, json=order(run, "buyer", "b1", "buy", price="50000"))
    ask = call(api, Role.backend, "POST", url, json=order(run, "seller", "s1", "sell"))
    assert bid.json()["state"] == ask.json()["state"] == "working"

    log.info("The buyer's BTC account is closed; the bid is amended to cross the ask")
    assert call(api, Role.admin, "POST", f"/v1/accounts/{btc.id}/close").status_code == 200
    r = call(api, Role.backend, "POST", f"{url}/{bid.json()['order_id']}/amend",
             json={"account": f"{run}-buyer", "price": "60000"})
    assert (r.status_code, code_of(r)) == (409, "account_closed"), r.text
    r = call(api, Role.backend, "POST", f"{url}/{bid.json()['order_id']}/amend",
             json={"account": f"{run}-buyer", "price": "51000"})
    assert r.status_code == 200 and r.json()["price"] == "51000.000000", r.text  # not crossing
    assert call(api, Role.auditor, "GET", f"/v1/markets/{symbol}/fills").json()["fills"] == []
    assert trading.rebuilds == rebuilds


def test_queries_and_market_creation_with_unstorable_input_answer_4xx(api, market):
    symbol, run = market
    base = f"/v1/markets/{symbol}"
    # Text PostgreSQL cannot store is refused at the door (custody/api/text_guard.py) before the
    # matching service sees it; matching's own checks answer the same way behind it.
    r = call(api, Role.auditor, "GET", f"{base}/orders/x%00y")
    assert (r.status_code, code_of(r)) == (422, "invalid_request")
    r = call(api, Role.auditor, "GET", f"{base}/orders", params={"account": "a\x00", "client_order_id": "c"})
    assert (r.status_code, code_of(r)) == (422, "invalid_request")
    for params in ({"order_id": "o\x00"}, {"account": "a\x00"}):
        r = call(api, Role.auditor, "GET", f"{base}/fills", params=params)
        assert (r.status_code, code_of(r)) == (422, "invalid_request"), r.text
    body = {"symbol": f"X-{run}", "base_asset": "BTC", "quote_asset": "USDT", "lot_size": 1,
            "quote_per_tick_lot": 1, "fees": {"default": {"maker_ppm": 1, "taker_ppm": 1}}}
    for change, code in (({"base_asset": "B\x00"}, "invalid_request"),
                         ({"fees": {"d\x00": {"maker_ppm": 1, "taker_ppm": 1}}}, "invalid_request"),
                         ({"quote_asset": "BTC"}, "market_assets_must_be_different"),
                         ({"lot_size": 10**80}, "invalid_request")):
        r = call(api, Role.admin, "POST", "/v1/markets", json={**body, **change})
        assert (r.status_code, code_of(r)) == (422, code), (change, r.text)
    r = call(api, Role.admin, "POST", "/v1/markets", json={**body, "base_asset": "NOPE"})
    assert (r.status_code, code_of(r)) == (404, "asset_not_found"), r.text
