"""Adversarial review of issue 11 (observations 4 and 10): what the reorg freeze and quarantine
returns still let through, on the database without a node.

Each scenario books a deposit the way the pipeline does (an observation made final, then
`Deposits.credit`) on a chain of the test's own (so the e2e suites' reconciliation later in the same
session never sees its location), then drives the pipeline's own reorg, re-mine and return steps.
A reorg opens a critical incident, which engages the kill switch: each scenario resolves what it
opened and releases the switch, so the session's other tests are not halted.

- a reorged-out credit that the customer's own releasable hold (an API hold, an order) covered at
  the moment of the reorg is not frozen: the hold is released and the money moved away;
- a freeze captured to suspense stays in suspense when the deposit is re-mined: the customer pays
  for a loss that did not happen;
- a quarantine return that is rejected (by any operator, or by policy) strands the deposit in
  `returned`: it can be neither released nor returned again;
- a quarantined deposit reorged out after finality can still be released (or returned).

Each now holds: the part of the credit another hold hid from the freeze (the incident's
`remainder`) freezes the account for API debits, holds, captures and withdrawals
(`account_frozen`) until the incident is resolved or the deposit re-mined, and a capture takes it;
a re-mine gives back what was captured; a reorged-out deposit is refused with
`deposit_reorged_out`; a return that ends unpaid puts its deposit back to `quarantined`. The last
scenarios (below the line) pin the fixes' edges.
"""
from __future__ import annotations

import logging
import uuid

import pytest
from sqlalchemy import text

from chain_adapters.base import BlockRef, Observation
from custody.controls import set_kill_switch
from custody.incidents import Incidents
from regtest.util import assert_equal
from signer.keys import Secret, SignerKeys, seed_from_text
from tests.integration.withdrawal_api import DEST, WithdrawalApi

log = logging.getLogger(__name__)
SENDER = "bcrt1qk8tdfzpr0f5gknhjq97e96mjufr8a93au6auez"  # the depositor's address (not ours)


@pytest.fixture(scope="module")
def api(engine) -> WithdrawalApi:
    api = WithdrawalApi(engine)
    keys = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
    api.custody.wallets.register_wallet("bitcoin", "deposit", "regtest", keys.account_xpub("bitcoin", "deposit"))
    return api


class Chain:
    """Deposits on a chain of the test's own, booked by the pipeline's own steps."""

    def __init__(self, api: WithdrawalApi) -> None:
        self.api = api
        self.name = f"test{uuid.uuid4().hex[:8]}"
        self.deposits = api.custody.deposits

    def deposit(self, account_id: int, amount: int, *, block: str = "b1") -> Observation:
        """A final observation of `amount` to a deposit address of `account_id`, credited (or
        quarantined, when its sender is denylisted) by `Deposits.credit`."""
        address = self.api.custody.wallets.issue_address(uuid.uuid4().hex, account_id)
        obs = Observation("BTC", uuid.uuid4().hex, 0, address.address, amount, BlockRef(100, f"{block}-{self.name}"), (SENDER,))
        with self.api.custody.engine.begin() as c:
            c.execute(text("INSERT INTO deposit_observation (chain, asset, txid, output_index, address, senders, amount, "
                           "block_hash, block_height, confirmations, state, deposit_address_id, account_id) "
                           "VALUES (:ch, 'BTC', :t, 0, :a, :s, :amt, :h, 100, 6, 'final', :d, :acc)"),
                      {"ch": self.name, "t": obs.txid, "a": obs.address, "s": [SENDER], "amt": amount,
                       "h": obs.block.hash, "d": address.id, "acc": account_id})
        self.deposits.credit(self.name)
        return obs

    def reorg_out(self, obs: Observation) -> None:
        with self.api.custody.engine.begin() as c:
            assert_equal(self.deposits._orphan(c, self.name, obs), "incident")

    def remine(self, obs: Observation, block: str) -> None:
        with self.api.custody.engine.begin() as c:
            row = c.execute(text("SELECT * FROM deposit_observation WHERE chain = :c AND txid = :t"),
                            {"c": self.name, "t": obs.txid}).one()
            self.deposits._remined_after_deep_reorg(c, row, Observation(
                obs.asset, obs.txid, obs.index, obs.address, obs.amount, BlockRef(101, f"{block}-{self.name}"), obs.senders))

    def observation_id(self, obs: Observation) -> int:
        with self.api.custody.engine.connect() as c:
            return c.execute(text("SELECT id FROM deposit_observation WHERE chain = :c AND txid = :t"),
                             {"c": self.name, "t": obs.txid}).scalar_one()

    def incident(self, obs: Observation) -> int:
        with self.api.custody.engine.connect() as c:
            return c.execute(text("SELECT id FROM incident WHERE kind = 'deposit_reorged_after_finality' "
                                  "AND (detail->>'observation_id')::bigint = :o ORDER BY id DESC LIMIT 1"),
                             {"o": self.observation_id(obs)}).scalar_one()

    def settle(self, obs: Observation, decision: str | None) -> None:
        """Resolve the reorg's incident (if still open) and release the kill switch it engaged."""
        incidents = Incidents(self.api.custody.engine, self.api.custody.ledger)
        incident = incidents.resolve(self.incident(obs), operator="review-cleanup", comment="test cleanup", decision=decision) \
            if not self._resolved(obs) else None
        with self.api.custody.engine.begin() as c:
            set_kill_switch(c, False, "review test cleanup", "review-cleanup")
        return incident

    def _resolved(self, obs: Observation) -> bool:
        with self.api.custody.engine.connect() as c:
            return c.execute(text("SELECT resolved_at IS NOT NULL FROM incident WHERE id = :i"),
                             {"i": self.incident(obs)}).scalar_one()


def customer(api: WithdrawalApi, who: str) -> int:
    owner = f"{who}-{uuid.uuid4().hex[:8]}"
    r = api.backend.post("/v1/accounts", json={"asset": "BTC", "kind": "customer", "owner": owner,
                                               "name": f"customer:{owner}:BTC"})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def btc_usdt_market(api: WithdrawalApi, ledger) -> str:
    """A BTC-USDT market of the test's own (no fees), created by an admin; its symbol."""
    ledger.create_asset("USDT", 6)
    symbol = f"BTC-USDT-{uuid.uuid4().hex[:8]}"
    r = api.admin.post("/v1/markets", json={"symbol": symbol, "base_asset": "BTC", "quote_asset": "USDT",
                                            "lot_size": 10_000, "quote_per_tick_lot": 1,
                                            "fees": {"default": {"maker_ppm": 0, "taker_ppm": 0}}})
    assert r.status_code == 201, r.text
    return symbol


def refusal(r) -> str | None:
    return r.json().get("error", {}).get("code") if r.status_code >= 400 else None


def test_a_reorged_out_credit_covered_by_a_releasable_hold_is_not_frozen(api, ledger):
    """The freeze holds min(credit, available): a hold the backend placed before the reorg (an
    order's, a pending transfer's) makes `available` 0, so nothing is frozen; the backend then
    releases its own hold and moves the whole credit to another customer."""
    chain = Chain(api)
    mallory, accomplice = customer(api, "mallory"), customer(api, "accomplice")
    obs = chain.deposit(mallory, 50_000_000)
    assert_equal(ledger.balance(mallory).available, 50_000_000)
    log.info("the backend holds the whole credit (an open order, say); then the deposit is reorged out")
    hold = api.backend.post("/v1/holds", json={"idempotency_key": f"order-{obs.txid}", "account_id": mallory,
                                               "amount": "0.5", "reference": "order"}).json()
    chain.reorg_out(obs)
    frozen = ledger.balance(mallory).held - 50_000_000
    log.info("custody froze %d of the reorged-out 0.5 BTC", frozen)
    log.info("the attack: release the backend's own hold and move the credit to another customer")
    assert_equal(api.backend.post(f"/v1/holds/{hold['id']}/release").status_code, 200)
    r = api.backend.post("/v1/transactions", json={"idempotency_key": f"away-{obs.txid}", "transfers": [
        {"debit_account_id": mallory, "credit_account_id": accomplice, "amount": "0.5"}]})
    log.info("-> %d %s", r.status_code, r.text[:120])
    moved = ledger.balance(accomplice).posted
    log.info("nor hold it again, nor (the kill switch released by an admin, the incident still open) withdraw it")
    again = api.backend.post("/v1/holds", json={"idempotency_key": f"again-{obs.txid}", "account_id": mallory,
                                                "amount": "0.5", "reference": "order"})
    with api.custody.engine.begin() as c:
        set_kill_switch(c, False, "review test: switch released before the incident is resolved", "review-admin")
    out = api.backend.post("/v1/withdrawals", json={"client_withdrawal_id": f"out-{obs.txid}", "account_id": mallory,
                                                    "amount": "0.4", "destination": DEST})
    log.info("the operator captures the remainder to suspense: the books recover the whole credit")
    suspense = api.custody.wallets.firm_account("suspense", "BTC")
    suspense_before = ledger.balance(suspense).posted
    with api.custody.engine.connect() as c:
        held = c.execute(text("SELECT detail->'hold' FROM incident WHERE id = :i"), {"i": chain.incident(obs)}).scalar_one()
    resolution = chain.settle(obs, "capture" if held["id"] or int(held.get("remainder") or 0) else None).resolution
    recovered = ledger.balance(suspense).posted - suspense_before
    # the reorged-out credit stays frozen until resolved, and the capture takes it back
    assert_equal((r.status_code, refusal(r), moved), (409, "account_frozen", 0))
    assert_equal([refusal(again), refusal(out)], ["account_frozen", "account_frozen"])
    assert_equal((frozen, resolution["captured_remainder"], recovered, ledger.balance(mallory).posted), (0, "50000000", 50_000_000, 0))


def test_a_freeze_captured_to_suspense_is_given_back_when_the_deposit_is_re_mined(api, ledger):
    """An operator captures a reorged-out credit to suspense; later the same transaction is re-mined
    and custody reverses its shortfall booking. The customer's captured amount stays in suspense:
    the deposit is on chain again, the pool location matches the chain, and only the customer is
    short (reconciliation sees nothing: suspense holds the difference)."""
    chain = Chain(api)
    alice = customer(api, "alice")
    obs = chain.deposit(alice, 30_000_000)
    suspense = api.custody.wallets.firm_account("suspense", "BTC")
    suspense_before = ledger.balance(suspense).posted
    chain.reorg_out(obs)
    log.info("an operator captures the frozen credit to suspense (the deposit looks lost)")
    chain.settle(obs, "capture")
    assert_equal(ledger.balance(alice).posted, 0)
    log.info("the deposit's transaction is re-mined in another block: the shortfall booking is reversed")
    chain.remine(obs, "b2")
    log.info("customer %d, suspense moved by %d", ledger.balance(alice).posted, ledger.balance(suspense).posted - suspense_before)
    assert_equal((ledger.balance(alice).posted, ledger.balance(suspense).posted - suspense_before), (30_000_000, 0))


def test_a_rejected_quarantine_return_leaves_the_deposit_releasable(api, ledger):
    """Operator A asks to return a quarantined deposit; operator B disagrees and rejects the return
    withdrawal. The deposit was moved to `returned` before the withdrawal was requested, and nothing
    moves it back: it can no longer be released to the customer nor returned again (a return that
    policy rejects, e.g. below the minimum withdrawal after the fee, strands it the same way)."""
    chain = Chain(api)
    bob = customer(api, "bob")
    with api.custody.engine.begin() as c:
        c.execute(text("INSERT INTO denylist_address (address, reason) VALUES (:a, 'review test') ON CONFLICT DO NOTHING"),
                  {"a": SENDER})
    try:
        obs = chain.deposit(bob, 20_000_000)
    finally:
        with api.custody.engine.begin() as c:
            c.execute(text("DELETE FROM denylist_address WHERE address = :a"), {"a": SENDER})
    deposit_id = chain.observation_id(obs)
    r = api.operator(1).post(f"/v1/deposits/{deposit_id}/return", json={"comment": "send it back", "destination": DEST})
    assert r.status_code == 200, r.text
    wid = r.json()["withdrawal_id"]
    log.info("return withdrawal %s is %s; a second operator rejects it", wid, r.json()["state"])
    assert_equal(api.operator(2).post(f"/v1/withdrawals/{wid}/reject", json={"comment": "release it instead"}).status_code, 200)
    log.info("the operators now release the deposit to its customer")
    r = api.operator(2).post(f"/v1/deposits/{deposit_id}/release", json={"comment": "cleared"})
    log.info("-> %d %s", r.status_code, r.text[:160])
    assert_equal(r.status_code, 200)
    assert_equal(ledger.balance(bob).posted, 20_000_000)


def test_a_quarantined_deposit_reorged_out_can_no_longer_be_released(api, ledger):
    """A quarantined deposit is reorged out after finality: custody books the shortfall to suspense
    and opens the critical incident, but the observation stays `quarantined` and nothing else
    changes. An operator then releases it (or returns it to its sender) as if the coins were there:
    the customer is credited from quarantine with money that is no longer on chain (the same
    shortfall the freeze protects against for a credited deposit)."""
    chain = Chain(api)
    carol = customer(api, "carol")
    with api.custody.engine.begin() as c:
        c.execute(text("INSERT INTO denylist_address (address, reason) VALUES (:a, 'review test') ON CONFLICT DO NOTHING"),
                  {"a": SENDER})
    try:
        obs = chain.deposit(carol, 40_000_000)
    finally:
        with api.custody.engine.begin() as c:
            c.execute(text("DELETE FROM denylist_address WHERE address = :a"), {"a": SENDER})
    log.info("the quarantined deposit is reorged out after finality")
    chain.reorg_out(obs)
    chain.settle(obs, None)  # the incident holds nothing: resolved without a decision; the switch released
    log.info("an operator releases the quarantined deposit to its customer")
    r = api.operator(1).post(f"/v1/deposits/{chain.observation_id(obs)}/release", json={"comment": "cleared by compliance"})
    log.info("-> %d %s; customer balance %d", r.status_code, r.text[:120], ledger.balance(carol).posted)
    assert_equal((r.status_code >= 400, ledger.balance(carol).posted), (True, 0))


# ---- the fixes' edges (branch deposits2) ------------------------------------------------------------------------------

def quarantined(api: WithdrawalApi, chain: Chain, account_id: int, amount: int) -> Observation:
    """A deposit from a denylisted sender: booked to quarantine."""
    with api.custody.engine.begin() as c:
        c.execute(text("INSERT INTO denylist_address (address, reason) VALUES (:a, 'review test') ON CONFLICT DO NOTHING"),
                  {"a": SENDER})
    try:
        return chain.deposit(account_id, amount)
    finally:
        with api.custody.engine.begin() as c:
            c.execute(text("DELETE FROM denylist_address WHERE address = :a"), {"a": SENDER})


def error_code(r) -> tuple[int, str | None]:
    return r.status_code, refusal(r)


def test_a_return_policy_rejects_leaves_the_deposit_quarantined(api, ledger):
    """A return whose amount after the network fee is below the minimum withdrawal is rejected by
    policy inside the request: the deposit goes back to `quarantined` in that same transaction."""
    chain = Chain(api)
    dave = customer(api, "dave")
    obs = quarantined(api, chain, dave, 12_000)  # 12,000 - 5,000 fee is below the 10,000 minimum
    deposit_id = chain.observation_id(obs)
    r = api.operator(1).post(f"/v1/deposits/{deposit_id}/return", json={"comment": "send it back"})
    log.info("-> %d %s", r.status_code, r.text[:160])
    assert_equal(error_code(r), (422, "withdrawal_rejected"))
    assert_equal(api.custody.deposits.list(account_id=dave)[0]["state"], "quarantined")
    with api.custody.engine.connect() as c:
        ended = c.execute(text("SELECT detail->>'reason' FROM audit_event WHERE action = 'deposit.return_ended' AND subject = :s"),
                          {"s": f"observation:{deposit_id}"}).scalars().all()
    assert_equal(["amount_below_minimum" in reason.split(",") for reason in ended], [True])
    assert_equal(api.operator(2).post(f"/v1/deposits/{deposit_id}/release", json={"comment": "cleared"}).status_code, 200)
    assert_equal(ledger.balance(dave).posted, 12_000)


def test_a_rejected_return_can_be_asked_again_as_a_new_withdrawal(api, ledger):
    """After a rejected return the deposit is `quarantined`; a second return is a new withdrawal
    (its own client withdrawal id), not a replay of the rejected one."""
    chain = Chain(api)
    erin = customer(api, "erin")
    deposit_id = chain.observation_id(quarantined(api, chain, erin, 20_000_000))
    first = api.operator(1).post(f"/v1/deposits/{deposit_id}/return", json={"comment": "back", "destination": DEST}).json()
    assert_equal(api.operator(2).post(f"/v1/withdrawals/{first['withdrawal_id']}/reject", json={"comment": "no"}).status_code, 200)
    r = api.operator(1).post(f"/v1/deposits/{deposit_id}/return", json={"comment": "back, to the sender this time"})
    assert r.status_code == 200, r.text
    second = api.custody.withdrawals.get(int(r.json()["withdrawal_id"]))
    log.info("second return: withdrawal %s %s (%s)", second.id, second.state, second.client_withdrawal_id)
    assert_equal((second.id != int(first["withdrawal_id"]), second.state, second.client_withdrawal_id),
                 (True, "pending_approval", f"deposit-return:{deposit_id}:2"))
    assert_equal(api.custody.deposits.list(account_id=erin)[0]["state"], "returned")
    api.custody.withdrawals.reject(second.id, operator="op-cleanup", comment="test cleanup")
    assert_equal(api.custody.deposits.list(account_id=erin)[0]["state"], "quarantined")


def test_a_reorged_out_quarantined_deposit_is_not_returned_and_is_releasable_once_re_mined(api, ledger):
    chain = Chain(api)
    frank = customer(api, "frank")
    obs = quarantined(api, chain, frank, 40_000_000)
    deposit_id = chain.observation_id(obs)
    chain.reorg_out(obs)
    chain.settle(obs, None)
    r = api.operator(1).post(f"/v1/deposits/{deposit_id}/return", json={"comment": "send it back", "destination": DEST})
    assert_equal(error_code(r), (409, "deposit_reorged_out"))
    assert_equal(api.custody.deposits.list(account_id=frank)[0]["state"], "quarantined")
    log.info("re-mined: the coins are there again, and the operators may release it")
    chain.remine(obs, "b2")
    assert_equal(api.operator(1).post(f"/v1/deposits/{deposit_id}/release", json={"comment": "cleared"}).status_code, 200)
    assert_equal(ledger.balance(frank).posted, 40_000_000)


def test_a_re_mined_deposit_unfreezes_the_account_and_gives_back_a_captured_remainder(api, ledger):
    """Two deposits of one customer, each hidden from the freeze by the backend's hold: the first is
    re-mined before the incident is resolved (the account is usable again at once); the second is
    captured to suspense (the remainder too) and then re-mined (every capture is given back)."""
    chain = Chain(api)
    grace, other = customer(api, "grace"), customer(api, "other")
    suspense = api.custody.wallets.firm_account("suspense", "BTC")
    suspense_before = ledger.balance(suspense).posted
    first = chain.deposit(grace, 10_000_000)
    hold = api.backend.post("/v1/holds", json={"idempotency_key": f"order-{first.txid}", "account_id": grace,
                                               "amount": "0.1", "reference": "order"}).json()
    chain.reorg_out(first)
    assert_equal(api.backend.post(f"/v1/holds/{hold['id']}/release").status_code, 200)
    move = {"idempotency_key": f"move-{first.txid}", "transfers": [
        {"debit_account_id": grace, "credit_account_id": other, "amount": "0.01"}]}
    assert_equal(error_code(api.backend.post("/v1/transactions", json=move)), (409, "account_frozen"))
    chain.remine(first, "b2")
    assert_equal(api.backend.post("/v1/transactions", json=move).status_code, 201)
    chain.settle(first, "release")

    second = chain.deposit(grace, 30_000_000, block="b3")
    hold = api.backend.post("/v1/holds", json={"idempotency_key": f"order-{second.txid}", "account_id": grace,
                                               "amount": "0.35", "reference": "order"}).json()
    chain.reorg_out(second)
    assert_equal(api.backend.post(f"/v1/holds/{hold['id']}/release").status_code, 200)
    resolution = chain.settle(second, "capture").resolution
    log.info("captured %s (remainder %s); grace has %d", resolution["captured"], resolution["captured_remainder"],
             ledger.balance(grace).posted)
    # 39M posted, 35M held by the backend: 4M frozen, 26M hidden behind the backend's hold
    assert_equal((resolution["captured"], resolution["captured_remainder"]), ("4000000", "26000000"))
    chain.remine(second, "b4")
    assert_equal((ledger.balance(grace).posted, ledger.balance(other).posted), (39_000_000, 1_000_000))
    assert_equal(ledger.balance(suspense).posted, suspense_before)


def test_a_pending_return_of_a_deposit_reorged_out_is_not_approved(api, ledger):
    """The deposit leaves the chain while its return waits for approvers: approving it would pay out
    coins the firm no longer has. It is refused; rejecting it quarantines the deposit again, which
    stays refused for release."""
    chain = Chain(api)
    heidi = customer(api, "heidi")
    obs = quarantined(api, chain, heidi, 25_000_000)
    deposit_id = chain.observation_id(obs)
    wid = api.operator(1).post(f"/v1/deposits/{deposit_id}/return", json={"comment": "back", "destination": DEST}).json()["withdrawal_id"]
    chain.reorg_out(obs)
    chain.settle(obs, None)
    r = api.approve(2, wid, "looks right")
    log.info("approve -> %d %s", r.status_code, r.text[:160])
    assert_equal(error_code(r), (409, "deposit_reorged_out"))
    assert_equal(api.operator(2).post(f"/v1/withdrawals/{wid}/reject", json={"comment": "coins gone"}).status_code, 200)
    assert_equal(api.custody.deposits.list(account_id=heidi)[0]["state"], "quarantined")
    r = api.operator(2).post(f"/v1/deposits/{deposit_id}/release", json={"comment": "cleared"})
    assert_equal((error_code(r), ledger.balance(heidi).posted), ((409, "deposit_reorged_out"), 0))


def test_a_frozen_account_cannot_trade_the_credit_away(api, ledger):
    """The same dodge through the order book: matching holds from the customer's account with its
    own ledger commands, not through the API's ledger access, so an order is refused at the door
    while a reorged-out credit freezes either of the owner's accounts in the market."""
    chain = Chain(api)
    mallory = customer(api, "mallory")
    owner = ledger.get_account(mallory).owner
    symbol = btc_usdt_market(api, ledger)
    obs = chain.deposit(mallory, 50_000_000)
    hold = api.backend.post("/v1/holds", json={"idempotency_key": f"order-{obs.txid}", "account_id": mallory,
                                               "amount": "0.5", "reference": "order"}).json()
    chain.reorg_out(obs)
    assert_equal(api.backend.post(f"/v1/holds/{hold['id']}/release").status_code, 200)
    log.info("the attack: sell the released credit on the book")
    r = api.backend.post(f"/v1/markets/{symbol}/orders", json={
        "account": owner, "client_order_id": "dump", "side": "sell", "qty": "0.5", "price": "1"})
    log.info("-> %d %s", r.status_code, r.text[:120])
    held_by_orders = ledger.balance(mallory).held
    chain.settle(obs, "capture")
    assert_equal((r.status_code, refusal(r), held_by_orders), (409, "account_frozen", 0))
    assert_equal(ledger.balance(mallory).posted, 0)
