"""Third adversarial review of issue 11: the reconciliation's "surplus that shrank" rule
(`shortfall_since`), on the database without a node.

- the re-mine of a deposit reorged out after finality reverses its `deposit_reorg` booking with the
  ledger's generic `reversal` kind, which is not in `CHAIN_TRACKED_KINDS`: the reversal raises the
  deposit line's books because the coins came back ON CHAIN, yet it is counted as an off-chain
  booking (`booked_off_chain`) and so "explains" a fall of the same size that never happened. A
  theft of that size from the deposit addresses in the same interval, while the line shows any
  surplus, nets to a smaller surplus: a warning, the kill switch never engages;
- the reorg freeze rejects every unbatched withdrawal of the account (`reject_for_reorg`) before
  it reads what is available, so a dust-sized reorged credit that the balance covers in full (no
  remainder, the account not frozen) still rejects a legit approved payout;
- a credit hidden behind a backend hold with no expiry: the capture is refused while the hold
  stands and only its owner may release it, so the backend alone keeps the account frozen and the
  loss unrecovered (the operator's other decision, `release`, is the second review's attack).
"""
from __future__ import annotations

import uuid

from sqlalchemy import text

from custody.errors import CustodyError, CustodyErrorCode
from custody.reconciliation import Line, PreviousPass, Reconciliation, line_severity
from custody.wallets import Wallets
from ledger.model import Transfer
from tests.integration.test_review_deposit_boundaries import api  # noqa: F401 - fixture


def test_a_remine_reversal_is_no_off_chain_booking_and_explains_no_fall(engine, ledger):
    """A credited 0.5 BTC deposit is reorged out after finality (deposit_reorg: suspense -> pool),
    then re-mined: custody reverses that booking. The coins are on chain again and the books again
    count them: nothing moved off chain. Meanwhile 0.5 BTC is stolen from the deposit addresses
    while the line had a 1 BTC unexplained surplus. Expected: the pass is critical (a 0.5 BTC fall
    nothing explains). Before: the reversal counts as 0.5 BTC booked off chain and explains the
    theft; the pass is a surplus warning."""
    asset = f"R3{uuid.uuid4().hex[:6].upper()}"
    ledger.create_asset(asset, 8)
    wallets = Wallets(engine, ledger)
    pool = wallets.location_account("bitcoin", "deposit", asset)
    suspense = wallets.firm_account("suspense", asset)
    recon = Reconciliation(engine, ledger, wallets, {}, network="regtest")
    recon._accounts[("bitcoin", "deposit", asset)] = pool
    x = 50_000_000

    def off_chain() -> int:
        with engine.connect() as c:
            return recon._booked_off_chain("bitcoin", "deposit", asset, c)

    equity = wallets.firm_account("equity", asset)
    ledger.post(f"r3-deposit-{asset}", [Transfer(pool, equity, x)], kind="deposit")  # booked when credited
    reorg = ledger.post(f"r3-reorg-{asset}", [Transfer(suspense, pool, x)], kind="deposit_reorg")
    before = off_chain()
    # previous pass: 1 BTC surplus (unbooked treasury funding), the deposit out of the chain and the books
    previous = PreviousPass(difference=100_000_000, booked_off_chain=before, observation_mark=0, height=100)
    ledger.reverse(reorg.transaction_id, f"r3-remined-{asset}")  # the deposit is re-mined
    after = off_chain()
    # this pass: the deposit back on chain (+x) and in the books (+x); x stolen from the addresses (-x)
    line = Line("bitcoin", asset, "deposit", on_chain=100_000_000 + x - x, books=x, in_transit=0,
                booked_off_chain=after)
    assert after == before, f"a re-mine's reversal counted as {after - before} booked off chain"
    assert line_severity(line, previous) == "critical"


def test_a_small_reorged_credit_rejects_no_withdrawal_the_balance_still_covers(api, ledger):
    """Alice holds 2 BTC and asks to withdraw 0.49 (approved, waiting for the batcher). A later
    0.01 BTC deposit of hers is reorged out after finality: 1.5 BTC is still available, so the
    freeze can hold the whole 0.01 and nothing is hidden. Expected: her withdrawal stands. Before:
    `reject_for_reorg` rejects every unbatched withdrawal of the account before reading what is
    available, whatever the balance (a legit payout refused by any dust reorg)."""
    from tests.integration.test_review_deposit_boundaries import Chain, customer
    chain = Chain(api)
    alice = customer(api, "alice")
    chain.deposit(alice, 200_000_000, block="b0")
    w = api.withdraw(alice, "0.49")
    assert w["state"] == "approved", w
    obs = chain.deposit(alice, 1_000_000)
    chain.reorg_out(obs)
    with api.custody.engine.connect() as c:
        state = c.execute(text("SELECT state FROM withdrawal_request WHERE id = :i"), {"i": w["id"]}).scalar_one()
    chain.settle(obs, "capture")
    api.reject_all(alice)
    assert state == "approved", f"withdrawal {w['id']} is {state}"


def test_the_backend_alone_cannot_keep_a_frozen_credit_out_of_the_operators_reach(api, ledger):
    """Mallory's 0.5 BTC credit is hidden behind a hold the backend placed before the reorg, with
    no expiry. The operator's `capture` is refused while the hold stands (`incident_remainder_held`)
    and only the hold's owner may release it: the backend, by doing nothing, keeps the account
    frozen for ever and the firm's loss unrecovered; the operator's only other decision, `release`,
    hands the credit back (the second review's attack). Expected: the operator recovers the credit
    without the backend, by the capture itself or by releasing the listed holds as an admin."""
    from tests.integration.test_review_deposit_boundaries import Chain, customer
    chain = Chain(api)
    mallory = customer(api, "mallory")
    obs = chain.deposit(mallory, 50_000_000)
    hold = api.backend.post("/v1/holds", json={"idempotency_key": f"r3-order-{obs.txid}", "account_id": mallory,
                                               "amount": "0.5", "reference": "order"}).json()
    chain.reorg_out(obs)
    suspense = api.custody.wallets.firm_account("suspense", "BTC")
    before = ledger.balance(suspense).posted
    try:
        chain.settle(obs, "capture")
    except CustodyError as refused:
        assert refused.code is CustodyErrorCode.incident_remainder_held, refused
        for h in refused.detail["holds"]:
            for who in (api.admin, api.operator()):
                r = who.post(f"/v1/holds/{h['id']}/release")
                if r.status_code == 200:
                    break
        try:
            chain.settle(obs, "capture")
        except CustodyError as again:
            log_refusal = again
        else:
            log_refusal = None
    else:
        log_refusal = None
    recovered = ledger.balance(suspense).posted - before
    api.backend.post(f"/v1/holds/{hold['id']}/release")  # clean up: the backend lets go at last
    if recovered == 0:
        chain.settle(obs, "capture")
    assert recovered == 50_000_000, f"the operator recovered {recovered} without the backend ({log_refusal})"
