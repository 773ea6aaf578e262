"""`Ledger.check_post` answers what `Ledger.post` would, without posting (issue 20: the payout job
reads the ledger's answer to a batch's capture with it before the signer is asked, instead of
posting the capture in a rolled-back savepoint and then again).

Each case: one database transaction sets the scene (holds, closes, expiries, a used key), asks
`check_post`, then posts the same thing in a savepoint (the old trial) and compares the refusal's
code and transfer index (None when the posting is created or answers a replay); everything is
rolled back, so the `ledger` fixture's verify() sees only the funding.
"""
from __future__ import annotations

import pytest
from sqlalchemy import text

from ledger.errors import ErrorCode, LedgerError
from ledger.model import AccountKind, Transfer
from tests.integration.ledger_helpers import Book

OWNER = "payouts"


@pytest.fixture()
def scene(ledger):
    book = Book(ledger)
    alice, bob = book.account("alice"), book.account("bob")
    in_flight = book.account("in-flight", AccountKind.in_flight)
    fees = book.account("fees", AccountKind.fee_income)
    location = book.account("location", AccountKind.asset_location)
    ledger.create_asset("USDX", 2)
    other = book.account("usd", asset="USDX")
    book.fund(alice, 100_000)
    book.fund(bob, 50_000)
    return book, alice, bob, in_flight, fees, location, other


def _both(engine, ledger, prepare, key, transfers, owner=OWNER):
    """(check_post's answer, post's answer) after `prepare(c)`, all rolled back."""
    def answer(err):
        return None if err is None else (err.code, err.detail.get("index"))

    with engine.connect() as c:
        tx = c.begin()
        try:
            legs = prepare(c)
            transfers = transfers(legs) if callable(transfers) else transfers
            checked = answer(ledger.check_post(key, transfers, kind="withdrawal_capture", hold_owner=owner,
                                               metadata={"batch": 1}, conn=c))
            savepoint = c.begin_nested()
            try:
                ledger.post(key, transfers, kind="withdrawal_capture", hold_owner=owner, metadata={"batch": 1}, conn=c)
                posted = None
            except LedgerError as err:
                posted = answer(err)
            finally:
                savepoint.rollback()
        finally:
            tx.rollback()
    return checked, posted


def _holds(ledger, c, book, accounts, amount=1_000):
    return [ledger.place_hold(book.key(), a, amount, owner=OWNER, reference="w", conn=c).id for a in accounts]


def _capture(alice, bob, in_flight, fees):
    def legs(h):
        return [Transfer(alice, in_flight, 900, h[0]), Transfer(alice, fees, 100, h[0]),
                Transfer(bob, in_flight, 950, h[1]), Transfer(bob, fees, 50, h[1])]
    return legs


CASES = {
    "created": (lambda c, h, s: None, None),
    "hold released": (lambda c, h, s: c.execute(text(
        "UPDATE hold SET state = 'released', released = amount - captured, resolved_at = now() WHERE id = :h"),
        {"h": h[1]}), ErrorCode.hold_already_resolved),
    "hold partly captured": (lambda c, h, s: c.execute(text(
        "UPDATE hold SET captured = 10 WHERE id = :h"), {"h": h[0]}), ErrorCode.hold_exceeded),
    "hold expired": (lambda c, h, s: c.execute(text(
        "UPDATE hold SET expires_at = now() - interval '1 second' WHERE id = :h"), {"h": h[1]}), ErrorCode.hold_expired),
    "hold of another owner": (lambda c, h, s: c.execute(text(
        "UPDATE hold SET owner = 'someone' WHERE id = :h"), {"h": h[1]}), ErrorCode.hold_owner_mismatch),
    "hold on another account": (lambda c, h, s: c.execute(text(
        "UPDATE hold SET account_id = :b WHERE id = :h"), {"h": h[0], "b": s[2]}), ErrorCode.hold_account_mismatch),
    "in-flight closed": (lambda c, h, s: c.execute(text(
        "UPDATE account SET closed_at = now() WHERE id = :a"), {"a": s[3]}), ErrorCode.account_closed),
    "closed and a hold released": (lambda c, h, s: (c.execute(text(
        "UPDATE account SET closed_at = now() WHERE id = :a"), {"a": s[4]}), c.execute(text(
        "UPDATE hold SET state = 'released', released = amount, resolved_at = now() WHERE id = :h"), {"h": h[0]})),
        ErrorCode.account_closed),
}


@pytest.mark.parametrize("case", list(CASES))
def test_check_post_answers_as_the_capture_would(engine, ledger, scene, case):
    book, alice, bob, in_flight, fees, location, other = scene
    change, code = CASES[case]
    key = book.key("capture")

    def prepare(c):
        h = _holds(ledger, c, book, [alice, bob])
        change(c, h, scene)
        return h

    checked, posted = _both(engine, ledger, prepare, key, _capture(alice, bob, in_flight, fees))
    assert checked == posted
    assert (posted or (None,))[0] == code


@pytest.mark.parametrize("same", [True, False])
def test_check_post_answers_a_used_key_as_the_posting_does(engine, ledger, scene, same):
    book, alice, bob, in_flight, fees, location, other = scene
    key = book.key("replay")

    def prepare(c):
        h = _holds(ledger, c, book, [alice, bob])
        if same:  # a replay: the posting answers `exists`
            ledger.post(key, _capture(alice, bob, in_flight, fees)(h), kind="withdrawal_capture", hold_owner=OWNER,
                        metadata={"batch": 1}, conn=c)
        else:  # a squatted key
            ledger.post(key, [Transfer(alice, bob, 1)], conn=c)
        return h

    expected = None if same else (ErrorCode.idempotency_conflict, None)
    assert _both(engine, ledger, prepare, key, _capture(alice, bob, in_flight, fees)) == (expected, expected)


@pytest.mark.parametrize("case, code", [
    ("insufficient", ErrorCode.insufficient_funds), ("location positive", ErrorCode.limit_exceeded),
    ("missing account", ErrorCode.account_not_found), ("other asset", ErrorCode.asset_mismatch),
    ("missing hold", ErrorCode.hold_not_found), ("two legs over one hold", ErrorCode.hold_exceeded),
    ("funds held elsewhere", ErrorCode.insufficient_funds),
])
def test_check_post_answers_other_refusals_as_the_posting_does(engine, ledger, scene, case, code):
    book, alice, bob, in_flight, fees, location, other = scene

    def prepare(c):
        h = _holds(ledger, c, book, [alice], amount=99_000)
        return h

    transfers = {
        "insufficient": lambda h: [Transfer(bob, alice, 10), Transfer(bob, in_flight, 60_000)],
        "location positive": lambda h: [Transfer(bob, alice, 10), Transfer(bob, location, 5)],
        "missing account": lambda h: [Transfer(bob, alice, 10), Transfer(bob, 10**15, 5)],
        "other asset": lambda h: [Transfer(bob, other, 5)],
        "missing hold": lambda h: [Transfer(alice, in_flight, 5, 10**15)],
        "two legs over one hold": lambda h: [Transfer(alice, in_flight, 98_000, h[0]), Transfer(alice, fees, 1_001, h[0])],
        "funds held elsewhere": lambda h: [Transfer(alice, bob, 2_000)],
    }[case]
    checked, posted = _both(engine, ledger, prepare, book.key(), transfers)
    assert checked == posted
    assert posted is not None and posted[0] == code
