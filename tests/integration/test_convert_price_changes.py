"""An operator's convert price counts only once the worker verified the operator's signature (0056).

A change is proposed over HTTP, signed by an operator (verified at the door), and applied by the
worker's `convert-prices` job as custody_worker after verifying the signature again against its own
approver keys. What a compromised api could store instead is refused: a signature by a key the
worker does not hold, a change past its expiry, an older change after a newer one of the pair; the
database makes every inserted row an unsigned proposal and lets the api move none to `applied`. A
treasury adjustment inserted as `approved` by a process role is a proposal too, and the worker may
not approve one. The ledger is verified at the end (the `ledger` fixture).
"""
from __future__ import annotations

import logging
import uuid

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from custody.api.app import create_app
from custody.auth import create_api_key
from custody.container import Container
from custody.convert.service import Convert
from custody.settings import Settings
from regtest.util import assert_equal
from tests.approvers import approve_over_api, registry, sign_approval
from tests.integration.price_helpers import PRICE_CHANGES, propose_and_sign, run_price_job, set_price_over_api

log = logging.getLogger(__name__)


@pytest.fixture()
def desk(engine, ledger):
    run = uuid.uuid4().hex[:6]
    settings = Settings(environment="test")
    operator, other = f"pc-ops-{run}", f"pc-other-{run}"
    container = Container(settings=settings, engine=engine, ledger=ledger, approvers=registry(operator))
    base, quote = f"B{run.upper()}", f"Q{run.upper()}"
    ledger.create_asset(base, 8)
    ledger.create_asset(quote, 2)
    client = TestClient(create_app(container), raise_server_exceptions=False)
    headers = {"X-API-Key": create_api_key(engine, operator, "operator", settings.api_key_pepper)}
    other_headers = {"X-API-Key": create_api_key(engine, other, "operator", settings.api_key_pepper)}
    return {"container": container, "client": client, "operator": operator, "other": other, "headers": headers,
            "other_headers": other_headers, "base": base, "quote": quote, "engine": engine,
            "convert": Convert(engine, ledger, settings)}


def _price(desk) -> int | None:
    found = desk["convert"].price(desk["base"], desk["quote"])
    return None if found is None else found.quote_minor_per_base_unit


def _body(desk, price: str) -> dict:
    return {"base_asset": desk["base"], "quote_asset": desk["quote"], "price": price}


def test_a_signed_price_counts_only_once_the_worker_applied_it(desk):
    r = propose_and_sign(desk["client"], desk["operator"], _body(desk, "60000"), headers=desk["headers"])
    assert_equal((r.status_code, r.json()["state"], r.json()["signed_by"]), (200, "signed", f"api:{desk['operator']}"))
    log.info("signed but not applied: no price yet")
    assert_equal(_price(desk), None)
    assert_equal(run_price_job(desk["container"]), [r.json()["id"]])
    assert_equal(_price(desk), 6_000_000)
    log.info("a replay of the signature on the applied change is refused at the door")
    r2 = desk["client"].post(f"{PRICE_CHANGES}/{r.json()['id']}/approve", headers=desk["headers"], json={
        "comment": "again", "signature": {"key_id": "x", "scheme": "ed25519", "signature": "AA=="}})
    assert_equal((r2.status_code, r2.json()["error"]["code"]), (409, "invalid_state"))


def test_a_signature_the_worker_does_not_verify_sets_nothing(desk):
    log.info("an operator without a key in the registry cannot sign at the door")
    r = propose_and_sign(desk["client"], desk["other"], _body(desk, "1"), headers=desk["other_headers"])
    assert_equal((r.status_code, r.json()["error"]["code"]), (403, "approver_unknown"))
    log.info("a compromised api stores a signature by a key of its own as if verified: the worker refuses it")
    r = desk["client"].post("/v1/convert/prices", json={"idempotency_key": "forged", **_body(desk, "1")},
                            headers=desk["headers"])
    change = r.json()["id"]
    forged = sign_approval(b"anything", "mallory", as_key=f"test-ed25519:{desk['operator']}")
    with desk["engine"].connect() as c:
        c.exec_driver_sql("SET LOCAL ROLE custody_api")
        c.execute(text("UPDATE convert_price_change SET state = 'signed', signed_by = :by, key_id = :k, "
                       "scheme = 'ed25519', signature = :s WHERE id = :i"),
                  {"by": f"api:{desk['operator']}", "k": forged.key_id, "s": forged.signature, "i": change})
        log.info("... nor may it mark the change applied itself")
        with pytest.raises(DBAPIError) as refused:
            with c.begin_nested():
                c.execute(text("UPDATE convert_price_change SET state = 'applied' WHERE id = :i"), {"i": change})
        assert_equal(refused.value.orig.sqlstate, "42501")
        c.commit()
        c.exec_driver_sql("RESET ROLE")
    assert_equal(run_price_job(desk["container"]), [])
    r = desk["client"].get(f"{PRICE_CHANGES}/{change}", headers=desk["headers"])
    assert_equal((r.json()["state"], r.json()["refusal"], _price(desk)), ("refused", "approval_signature_invalid", None))


def test_an_expired_or_superseded_change_is_refused(desk):
    log.info("the api inserts a change already applied and expiring in a year: it is a fresh proposal")
    with desk["engine"].connect() as c:
        c.exec_driver_sql("SET LOCAL ROLE custody_api")  # ends with the transaction
        row = c.execute(text(
            "INSERT INTO convert_price_change (request_key, base_asset, quote_asset, quote_minor_per_base_unit, "
            "proposed_by, expires_at, state) VALUES ('k', :b, :q, 1, 'api:x', now() + interval '1 year', 'applied') "
            "RETURNING state, expires_at <= now() + interval '15 minutes' AS capped"),
            {"b": desk["base"], "q": desk["quote"]}).one()
        c.rollback()
    assert_equal(tuple(row), ("proposed", True))
    r = desk["client"].post("/v1/convert/prices", json={"idempotency_key": "older", **_body(desk, "50000")},
                            headers=desk["headers"])
    older = r.json()["id"]
    newer = set_price_over_api(desk["container"], desk["client"], desk["operator"], _body(desk, "60000"),
                               headers=desk["headers"])
    assert_equal(newer["state"], "applied")
    log.info("the older change, signed after the newer one was applied, would put an old price back: refused")
    r = approve_over_api(desk["client"], older, desk["operator"], "late", resource=PRICE_CHANGES, headers=desk["headers"])
    assert_equal(r.json()["state"], "signed")
    assert_equal(run_price_job(desk["container"]), [])
    r = desk["client"].get(f"{PRICE_CHANGES}/{older}", headers=desk["headers"])
    assert_equal((r.json()["state"], r.json()["refusal"]), ("refused", f"superseded by change {newer['id']}"))
    log.info("a change past its expiry is refused at the door and by the worker")
    r = desk["client"].post("/v1/convert/prices", json={"idempotency_key": "late", **_body(desk, "70000")},
                            headers=desk["headers"])
    late = r.json()["id"]
    with desk["engine"].begin() as c:  # the owner's session: time passes
        c.execute(text("UPDATE convert_price_change SET expires_at = now() - interval '1 second' WHERE id = :i"),
                  {"i": late})
    r = desk["client"].post(f"{PRICE_CHANGES}/{late}/approve", headers=desk["headers"], json={
        "comment": "late", "signature": {"key_id": "x", "scheme": "ed25519", "signature": "AA=="}})
    assert_equal((r.status_code, r.json()["error"]["code"]), (409, "price_change_expired"))
    assert_equal(run_price_job(desk["container"]), [])
    r = desk["client"].get(f"{PRICE_CHANGES}/{late}", headers=desk["headers"])
    assert_equal((r.json()["state"], r.json()["refusal"], _price(desk)), ("refused", "expired unsigned", 6_000_000))


def test_no_process_role_writes_an_approved_adjustment_nor_the_worker_approves_one(engine):
    with engine.connect() as c:
        c.exec_driver_sql("SET LOCAL ROLE custody_api")
        row = c.execute(text(
            "INSERT INTO treasury_adjustment (idempotency_key, proposed_by, reason, transfers, quorum, state) "
            "VALUES (:k, 'api:x', 'forged', '[]'::jsonb, 1, 'approved') RETURNING id, state"),
            {"k": uuid.uuid4().hex}).one()
        assert_equal(row.state, "proposed")
        c.commit()
        c.exec_driver_sql("SET LOCAL ROLE custody_worker")
        with pytest.raises(DBAPIError) as refused:
            with c.begin_nested():
                c.execute(text("UPDATE treasury_adjustment SET state = 'approved' WHERE id = :i"), {"i": row.id})
        assert_equal(refused.value.orig.sqlstate, "42501")
        c.exec_driver_sql("RESET ROLE")
        c.execute(text("UPDATE treasury_adjustment SET state = 'rejected' WHERE id = :i"), {"i": row.id})
        c.commit()
