"""Second adversarial review of issue 11: paths the first review did not attack, on the database
without a node (deposits booked on a chain of the test's own, as in test_review_deposit_boundaries).

- a reorged-out credit hidden from the freeze by a RESTING order (placed before the reorg) is sold
  on the book afterwards: the freeze refuses new and amended orders of the frozen owner, but the
  fill that takes the frozen owner's resting order is the counterparty's, so the credit leaves the
  frozen account all the same;
- a reorged-out credit hidden from the freeze by the customer's own WITHDRAWAL (requested before
  the reorg) is paid out: the freeze refuses new withdrawals, but the one already holding the credit
  is approved by operators and taken by the batcher, neither of which asks `refuse_frozen`;
- a credit hidden behind the backend's hold KEPT until the operator resolves with `capture` is
  captured "as far as available" (nothing), the resolution ends the freeze, and the backend then
  releases its hold and moves the credit away.

Each now holds: matching evicts a resting order that would debit a frozen account before anything
trades with it (walking the reach again after each eviction) and rejects a fired stop of one
(`Trading.blocked_accounts`, wired by custody.trading); the freeze rejects the account's
withdrawals not batched yet before it reads what is available, and approving or batching one of a
frozen account is refused; a `capture` that cannot take the whole remainder is refused
(`incident_remainder_held`, naming the holds), so the account stays frozen until it can. The last
scenarios (below the line) pin the fixes' edges.
"""
from __future__ import annotations

import logging
import uuid

from sqlalchemy import text

from custody.errors import CustodyError
from custody.controls import set_kill_switch
from custody.incidents import Incidents
from custody.payouts import Payouts
from custody.wallet_index import Ours
from regtest.util import assert_equal
from tests.integration.test_review_deposit_boundaries import Chain, api, btc_usdt_market, customer, refusal  # noqa: F401 - fixture

log = logging.getLogger(__name__)


def test_a_resting_order_placed_before_the_reorg_still_sells_the_frozen_credit(api, ledger):
    """Mallory deposits 0.5 BTC and rests a sell order of it at the lowest price; the deposit is
    reorged out after finality (the order's hold hides the whole credit from the freeze: all of it
    is the incident's remainder, the account frozen). Her accomplice then buys across the resting
    order: matching settles the fill from Mallory's frozen account, and the BTC is the accomplice's,
    free to withdraw. Expected: the fill is refused (or the resting order cancelled by the freeze)
    and the operator's capture recovers the whole credit."""
    chain = Chain(api)
    mallory = customer(api, "mallory")
    owner = ledger.get_account(mallory).owner
    symbol = btc_usdt_market(api, ledger)
    accomplice = f"accomplice-{uuid.uuid4().hex[:8]}"
    api.backend.post("/v1/accounts", json={"asset": "USDT", "kind": "customer", "owner": accomplice,
                                           "name": f"customer:{accomplice}:USDT"}).raise_for_status()
    usdt = ledger.account_by_name(f"customer:{accomplice}:USDT").id
    equity = api.custody.wallets.firm_account("equity", "USDT")
    ledger.transfer(f"review2-fund-{accomplice}", equity, usdt, 1_000_000_000)

    obs = chain.deposit(mallory, 50_000_000)
    log.info("Mallory rests a sell of the whole credit at the lowest price before the reorg")
    ask = api.backend.post(f"/v1/markets/{symbol}/orders", json={
        "account": owner, "client_order_id": "rest", "side": "sell", "qty": "0.5", "price": "1"})
    assert ask.status_code == 201 and ask.json()["state"] == "working", ask.text
    chain.reorg_out(obs)
    with api.custody.engine.connect() as c:
        held = c.execute(text("SELECT detail->'hold' FROM incident WHERE id = :i"), {"i": chain.incident(obs)}).scalar_one()
    log.info("the freeze: %s", held)

    log.info("the attack: the accomplice buys across Mallory's resting order")
    bid = api.backend.post(f"/v1/markets/{symbol}/orders", json={
        "account": accomplice, "client_order_id": "take", "side": "buy", "qty": "0.5", "price": "1"})
    log.info("-> %d %s", bid.status_code, bid.text[:200])
    btc = ledger.account_by_name(f"customer:{accomplice}:BTC").id if bid.status_code == 201 else None
    taken = ledger.balance(btc).posted if btc else 0
    log.info("the accomplice now holds %d sat of Mallory's reorged-out credit", taken)

    suspense = api.custody.wallets.firm_account("suspense", "BTC")
    before = ledger.balance(suspense).posted
    decision = "capture" if held.get("id") or int(held.get("remainder") or 0) else None
    resolution = chain.settle(obs, decision).resolution
    recovered = ledger.balance(suspense).posted - before
    log.info("resolution %s; suspense recovered %d", resolution, recovered)
    if btc and taken:  # give the stolen credit back so the session's books stay clean, then fail
        ledger.transfer(f"review2-cleanup-{accomplice}", btc, suspense, taken)
    assert_equal((taken, recovered), (0, 50_000_000))


def test_a_withdrawal_requested_before_the_reorg_still_pays_out_the_frozen_credit(api, ledger):
    """Mallory deposits 0.5 BTC and at once asks to withdraw 0.49 of it (small: approved by policy,
    waiting for the batcher; its hold is custody's own). The deposit is then reorged out after
    finality: the withdrawal's hold hides the credit from the freeze (remainder 0.49 + fee). The
    operator does everything right: resolves the incident with `capture`, and an admin lifts the
    kill switch. The capture takes only what was available (the remainder sits behind the
    withdrawal's hold), the account is no longer frozen, and the batcher takes the withdrawal: the
    firm pays out 0.49 BTC it no longer has. Expected: the reorg (or the capture) rejects the
    withdrawal and releases its hold, so the capture recovers the whole credit; at the least the
    batcher refuses a withdrawal from a frozen account."""
    chain = Chain(api)
    mallory = customer(api, "mallory")
    obs = chain.deposit(mallory, 50_000_000)
    w = api.withdraw(mallory, "0.49")
    log.info("withdrawal %s is %s; now the deposit is reorged out", w["id"], w["state"])
    assert_equal(w["state"], "approved")
    chain.reorg_out(obs)
    suspense = api.custody.wallets.firm_account("suspense", "BTC")
    before = ledger.balance(suspense).posted
    resolution = chain.settle(obs, "capture").resolution  # the operator's capture, the admin's switch
    recovered = ledger.balance(suspense).posted - before
    log.info("resolution %s: suspense recovered %d", resolution, recovered)
    payouts = Payouts(api.custody.engine, api.custody.ledger, api.custody.wallets, {}, signer=None)
    with api.custody.engine.connect() as c, c.begin() as t:
        taken = [row.id for row in payouts._take_approved(c, "bitcoin", 100)]
        t.rollback()  # look only: nothing is batched here
    log.info("the batcher pays %s", taken)
    api.reject_all(mallory)
    assert_equal((recovered, taken), (50_000_000, []))


def test_a_credit_hidden_behind_a_hold_kept_until_the_resolution_escapes_the_capture(api, ledger):
    """The freeze's remainder was captured at resolution only "as far as it is available by then".
    The backend simply keeps its hold (an order's, say) in place until the operator has resolved
    the incident with `capture`: nothing is available, the capture takes nothing of the remainder,
    the resolved incident no longer freezes the account, and the backend releases its hold and
    moves the whole credit to an accomplice. Then (review 3) the fix let the backend keep the
    credit out of reach forever by never releasing its hold. Now the capture first releases the API
    callers' holds on the frozen account (audited in the resolution) and takes the whole credit."""
    chain = Chain(api)
    mallory, accomplice = customer(api, "mallory"), customer(api, "accomplice")
    obs = chain.deposit(mallory, 50_000_000)
    hold = api.backend.post("/v1/holds", json={"idempotency_key": f"order-{obs.txid}", "account_id": mallory,
                                               "amount": "0.5", "reference": "order"}).json()
    chain.reorg_out(obs)
    suspense = api.custody.wallets.firm_account("suspense", "BTC")
    before = ledger.balance(suspense).posted
    log.info("the operator resolves with capture while the backend's hold still hides the credit")
    resolution = chain.settle(obs, "capture").resolution
    log.info("resolution: %s", resolution)
    assert_equal([h["id"] for h in resolution["released_holds"]], [hold["id"]])
    log.info("the attack, too late: release the hold and move the credit away")
    assert_equal(api.backend.post(f"/v1/holds/{hold['id']}/release").status_code, 200)  # a released hold: a retry
    r = api.backend.post("/v1/transactions", json={"idempotency_key": f"away-{obs.txid}", "transfers": [
        {"debit_account_id": mallory, "credit_account_id": accomplice, "amount": "0.5"}]})
    log.info("-> %d %s", r.status_code, r.text[:160])
    assert_equal(refusal(r), "insufficient_funds")
    moved = ledger.balance(accomplice).posted
    recovered = ledger.balance(suspense).posted - before
    assert_equal((moved, recovered), (0, 50_000_000))


def test_a_deposit_re_mined_in_its_original_block_is_not_seen_as_re_mined(api, ledger):
    """A reorg battle: block X holding Alice's credited deposit is reorged out (the shortfall is
    booked to suspense, her credit frozen), then the original branch wins back and block X, with
    the very same transaction, is the main chain again (bitcoind: invalidateblock X, then
    reconsiderblock X). The scanner reports the observation in block X; `Deposits._record` answers
    "seen before in this very block" (the observation still names X, as `_deep_reorg` left it) and
    stops before its re-mine branch. The coins are on chain, yet the shortfall stays booked, the
    credit stays frozen and may be captured to suspense: the customer pays for a loss that did not
    happen (and reconciliation of the deposit location sees a surplus: a warning). Expected: the
    same handling as a re-mine in another block (compensation reversed, captures given back)."""
    chain = Chain(api)
    alice = customer(api, "alice")
    obs = chain.deposit(alice, 20_000_000)
    suspense = api.custody.wallets.firm_account("suspense", "BTC")
    before = ledger.balance(suspense).posted
    chain.reorg_out(obs)
    log.info("the original branch wins back: the same transaction in the same block %s", obs.block.hash)
    with api.custody.engine.connect() as c:
        address_id = c.execute(text("SELECT id FROM deposit_address WHERE address = :a"), {"a": obs.address}).scalar_one()
    owner = ledger.get_account(alice).owner
    with api.custody.engine.begin() as c:
        recorded = api.custody.deposits._record(c, chain.name, obs, Ours("deposit", 0, 0, address_id, alice, owner))
    after_remine = ledger.balance(suspense).posted - before
    frozen = ledger.balance(alice).held
    log.info("recorded %d; suspense still short by %d; %d of alice's credit held", recorded, after_remine, frozen)
    chain.settle(obs, "release")
    # the shortfall booking is reversed (custody's freeze hold stays for the operator to release,
    # as after a re-mine in another block)
    assert_equal(after_remine, 0)


def test_a_deposit_reorged_out_of_the_same_block_twice_is_compensated_twice(api, ledger):
    """The follow-on of the reorg battle: block X comes back (unnoticed, above) and is reorged out
    once more. `_orphan` finds the observation still credited in X and books a second shortfall
    and a second freeze for the one deposit: suspense shows twice the loss and the customer's
    other money is frozen too. (With no other coins in the pool, the second shortfall booking is
    refused by the location's limit instead, and the scanner's whole transaction with it: the
    chain's deposit scan is stuck.) Expected: one shortfall for one deposit."""
    chain = Chain(api)
    bob, carol = customer(api, "bob"), customer(api, "carol")
    chain.deposit(carol, 50_000_000, block="b0")  # the pool holds other customers' coins too
    obs = chain.deposit(bob, 20_000_000)
    api.custody.ledger.post(f"review2-more-{obs.txid}", [  # bob has other money too
        __import__("ledger.model", fromlist=["Transfer"]).Transfer(
            api.custody.wallets.firm_account("equity", "BTC"), bob, 30_000_000)], kind="treasury_credit")
    suspense = api.custody.wallets.firm_account("suspense", "BTC")
    before = ledger.balance(suspense).posted
    chain.reorg_out(obs)
    with api.custody.engine.connect() as c:
        address_id = c.execute(text("SELECT id FROM deposit_address WHERE address = :a"), {"a": obs.address}).scalar_one()
    with api.custody.engine.begin() as c:  # X is back: the same observation in the same block
        api.custody.deposits._record(c, chain.name, obs, Ours("deposit", 0, 0, address_id, bob, ledger.get_account(bob).owner))
    with api.custody.engine.begin() as c:  # and X is out again
        outcome = api.custody.deposits._orphan(c, chain.name, obs)
    short, held = before - ledger.balance(suspense).posted, ledger.balance(bob).held
    log.info("second orphaning -> %s; suspense short by %d; %d of bob's money held", outcome, short, held)
    with api.custody.engine.connect() as c:
        incidents = c.execute(text("SELECT id FROM incident WHERE kind = 'deposit_reorged_after_finality' AND resolved_at IS NULL "
                                   "AND (detail->>'observation_id')::bigint = :o"), {"o": chain.observation_id(obs)}).scalars().all()
    for incident in incidents:
        Incidents(api.custody.engine, ledger).resolve(incident, operator="review2-cleanup", comment="cleanup", decision="release")
    chain.settle(obs, None)
    assert_equal(short, 20_000_000)


# ---- the fixes' edges -------------------------------------------------------------------------


def market_with_accomplice(api, ledger, quote: int = 1_000_000_000) -> tuple[str, str]:
    """A BTC-USDT market without fees, and an accomplice funded with USDT. Returns (symbol, owner)."""
    symbol = btc_usdt_market(api, ledger)
    accomplice = f"accomplice-{uuid.uuid4().hex[:8]}"
    api.backend.post("/v1/accounts", json={"asset": "USDT", "kind": "customer", "owner": accomplice,
                                           "name": f"customer:{accomplice}:USDT"}).raise_for_status()
    usdt = ledger.account_by_name(f"customer:{accomplice}:USDT").id
    ledger.transfer(f"review2-fund-{accomplice}", api.custody.wallets.firm_account("equity", "USDT"), usdt, quote)
    return symbol, accomplice


def order(api, symbol: str, owner: str, client_order_id: str, side: str, qty: str, price: str | None = None, **more):
    r = api.backend.post(f"/v1/markets/{symbol}/orders", json={
        "account": owner, "client_order_id": client_order_id, "side": side, "qty": qty,
        **({"price": price} if price is not None else {}), **more})
    log.info("%s %s %s @ %s -> %d %s", owner, side, qty, price, r.status_code, r.text[:160])
    return r


def btc_of(ledger, owner: str) -> int:
    try:
        return ledger.balance(ledger.account_by_name(f"customer:{owner}:BTC").id).posted
    except Exception:  # noqa: BLE001 - never opened: nothing received
        return 0


def recover(api, ledger, chain: Chain, obs, thief: str, taken: int) -> int:
    """Give back what `thief` took (so the session's books stay clean), then resolve the incident
    with `capture` (or, if that is refused because part of the credit is still hidden, with
    `release`, so the session is not left frozen and halted). Returns what suspense recovered."""
    suspense = api.custody.wallets.firm_account("suspense", "BTC")
    if taken:
        ledger.transfer(f"review2-cleanup-{thief}", ledger.account_by_name(f"customer:{thief}:BTC").id, suspense, taken)
    before = ledger.balance(suspense).posted
    try:
        chain.settle(obs, "capture")
    except CustodyError as exc:
        log.info("capture refused: %s", exc)
        chain.settle(obs, "release")
    return ledger.balance(suspense).posted - before


def test_a_frozen_sellers_deeper_resting_orders_are_evicted_too(api, ledger):
    """Mallory rests her credit in two sells at two prices before the reorg. The accomplice's buy
    reaches only the first level at first sight; once that order is evicted it reaches the second:
    matching walks the reach again after an eviction, so the deeper order is evicted as well and
    the accomplice's buy takes nothing of the frozen credit."""
    chain = Chain(api)
    mallory = customer(api, "mallory")
    owner = ledger.get_account(mallory).owner
    symbol, accomplice = market_with_accomplice(api, ledger)
    obs = chain.deposit(mallory, 50_000_000)
    assert_equal(order(api, symbol, owner, "low", "sell", "0.25", "1").json()["state"], "working")
    assert_equal(order(api, symbol, owner, "high", "sell", "0.25", "2").json()["state"], "working")
    chain.reorg_out(obs)
    order(api, symbol, accomplice, "take", "buy", "0.25", "2")
    taken = btc_of(ledger, accomplice)
    log.info("the accomplice took %d of mallory's credit", taken)
    assert_equal((taken, recover(api, ledger, chain, obs, accomplice, taken)), (0, 50_000_000))


def test_a_stop_placed_before_the_reorg_is_not_activated_on_a_frozen_account(api, ledger):
    """Mallory places a stop sell of her credit before the reorg (a stop holds nothing until it
    fires) and the backend hides the credit behind its own hold; after the reorg the backend
    releases that hold (allowed: the account stays frozen) and an unrelated trade fires the stop.
    Its hold would be placed by matching's own ledger command and the sell would trade the credit
    to the accomplice's resting bid: the stop of a frozen account is rejected instead."""
    chain = Chain(api)
    mallory, carol = customer(api, "mallory"), customer(api, "carol")
    owner, carol_owner = ledger.get_account(mallory).owner, ledger.get_account(carol).owner
    symbol, accomplice = market_with_accomplice(api, ledger)
    chain.deposit(carol, 1_000_000, block="b0")
    obs = chain.deposit(mallory, 50_000_000)
    stop = order(api, symbol, owner, "stop", "sell", "0.5", None, type="stop", stop_price="1")
    assert_equal(stop.status_code, 201)
    hold = api.backend.post("/v1/holds", json={"idempotency_key": f"order-{obs.txid}", "account_id": mallory,
                                               "amount": "0.5", "reference": "order"}).json()
    chain.reorg_out(obs)
    assert_equal(api.backend.post(f"/v1/holds/{hold['id']}/release").status_code, 200)
    log.info("the accomplice bids for the credit; carol's small sale fires the stop")
    order(api, symbol, accomplice, "bid", "buy", "0.51", "1")
    order(api, symbol, carol_owner, "fire", "sell", "0.01", "1")
    state = api.backend.get(f"/v1/markets/{symbol}/orders/{stop.json()['order_id']}", params={"account": owner}).json().get("state")
    taken = btc_of(ledger, accomplice) - 1_000_000
    log.info("the stop is %s; the accomplice took %d of mallory's credit", state, taken)
    assert_equal((taken, recover(api, ledger, chain, obs, accomplice, taken)), (0, 50_000_000))


def test_a_withdrawal_that_raced_the_freeze_is_rejected_by_the_batcher(api, ledger, monkeypatch):
    """A request that read "not frozen" just before the freeze committed holds its amount just after
    it (the freeze rejected only the withdrawals it found). Simulated here: the backend's hold hid
    part of the credit, the backend releases it, an admin has lifted the kill switch, and the
    request's door check is bypassed. The policy approves it; the batcher must not take it: it is
    rejected (`account_frozen`), its hold released, and the capture recovers the whole credit."""
    chain = Chain(api)
    mallory = customer(api, "mallory")
    obs = chain.deposit(mallory, 50_000_000)
    hold = api.backend.post("/v1/holds", json={"idempotency_key": f"order-{obs.txid}", "account_id": mallory,
                                               "amount": "0.3", "reference": "order"}).json()
    chain.reorg_out(obs)
    assert_equal(api.backend.post(f"/v1/holds/{hold['id']}/release").status_code, 200)
    with api.custody.engine.begin() as c:
        set_kill_switch(c, False, "an admin lifts the switch", "review2-admin")
    monkeypatch.setattr("custody.withdrawals.refuse_frozen", lambda conn, ids: None)  # the race: read before the freeze
    w = api.withdraw(mallory, "0.29")
    monkeypatch.undo()
    log.info("withdrawal %s is %s on the frozen account", w["id"], w["state"])
    assert_equal(w["state"], "approved")
    payouts = Payouts(api.custody.engine, api.custody.ledger, api.custody.wallets, {}, signer=None)
    with api.custody.engine.begin() as c:
        taken = [row.id for row in payouts._take_approved(c, "bitcoin", 100) if row.account_id == mallory]
    state = api.custody.withdrawals.get(int(w["id"])).state
    log.info("the batcher takes %s; the withdrawal is %s", taken, state)
    api.reject_all(mallory)
    suspense = api.custody.wallets.firm_account("suspense", "BTC")
    before = ledger.balance(suspense).posted
    chain.settle(obs, "capture")
    assert_equal((taken, state, ledger.balance(suspense).posted - before), ([], "rejected", 50_000_000))


def test_an_idle_resting_order_does_not_keep_the_credit_out_of_the_operators_reach(api, ledger):
    """Review 3: a resting sell order of the whole credit, placed before the reorg and never traded
    against, hid the remainder behind matching's hold; the backend, by never cancelling it, kept the
    account frozen and the loss unrecovered (`incident_remainder_held` on every capture). Now the
    operator's capture over the API cancels the owner's resting orders first (audited), then takes
    the whole credit."""
    chain = Chain(api)
    mallory = customer(api, "mallory")
    owner = ledger.get_account(mallory).owner
    symbol = btc_usdt_market(api, ledger)
    obs = chain.deposit(mallory, 50_000_000)
    ask = api.backend.post(f"/v1/markets/{symbol}/orders", json={
        "account": owner, "client_order_id": "idle", "side": "sell", "qty": "0.5", "price": "100000"})
    assert ask.status_code == 201 and ask.json()["state"] == "working", ask.text
    chain.reorg_out(obs)
    suspense = api.custody.wallets.firm_account("suspense", "BTC")
    before = ledger.balance(suspense).posted
    log.info("an operator captures over the API: the idle order is cancelled first")
    r = api.operator().post(f"/v1/incidents/{chain.incident(obs)}/resolve",
                            json={"comment": "reorged-out credit recovered", "decision": "capture"})
    log.info("-> %d %s", r.status_code, r.text[:200])
    with api.custody.engine.begin() as c:
        set_kill_switch(c, False, "review test cleanup", "review-cleanup")
    order = api.backend.get(f"/v1/markets/{symbol}/orders/{ask.json()['order_id']}").json()
    assert_equal((r.status_code, order["state"]), (200, "cancelled"))
    assert_equal((ledger.balance(suspense).posted - before, ledger.balance(mallory).posted), (50_000_000, 0))
