"""allowlist_loosening (issue 11, observation 6): the backend added an address, loosened the
allowlist at once (cooling-off 0, approvals 1) and a withdrawal to the address was approved with no
operator. Now a loosening waits for an operator (any one: the requester is the backend key), is
audited, and even once approved never shortens the cooling-off of an address already added; a
tightening (stricter mode, longer cooling-off, more approvals, an address removed) applies at once."""
from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest
from sqlalchemy import text

import custody.withdrawals as withdrawals
from regtest.util import assert_equal
from tests.integration.withdrawal_api import WithdrawalApi

log = logging.getLogger(__name__)

OTHER = "bcrt1qk8tdfzpr0f5gknhjq97e96mjufr8a93au6auez"  # a second address, not ours
LATER = "bcrt1qy0vz28q5uwkh3qmkcha39p3tf2564weu5f5m55"  # added after the loosening


@pytest.fixture(scope="module")
def api(engine) -> WithdrawalApi:
    return WithdrawalApi(engine)


def error(r) -> tuple[int, str]:
    return r.status_code, r.json()["error"]["code"]


def test_loosening_waits_for_an_operator_and_never_shortens_a_cooling_off(api, ledger):
    acct = api.open_customer(f"cust-{uuid.uuid4().hex[:8]}")
    allowlist = f"/v1/accounts/{acct}/allowlist"
    log.info("the customer turns on review mode, a day's cooling-off, two approvals, and adds an address")
    r = api.backend.put(allowlist, json={"mode": "review", "cooling_off_seconds": 86400, "approvals": 2})
    assert_equal(r.status_code, 200)
    assert_equal(api.backend.post(allowlist, json={"address": OTHER}).status_code, 201)

    log.info("the attack: loosen to no cooling-off and one approval, then withdraw to the address just added")
    r = api.backend.put(allowlist, json={"mode": "review", "cooling_off_seconds": 0, "approvals": 1})
    w = api.withdraw(acct, "0.01", OTHER)
    log.info("-> %d, withdrawal %s %s", r.status_code, w["state"], api.reasons(w["id"]))
    assert_equal((w["state"], api.reasons(w["id"])), ("pending_approval", ["destination_cooling_off"]))
    assert_equal(r.status_code, 202)
    body = r.json()
    assert_equal((body["cooling_off_seconds"], body["approvals"]), (86400, 2))
    change = body["pending_change"]
    assert_equal((change["state"], change["loosens"], change["cooling_off_seconds"]), ("pending", ["cooling_off", "approvals"], 0))

    log.info("the backend cannot approve its own loosening; an admin who asked for one cannot either")
    assert_equal(error(api.backend.post(f"/v1/allowlist-changes/{change['id']}/approve", json={"comment": "me"})), (403, "forbidden"))
    queue = api.operator().get("/v1/allowlist-changes").json()
    assert change["id"] in [ch["id"] for ch in queue]

    log.info("an operator approves it: the rule loosens, the address keeps its day of cooling-off")
    r = api.operator().post(f"/v1/allowlist-changes/{change['id']}/approve", json={"comment": "customer called in, verified"})
    assert_equal((r.status_code, r.json()["state"]), (200, "approved"))
    assert_equal(error(api.operator(2).post(f"/v1/allowlist-changes/{change['id']}/approve", json={"comment": "again"})),
                 (409, "invalid_state"))
    now = api.backend.get(allowlist).json()
    assert_equal((now["cooling_off_seconds"], now["approvals"], now["pending_change"]), (0, 1, None))
    again = api.withdraw(acct, "0.01", OTHER)
    assert_equal((again["state"], api.reasons(again["id"])), ("pending_approval", ["destination_cooling_off"]))
    assert_equal(api.backend.post(allowlist, json={"address": LATER}).status_code, 201)
    assert_equal(api.withdraw(acct, "0.01", LATER)["state"], "approved")  # added under the loosened rule
    with api.custody.engine.connect() as c:
        actions = c.execute(text("SELECT action FROM audit_event WHERE subject = :s ORDER BY id"), {"s": f"account:{acct}"}).scalars().all()
    assert_equal(actions, ["allowlist.policy", "allowlist.add", "allowlist.policy", "allowlist.change.approve", "allowlist.add"])

    log.info("tightening applies at once: enforce, an hour's cooling-off; removing an address too")
    r = api.backend.put(allowlist, json={"mode": "enforce", "cooling_off_seconds": 3600, "approvals": 1})
    assert_equal((r.status_code, r.json()["mode"], r.json()["cooling_off_seconds"]), (200, "enforce", 3600))
    assert_equal(api.withdraw(acct, "0.01", LATER)["state"], "pending_approval")  # the longer cooling-off counts now
    assert_equal(api.backend.delete(f"{allowlist}/{LATER}").json()["removed"], True)
    gone = api.withdraw(acct, "0.01", LATER)
    assert_equal((gone["state"], gone["reasons"]), ("rejected", ["destination_not_allowlisted"]))
    api.reject_all(acct)
    assert_equal(ledger.balance(acct).held, 0)


def test_a_mixed_change_tightens_now_and_a_rejected_loosening_changes_nothing(api, ledger):
    acct = api.open_customer(f"cust-{uuid.uuid4().hex[:8]}")
    allowlist = f"/v1/accounts/{acct}/allowlist"
    api.backend.put(allowlist, json={"mode": "review", "cooling_off_seconds": 3600, "approvals": 1})
    log.info("enforce (tighter) with no cooling-off (looser): enforce now, the cooling-off waits")
    r = api.backend.put(allowlist, json={"mode": "enforce", "cooling_off_seconds": 0, "approvals": 1})
    body = r.json()
    assert_equal((r.status_code, body["mode"], body["cooling_off_seconds"], body["pending_change"]["loosens"]),
                 (202, "enforce", 3600, ["cooling_off"]))
    first = body["pending_change"]["id"]
    log.info("a newer request supersedes the pending one; an operator rejects the newer")
    second = api.backend.put(allowlist, json={"mode": "review", "cooling_off_seconds": 60, "approvals": 1}).json()["pending_change"]
    assert_equal(api.operator().get("/v1/allowlist-changes", params={"state": "superseded"}).status_code, 200)
    assert_equal(error(api.operator().post(f"/v1/allowlist-changes/{first}/approve", json={"comment": "old"})), (409, "invalid_state"))
    r = api.operator().post(f"/v1/allowlist-changes/{second['id']}/reject", json={"comment": "not the customer"})
    assert_equal(r.json()["state"], "rejected")
    now = api.backend.get(allowlist).json()
    assert_equal((now["mode"], now["cooling_off_seconds"], now["pending_change"]), ("enforce", 3600, None))
    log.info("an admin that asked for a loosening may not approve it (admins never approve: operators decide)")
    pending = api.admin.put(allowlist, json={"mode": "review", "cooling_off_seconds": 0, "approvals": 1}).json()["pending_change"]
    assert_equal(error(api.admin.post(f"/v1/allowlist-changes/{pending['id']}/approve", json={"comment": "mine"})),
                 (403, "forbidden"))
    assert_equal(error(api.operator().post("/v1/allowlist-changes/999999999/approve", json={"comment": "x"})),
                 (404, "allowlist_change_not_found"))


def test_two_first_rules_at_once_never_end_on_the_looser(api, ledger, monkeypatch):
    """An account's first rule has no row to lock: two PUTs at once both read "no rule", each took
    itself for a tightening, and the later write won, so the looser rule applied with no operator.
    Both requests now pause right after reading the rule; the second must see the first's rule."""
    acct = api.open_customer(f"cust-{uuid.uuid4().hex[:8]}")
    allowlist = f"/v1/accounts/{acct}/allowlist"
    both_read = threading.Barrier(2, timeout=2)
    read = withdrawals._allowlist_rule

    def read_then_wait(c, account_id, *, lock=False):
        rule = read(c, account_id, lock=lock)
        if account_id == acct and lock:
            try:
                both_read.wait()
            except threading.BrokenBarrierError:
                pass  # the other request waits for this one's lock: it never reaches here meanwhile
        return rule

    monkeypatch.setattr(withdrawals, "_allowlist_rule", read_then_wait)
    strict = {"mode": "enforce", "cooling_off_seconds": 86400, "approvals": 2}
    loose = {"mode": "review", "cooling_off_seconds": 0, "approvals": 1}
    answers = {}

    def put(name, body):
        answers[name] = api.backend.put(allowlist, json=body).status_code

    threads = [threading.Thread(target=put, args=("strict", strict))]
    threads.append(threading.Thread(target=put, args=("loose", loose)))
    threads[0].start()
    time.sleep(0.2)  # the strict request reads first
    threads[1].start()
    for t in threads:
        t.join()
    now = api.backend.get(allowlist).json()
    log.info("answers %s; rule in force %s", answers, {k: now[k] for k in ("mode", "cooling_off_seconds", "approvals")})
    assert_equal((now["mode"], now["cooling_off_seconds"], now["approvals"]), ("enforce", 86400, 2))
    assert_equal(answers, {"strict": 200, "loose": 202})
    api.operator().post(f"/v1/allowlist-changes/{now['pending_change']['id']}/reject", json={"comment": "test cleanup"})
