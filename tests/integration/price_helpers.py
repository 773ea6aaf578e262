"""Convert prices in the tests: propose over HTTP, sign as an operator, let the worker set it.

In deployment an operator's price counts only once the worker's `convert-prices` job verified the
operator's signature against its own approver keys and called `convert_price_set`, which the api's
database role may not (migration 0056). `set_price_over_api` does the three steps: POST
/v1/convert/prices, `approve_over_api` on the change (the operator's test key, named as their API
key), and `run_price_job` (the job as custody_worker, with the container's approver registry).
"""
from __future__ import annotations

import uuid

from custody.convert.prices import PriceChanges
from ledger.service import Ledger
from tests.approvers import approve_over_api
from tests.integration.test_db_roles import as_role

PRICE_CHANGES = "/v1/convert/prices/changes"
WORKER = "custody_worker"


def run_price_job(container) -> list[int]:
    """`PriceChanges.apply_signed()` as custody_worker on the container's database, with its
    approver registry; the ids applied."""
    engine = as_role(container.engine.url.render_as_string(hide_password=False), WORKER, login=False)
    try:
        return PriceChanges(engine, Ledger(engine), approvers=container.approvers).apply_signed()
    finally:
        engine.dispose()


def propose_and_sign(client, operator: str, body: dict, *, headers: dict | None = None):
    """POST /v1/convert/prices (`body` without a key: a fresh one), then sign the change as
    `operator`; the approve response."""
    r = client.post("/v1/convert/prices", json={"idempotency_key": uuid.uuid4().hex, **body}, headers=headers)
    assert r.status_code == 201, r.text
    assert r.json()["state"] == "proposed", r.text
    return approve_over_api(client, r.json()["id"], operator, "price checked", resource=PRICE_CHANGES, headers=headers)


def set_price_over_api(container, client, operator: str, body: dict, *, headers: dict | None = None) -> dict:
    """Propose, sign as `operator` and apply (the worker's job): the applied change."""
    r = propose_and_sign(client, operator, body, headers=headers)
    assert r.status_code == 200 and r.json()["state"] == "signed", r.text
    change = r.json()["id"]
    assert run_price_job(container) == [change]
    r = client.get(f"{PRICE_CHANGES}/{change}", headers=headers)
    assert r.status_code == 200 and r.json()["state"] == "applied", r.text
    return r.json()
