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
