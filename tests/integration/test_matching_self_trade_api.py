"""A self-trade over HTTP with a caller-chosen `stp_group` (issue 11, observation 12).

The backend places a resting ask for one account in group "g1", then a crossing bid for the SAME
account in group "g2". Before the fix the engine matched them (the groups differed), the ledger
refused the fill (`accounts_must_be_different`) and the market had to be rebuilt. Now the engine
prevents it: an account never trades with itself, whatever groups its orders carry; a group only
widens prevention (two accounts in one group do not trade either). No fill, no rebuild, and the
ledger verifies.
"""
from __future__ import annotations

import logging

from custody.auth import Role
from tests.integration.test_matching_api import api, call, market  # noqa: F401 - fixtures
from tests.integration.test_matching_support import USDT, fund

log = logging.getLogger(__name__)


def order(run: str, who: str, cid: str, side: str, **kw) -> dict:
    return {"account": f"{run}-{who}", "client_order_id": cid, "side": side, "qty": "0.1",
            "price": "60000", **kw}


def test_caller_chosen_groups_never_let_an_account_trade_with_itself(api, market, ledger):
    symbol, run = market
    client, _ = api
    trading = client.app.state.container.trading
    url = f"/v1/markets/{symbol}/orders"
    rebuilds = trading.rebuilds

    log.info("The seller (who also holds USDT) rests an ask in group g1")
    fund(ledger, run, f"{run}-seller", "USDT", 10_000 * USDT)
    ask = call(api, Role.backend, "POST", url, json=order(run, "seller", "s1", "sell", stp_group="g1"))
    assert ask.status_code == 201 and ask.json()["state"] == "working", ask.text

    log.info("The same account bids across it in group g2: prevented, not matched")
    bid = call(api, Role.backend, "POST", url, json=order(run, "seller", "s2", "buy", stp_group="g2"))
    assert bid.status_code == 201, bid.text
    assert (bid.json()["state"], bid.json()["reject_code"]) == ("rejected", "self_trade_prevented")
    fills = call(api, Role.auditor, "GET", f"/v1/markets/{symbol}/fills").json()["fills"]
    assert fills == []

    log.info("A bid with no group at all is prevented the same way")
    bid = call(api, Role.backend, "POST", url, json=order(run, "seller", "s3", "buy"))
    assert (bid.json()["state"], bid.json()["reject_code"]) == ("rejected", "self_trade_prevented")

    log.info("Another account in the ask's group g1 is prevented too (a group widens)")
    bid = call(api, Role.backend, "POST", url, json=order(run, "buyer", "b1", "buy", stp_group="g1"))
    assert (bid.json()["state"], bid.json()["reject_code"]) == ("rejected", "self_trade_prevented")

    log.info("The buyer in another group trades with the ask as usual")
    bid = call(api, Role.backend, "POST", url, json=order(run, "buyer", "b2", "buy", stp_group="g2"))
    assert bid.json()["state"] == "filled", bid.text
    fills = call(api, Role.auditor, "GET", f"/v1/markets/{symbol}/fills").json()["fills"]
    assert [(f["maker_account"], f["taker_account"]) for f in fills] == [(f"{run}-seller", f"{run}-buyer")]

    assert trading.rebuilds == rebuilds, "no command needed a market rebuild"
