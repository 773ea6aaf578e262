"""Review 4 of issue 11: holes in the newest fixes, each a failing test.

1. A `capture` resolution cancels the account owner's resting orders through matching *before*
   it checks that a capture fits the incident: on an incident whose deposit was re-mined (the
   shortfall reversed, the account no longer frozen) the capture is refused, yet the customer's
   orders are already cancelled.
2. A `capture` cancels every resting order (and releases every API hold) on the account even when
   what is available already covers the whole remainder (the rule just adopted for withdrawals,
   "only as many as the credit needs", is not applied here).
"""
from __future__ import annotations

import logging
import uuid

from custody.controls import set_kill_switch
from regtest.util import assert_equal
from tests.integration.test_review_deposit_boundaries import Chain, api, customer, refusal  # noqa: F401 - fixture

log = logging.getLogger(__name__)


def _market(api, ledger) -> str:
    ledger.create_asset("USDT", 6)
    symbol = f"BTC-USDT-{uuid.uuid4().hex[:8]}"
    api.admin.post("/v1/markets", json={"symbol": symbol, "base_asset": "BTC", "quote_asset": "USDT", "lot_size": 10_000,
                                        "quote_per_tick_lot": 1, "fees": {"default": {"maker_ppm": 0, "taker_ppm": 0}}}
                   ).raise_for_status()
    return symbol


def _resting_sell(api, symbol: str, owner: str, qty: str, coid: str) -> str:
    ask = api.backend.post(f"/v1/markets/{symbol}/orders", json={
        "account": owner, "client_order_id": coid, "side": "sell", "qty": qty, "price": "100000"})
    assert ask.status_code == 201 and ask.json()["state"] == "working", ask.text
    return ask.json()["order_id"]


def _cleanup(api) -> None:
    with api.custody.engine.begin() as c:
        set_kill_switch(c, False, "review test cleanup", "review-cleanup")


def test_a_refused_capture_does_not_cancel_a_no_longer_frozen_customers_orders(api, ledger):
    """The deposit is reorged out with the whole credit behind a resting order, then re-mined: the
    account is no longer frozen and a capture no longer fits (`incident_decision_invalid`). An
    operator asks for capture anyway: refused, as it must be, but the customer's resting order has
    already been cancelled by `_cancel_hiding_orders`, which runs before `resolution_plan`."""
    chain = Chain(api)
    alice = customer(api, "alice")
    owner = ledger.get_account(alice).owner
    symbol = _market(api, ledger)
    obs = chain.deposit(alice, 50_000_000)
    order_id = _resting_sell(api, symbol, owner, "0.5", "resting")
    chain.reorg_out(obs)
    chain.remine(obs, "b2")
    log.info("the deposit is back on chain; an operator resolves with capture")
    r = api.operator().post(f"/v1/incidents/{chain.incident(obs)}/resolve",
                            json={"comment": "capture, by mistake", "decision": "capture"})
    log.info("-> %d %s", r.status_code, r.text[:200])
    order = api.backend.get(f"/v1/markets/{symbol}/orders/{order_id}").json()
    log.info("the customer's order after the refused capture: %s", order["state"])
    _cleanup(api)
    assert_equal((refusal(r), order["state"]), ("incident_decision_invalid", "working"))
    chain.settle(obs, "release")


def test_a_capture_the_balance_covers_leaves_orders_and_api_holds_alone(api, ledger):
    """The reorged-out credit (0.5) was behind a resting order; the customer has since received
    another 1.0, so 1.0 is available, twice the remainder. The capture takes the remainder from
    what is available; nothing needs to be cancelled. Yet it cancels the customer's resting order
    (the same loop releases every API caller's pending hold, needed or not)."""
    chain = Chain(api)
    alice = customer(api, "alice")
    owner = ledger.get_account(alice).owner
    symbol = _market(api, ledger)
    obs = chain.deposit(alice, 50_000_000)
    order_id = _resting_sell(api, symbol, owner, "0.5", "resting")
    chain.reorg_out(obs)
    chain.deposit(alice, 100_000_000, block="b3")
    available = ledger.balance(alice).available
    log.info("available %d, remainder 50000000", available)
    assert available >= 50_000_000
    r = api.operator().post(f"/v1/incidents/{chain.incident(obs)}/resolve",
                            json={"comment": "recovered", "decision": "capture"})
    log.info("-> %d %s", r.status_code, r.text[:300])
    order = api.backend.get(f"/v1/markets/{symbol}/orders/{order_id}").json()
    _cleanup(api)
    assert_equal((r.status_code, order["state"]), (200, "working"))


def test_a_capture_the_balance_covers_leaves_the_backends_hold_alone(api, ledger):
    """The backend held the whole credit (0.5, a pending payment of the customer's) when it was
    reorged out; the customer has since received another 1.0, which covers the remainder. The
    capture takes the remainder from what is available; the backend's hold hides nothing that is
    needed. Yet the capture releases it (`released_holds`), so the backend's own capture of its
    pending payment then fails."""
    chain = Chain(api)
    alice = customer(api, "alice")
    obs = chain.deposit(alice, 50_000_000)
    hold = api.backend.post("/v1/holds", json={"idempotency_key": f"payment-{obs.txid}", "account_id": alice,
                                               "amount": "0.5", "reference": "payment"}).json()
    chain.reorg_out(obs)
    chain.deposit(alice, 100_000_000, block="b3")
    assert ledger.balance(alice).available >= 50_000_000
    r = api.operator().post(f"/v1/incidents/{chain.incident(obs)}/resolve",
                            json={"comment": "recovered", "decision": "capture"})
    log.info("-> %d %s", r.status_code, r.text[:300])
    _cleanup(api)
    released = [h["id"] for h in r.json()["resolution"].get("released_holds", [])] if r.status_code == 200 else None
    assert_equal((r.status_code, released, ledger.get_hold(hold["id"]).state.value), (200, [], "pending"))
