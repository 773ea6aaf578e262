"""withdrawal_rejections: every refusal has a clear code, over the HTTP API where the backend meets it
(through the typed custody.client, as the backend calls it); the kill switch refuses new
withdrawals; many simultaneous requests never overdraw one balance."""
from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import uuid
from decimal import Decimal

import pytest
from sqlalchemy import text

from custody.controls import set_kill_switch
from custody.errors import CustodyError
from custody.policy_config import PolicyProvider, default_policy
from ledger.errors import LedgerError
from ledger.model import Transfer
from policies import VelocityLimit
from regtest.util import assert_equal
from tests.e2e.custody.api_helpers import answered, backend_client, refusal, refused

REGTEST_DEST = "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080"
MAINNET_DEST = "bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t4"


def credit(custody, acct: int, amount: int) -> None:
    """A treasury credit from equity (the deposit pipeline is covered by the deposit suites; taking
    it from the deposit pool without coins would leave the books unreconciled)."""
    equity = custody.wallets.firm_account("equity", "BTC")
    custody.ledger.post(f"test-credit:{uuid.uuid4().hex}", [Transfer(equity, acct, amount)], kind="treasury_credit")


@pytest.fixture
def api(custody):
    return backend_client(custody, "backend")


def post(api, acct, amount: str, dest=REGTEST_DEST, cw=None):
    """Request a withdrawal; its answer (status 201 asserted), or the client's error when refused."""
    return answered(api, 201, api.request_withdrawal(client_withdrawal_id=cw or uuid.uuid4().hex, account_id=acct,
                                                     amount=Decimal(amount), destination=dest))


def test_rejections_have_clear_codes(custody, customer, api, engine, ledger, bitcoind, log):
    acct = customer("BTC")
    credit(custody, acct, 100_000_000)
    cases = [("0.000000001", REGTEST_DEST, 422, "excess_precision"),
             ("0.1", MAINNET_DEST, 422, "invalid_destination"),
             ("0.1", "bcrt1qnotanaddress", 422, "invalid_destination"),
             ("0.1", "1BoatSLRHtKNngkdXEeobR76b53LETtpyT", 422, "invalid_destination"),
             ("5", REGTEST_DEST, 409, "insufficient_funds"),
             ("0.00001", REGTEST_DEST, 422, "withdrawal_rejected")]  # below the 0.0001 BTC minimum
    for amount, dest, status, code in cases:
        got = refused(lambda: post(api, acct, amount, dest))
        log.info("%s to %s... -> %d %s", amount, dest[:12], *got)
        assert_equal(got, (status, code))
    assert_equal(ledger.balance(acct).held, 0)
    log.info("only customer accounts are withdrawn from: every firm account is refused (issue 11)")
    firm = {role: custody.wallets.firm_account(role, "BTC") for role in ("quarantine", "equity", "fees", "in_flight", "suspense")}
    firm["hot location"] = custody.wallets.location_account("bitcoin", "hot", "BTC")
    for role, account in firm.items():
        got = refused(lambda: post(api, account, "0.01"))
        log.info("from the %s account -> %d %s", role, *got)
        assert_equal(got, (403, "kind_not_permitted"))

    log.info("a denylisted destination is rejected by policy, its hold released, the reason returned")
    denied = bitcoind.wallet("getnewaddress", "", "bech32")
    with engine.begin() as c:
        c.execute(text("INSERT INTO denylist_address (address, reason) VALUES (:a, 'test: sanctioned') ON CONFLICT DO NOTHING"),
                  {"a": denied})
    error = refusal(lambda: post(api, acct, "0.1", denied))
    assert_equal((error.status, error.code), (422, "withdrawal_rejected"))
    assert "destination_sanctioned" in error.detail["reasons"]
    wid = int(error.detail["withdrawal_id"])
    assert_equal(custody.withdrawals.get(wid).state, "rejected")
    assert_equal(ledger.balance(acct).held, 0)


def test_velocity_exceeded_needs_approval(custody, customer, api, ledger, log):
    acct = customer("BTC")
    credit(custody, acct, 100_000_000)
    base = default_policy()
    tight = dataclasses.replace(base, version=base.version + "+tight-velocity", assets={
        **base.assets, "BTC": dataclasses.replace(base.assets["BTC"], velocity=VelocityLimit(dt.timedelta(hours=1), 15_000_000, 1))})
    saved = custody.withdrawals.policies
    custody.withdrawals.policies = PolicyProvider(tight)
    try:
        first = post(api, acct, "0.1")
        second = post(api, acct, "0.1")
    finally:
        custody.withdrawals.policies = saved
    log.info("0.1 then 0.1 BTC within an hour against a 0.15 BTC limit: %s, %s", first.state, second.state)
    assert_equal((first.state, second.state), ("approved", "pending_approval"))
    decided = custody.engine.connect().execute(text("SELECT reasons, policy_version FROM policy_decision WHERE withdrawal_id = :w"),
                                               {"w": second.id}).one()
    # the owner has this one account, so their owner-wide total (same default figures) is over too
    assert_equal((list(decided.reasons), decided.policy_version),
                 (["velocity_limit_exceeded", "owner_velocity_limit_exceeded"], tight.version))
    for w in (first, second):  # leave nothing approved behind for other suites' batch jobs
        custody.withdrawals.reject(w.id, operator="op-test", comment="test cleanup")
    assert_equal(ledger.balance(acct).held, 0)


def test_kill_switch_refuses_new_withdrawals(custody, customer, api, engine, ledger):
    acct = customer("BTC")
    credit(custody, acct, 10_000_000)
    with engine.begin() as c:
        set_kill_switch(c, True, "test: incident drill", "op-test")
    try:
        assert_equal(refused(lambda: post(api, acct, "0.01")), (503, "withdrawals_halted"))
    finally:
        with engine.begin() as c:
            set_kill_switch(c, False, "drill over", "op-test")
    assert_equal(ledger.balance(acct).held, 0)


def test_simultaneous_requests_never_overdraw(custody, customer, ledger, log):
    acct = customer("BTC")
    credit(custody, acct, 100_000_000)
    barrier = threading.Barrier(16)
    outcomes: list[str] = []

    def one(i: int) -> None:
        barrier.wait()
        try:
            custody.withdrawals.request(client_withdrawal_id=f"race-{acct}-{i}", account_id=acct, amount=30_000_000,
                                        destination=REGTEST_DEST, requested_by="backend")
            outcomes.append("ok")
        except (LedgerError, CustodyError) as exc:
            outcomes.append(exc.code.value)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.info("16 simultaneous 0.3 BTC requests against 1 BTC: %s", sorted(outcomes))
    assert_equal(outcomes.count("ok"), 3)
    assert_equal(outcomes.count("insufficient_funds"), 13)
    bal = ledger.balance(acct)
    assert_equal((bal.held, bal.available), (3 * (30_000_000 + 5_000), 100_000_000 - 3 * 30_005_000))
    for w in custody.withdrawals.list(account_id=acct):
        custody.withdrawals.reject(w.id, operator="op-test", comment="test cleanup")


def test_destination_allowlist_modes(custody, customer, api, bitcoind, ledger, log):
    w = custody.withdrawals
    acct = customer("BTC")
    credit(custody, acct, 100_000_000)
    known, fresh = (bitcoind.wallet("getnewaddress", "", "bech32") for _ in range(2))
    log.info("review mode with a one-hour cooling-off: a just-added destination and an unknown one both need approval")
    answered(api, 200, api.set_allowlist(acct, mode="review", cooling_off_seconds=3600))
    answered(api, 201, api.allow_destination(acct, address=known))
    assert_equal(refusal(lambda: api.allow_destination(acct, address=MAINNET_DEST)).code, "invalid_destination")
    cooling = post(api, acct, "0.01", known)
    unknown = post(api, acct, "0.01", fresh)
    assert_equal((cooling.state, unknown.state), ("pending_approval", "pending_approval"))
    with custody.engine.connect() as c:
        reasons = dict(c.execute(text("SELECT withdrawal_id, reasons FROM policy_decision WHERE withdrawal_id = ANY(:w)"),
                                 {"w": [cooling.id, unknown.id]}).all())
    assert_equal((reasons[cooling.id], reasons[unknown.id]), (["destination_cooling_off"], ["destination_not_yet_allowlisted"]))
    log.info("enforce mode: an unknown destination is rejected outright")
    api.set_allowlist(acct, mode="enforce")
    error = refusal(lambda: post(api, acct, "0.01", fresh))
    assert_equal((error.status, error.detail["reasons"]), (422, ["destination_not_allowlisted"]))
    for wd in (cooling, unknown):
        w.reject(wd.id, operator="op-test", comment="test cleanup")
    assert_equal(ledger.balance(acct).held, 0)
