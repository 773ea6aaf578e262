"""Review 14 (R2): failing tests for the findings of the adversarial review of issue 14's backend work.

Each test shows one finding on the real components (PostgreSQL, the in-process API as custody_api,
a real NATS JetStream server) and is marked xfail(strict=True) so the branch stays green; the fix
turns it into an XPASS, which fails the run until the mark is removed. See each test's reason.

- F2: the api role can forge outbox events (any type) and rewind an aggregate's sequence so that
  the next trigger-emitted event is silently dropped (migration 0026 grants custody_api INSERT on
  `outbox` and INSERT, UPDATE on `outbox_aggregate`; `custody_emit` is SECURITY INVOKER).
- F3: one backend request with a large `metadata` stops the whole event stream: the JetStream
  publish of its `ledger.transaction_posted` is refused (NATS max_payload), the sink reports every
  failure as `BrokerUnavailable`, and the dispatcher never gets past it (head-of-line blocking).
  Fixed (fix14b): metadata is bounded (16 KB), so the test now shows the 422 and, for an event
  the broker still refuses (written by the owner), the dead letter, its incident and that only its
  own aggregate waits.
- F4: a backend reads the firm's own movements through a firm account's statement, which
  `GET /v1/transactions/{id}` (custody.money_rules.may_read_transaction) hides from it.
- F5: `/metrics` answers without an API key and shows what the books say each hot/cold location
  holds, reconciliation differences and open incidents.
- F6: an admin key left working for a rotation's grace period rotates the key that replaced it
  (custody_rotate_api_key only asks that the target be live and not rotated yet).
F1 and F7 (webhook signing, webhook URLs) are in tests/unit/test_review14_webhook_signature.py.
"""
from __future__ import annotations

import asyncio
import logging
import os
import uuid
from pathlib import Path

import nats
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from custody.api.app import create_app
from custody.auth import Role, create_api_key, list_api_keys, revoke_api_key
from custody.broker import JetStreamSink, embedded_nats_url
from custody.container import Container
from custody.jobs import OutboxDispatcher
from custody.settings import Settings
from ledger.model import AccountKind
from ledger.service import Ledger
from regtest.util import assert_equal
from tests.integration.own_database import own_database

log = logging.getLogger(__name__)


def _client(engine, ledger) -> tuple[TestClient, Settings]:
    settings = Settings(environment="test")
    return TestClient(create_app(Container(settings=settings, engine=engine, ledger=ledger)),
                      raise_server_exceptions=False), settings


# ---- F2: the api role writes the outbox directly ------------------------------------------------

def test_the_api_role_cannot_forge_a_ledger_event(engine):
    run = uuid.uuid4().hex[:8]
    forged_payload = ('{"transaction_id": 999999999, "kind": "deposit", "legs": '
                      '[{"account_id": 1, "asset": "BTC", "amount": 100000000, "entry_id": 1, "hold_id": null}]}')
    refused = []
    with engine.connect() as c:
        tx = c.begin()
        try:
            c.execute(text("SET LOCAL ROLE custody_api"))
            for label, sql in (
                ("INSERT outbox", "INSERT INTO outbox (topic, event_key, aggregate, aggregate_seq, payload) "
                                  "VALUES ('ledger.transaction_posted', :k, 'journal_transaction:999999999', 1, "
                                  "CAST(:p AS jsonb))"),
                ("custody_emit", "SELECT custody_emit('ledger.transaction_posted', :k || '-emit', "
                                 "'journal_transaction:999999998', 1, CAST(:p AS jsonb))"),
            ):
                c.execute(text("SAVEPOINT s"))
                try:
                    c.execute(text(sql), {"k": f"ledger.transaction_posted:r14-{run}", "p": forged_payload})
                    c.execute(text("RELEASE SAVEPOINT s"))
                except DBAPIError:
                    c.execute(text("ROLLBACK TO SAVEPOINT s"))
                    refused.append(label)
        finally:
            tx.rollback()  # nothing forged stays in the session database
    assert_equal(refused, ["INSERT outbox", "custody_emit"])


def test_the_api_role_cannot_make_a_hold_event_disappear(engine, ledger):
    run = uuid.uuid4().hex[:8]
    asset = f"R{run[:6].upper()}"
    ledger.create_asset(asset, 8)
    alice = ledger.open_account(asset, AccountKind.customer, f"customer:{run}-a:{asset}", owner=f"{run}-a").id
    pool = ledger.open_account(asset, AccountKind.asset_location, f"test:{run}:pool").id
    ledger.transfer(f"test:{run}:fund", pool, alice, 1_000, kind="deposit")
    hold = ledger.place_hold(f"test:{run}:hold", alice, 400, owner="review14", reference="r14")
    aggregate = f"hold:{hold.id}"

    with engine.connect() as c:  # what a compromised api process can do with its own grants
        c.execute(text("SET ROLE custody_api"))
        c.commit()
        try:
            c.execute(text("UPDATE outbox_aggregate SET last_seq = 0 WHERE aggregate = :a"), {"a": aggregate})
            c.commit()
            refused = False
        except DBAPIError:
            c.rollback()
            refused = True
        c.execute(text("RESET ROLE"))
        c.commit()
    if refused:
        log.info("custody_api may not rewind an aggregate: fixed")
        ledger.release_hold(hold.id, owner="review14")
        return

    ledger.release_hold(hold.id, owner="review14")  # a money operation by the service: it commits
    with engine.connect() as c:
        states = c.execute(text("SELECT payload->>'state' FROM outbox WHERE aggregate = :a ORDER BY aggregate_seq"),
                           {"a": aggregate}).scalars().all()
        # leave the aggregate consistent for anyone after us
        c.execute(text("UPDATE outbox_aggregate SET last_seq = (SELECT max(aggregate_seq) FROM outbox "
                       "WHERE aggregate = :a) WHERE aggregate = :a"), {"a": aggregate})
        c.commit()
    assert_equal(states, ["pending", "released"])  # today: ["pending"], the release's event is gone


# ---- F3: one oversized event stops the event stream ---------------------------------------------

@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return os.environ.get("NATS_URL") or embedded_nats_url(Path(tmp_path_factory.mktemp("state")))


def _delete_stream(url: str, stream: str) -> None:
    async def go() -> None:
        nc = await nats.connect(url)
        try:
            await nc.jetstream().delete_stream(stream)
        except Exception:  # noqa: BLE001 - not created
            pass
        finally:
            await nc.close()
    asyncio.run(go())


def test_one_large_transaction_does_not_stop_every_later_event(database_url, nats_url):
    run = uuid.uuid4().hex[:8]
    stream, prefix = f"R14POISON{run.upper()}", f"r14p{run}"
    with own_database(database_url, "r14poison") as engine:
        ledger = Ledger(engine)
        client, settings = _client(engine, ledger)
        key = create_api_key(engine, f"r14-backend-{run}", Role.backend, settings.api_key_pepper)
        asset = f"P{run[:6].upper()}"
        ledger.create_asset(asset, 8)
        alice = ledger.open_account(asset, AccountKind.customer, f"customer:{run}-a:{asset}", owner=f"{run}-a").id
        bob = ledger.open_account(asset, AccountKind.customer, f"customer:{run}-b:{asset}", owner=f"{run}-b").id
        pool = ledger.open_account(asset, AccountKind.asset_location, f"test:{run}:pool").id
        ledger.transfer(f"test:{run}:fund", pool, alice, 100_000_000, kind="deposit")

        def post(idem: str, metadata: dict) -> int:
            r = client.post("/v1/transactions", headers={"X-API-Key": key}, json={
                "idempotency_key": idem, "kind": "transfer", "metadata": metadata,
                "transfers": [{"debit_account_id": alice, "credit_account_id": bob, "amount": "0.0001"}]})
            assert_equal(r.status_code, 201)
            return r.json()["transaction_id"]

        # fix14b: a backend's metadata is bounded now (16 KB as JSON, schema and CHECK, migration 0032)...
        r = client.post("/v1/transactions", headers={"X-API-Key": key}, json={
            "idempotency_key": "big", "kind": "transfer", "metadata": {"note": "x" * 1_100_000},
            "transfers": [{"debit_account_id": alice, "credit_account_id": bob, "amount": "0.0001"}]})
        assert_equal((r.status_code, r.json()["error"]["code"]), (422, "invalid_request"))
        # ...but an event may still be one the broker refuses (written before the bound, a larger
        # subsystem payload): the owner writes such an event, then a second one on its aggregate
        poison = f"r14:{run}:poison"
        with engine.begin() as c:
            for n, size in ((1, 1_100_000), (2, 10)):
                c.execute(text("SELECT custody_emit('ledger.transaction_posted', :k, :a, 1, CAST(:p AS jsonb))"),
                          {"k": f"{poison}:{n}", "a": poison, "p": '{"note": "%s"}' % ("x" * size)})
        small = post("small", {"trade": "43"})
        sink = JetStreamSink(nats_url, stream=stream, subject_prefix=prefix, timeout_s=2.0)
        try:
            dispatcher = OutboxDispatcher(engine, sink)
            for _ in range(3):
                dispatcher.dispatch()
            with engine.connect() as c:
                delivered = dict(c.execute(text(
                    "SELECT event_key, delivered_at IS NOT NULL FROM outbox WHERE event_key = ANY (:k)"),
                    {"k": [f"{poison}:1", f"{poison}:2", f"ledger.transaction_posted:{small}"]}).all())
                dead = c.execute(text("SELECT event_key FROM outbox WHERE dead_lettered_at IS NOT NULL")).scalars().all()
                incidents = c.execute(text("SELECT kind, severity FROM incident WHERE dedupe_key = :d"),
                                      {"d": f"event_dead_lettered:{poison}:1"}).all()
            log.info("delivered: %s", delivered)
        finally:
            sink.close()
            _delete_stream(nats_url, stream)
        ledger.assert_verified()
        client.close()
    # the small transaction's event (and every later one) must not wait behind the one that cannot be published
    assert_equal(delivered[f"ledger.transaction_posted:{small}"], True)
    # the refused one is set aside with an incident; its own aggregate's next event waits behind it
    assert_equal(dead, [f"{poison}:1"])
    assert_equal([tuple(i) for i in incidents], [("event_dead_lettered", "warning")])
    assert_equal((delivered[f"{poison}:1"], delivered[f"{poison}:2"]), (False, False))


# ---- F4: a firm account's statement shows what GET /v1/transactions/{id} hides -----------------

def test_a_backend_does_not_see_firm_movements_through_a_statement(engine, ledger):
    run = uuid.uuid4().hex[:8]
    client, settings = _client(engine, ledger)
    backend = create_api_key(engine, f"r14-stmt-{run}", Role.backend, settings.api_key_pepper)
    asset = f"S{run[:6].upper()}"
    ledger.create_asset(asset, 8)
    pool = ledger.open_account(asset, AccountKind.asset_location, f"test:{run}:pool").id
    equity = ledger.open_account(asset, AccountKind.equity, f"test:{run}:equity").id
    firm_only = ledger.transfer(f"test:{run}:treasury-move", pool, equity, 5_000, kind="test_funding").transaction_id

    r = client.get(f"/v1/transactions/{firm_only}", headers={"X-API-Key": backend})
    assert_equal((r.status_code, r.json()["error"]["code"]), (404, "transaction_not_found"))  # hidden here...

    r = client.get(f"/v1/accounts/{pool}/statement", headers={"X-API-Key": backend})
    seen = [(l["transaction_id"], l["idempotency_key"]) for l in r.json().get("lines", [])] if r.status_code == 200 else []
    log.info("the backend's statement of the firm's pool: %s %s", r.status_code, seen)
    assert_equal(seen, [])  # ...and shown here: [(firm_only, 'test:<run>:treasury-move')]


# ---- F5: /metrics is public and shows the firm's holdings ----------------------------------------

def test_metrics_do_not_show_the_firms_holdings_to_anyone(database_url):
    run = uuid.uuid4().hex[:8]
    with own_database(database_url, "r14metrics") as engine:  # a location account of its own, seen by nobody else
        ledger = Ledger(engine)
        client, _ = _client(engine, ledger)
        asset = f"M{run[:6].upper()}"
        ledger.create_asset(asset, 8)
        hot = ledger.open_account(asset, AccountKind.asset_location, f"location:bitcoin:hot:{asset}").id
        equity = ledger.open_account(asset, AccountKind.equity, f"test:{run}:equity").id
        ledger.transfer(f"test:{run}:fund-hot", hot, equity, 123_456_789_000, kind="test_funding")

        r = client.get("/metrics")  # no X-API-Key
        exposed = [line for line in r.text.splitlines()
                   if asset in line and line.startswith("custody_location_balance_minor")]
        log.info("anonymous /metrics: %s %s", r.status_code, exposed)
        ledger.assert_verified()
        client.close()
    assert r.status_code in (401, 403) or not exposed, exposed


# ---- F6: a key in its rotation grace period takes over its successor ------------------------------

def test_a_key_in_its_grace_period_cannot_rotate_its_successor(engine, ledger):
    run = uuid.uuid4().hex[:8]
    client, settings = _client(engine, ledger)
    name = f"r14-admin-{run}"
    leaked = create_api_key(engine, name, Role.admin, settings.api_key_pepper)
    mine = client.get("/v1/api-keys", headers={"X-API-Key": leaked}, params={"live": "true"}).json()["keys"]
    leaked_id = next(k["id"] for k in mine if k["name"] == name)

    log.info("the owner rotates the leaked admin key, leaving it an hour for the deployments to switch")
    r = client.post(f"/v1/api-keys/{leaked_id}/rotate", headers={"X-API-Key": leaked}, json={"grace_seconds": 3600})
    assert_equal(r.status_code, 200)
    successor_id, successor = r.json()["new"]["id"], r.json()["key"]

    log.info("whoever holds the leaked key rotates the successor during the grace period")
    r = client.post(f"/v1/api-keys/{successor_id}/rotate", headers={"X-API-Key": leaked}, json={"grace_seconds": 0})
    log.info("answer: %s %s", r.status_code, r.json().get("new", r.json()))
    try:
        assert r.status_code in (401, 403, 409), "the leaked key took over its successor"
        assert_equal(client.get("/v1/api-keys", headers={"X-API-Key": successor}).status_code, 200)
    finally:  # leave no live admin key behind in the session database
        for k in list_api_keys(engine, include_revoked=False):
            if k.name == name:
                revoke_api_key(engine, k.id, by="review14-test")


def test_the_database_refuses_key_management_by_a_key_in_its_grace_period(engine):
    """Migration 0031: as custody_api, the caller-less functions are not executable, and the ones
    with a caller refuse a key whose revoked_at is set (42501), whatever the api checked."""
    from custody.auth import get_api_key, hash_key, rotate_api_key
    run = uuid.uuid4().hex[:8]
    pepper = Settings(environment="test").api_key_pepper
    name = f"r14-db-{run}"
    create_api_key(engine, name, Role.admin, pepper)
    old_id = next(k.id for k in list_api_keys(engine, include_revoked=False) if k.name == name)
    new, _ = rotate_api_key(engine, old_id, pepper, by="review14-test", grace_seconds=3600)
    states = []
    try:
        for sql, args in (("SELECT custody_revoke_api_key(:i, 'x')", {"i": new.id}),
                          ("SELECT custody_revoke_api_key(:i, 'x', :c)", {"i": new.id, "c": old_id}),
                          ("SELECT custody_rotate_api_key(:i, 'csk_x', :h, 0, 'x', :c)",
                           {"i": new.id, "h": hash_key(f"csk_{run}", pepper), "c": old_id})):
            with engine.connect() as c:
                c.execute(text("SET LOCAL ROLE custody_api"))
                try:
                    c.execute(text(sql), args)
                    states.append("done")
                except DBAPIError as exc:
                    states.append(getattr(exc.orig, "sqlstate", None))
                c.rollback()
        assert_equal(states, ["42501", "42501", "42501"])
        assert_equal(get_api_key(engine, new.id).revoked_at, None)  # the successor is untouched
    finally:
        for k in list_api_keys(engine, include_revoked=False):
            if k.name == name:
                revoke_api_key(engine, k.id, by="review14-test")
