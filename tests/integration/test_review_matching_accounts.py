"""Adversarial review of issue 11 (observations 2 and 12): matching finds a customer's account by a
name the backend can squat.

Matching opens each owner's account on first use as `customer:<owner>:<asset>` (open_account is
idempotent by name and raises `idempotency_conflict` when the name exists with another asset, kind
or owner). `POST /v1/accounts` lets the backend open any name in `customer:<owner>:...`, of any asset,
so it can open `customer:<seller>:USDT` as a *BTC* account before the seller's first sale. The
seller's USDT account is then needed only inside the fill, after the engine matched: the fill's
settlement fails with `idempotency_conflict` (409) for whoever crosses the seller's order: one
cheap ask with a squatted name blocks every buyer of the market at or above its price, for as
long as the ask rests (observation 12: a market is never blocked by a client's input).
"""
from __future__ import annotations

import logging

from custody.auth import Role
from regtest.util import assert_equal
from tests.integration.test_matching_api import api, call, market  # noqa: F401 - fixtures
from tests.integration.test_matching_support import USDT, fund

log = logging.getLogger(__name__)


def test_a_squatted_matching_account_name_does_not_block_a_market(api, market, ledger):  # noqa: F811
    symbol, run = market
    seller, buyer, other_buyer = f"{run}-seller", f"{run}-buyer", f"{run}-other-buyer"
    fund(ledger, run, other_buyer, "USDT", 100_000 * USDT)
    log.info("the attack: open the seller's future USDT account name as a BTC account, then offer cheap")
    squat = call(api, Role.backend, "POST", "/v1/accounts", json={
        "asset": "BTC", "kind": "customer", "owner": seller, "name": f"customer:{seller}:USDT"})
    log.info("squat -> %d %s", squat.status_code, squat.text[:120])
    base = f"/v1/markets/{symbol}"
    ask = call(api, Role.backend, "POST", f"{base}/orders", json={
        "account": seller, "client_order_id": "a1", "side": "sell", "qty": "0.2", "price": "59900"})
    assert ask.status_code == 201, ask.text
    answers = {}
    for who in (buyer, other_buyer):
        bid = call(api, Role.backend, "POST", f"{base}/orders", json={
            "account": who, "client_order_id": "b1", "side": "buy", "qty": "0.1", "price": "60000"})
        log.info("%s buys at or above the best ask -> %d %s", who, bid.status_code, bid.text[:160])
        answers[who] = (bid.status_code, bid.json().get("state") or bid.json()["error"]["code"])
    call(api, Role.backend, "POST", f"{base}/orders/{ask.json()['order_id']}/cancel", json={"account": seller})
    if squat.status_code >= 400:
        return  # the squat itself is refused: nothing to block
    log.info("every buyer crossing the poisoned ask is refused: nobody can buy at or above 59900")
    assert_equal(answers, {buyer: (201, "filled"), other_buyer: (201, "filled")})
