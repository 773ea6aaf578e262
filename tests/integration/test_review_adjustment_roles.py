"""Adversarial review of issue 11: treasury adjustments are maker-checker between OPERATORS, and the
README's money table says an admin is bound by the backend's money rules (never debits a firm
account). But the adjustment routes admit `Operator`, which every admin passes: two admin keys
(or one admin and one operator) propose and approve an adjustment that mints customer money from
equity, with no operator at all in the first case.
"""
from __future__ import annotations

import logging

from custody.auth import create_api_key
from regtest.util import assert_equal
from tests.integration.test_money_boundaries import Api, firm

log = logging.getLogger(__name__)


def test_admins_cannot_propose_or_approve_treasury_adjustments(engine, ledger):
    api = Api(engine)
    api("admin", "POST", "/v1/assets", json={"code": "BTC", "decimals": 8})
    api.keys["admin2"] = create_api_key(engine, f"admin2-{api.run}", "admin", api.container.settings.api_key_pepper)
    alice = api.customer("alice")
    equity = firm(api, "equity:BTC")
    log.info("the attack: an admin proposes equity -> alice, a second admin approves")
    proposed = api.client.post("/v1/treasury/adjustments", headers={"X-API-Key": api.keys["admin"]}, json={
        "idempotency_key": "admin-mint", "reason": "bonus", "transfers": [
            {"debit_account_id": equity, "credit_account_id": alice, "amount": "1"}]})
    log.info("propose -> %d %s", proposed.status_code, proposed.text[:160])
    approved = None
    if proposed.status_code == 201:
        approved = api.client.post(f"/v1/treasury/adjustments/{proposed.json()['id']}/approve",
                                   headers={"X-API-Key": api.keys["admin2"]}, json={"comment": "ok"})
        log.info("approve -> %d %s", approved.status_code, approved.text[:160])
    minted = ledger.balance(alice).posted
    assert_equal((proposed.status_code, minted), (403, 0))
