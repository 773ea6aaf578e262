"""Issue 11, observation 11: bad input was answered 500. Each case here, sent over HTTP as an
attacker (or a buggy client) would, answered `internal_error` before; now each is a 4xx with a
documented code and nothing is written.

- a NUL character in any text field: transaction metadata (a nested value, a nested key), an
  idempotency key, a client withdrawal id, a hold reference, an account name, a `state` query
  parameter, a path parameter; and a lone surrogate, which UTF-8 cannot even encode;
- an id beyond 64 bits (`POST /v1/holds/99999999999999999999/release`), or zero, or negative;
- an allowlist for an account that does not exist;
- a proof-of-reserves report while no customer account exists ("a tree needs at least one leaf").

The service runs on a database of its own: "no customer account exists" cannot be arranged on the
shared session database. Withdrawals are wired without chain adapters (the requests here are
refused before any chain is needed); the reserves report gets a bitcoin adapter that only knows
the tip, which is all the report reads before it finds there is nothing to commit to.
"""
from __future__ import annotations

import json
import logging

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from chain_adapters.base import BlockRef
from custody.api.app import create_app
from custody.auth import Role, create_api_key
from custody.container import Container
from custody.reserves import Reserves
from custody.settings import Settings
from ledger.model import AccountKind
from ledger.service import Ledger
from regtest.util import assert_equal
from signer.keys import Secret, SignerKeys, seed_from_text
from signer.service import Signer
from tests.integration.own_database import own_database

log = logging.getLogger(__name__)
KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
DESTINATION = "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080"  # a valid regtest address (BIP173 vector)


class TipOnly:
    """A bitcoin adapter that knows its tip and nothing else: a report refused for want of
    customer accounts must not get further than that."""

    def tip(self) -> BlockRef:
        return BlockRef(101, "00" * 32)

    def __getattr__(self, name: str):
        raise AssertionError(f"the report read the chain ({name}) before refusing")


@pytest.fixture(scope="module")
def service(database_url):
    with own_database(database_url, "custody_badinput") as engine:
        yield from _service(engine)


@pytest.fixture()
def empty_service(database_url):
    """Another service on a database of its own, where no customer account exists."""
    with own_database(database_url, "custody_badinput_empty") as engine:
        yield from _service(engine)


def _service(engine):
    config = Settings(environment="test")
    container = Container(settings=config, engine=engine, ledger=Ledger(engine)).with_chains({})
    for tier in ("deposit", "hot"):
        container.wallets.register_wallet("bitcoin", tier, "regtest", KEYS.account_xpub("bitcoin", tier))
    container.reserves = Reserves(engine, {"bitcoin": TipOnly()}, Signer(engine, KEYS, bitcoin_network="regtest"),
                                  network="regtest")
    keys = {role: create_api_key(engine, f"bad-{role.value}", role, config.api_key_pepper) for role in Role}
    yield TestClient(create_app(container), raise_server_exceptions=False), keys, container
    container.ledger.assert_verified()


def call(service, role: Role, method: str, path: str, headers_extra: dict | None = None, **kw):
    client, keys, _ = service
    return client.request(method, path, headers={"X-API-Key": keys[role], **(headers_extra or {})}, **kw)


def answer(response) -> tuple[int, str]:
    """(status, error code) of an error answer in the API's one format."""
    body = response.json()
    assert set(body) == {"error"} and body["error"]["message"], body
    return response.status_code, body["error"]["code"]


def rows(service, table: str) -> int:
    _, _, container = service
    with container.engine.connect() as c:
        return c.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()


@pytest.fixture(scope="module")
def funded(service):
    """A BTC customer account with 1 BTC and the equity account that paid it in (ids)."""
    _, _, container = service
    ledger, wallets = container.ledger, container.wallets
    wallets.configure_asset("BTC", 8, "bitcoin", finality=3, min_withdrawal=10_000, withdrawal_fee=5_000)
    equity = ledger.open_account("BTC", AccountKind.equity, "badinput:equity:BTC")
    alice = wallets.customer_account("alice", "BTC")
    ledger.transfer("badinput:fund:alice", equity.id, alice, 10**8)
    return equity.id, alice


def transfer(equity: int, alice: int, **fields) -> dict:
    return {"idempotency_key": "badinput:tx", "kind": "deposit",
            "transfers": [{"debit_account_id": equity, "credit_account_id": alice, "amount": "0.1"}], **fields}


@pytest.mark.parametrize("what, body", [
    ("a metadata value", lambda e, a: transfer(e, a, metadata={"note": "paid\x00"})),
    ("a nested metadata key", lambda e, a: transfer(e, a, metadata={"order": {"id\x00": 1}})),
    ("a metadata value with a lone surrogate", lambda e, a: transfer(e, a, metadata={"note": "\ud800"})),
    ("an idempotency key", lambda e, a: transfer(e, a, idempotency_key="badinput:\x00")),
])
def test_nul_in_a_posting_is_refused_and_nothing_is_posted(service, funded, what, body):
    log.info("POST /v1/transactions with a NUL character in %s", what)
    before = rows(service, "journal_transaction")
    # json.dumps escapes (\u0000, \ud800) as any client's JSON encoder must: httpx's own would not send a surrogate
    r = call(service, Role.backend, "POST", "/v1/transactions", content=json.dumps(body(*funded)),
             headers_extra={"Content-Type": "application/json"})
    assert_equal(answer(r), (422, "invalid_request"))
    assert "\x00" not in r.text and "\\u0000" not in r.text
    assert_equal(rows(service, "journal_transaction"), before)


def test_nul_in_a_hold_reference_or_its_key_is_refused(service, funded):
    _, alice = funded
    for field, value in (("reference", "order\x00"), ("idempotency_key", "badinput:hold\x00")):
        log.info("POST /v1/holds with a NUL character in %s", field)
        body = {"idempotency_key": "badinput:hold", "account_id": alice, "amount": "0.01", "reference": "order-1",
                field: value}
        assert_equal(answer(call(service, Role.backend, "POST", "/v1/holds", json=body)), (422, "invalid_request"))
    assert_equal(rows(service, "hold"), 0)


def test_nul_in_an_account_name_is_refused(service, funded):
    log.info("POST /v1/accounts with a NUL character in the name")
    before = rows(service, "account")
    r = call(service, Role.backend, "POST", "/v1/accounts",
             json={"asset": "BTC", "kind": "customer", "name": "customer:mallory\x00:BTC", "owner": "mallory"})
    assert_equal(answer(r), (422, "invalid_request"))
    assert_equal(rows(service, "account"), before)


def test_nul_in_a_client_withdrawal_id_is_refused(service, funded):
    _, alice = funded
    log.info("POST /v1/withdrawals with a NUL character in client_withdrawal_id")
    r = call(service, Role.backend, "POST", "/v1/withdrawals",
             json={"client_withdrawal_id": "w\x001", "account_id": alice, "amount": "0.01", "destination": DESTINATION})
    assert_equal(answer(r), (422, "invalid_request"))
    assert_equal(rows(service, "withdrawal_request"), 0)


@pytest.mark.parametrize("path", [
    "/v1/withdrawals?state=%00",
    "/v1/withdrawals?state=pending%00approval",
    "/v1/rebalances?state=%00",
    "/v1/markets/BTC%00USDT/depth",
])
def test_nul_in_a_query_or_path_parameter_is_refused(service, path):
    log.info("GET %s", path)
    assert_equal(answer(call(service, Role.operator, "GET", path)), (422, "invalid_request"))


@pytest.mark.parametrize("hold_id", ["99999999999999999999", str(2**63), "0", "-1"])
def test_a_hold_id_that_cannot_exist_is_invalid_request(service, funded, hold_id):
    log.info("POST /v1/holds/%s/release: not a bigint id", hold_id)
    assert_equal(answer(call(service, Role.backend, "POST", f"/v1/holds/{hold_id}/release")), (422, "invalid_request"))
    log.info("the largest bigint is an id that could exist: the hold's own not-found code")
    assert_equal(answer(call(service, Role.backend, "POST", f"/v1/holds/{2**63 - 1}/release")), (404, "hold_not_found"))


def test_an_account_id_beyond_64_bits_in_a_body_is_invalid_request(service, funded):
    equity, _ = funded
    body = transfer(equity, 2**64, idempotency_key="badinput:big")
    assert_equal(answer(call(service, Role.backend, "POST", "/v1/transactions", json=body)), (422, "invalid_request"))


def test_an_allowlist_for_a_missing_account_is_account_not_found(service, funded):
    log.info("PUT and POST /v1/accounts/{id}/allowlist for an account that does not exist")
    missing = 10**12
    r = call(service, Role.backend, "PUT", f"/v1/accounts/{missing}/allowlist", json={"mode": "enforce"})
    assert_equal(answer(r), (404, "account_not_found"))
    r = call(service, Role.backend, "POST", f"/v1/accounts/{missing}/allowlist", json={"address": DESTINATION})
    assert_equal(answer(r), (404, "account_not_found"))
    assert_equal(rows(service, "allowlist_policy") + rows(service, "allowlist_entry"), 0)


def test_a_reserves_report_without_customer_accounts_is_refused_with_its_own_code(empty_service):
    log.info("POST /v1/reserves/reports with no customer account at all")
    r = call(empty_service, Role.operator, "POST", "/v1/reserves/reports", json={"idempotency_key": "reserves-1"})
    assert_equal(answer(r), (409, "no_customer_accounts"))
    assert_equal(rows(empty_service, "reserve_report") + rows(empty_service, "reserve_job"), 0)


def test_database_refusals_map_to_documented_codes_except_the_ledger_guards(engine, ledger):
    """The last line of defence (custody/api/errors.py: refused_input), on real refusals from the
    server: a duplicate row is a conflict, a value out of range is invalid_request, and a refusal
    by the ledger's own guard triggers (append-only) stays an internal error: it is our bug."""
    from sqlalchemy.exc import DBAPIError

    from custody.api.errors import refused_input

    def refusal(sql: str, params: dict | None = None) -> DBAPIError:
        with pytest.raises(DBAPIError) as caught, engine.begin() as c:
            c.execute(text(sql), params or {})
        return caught.value

    ledger.create_asset("BTC", 8)
    equity = ledger.open_account("BTC", AccountKind.equity, "badinput:refusals:equity")
    pool = ledger.open_account("BTC", AccountKind.asset_location, "badinput:refusals:pool")
    posted = ledger.transfer("badinput:refusals:tx", pool.id, equity.id, 1)
    assert_equal(refused_input(refusal("INSERT INTO asset (code, decimals) VALUES ('BTC', 8)")), (409, "conflict"))
    assert_equal(refused_input(refusal("SELECT CAST(:v AS bigint)", {"v": str(2**64)})), (422, "invalid_request"))
    assert_equal(refused_input(refusal("SELECT CAST(:v AS text)", {"v": "nul\x00"})), (422, "invalid_request"))
    assert_equal(refused_input(refusal("INSERT INTO allowlist_policy (account_id, mode, cooling_off_secs, approvals) "
                                       "VALUES (:a, 'enforce', 0, 1)", {"a": 10**12})), (422, "invalid_request"))
    assert refused_input(refusal("UPDATE journal_transaction SET kind = 'edited' WHERE id = :t",
                                 {"t": posted.transaction_id})) is None
