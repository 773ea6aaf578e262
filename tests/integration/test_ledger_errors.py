"""Every ledger error code, triggered through the public API, and the documented code table.

The scenario table below must name every `ErrorCode`: adding a code without a test fails
`test_every_error_code_has_a_scenario`.
"""
from __future__ import annotations

import datetime as dt
import re
import uuid
from typing import Callable

import pytest
from sqlalchemy import text

import ledger.errors as errors_module
from ledger.amounts import parse_amount
from ledger.errors import ErrorCode
from ledger.model import AccountKind, Transfer
from ledger.service import Ledger
from tests.integration.ledger_helpers import Book, assert_code, failed_checks

OWNER = "withdrawals"


def _hold(book: Book, amount: int = 100, **kw):
    """A funded customer with a pending hold, and a destination account."""
    alice, out = book.account("alice"), book.account("out", AccountKind.in_flight)
    book.fund(alice, 1_000)
    hold = book.ledger.place_hold(book.key(), alice, amount, owner=OWNER, reference="w1", **kw)
    return alice, out, hold


# Each scenario sets the stage and returns the one call that must be refused.
Act = Callable[[], object]


def invalid_request(led: Ledger, book: Book) -> Act:
    return lambda: led.post(book.key(), [])


def invalid_amount(led: Ledger, book: Book) -> Act:
    alice = book.account("a")
    return lambda: led.transfer(book.key(), book.world, alice, 0)


def excess_precision(led: Ledger, book: Book) -> Act:
    decimals = led.get_asset("BTC").decimals
    return lambda: parse_amount("0.000000001", decimals)


def asset_not_found(led: Ledger, book: Book) -> Act:
    return lambda: led.open_account(f"NOPE{uuid.uuid4().hex[:8].upper()}", AccountKind.customer, book.key("acct"))


def asset_exists_with_different_decimals(led: Ledger, book: Book) -> Act:
    return lambda: led.create_asset("BTC", 2)


def account_not_found(led: Ledger, book: Book) -> Act:
    return lambda: led.transfer(book.key(), book.world, 10**15, 1)


def account_closed(led: Ledger, book: Book) -> Act:
    closed = book.account("closed")
    led.close_account(closed)
    return lambda: led.transfer(book.key(), book.world, closed, 1)


def account_not_empty(led: Ledger, book: Book) -> Act:
    alice = book.account("alice")
    book.fund(alice, 1)
    return lambda: led.close_account(alice)


def account_has_open_holds(led: Ledger, book: Book) -> Act:
    suspense = book.account("suspense", AccountKind.suspense)  # may go negative: zero balance, held 5
    led.place_hold(book.key(), suspense, 5, owner=OWNER, reference="r")
    return lambda: led.close_account(suspense)


def accounts_must_be_different(led: Ledger, book: Book) -> Act:
    alice = book.account("alice")
    return lambda: led.transfer(book.key(), alice, alice, 1)


def asset_mismatch(led: Ledger, book: Book) -> Act:
    led.create_asset("ETH", 18)
    eth = book.account("eth", asset="ETH")
    return lambda: led.transfer(book.key(), book.world, eth, 1)


def idempotency_conflict(led: Ledger, book: Book) -> Act:
    alice = book.account("alice")
    key = book.key()
    led.transfer(key, book.world, alice, 1)
    return lambda: led.transfer(key, book.world, alice, 2)


def insufficient_funds(led: Ledger, book: Book) -> Act:
    alice, bob = book.account("alice"), book.account("bob")
    book.fund(alice, 10)
    return lambda: led.transfer(book.key(), alice, bob, 11)


def limit_exceeded(led: Ledger, book: Book) -> Act:
    cold = book.account("cold", AccountKind.asset_location)
    return lambda: led.transfer(book.key(), book.world, cold, 1)


def hold_not_found(led: Ledger, book: Book) -> Act:
    return lambda: led.release_hold(10**15, owner=OWNER)


def hold_already_resolved(led: Ledger, book: Book) -> Act:
    alice, out, hold = _hold(book)
    led.release_hold(hold.id, owner=OWNER)
    return lambda: led.capture_hold(book.key(), hold.id, [Transfer(alice, out, 1)], owner=OWNER)


def hold_expired(led: Ledger, book: Book) -> Act:
    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1)
    alice, out, hold = _hold(book, expires_at=past)
    return lambda: led.capture_hold(book.key(), hold.id, [Transfer(alice, out, 1)], owner=OWNER)


def hold_owner_mismatch(led: Ledger, book: Book) -> Act:
    _, _, hold = _hold(book)
    return lambda: led.release_hold(hold.id, owner="matching")


def hold_account_mismatch(led: Ledger, book: Book) -> Act:
    _, out, hold = _hold(book)
    bob = book.account("bob")
    book.fund(bob, 10)
    return lambda: led.capture_hold(book.key(), hold.id, [Transfer(bob, out, 1)], owner=OWNER)


def hold_exceeded(led: Ledger, book: Book) -> Act:
    alice, out, hold = _hold(book, amount=100)
    return lambda: led.capture_hold(book.key(), hold.id, [Transfer(alice, out, 101)], owner=OWNER)


def transaction_not_found(led: Ledger, book: Book) -> Act:
    return lambda: led.reverse(10**15, book.key())


def already_reversed(led: Ledger, book: Book) -> Act:
    r = book.fund(book.account("alice"), 5)
    led.reverse(r.transaction_id, book.key())
    return lambda: led.reverse(r.transaction_id, book.key())


def verification_failed(led: Ledger, book: Book) -> Act:
    alice = book.account("alice")
    book.fund(alice, 5)
    with led.engine.begin() as c:  # corrupt the derived projection; the test rebuilds it afterwards
        c.execute(text("UPDATE account_balance SET posted = 6 WHERE account_id = :a"), {"a": alice})
    return led.assert_verified


def _state(led: Ledger) -> tuple:
    """Everything a refused command must leave as it was."""
    with led.engine.connect() as c:
        return tuple(c.execute(text(
            "SELECT (SELECT count(*) FROM journal_transaction), (SELECT count(*) FROM journal_entry), "
            "(SELECT count(*) FROM hold), (SELECT count(*) FROM hold WHERE state = 'pending'), "
            "(SELECT coalesce(sum(captured + released), 0) FROM hold), "
            "(SELECT coalesce(sum(held), 0) FROM account_balance), "
            "(SELECT count(*) FROM account), (SELECT count(*) FROM account WHERE closed_at IS NOT NULL), "
            "(SELECT count(*) FROM asset)"
        )).one())


SCENARIOS: dict[ErrorCode, Callable[[Ledger, Book], Act]] = {
    code: globals()[code.value] for code in ErrorCode if code.value in globals()
}


def test_every_error_code_has_a_scenario():
    assert set(SCENARIOS) == set(ErrorCode)


@pytest.mark.parametrize("code", list(ErrorCode), ids=lambda c: c.value)
def test_error_code_is_raised_through_the_public_api_and_changes_nothing(ledger, code):
    act = SCENARIOS[code](ledger, Book(ledger))
    before = _state(ledger)
    err = assert_code(code, act)
    assert err.message and str(err).startswith(code.value)
    assert _state(ledger) == before
    # Only the verification scenario corrupted anything; rebuilding repairs exactly that one row.
    assert ledger.rebuild_projections() == (1 if code is ErrorCode.verification_failed else 0)


def test_every_error_code_has_an_http_status_and_a_meaning():
    for code in ErrorCode:
        assert code.http_status in {403, 404, 409, 422, 500}, code
        assert isinstance(code.meaning, str) and code.meaning.strip(), code
        assert code.value == code.name


def test_the_documented_table_matches_the_enum():
    rows = re.findall(r"^\| (\w+) \| (\d{3}) \| (.+?) \|$", errors_module.__doc__, re.M)
    documented = {name: int(status) for name, status, _ in rows if name != "code"}
    assert documented == {code.value: code.http_status for code in ErrorCode}
    assert [name for name, _, _ in rows] == [code.value for code in ErrorCode]  # same order


def test_statuses_follow_the_kind_of_refusal():
    assert ErrorCode.account_not_found.http_status == 404
    assert ErrorCode.insufficient_funds.http_status == 409
    assert ErrorCode.invalid_amount.http_status == 422
    assert ErrorCode.hold_owner_mismatch.http_status == 403
    assert ErrorCode.verification_failed.http_status == 500


@pytest.mark.parametrize("code", ["btc", "", "B T", "-X", "X" * 33, "ÄB", 5])
def test_bad_asset_codes_are_invalid_requests(ledger, code):
    assert_code(ErrorCode.invalid_request, ledger.create_asset, code, 8)


@pytest.mark.parametrize("decimals", [-1, 37, 8.0, True, "8"])
def test_bad_asset_decimals_are_invalid_requests(ledger, decimals):
    assert_code(ErrorCode.invalid_request, ledger.create_asset, "BTC", decimals)


@pytest.mark.parametrize("amount", [0, -1, 1.5, 10**78, True, "5", None])
def test_bad_transfer_amounts_are_invalid_amount(ledger, amount):
    book = Book(ledger)
    assert_code(ErrorCode.invalid_amount, ledger.transfer, book.key(), book.world, book.account("a"), amount)


@pytest.mark.parametrize("key", ["", "k" * 301, None, 5])
def test_bad_idempotency_keys_are_invalid_requests(ledger, key):
    book = Book(ledger)
    assert_code(ErrorCode.invalid_request, ledger.transfer, key, book.world, book.account("a"), 1)


def test_invalid_request_for_other_malformed_input(ledger):
    book = Book(ledger)
    assert_code(ErrorCode.invalid_request, ledger.open_account, "BTC", "no_such_kind", book.key("x"))
    assert_code(ErrorCode.invalid_request, ledger.open_account, "BTC", AccountKind.customer, "")
    assert_code(ErrorCode.invalid_request, ledger.post, book.key(), [Transfer(book.world, book.account("a"), 1)] * 10_001)
    assert failed_checks(ledger) == set()
