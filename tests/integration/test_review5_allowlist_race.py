"""Adversarial review 5 of issue 11: an operator approving a pending allowlist loosening while the
backend tightens the same account's rule.

The approval locks the change row, then the rule row; the tightening PUT takes the account's
advisory lock, locks the rule row, then the pending change rows (to supersede them). Met at the
wrong moment, each waits for the other: PostgreSQL kills one as a deadlock victim and the caller is
told 503 after a second's wait. Either serial order is fine (approve then tighten: tight;
tighten then approve: the change is superseded, 409); a deadlock is not.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest

import custody.withdrawals as withdrawals
from regtest.util import assert_equal
from tests.integration.withdrawal_api import WithdrawalApi

log = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def api(engine) -> WithdrawalApi:
    return WithdrawalApi(engine)


def test_approving_a_loosening_while_the_rule_is_tightened_does_not_deadlock(api, ledger, monkeypatch):
    acct = api.open_customer(f"cust-{uuid.uuid4().hex[:8]}")
    allowlist = f"/v1/accounts/{acct}/allowlist"
    log.info("the customer has review mode with an hour's cooling-off and asks to drop the cooling-off")
    assert_equal(api.backend.put(allowlist, json={"mode": "review", "cooling_off_seconds": 3600, "approvals": 1}).status_code, 200)
    r = api.backend.put(allowlist, json={"mode": "review", "cooling_off_seconds": 0, "approvals": 1})
    assert_equal(r.status_code, 202)
    change = r.json()["pending_change"]["id"]

    log.info("an operator approves it while the backend tightens the rule: the approval holds the change row "
             "and pauses until the tightening holds the rule row")
    tightening_read = threading.Event()
    read = withdrawals._allowlist_rule

    calls = []  # the routes run on the server's worker threads: the approval reads first, by the sleep below

    def read_in_order(c, account_id, *, lock=False):
        if not (account_id == acct and lock):
            return read(c, account_id, lock=lock)
        calls.append(account_id)
        if len(calls) == 1:  # the approval, holding the change row
            tightening_read.wait(timeout=3)  # with a consistent lock order the tightening never gets here first
            return read(c, account_id, lock=lock)
        rule = read(c, account_id, lock=lock)  # the tightening, holding the rule row
        tightening_read.set()
        return rule

    monkeypatch.setattr(withdrawals, "_allowlist_rule", read_in_order)
    answers = {}

    def approve():
        answers["approve"] = api.operator().post(f"/v1/allowlist-changes/{change}/approve",
                                                 json={"comment": "customer called in"}).status_code

    def tighten():
        answers["tighten"] = api.backend.put(allowlist, json={"mode": "enforce", "cooling_off_seconds": 86400,
                                                              "approvals": 2}).status_code

    threads = [threading.Thread(target=approve, name="approve"), threading.Thread(target=tighten, name="tighten")]
    threads[0].start()
    time.sleep(0.3)  # the approval holds the change row
    threads[1].start()
    for t in threads:
        t.join()
    now = api.backend.get(allowlist).json()
    log.info("answers %s; rule in force %s", answers, {k: now[k] for k in ("mode", "cooling_off_seconds", "approvals")})
    assert_equal((now["mode"], now["cooling_off_seconds"], now["approvals"]), ("enforce", 86400, 2))
    assert_equal({k: v for k, v in answers.items() if v >= 500}, {})
