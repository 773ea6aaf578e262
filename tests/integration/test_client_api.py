"""custody.client against the in-process API (FastAPI's TestClient as its httpx transport).

- A round trip in typed models: amounts come back as `Money` with `Decimal` values and int minor units.
- Errors raise the `CustodyApiError` subclass of their status, carrying the API's `error.code`.
- `iter_*` walks every page by `X-Next-Cursor`.
- A 503 `temporarily_unavailable` (a real lock timeout in PostgreSQL: the `hold` table is locked by
  another session) is retried after the answer's `Retry-After`, with the same body and so the same
  idempotency key; the hold is placed once. With no retries left the error is raised with its code.
"""
from __future__ import annotations

import json
import logging
import threading
import uuid
from decimal import Decimal

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from custody.api.app import create_app
from custody.auth import Role, create_api_key
from custody.client import Conflict, CustodyClient, Forbidden, NotFound, ServiceUnavailable, Unauthorized, models
from custody.container import Container
from custody.settings import Settings
from ledger.service import Ledger
from regtest.util import assert_equal
from tests.integration.own_database import own_database
from tests.integration.test_matching_support import fund

BASE = "http://custody.test"


def clients(engine) -> dict[Role, CustodyClient]:  # noqa: ANN001
    settings = Settings(environment="test")
    http = TestClient(create_app(Container(settings=settings, engine=engine, ledger=Ledger(engine))),
                      base_url=BASE, raise_server_exceptions=False)
    run = uuid.uuid4().hex[:8]
    return {role: CustodyClient(BASE, create_api_key(engine, f"client-{role.value}-{run}", role, settings.api_key_pepper),
                                http=http, retries=0)
            for role in Role}


def test_typed_round_trip_and_errors_carry_the_code(engine, ledger):
    api = clients(engine)
    run = uuid.uuid4().hex[:6].upper()
    asset = api[Role.admin].create_asset(code=f"C{run}", decimals=8)
    assert_equal(asset.code, f"C{run}")
    owner = f"client-{run}"
    account_id = fund(ledger, run, owner, f"C{run}", 150_000_000)

    hold = api[Role.backend].place_hold(models.HoldIn(account_id=account_id, amount=Decimal("0.5"), reference="r1"))
    assert_equal((hold.amount.value, hold.amount.minor), (Decimal("0.50000000"), 50_000_000))
    balance = api[Role.auditor].get_balance(account_id)
    assert_equal((balance.held.minor, balance.available.value), (50_000_000, Decimal("1.00000000")))

    with pytest.raises(Conflict) as refused:
        api[Role.backend].place_hold(account_id=account_id, amount="1.00000001", reference="r2")
    assert_equal((refused.value.status, refused.value.code), (409, "insufficient_funds"))
    with pytest.raises(NotFound) as missing:
        api[Role.auditor].get_hold(2**62)
    assert_equal((missing.value.status, missing.value.code), (404, "hold_not_found"))
    with pytest.raises(Forbidden) as forbidden:
        api[Role.backend].create_asset(code=f"D{run}", decimals=2)
    assert_equal(forbidden.value.code, "forbidden")
    with pytest.raises(Unauthorized) as nobody:
        api[Role.auditor].with_key("not-a-key").get_balance(account_id)
    assert_equal((nobody.value.status, nobody.value.code), (401, "unauthorized"))

    released = api[Role.backend].release_hold(hold.id)
    assert_equal(released.state, "released")
    ledger.assert_verified()


def test_last_response_tells_created_from_replayed(engine, ledger):
    api = clients(engine)
    backend = api[Role.backend]
    run = uuid.uuid4().hex[:6].upper()
    api[Role.admin].create_asset(code=f"L{run}", decimals=2)
    account_id = fund(ledger, run, f"last-{run}", f"L{run}", 1_000)
    assert backend.last_response is None
    first = backend.place_hold(idempotency_key=f"h-{run}", account_id=account_id, amount=Decimal("1"), reference="r")
    assert_equal(backend.last_response.status_code, 201)
    again = backend.place_hold(idempotency_key=f"h-{run}", account_id=account_id, amount=Decimal("1"), reference="r")
    assert_equal((backend.last_response.status_code, again.id), (200, first.id))
    with pytest.raises(Conflict):
        backend.place_hold(account_id=account_id, amount=Decimal("100"), reference="r")
    assert_equal(backend.last_response.status_code, 409)
    assert backend.with_key(None).last_response is None  # another client object: its own
    backend.release_hold(first.id)
    ledger.assert_verified()


def test_iter_follows_the_next_cursor_across_pages(engine, ledger):
    api = clients(engine)
    run = uuid.uuid4().hex[:6].upper()
    for i in range(3):
        api[Role.admin].create_asset(code=f"P{run}{i}", decimals=i)
    every = [a.code for a in api[Role.auditor].iter_assets(limit=1)]
    assert {f"P{run}{i}" for i in range(3)} <= set(every)
    assert_equal(len(every), len(set(every)))
    assert_equal(len(api[Role.auditor].list_assets(limit=1)), 1)
    ledger.assert_verified()


def test_a_503_is_retried_after_retry_after_with_the_same_idempotency_key(database_url, caplog):
    with own_database(database_url, "client_retry") as eng:
        with eng.begin() as conn:
            conn.execute(text(f"ALTER DATABASE {eng.url.database} SET lock_timeout = '300ms'"))
        eng.dispose()  # every new connection takes the timeout
        ledger = Ledger(eng)
        ledger.create_asset("BTC", 8)
        account_id = fund(ledger, "retry", "alice", "BTC", 100_000_000)
        api = clients(eng)[Role.backend]
        sent: list[bytes] = []
        api._http.event_hooks["request"].append(lambda request: sent.append(request.read()))

        locker = eng.connect()
        locker.execute(text("LOCK TABLE hold IN ACCESS EXCLUSIVE MODE"))  # the hold cannot be read nor written
        threading.Timer(0.6, locker.commit).start()  # after the first attempt, before the retry
        request = models.HoldIn(account_id=account_id, amount=Decimal("0.25"), reference="order:1")
        with caplog.at_level(logging.WARNING, logger="custody.client"):
            hold = CustodyClient(BASE, api._settings.api_key, http=api._http, retries=2).place_hold(request)
        locker.close()

        assert_equal(len(sent), 2)
        assert_equal(sent[0], sent[1])  # one body: the same idempotency key on the retry
        key = json.loads(sent[0])["idempotency_key"]
        assert_equal(key, request.idempotency_key)
        [retry] = [r.getMessage() for r in caplog.records if r.name == "custody.client"]
        assert "answered 503 temporarily_unavailable; retry 1 of 2 in 1.00s" in retry, retry  # Retry-After: 1
        with eng.connect() as conn:
            keys = conn.execute(text("SELECT idempotency_key FROM hold WHERE reference = 'order:1'")).scalars().all()
        assert_equal(len(keys), 1)
        assert keys[0].endswith(key), keys
        assert_equal(hold.amount.minor, 25_000_000)

        with eng.connect() as locker:
            locker.execute(text("LOCK TABLE hold IN ACCESS EXCLUSIVE MODE"))
            with pytest.raises(ServiceUnavailable) as busy:
                api.place_hold(account_id=account_id, amount="0.1", reference="order:2")  # retries=0
            locker.rollback()
        assert_equal((busy.value.status, busy.value.code), (503, "temporarily_unavailable"))
        ledger.assert_verified()
