"""velocity_per_owner (issue 11, observation 7): velocity limits counted per ledger account, so a
second account of the same owner got a fresh limit. Now every account of one owner counts towards
one limit per asset (as well as each account's own); another owner is not affected."""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import uuid

import pytest

from custody.policy_config import default_policy
from policies import VelocityLimit
from regtest.util import assert_equal
from tests.integration.withdrawal_api import WithdrawalApi

log = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def api(engine) -> WithdrawalApi:
    base = default_policy()
    tight = dataclasses.replace(base, version=base.version + "+tight-velocity", assets={
        **base.assets, "BTC": dataclasses.replace(base.assets["BTC"], velocity=VelocityLimit(dt.timedelta(hours=1), 15_000_000, 1))})
    return WithdrawalApi(engine, policy=tight)


def test_a_second_account_of_one_owner_gets_no_fresh_limit(api, ledger):
    owner = f"cust-{uuid.uuid4().hex[:8]}"
    first, second = api.open_customer(owner), api.open_customer(owner)
    stranger = api.open_customer(f"cust-{uuid.uuid4().hex[:8]}")
    log.info("0.1 BTC from the first account against a 0.15 BTC hourly limit: approved")
    assert_equal(api.withdraw(first, "0.1")["state"], "approved")
    log.info("the attack: 0.1 BTC more from a second account of the same owner")
    w = api.withdraw(second, "0.1")
    log.info("-> %s %s", w["state"], api.reasons(w["id"]))
    assert_equal((w["state"], api.reasons(w["id"])), ("pending_approval", ["owner_velocity_limit_exceeded"]))
    log.info("a third account opened later is no way around it either; another owner has their own limit")
    third = api.open_customer(owner)
    assert_equal(api.withdraw(third, "0.02")["state"], "pending_approval")
    assert_equal(api.withdraw(stranger, "0.1")["state"], "approved")
    log.info("per account as before: the first account alone over its limit")
    w = api.withdraw(first, "0.1")
    assert_equal(api.reasons(w["id"]), ["velocity_limit_exceeded", "owner_velocity_limit_exceeded"])
    api.reject_all(first, second, third, stranger)
    for acct in (first, second, third, stranger):
        assert_equal(ledger.balance(acct).held, 0)



def test_simultaneous_requests_from_two_accounts_of_one_owner_pass_the_limit_once(api, ledger):
    """Two accounts of one owner racing: both requests have placed their holds and reached the
    decision at the same moment (a barrier in the decision's clock); the owner's decisions are
    taken one at a time, so only one 0.1 BTC request fits the 0.15 BTC limit."""
    import threading

    owner = f"cust-{uuid.uuid4().hex[:8]}"
    accounts = [api.open_customer(owner), api.open_customer(owner)]
    withdrawals = api.custody.withdrawals
    real_clock, barrier = withdrawals.clock, threading.Barrier(2, timeout=10)
    states: list[str] = []

    def clock():
        barrier.wait()  # both decisions start together
        return real_clock()

    def one(acct: int) -> None:
        w = withdrawals.request(client_withdrawal_id=f"race-{owner}-{acct}", account_id=acct, amount=10_000_000,
                                destination="bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080", requested_by="backend")
        states.append(w.state)

    withdrawals.clock = clock
    try:
        threads = [threading.Thread(target=one, args=(acct,)) for acct in accounts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        withdrawals.clock = real_clock
    log.info("two simultaneous 0.1 BTC requests from two accounts of one owner: %s", sorted(states))
    assert_equal(sorted(states), ["approved", "pending_approval"])
    api.reject_all(*accounts)
