"""api_paging: list routes page with an opaque cursor (custody.api.paging), stable under inserts.

- oldest first (`GET /v1/firm-accounts?asset=`, a fresh asset of its own): walking pages of 3 while
  accounts are opened between the pages returns every account exactly once, in id order, the new
  ones at the end; the walk equals one full listing taken afterwards; the last page has no
  `X-Next-Cursor` and no `Link`;
- newest first (`GET /v1/treasury/adjustments`): walking pages of 2 while adjustments are proposed
  between the pages returns every proposal that existed when the walk began exactly once, newest
  first, and none proposed during the walk; nothing was posted, the ledger verifies;
- an envelope answer (`GET /v1/api-keys`) carries the same cursor in `next_cursor`;
- a cursor that was edited, is not a cursor, or comes from another list is `invalid_cursor` (422);
  a cursor beside the older `after` is `invalid_request` (422); never a 500.

Every request runs as the custody_api role (tests/api_role.py).
"""
from __future__ import annotations

import logging
import uuid

import pytest
from fastapi.testclient import TestClient

from custody.api.app import create_app
from custody.auth import Role, create_api_key
from custody.container import Container
from custody.settings import Settings
from ledger.model import AccountKind
from ledger.service import Ledger
from regtest.util import assert_equal

log = logging.getLogger(__name__)
SETTINGS = Settings(environment="test")


@pytest.fixture
def api(engine):
    container = Container(settings=SETTINGS, engine=engine, ledger=Ledger(engine)).with_chains({})
    keys = {role: {"X-API-Key": create_api_key(engine, f"paging-{role.value}-{uuid.uuid4().hex[:8]}", role,
                                               SETTINGS.api_key_pepper)} for role in Role}
    return TestClient(create_app(container), raise_server_exceptions=False), keys


def code(r) -> tuple[int, str | None]:
    try:
        return r.status_code, r.json()["error"]["code"]
    except (KeyError, TypeError, ValueError):
        return r.status_code, None


def walk(client: TestClient, path: str, headers: dict, *, between=lambda page: None, rows=lambda body: body) -> list[list]:
    """Every page of a list, following X-Next-Cursor; `between(n)` runs after page n is read."""
    pages, url = [], path
    while True:
        r = client.get(url, headers=headers)
        assert_equal(r.status_code, 200)
        pages.append(rows(r.json()))
        cursor = r.headers.get("X-Next-Cursor")
        if cursor is None:
            assert "Link" not in r.headers
            return pages
        assert r.headers["Link"].endswith('; rel="next"') and f"cursor={cursor}" in r.headers["Link"]
        between(len(pages))
        url = r.headers["Link"][1:].split(">;")[0]


def test_an_oldest_first_walk_returns_every_row_once_with_inserts_between_pages(api, ledger):
    client, keys = api
    asset = f"PG{uuid.uuid4().hex[:6].upper()}"
    ledger.create_asset(asset, 2)
    opened = [ledger.open_account(asset, AccountKind.equity, f"paging:{asset}:{i}").id for i in range(7)]

    def open_two(page: int) -> None:
        log.info("after page %d: two accounts are opened", page)
        opened.extend(ledger.open_account(asset, AccountKind.equity, f"paging:{asset}:p{page}:{i}").id for i in range(2))

    pages = walk(client, f"/v1/firm-accounts?asset={asset}&limit=3", keys[Role.auditor], between=open_two)
    seen = [a["id"] for page in pages for a in page]
    assert all(len(page) <= 3 for page in pages)
    assert_equal(len(seen), len(set(seen)))  # no row twice
    assert_equal(seen, sorted(opened))  # every row once, the new ones at the end
    full = client.get(f"/v1/firm-accounts?asset={asset}", headers=keys[Role.auditor]).json()
    assert_equal([a["id"] for a in full], seen)


def test_a_newest_first_walk_returns_every_row_that_existed_once(api, ledger):
    client, keys = api
    asset = f"PG{uuid.uuid4().hex[:6].upper()}"
    ledger.create_asset(asset, 2)
    a = ledger.open_account(asset, AccountKind.equity, f"paging:{asset}:a").id
    b = ledger.open_account(asset, AccountKind.equity, f"paging:{asset}:b").id
    operator = keys[Role.operator]

    def propose(n: int) -> int:
        r = client.post("/v1/treasury/adjustments", headers=operator, json={
            "idempotency_key": f"paging-{asset}-{n}", "reason": "paging test",
            "transfers": [{"debit_account_id": a, "credit_account_id": b, "amount": "0.01"}]})
        assert_equal(r.status_code, 201)
        return r.json()["id"]

    before = [propose(n) for n in range(5)]
    during: list[int] = []
    pages = walk(client, "/v1/treasury/adjustments?state=proposed&limit=2", keys[Role.auditor],
                 between=lambda page: during.append(propose(100 + page)))
    seen = [x["id"] for page in pages for x in page]
    assert_equal(len(seen), len(set(seen)))
    assert_equal(seen, sorted(seen, reverse=True))
    assert set(before) <= set(seen), "a row that existed when the walk began was skipped"
    assert during and not set(during) & set(seen), "a newest-first walk shows rows inserted after it began"
    assert_equal(ledger.balance(a).posted, 0)  # proposals move nothing


def test_an_envelope_carries_the_cursor_too(api, engine):
    client, keys = api
    for _ in range(2):
        create_api_key(engine, f"paging-extra-{uuid.uuid4().hex[:8]}", Role.backend, SETTINGS.api_key_pepper)
    r = client.get("/v1/api-keys?limit=2", headers=keys[Role.admin])
    assert_equal(r.status_code, 200)
    first = r.json()
    assert_equal(len(first["keys"]), 2)
    assert_equal(first["next_cursor"], r.headers["X-Next-Cursor"])
    nxt = client.get("/v1/api-keys", params={"limit": 2, "cursor": first["next_cursor"]}, headers=keys[Role.admin]).json()
    assert min(k["id"] for k in nxt["keys"]) > max(k["id"] for k in first["keys"])


def test_a_bad_cursor_is_a_4xx_never_a_500(api, ledger):
    client, keys = api
    auditor = keys[Role.auditor]
    asset = f"PG{uuid.uuid4().hex[:6].upper()}"
    ledger.create_asset(asset, 2)
    for i in range(3):
        ledger.open_account(asset, AccountKind.equity, f"paging:{asset}:{i}")
    cursor = client.get(f"/v1/firm-accounts?asset={asset}&limit=1", headers=auditor).headers["X-Next-Cursor"]
    assert_equal(client.get(f"/v1/firm-accounts?asset={asset}&limit=1&cursor={cursor}", headers=auditor).status_code, 200)

    log.info("one character changed: the checksum fails")
    for i in (0, len(cursor) // 2, len(cursor) - 1):
        tampered = cursor[:i] + ("A" if cursor[i] != "A" else "B") + cursor[i + 1:]
        assert_equal(code(client.get(f"/v1/firm-accounts?cursor={tampered}", headers=auditor)), (422, "invalid_cursor"))
    log.info("not a cursor at all, or one of another list")
    for bad in ("x", "AAAA", "bm90IGEgY3Vyc29y", cursor + "AA"):
        assert_equal(code(client.get(f"/v1/firm-accounts?cursor={bad}", headers=auditor)), (422, "invalid_cursor"))
    assert_equal(code(client.get(f"/v1/assets?cursor={cursor}", headers=auditor)), (422, "invalid_cursor"))
    assert_equal(code(client.get(f"/v1/markets?cursor={cursor}", headers=auditor)), (422, "invalid_cursor"))
    log.info("characters a cursor never has, and a cursor beside the older `after`")
    assert_equal(code(client.get("/v1/firm-accounts?cursor=a%2Bb", headers=auditor)), (422, "invalid_request"))
    account = ledger.open_account(asset, AccountKind.equity, f"paging:{asset}:s").id
    statement_cursor = "eyJ4IjoxfQ"  # well-formed base64, but no checksum
    assert_equal(code(client.get(f"/v1/accounts/{account}/statement?cursor={statement_cursor}", headers=auditor)),
                 (422, "invalid_cursor"))
    from custody.api.paging import encode
    good = encode("statement", 1)
    assert_equal(code(client.get(f"/v1/accounts/{account}/statement?cursor={good}&after=1", headers=auditor)),
                 (422, "invalid_request"))
