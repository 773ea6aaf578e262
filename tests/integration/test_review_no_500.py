"""Adversarial review of issue 11 (observation 11, "no route answers 500 for any input") on the
routes the trust-boundary work added or changed: treasury adjustments, allowlist changes, incident
resolution, withdrawal approvals, and the ledger commands behind `CallerLedger`.

A NUL byte is a valid JSON string character that PostgreSQL cannot store in text: it must be
refused with a 4xx before it reaches the database. Every request below is sent once by the role
that may send it, and the answers are compared all at once, so a run shows every 500.
"""
from __future__ import annotations

import logging
import uuid

from regtest.util import assert_equal
from tests.integration.test_money_boundaries import Api, firm
from tests.integration.withdrawal_api import DEST, WithdrawalApi

log = logging.getLogger(__name__)
NUL = "\x00"


def test_nul_bytes_and_huge_ids_on_the_new_routes_are_refused_not_500(engine, ledger):
    api = Api(engine)
    api("admin", "POST", "/v1/assets", json={"code": "BTC", "decimals": 8})
    alice = api.customer("alice")
    equity = firm(api, "equity:BTC")
    leg = [{"debit_account_id": equity, "credit_account_id": alice, "amount": "0.00000001"}]
    proposal = api("ann", "POST", "/v1/treasury/adjustments", 201,
                   json={"idempotency_key": "review-no-500", "reason": "review", "transfers": leg})
    requests = {
        "adjustment key": ("ann", "POST", "/v1/treasury/adjustments",
                           {"json": {"idempotency_key": f"k{NUL}", "reason": "r", "transfers": leg}}),
        "adjustment reason": ("ann", "POST", "/v1/treasury/adjustments",
                              {"json": {"idempotency_key": "k2", "reason": f"r{NUL}", "transfers": leg}}),
        "adjustment vote comment": ("ben", "POST", f"/v1/treasury/adjustments/{proposal['id']}/reject",
                                    {"json": {"comment": f"no{NUL}"}}),
        "account name": ("backend", "POST", "/v1/accounts",
                         {"json": {"asset": "BTC", "kind": "customer", "name": f"customer:o{api.run}:{NUL}", "owner": f"o{api.run}"}}),
        "hold id beyond 64 bits": ("backend", "POST", "/v1/holds/99999999999999999999/release", {}),
        "firm accounts asset": ("backend", "GET", "/v1/firm-accounts", {"params": {"asset": NUL}}),
    }
    answers = {}
    for what, (actor, method, path, kw) in requests.items():
        answers[what] = api.client.request(method, path, headers={"X-API-Key": api.keys[actor]}, **kw).status_code
    api("ben", "POST", f"/v1/treasury/adjustments/{proposal['id']}/reject", 200, json={"comment": "review cleanup"})

    w = WithdrawalApi(engine)
    acct = w.open_customer(f"nul-{uuid.uuid4().hex[:8]}")
    answers["client withdrawal id"] = w.backend.post("/v1/withdrawals", json={
        "client_withdrawal_id": f"w{NUL}", "account_id": acct, "amount": "0.1", "destination": DEST}).status_code
    answers["withdrawal queue state"] = w.operator().get("/v1/withdrawals", params={"state": NUL}).status_code
    pending = w.withdraw(acct, "5")  # above the automatic tier: waits for operators
    answers["withdrawal approval comment"] = w.operator().post(f"/v1/withdrawals/{pending['id']}/approve",
                                                              json={"comment": f"ok{NUL}"}).status_code
    w.reject_all(acct)
    log.info("answers: %s", answers)
    assert_equal({k: v for k, v in answers.items() if v >= 500}, {})
