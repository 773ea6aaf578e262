"""Brief H2 item 3: who set a price, or changed an API key, is the authenticated principal's name, never
a name the caller picks.

Over HTTP the actor was already the principal's (`who.name`) and no request body may carry one
(every request model forbids unknown fields: a body naming someone is `invalid_request`, 422). But
the price route wrote the bare name where every other route writes `api:<name>`, and the database
took whatever name the api passed: `convert_price_set('custody', ...)` as custody_api set a price in
the service's own name (or anyone's, or nobody's), and `custody_revoke_api_key(id, by, caller)`
audited a `by` unrelated to the calling key. Migration 0052: as a service role, a price's actor must
be `api:<name>` of a live operator or admin (API key or console credential) and a key change's actor
`api:<the calling key's name>`, else 42501. Since migration 0056 custody_api may not call
`convert_price_set` at all: the worker calls it, in the name of the operator whose signature over
the proposed change it verified, and that name must still be a live operator's. The ledger is
verified at the end.
"""
from __future__ import annotations

import os
import uuid

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from custody.api.app import create_app
from custody.auth import create_api_key, get_api_key, revoke_api_key
from custody.container import Container
from custody.settings import Settings
from ledger.service import Ledger
from regtest.util import assert_equal
from tests.approvers import registry
from tests.integration.price_helpers import set_price_over_api

SETTINGS = Settings(environment="test")


@pytest.fixture()
def world(engine, ledger):
    run = uuid.uuid4().hex[:6]
    base, quote = f"B{run.upper()}", f"Q{run.upper()}"
    ledger.create_asset(base, 8)
    ledger.create_asset(quote, 2)
    keys = {}
    for name, role in (("operator", "operator"), ("admin", "admin"), ("backend", "backend"), ("gone", "operator")):
        keys[name] = (f"actor-{name}-{run}", create_api_key(engine, f"actor-{name}-{run}", role, SETTINGS.api_key_pepper))
    revoke_api_key(engine, _key_id(engine, keys["gone"][0]), by="test")
    console_user = f"actor-console-{run}"
    with engine.begin() as c:  # an active operator credential, as an approved enrolment leaves it
        c.execute(text("INSERT INTO console_credential (username, credential_id, public_key, rp_id, origin) "
                       "VALUES (:u, :i, :k, 'localhost', 'http://localhost:8000')"),
                  {"u": console_user, "i": os.urandom(16), "k": os.urandom(32)})
        c.execute(text("UPDATE console_credential SET state = 'active', role = 'operator', decided_by = 'test', "
                       "decided_at = now() WHERE username = :u"), {"u": console_user})
    container = Container(settings=SETTINGS, engine=engine, ledger=Ledger(engine),
                          approvers=registry(keys["operator"][0]))
    client = TestClient(create_app(container), raise_server_exceptions=False)
    yield {"run": run, "base": base, "quote": quote, "keys": keys, "console_user": console_user, "client": client,
           "container": container}
    ledger.verify()


def _key_id(engine, name: str) -> int:
    with engine.connect() as c:
        return c.execute(text("SELECT id FROM api_key WHERE name = :n AND revoked_at IS NULL"), {"n": name}).scalar_one()


def as_api(engine, sql: str, params: dict, *, role: str = "custody_api") -> str | None:
    """Run `sql` as `role` in a transaction that is rolled back: None, or the SQLSTATE it failed with."""
    with engine.connect() as c:
        try:
            c.exec_driver_sql(f"SET LOCAL ROLE {role}")
            c.execute(text(sql), params)
        except DBAPIError as exc:
            return getattr(exc.orig, "sqlstate", None)
        finally:
            c.rollback()
    return None


SET_PRICE = "SELECT * FROM convert_price_set(:by, :b, :q, 5900000)"


def test_the_database_sets_a_price_only_in_a_live_operators_name(engine, world):
    """As custody_worker (the one process role that may call it, 0056); custody_api is refused each."""
    keys = world["keys"]
    refused = {
        "the service's own actor": "custody",
        "a bare key name": keys["operator"][0],
        "nobody": f"api:nobody-{world['run']}",
        "a backend key": f"api:{keys['backend'][0]}",
        "a revoked operator key": f"api:{keys['gone'][0]}",
    }
    allowed = {
        "a live operator key": f"api:{keys['operator'][0]}",
        "a live admin key": f"api:{keys['admin'][0]}",
        "an active console operator": f"api:{world['console_user']}",
    }
    answers = {what: as_api(engine, SET_PRICE, {"by": by, "b": world["base"], "q": world["quote"]}, role="custody_worker")
               for what, by in {**refused, **allowed}.items()}
    assert_equal(answers, {**{what: "42501" for what in refused}, **{what: None for what in allowed}})
    api = {what: as_api(engine, SET_PRICE, {"by": by, "b": world["base"], "q": world["quote"]}) for what, by in allowed.items()}
    assert_equal(api, {what: "42501" for what in allowed})


def test_a_price_set_over_http_is_the_callers_and_a_body_naming_someone_is_refused(engine, world):
    name, key = world["keys"]["operator"]
    client, body = world["client"], {"base_asset": world["base"], "quote_asset": world["quote"], "price": "60000"}
    named = client.post("/v1/convert/prices", json={**body, "idempotency_key": "named", "set_by": "someone-else"},
                        headers={"X-API-Key": key})
    assert_equal((named.status_code, named.json()["error"]["code"]), (422, "invalid_request"))
    change = set_price_over_api(world["container"], client, name, body, headers={"X-API-Key": key})
    with engine.connect() as c:
        actors = c.execute(text("SELECT actor FROM audit_event WHERE action = 'convert.price' AND subject = :s"),
                           {"s": f"convert-price:{world['base']}/{world['quote']}"}).scalars().all()
    assert_equal((change["proposed_by"], change["signed_by"], actors), (f"api:{name}", f"api:{name}", [f"api:{name}"]))


def test_a_key_change_through_the_api_is_audited_as_the_calling_key(engine, world):
    admin_name, admin_key = world["keys"]["admin"]
    admin, target = _key_id(engine, admin_name), _key_id(engine, world["keys"]["operator"][0])
    revoke = "SELECT custody_revoke_api_key(:t, :by, :caller)"
    rotate = "SELECT custody_rotate_api_key(:t, 'prefix', 'hash', 0, :by, :caller)"
    answers = [as_api(engine, sql, {"t": target, "by": by, "caller": admin})
               for sql in (revoke, rotate) for by in ("api:someone-else", f"api:{admin_name}")]
    assert_equal(answers, ["42501", None, "42501", None])
    r = world["client"].post(f"/v1/api-keys/{target}/rotate", json={"grace_seconds": 0, "by": "someone-else"},
                             headers={"X-API-Key": admin_key})
    assert_equal((r.status_code, r.json()["error"]["code"], get_api_key(engine, target).revoked_at), (422, "invalid_request", None))
