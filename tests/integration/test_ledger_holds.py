"""Holds, the ledger's two-phase pending transfers: place, capture in parts, release, expire.

Guarantees under test: `available = posted - held`; a hold reaches a terminal state exactly once;
only the subsystem that placed a hold may capture or release it; every capture is a balanced
journal transaction. Every test ends with the ledger verified (fixture).
"""
from __future__ import annotations

import datetime as dt

import pytest

from ledger.errors import ErrorCode
from ledger.model import AccountKind, HoldState, Transfer
from tests.integration.ledger_helpers import Book, assert_code, journal_size

OWNER = "withdrawals"
UTC = dt.timezone.utc


@pytest.fixture()
def book(ledger) -> Book:
    return Book(ledger)


@pytest.fixture()
def funded(ledger, book):
    """alice holds 1,000; `out` is where captures go (in-flight withdrawals)."""
    alice = book.account("alice")
    out = book.account("in_flight", AccountKind.in_flight)
    book.fund(alice, 1_000)
    return alice, out


def _bal(ledger, account_id):
    b = ledger.balance(account_id)
    assert b.available == b.posted - b.held
    return b.posted, b.held, b.available


def test_placing_a_hold_moves_available_to_held(ledger, book, funded):
    alice, _ = funded
    before = journal_size(ledger)
    hold = ledger.place_hold(book.key(), alice, 300, owner=OWNER, reference="w1")
    assert (hold.state, hold.amount, hold.captured, hold.released, hold.remaining) == (HoldState.pending, 300, 0, 0, 300)
    assert hold.created and hold.owner == OWNER and hold.reference == "w1" and hold.account_id == alice
    assert _bal(ledger, alice) == (1_000, 300, 700)
    assert journal_size(ledger) == before  # a hold is not a posting
    ledger.release_hold(hold.id, owner=OWNER)


def test_available_not_posted_limits_debits_and_further_holds(ledger, book, funded):
    alice, out = funded
    hold = ledger.place_hold(book.key(), alice, 600, owner=OWNER, reference="w1")
    assert_code(ErrorCode.insufficient_funds, ledger.transfer, book.key(), alice, out, 401)
    assert_code(ErrorCode.insufficient_funds, ledger.place_hold, book.key(), alice, 401, owner=OWNER, reference="w2")
    ledger.transfer(book.key(), alice, out, 400)
    assert _bal(ledger, alice) == (600, 600, 0)
    assert_code(ErrorCode.insufficient_funds, ledger.place_hold, book.key(), alice, 1, owner=OWNER, reference="w3")
    ledger.release_hold(hold.id, owner=OWNER)
    assert _bal(ledger, alice) == (600, 0, 600)


def test_place_hold_is_idempotent_per_key(ledger, book, funded):
    alice, _ = funded
    key = book.key()
    first = ledger.place_hold(key, alice, 300, owner=OWNER, reference="w1")
    again = ledger.place_hold(key, alice, 300, owner=OWNER, reference="w1")
    assert (again.id, again.created) == (first.id, False)
    assert _bal(ledger, alice) == (1_000, 300, 700)  # held once
    for change in ({"amount": 301}, {"reference": "w2"}, {"owner": "other"}):
        args = {"amount": 300, "owner": OWNER, "reference": "w1", **change}
        assert_code(ErrorCode.idempotency_conflict, ledger.place_hold, key, alice, args["amount"],
                    owner=args["owner"], reference=args["reference"])
    assert _bal(ledger, alice) == (1_000, 300, 700)
    ledger.release_hold(first.id, owner=OWNER)


def test_capture_in_parts_until_fully_captured(ledger, book, funded):
    alice, out = funded
    fee = book.account("fee", AccountKind.fee_income)
    hold = ledger.place_hold(book.key(), alice, 100, owner=OWNER, reference="w1")

    ledger.capture_hold(book.key(), hold.id, [Transfer(alice, out, 30)], owner=OWNER)
    h = ledger.get_hold(hold.id)
    assert (h.state, h.captured, h.remaining) == (HoldState.pending, 30, 70)
    assert _bal(ledger, alice) == (970, 70, 900)

    # one capture may have several legs (amount and fee), each a transfer through the hold
    r = ledger.capture_hold(book.key(), hold.id, [Transfer(alice, out, 45), Transfer(alice, fee, 5)], owner=OWNER)
    assert ledger.transaction_transfers(r.transaction_id) == [
        Transfer(alice, out, 45, hold.id), Transfer(alice, fee, 5, hold.id)
    ]
    assert ledger.get_hold(hold.id).remaining == 20

    assert_code(ErrorCode.hold_exceeded, ledger.capture_hold, book.key(), hold.id, [Transfer(alice, out, 21)], owner=OWNER)
    assert_code(ErrorCode.hold_exceeded, ledger.capture_hold, book.key(), hold.id,
                [Transfer(alice, out, 15), Transfer(alice, fee, 6)], owner=OWNER)

    ledger.capture_hold(book.key(), hold.id, [Transfer(alice, out, 20)], owner=OWNER)
    h = ledger.get_hold(hold.id)
    assert (h.state, h.captured, h.released, h.remaining) == (HoldState.captured, 100, 0, 0)
    assert _bal(ledger, alice) == (900, 0, 900)
    assert (book.posted(out), book.posted(fee)) == (95, 5)


def test_bitsten_capture_60_of_100_then_final_release_returns_40(ledger, book, funded):
    """The Bitsten failure mode: a partial fill must not strand the unfilled part of a hold."""
    alice, out = funded
    hold = ledger.place_hold(book.key(), alice, 100, owner=OWNER, reference="order-7")
    ledger.capture_hold(book.key(), hold.id, [Transfer(alice, out, 60)], owner=OWNER, final=True)
    h = ledger.get_hold(hold.id)
    assert (h.state, h.captured, h.released, h.remaining) == (HoldState.released, 60, 40, 0)
    assert _bal(ledger, alice) == (940, 0, 940)
    assert book.posted(out) == 60
    assert_code(ErrorCode.hold_already_resolved, ledger.capture_hold, book.key(), hold.id,
                [Transfer(alice, out, 40)], owner=OWNER)


def test_bitsten_price_improvement_is_returned_not_lost(ledger):
    """The article's case in its own numbers: a bid reserves 0.5 BTC x 60,000 = 30,000 USDT, fills
    0.2 BTC at 59,900 (11,980 USDT) and closes. The release reads what is left on the hold (18,020),
    so the 20 USDT of price improvement goes back to the buyer instead of vanishing."""
    book = Book(ledger, "USDT", 6)
    usdt = 10**6
    buyer, seller = book.account("buyer"), book.account("seller")
    book.fund(buyer, 40_000 * usdt)
    hold = ledger.place_hold(book.key("order:1:reserve"), buyer, 30_000 * usdt, owner="matching", reference="order:1")
    assert _bal(ledger, buyer) == (40_000 * usdt, 30_000 * usdt, 10_000 * usdt)
    ledger.capture_hold(book.key("fill:BTC-USDT:1"), hold.id, [Transfer(buyer, seller, 11_980 * usdt)], owner="matching")
    closed = ledger.release_hold(hold.id, owner="matching")  # the order closes with 0.3 BTC unfilled
    assert closed.released == 18_020 * usdt  # not 0.3 x 60,000 = 18,000
    assert _bal(ledger, buyer) == (28_020 * usdt, 0, 28_020 * usdt)
    assert book.posted(buyer) + book.posted(seller) == 40_000 * usdt


def test_a_replayed_final_capture_releases_nothing_more(ledger, book, funded):
    alice, out = funded
    hold = ledger.place_hold(book.key(), alice, 100, owner=OWNER, reference="w1")
    key = book.key()
    first = ledger.capture_hold(key, hold.id, [Transfer(alice, out, 60)], owner=OWNER, final=True)
    again = ledger.capture_hold(key, hold.id, [Transfer(alice, out, 60)], owner=OWNER, final=True)
    assert (again.transaction_id, again.created) == (first.transaction_id, False)
    assert _bal(ledger, alice) == (940, 0, 940)


def test_release_returns_the_remainder_and_a_retry_is_a_no_op(ledger, book, funded):
    alice, out = funded
    hold = ledger.place_hold(book.key(), alice, 100, owner=OWNER, reference="w1")
    ledger.capture_hold(book.key(), hold.id, [Transfer(alice, out, 25)], owner=OWNER)
    released = ledger.release_hold(hold.id, owner=OWNER)
    assert (released.state, released.captured, released.released) == (HoldState.released, 25, 75)
    assert _bal(ledger, alice) == (975, 0, 975)
    assert ledger.release_hold(hold.id, owner=OWNER) == released  # retry answers the same
    assert _bal(ledger, alice) == (975, 0, 975)


def test_only_the_owner_may_release_or_capture(ledger, book, funded):
    alice, out = funded
    hold = ledger.place_hold(book.key(), alice, 100, owner=OWNER, reference="w1")
    assert_code(ErrorCode.hold_owner_mismatch, ledger.release_hold, hold.id, owner="matching")
    assert_code(ErrorCode.hold_owner_mismatch, ledger.capture_hold, book.key(), hold.id,
                [Transfer(alice, out, 10)], owner="matching")
    assert_code(ErrorCode.hold_owner_mismatch, ledger.post, book.key(),
                [Transfer(alice, out, 10, hold.id)])  # no owner at all
    h = ledger.get_hold(hold.id)
    assert (h.state, h.captured) == (HoldState.pending, 0)
    assert _bal(ledger, alice) == (1_000, 100, 900)
    ledger.release_hold(hold.id, owner=OWNER)


def test_a_capture_must_debit_the_held_account(ledger, book, funded):
    alice, out = funded
    bob = book.account("bob")
    book.fund(bob, 50)
    hold = ledger.place_hold(book.key(), alice, 100, owner=OWNER, reference="w1")
    assert_code(ErrorCode.hold_account_mismatch, ledger.capture_hold, book.key(), hold.id,
                [Transfer(bob, out, 10)], owner=OWNER)
    assert book.posted(bob) == 50 and ledger.get_hold(hold.id).captured == 0
    ledger.release_hold(hold.id, owner=OWNER)


def test_expiry_releases_timed_out_holds_once(ledger, book, funded):
    alice, out = funded
    now = dt.datetime.now(UTC)
    soon = ledger.place_hold(book.key(), alice, 100, owner=OWNER, reference="w1", expires_at=now + dt.timedelta(hours=1))
    later = ledger.place_hold(book.key(), alice, 200, owner=OWNER, reference="w2", expires_at=now + dt.timedelta(days=2))
    never = ledger.place_hold(book.key(), alice, 300, owner=OWNER, reference="w3")
    ledger.capture_hold(book.key(), soon.id, [Transfer(alice, out, 10)], owner=OWNER)
    assert _bal(ledger, alice) == (990, 590, 400)

    assert soon.id not in ledger.expire_holds()  # not yet timed out
    job_time = now + dt.timedelta(hours=2)
    expired = ledger.expire_holds(now=job_time)
    assert soon.id in expired and later.id not in expired and never.id not in expired
    h = ledger.get_hold(soon.id)
    assert (h.state, h.captured, h.released) == (HoldState.expired, 10, 90)
    assert _bal(ledger, alice) == (990, 500, 490)

    assert soon.id not in ledger.expire_holds(now=job_time)  # terminal exactly once
    assert_code(ErrorCode.hold_already_resolved, ledger.release_hold, soon.id, owner=OWNER)
    assert_code(ErrorCode.hold_already_resolved, ledger.capture_hold, book.key(), soon.id,
                [Transfer(alice, out, 1)], owner=OWNER)
    assert ledger.get_hold(soon.id) == h

    expired = ledger.expire_holds(now=now + dt.timedelta(days=3))
    assert later.id in expired and never.id not in expired
    assert _bal(ledger, alice) == (990, 300, 690)
    ledger.release_hold(never.id, owner=OWNER)


def test_a_timed_out_hold_cannot_be_captured(ledger, book, funded):
    alice, out = funded
    past = dt.datetime.now(UTC) - dt.timedelta(seconds=1)
    hold = ledger.place_hold(book.key(), alice, 100, owner=OWNER, reference="w1", expires_at=past)
    assert_code(ErrorCode.hold_expired, ledger.capture_hold, book.key(), hold.id, [Transfer(alice, out, 10)], owner=OWNER)
    assert hold.id in ledger.expire_holds()
    assert ledger.get_hold(hold.id).state is HoldState.expired
    assert _bal(ledger, alice) == (1_000, 0, 1_000)


@pytest.mark.parametrize("first", ["capture_all", "release", "expire"])
def test_every_terminal_state_refuses_every_other_resolution(ledger, book, funded, first):
    alice, out = funded
    now = dt.datetime.now(UTC)
    hold = ledger.place_hold(book.key(), alice, 100, owner=OWNER, reference="w1", expires_at=now + dt.timedelta(hours=1))
    if first == "capture_all":
        ledger.capture_hold(book.key(), hold.id, [Transfer(alice, out, 100)], owner=OWNER)
    elif first == "release":
        ledger.release_hold(hold.id, owner=OWNER)
    else:
        assert hold.id in ledger.expire_holds(now=now + dt.timedelta(hours=2))
    done = ledger.get_hold(hold.id)
    assert done.state.value == {"capture_all": "captured", "release": "released", "expire": "expired"}[first]
    snapshot = _bal(ledger, alice)

    assert_code(ErrorCode.hold_already_resolved, ledger.capture_hold, book.key(), hold.id,
                [Transfer(alice, out, 1)], owner=OWNER)
    if first != "release":
        assert_code(ErrorCode.hold_already_resolved, ledger.release_hold, hold.id, owner=OWNER)
    assert hold.id not in ledger.expire_holds(now=now + dt.timedelta(hours=3))
    assert ledger.get_hold(hold.id) == done
    assert _bal(ledger, alice) == snapshot


def test_hold_errors_for_unknown_holds_and_bad_input(ledger, book, funded):
    alice, out = funded
    assert_code(ErrorCode.hold_not_found, ledger.get_hold, 10**15)
    assert_code(ErrorCode.hold_not_found, ledger.release_hold, 10**15, owner=OWNER)
    assert_code(ErrorCode.hold_not_found, ledger.capture_hold, book.key(), 10**15, [Transfer(alice, out, 1)], owner=OWNER)
    assert_code(ErrorCode.invalid_amount, ledger.place_hold, book.key(), alice, 0, owner=OWNER, reference="w")
    assert_code(ErrorCode.invalid_request, ledger.place_hold, book.key(), alice, 1, owner="", reference="w")
    assert_code(ErrorCode.invalid_request, ledger.place_hold, book.key(), alice, 1, owner=OWNER, reference="w",
                expires_at=dt.datetime(2030, 1, 1))  # naive datetime
    assert_code(ErrorCode.account_not_found, ledger.place_hold, book.key(), 10**15, 1, owner=OWNER, reference="w")
    assert _bal(ledger, alice) == (1_000, 0, 1_000)
