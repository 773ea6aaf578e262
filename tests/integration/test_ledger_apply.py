"""`Ledger.apply`: several ledger commands in one statement, each answering as it would alone."""
from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ledger.errors import ErrorCode, LedgerError
from ledger.model import HoldState, PlaceHold, PostTransfers, ReleaseHold, ReplaceHold, Transfer
from tests.integration.ledger_helpers import Book, journal_size

OWNER = "matching:TEST"


@pytest.fixture
def book(ledger) -> Book:
    return Book(ledger)


def test_commands_run_in_order_and_answer_like_the_single_calls(ledger, book):
    alice, bob, fee = book.account("alice"), book.account("bob"), book.account("fee")
    book.fund(alice, 1_000)
    hold = ledger.place_hold(book.key("h0"), alice, 300, owner=OWNER, reference="o0")
    results = ledger.apply([
        PostTransfers(book.key("p1"), (Transfer(alice, bob, 100, hold.id), Transfer(alice, fee, 5, hold.id)),
                      kind="fill", metadata={"seq": 1}, hold_owner=OWNER),
        ReleaseHold(hold.id, OWNER),
        PlaceHold(book.key("h1"), alice, 895, OWNER, "o1"),   # exactly what is left after the capture
        PlaceHold(book.key("h2"), alice, 1, OWNER, "o2"),     # nothing left: refused, writes nothing
    ])
    assert [r.status for r in results] == ["created", "created", "created", "insufficient_funds"]
    assert results[1].id == hold.id
    assert ledger.get_hold(hold.id).state is HoldState.released
    assert ledger.get_hold(results[2].id).amount == 895
    b = ledger.balance(alice)
    assert (b.posted, b.held) == (895, 895)
    assert (ledger.balance(bob).posted, ledger.balance(fee).posted) == (100, 5)
    # The same commands again are replays: nothing moves, the same ids answer.
    size = journal_size(ledger)
    again = ledger.apply([
        PostTransfers(book.key("p1"), (Transfer(alice, bob, 100, hold.id), Transfer(alice, fee, 5, hold.id)),
                      kind="fill", metadata={"seq": 1}, hold_owner=OWNER),
        ReleaseHold(hold.id, OWNER),
        PlaceHold(book.key("h1"), alice, 895, OWNER, "o1"),
    ])
    assert [(r.status, r.id) for r in again] == [("exists", results[0].id), ("exists", hold.id),
                                                ("exists", results[2].id)]
    assert journal_size(ledger) == size
    # A batched posting and the single call share keys and content hashes.
    assert ledger.post(book.key("p1"), [Transfer(alice, bob, 100, hold.id), Transfer(alice, fee, 5, hold.id)],
                       kind="fill", metadata={"seq": 1}, hold_owner=OWNER).created is False
    ledger.assert_verified()


def test_replace_counts_the_old_hold_as_available_and_changes_nothing_when_short(ledger, book):
    alice = book.account("alice")
    book.fund(alice, 1_000)
    old = ledger.place_hold(book.key("h0"), alice, 600, owner=OWNER, reference="o")
    (short,) = ledger.apply([ReplaceHold(old.id, book.key("h1"), alice, 1_001, OWNER, "o")])
    assert short.status == "insufficient_funds"
    assert ledger.get_hold(old.id).state is HoldState.pending
    assert ledger.balance(alice).held == 600
    (done,) = ledger.apply([ReplaceHold(old.id, book.key("h1"), alice, 1_000, OWNER, "o")])
    assert done.status == "created" and done.id != old.id
    assert ledger.get_hold(old.id).state is HoldState.released
    assert ledger.balance(alice).held == 1_000
    (replay,) = ledger.apply([ReplaceHold(old.id, book.key("h1"), alice, 1_000, OWNER, "o")])
    assert (replay.status, replay.id) == ("exists", done.id)
    (conflict,) = ledger.apply([ReplaceHold(old.id, book.key("h1"), alice, 999, OWNER, "o")])
    assert conflict.status == "idempotency_conflict"
    ledger.assert_verified()


def test_replace_refuses_a_foreign_or_resolved_hold(ledger, book):
    alice, bob = book.account("alice"), book.account("bob")
    book.fund(alice, 1_000)
    book.fund(bob, 1_000)
    held = ledger.place_hold(book.key("h0"), alice, 100, owner=OWNER, reference="o")
    results = ledger.apply([
        ReplaceHold(held.id, book.key("x1"), alice, 200, "someone else", "o"),
        ReplaceHold(held.id, book.key("x2"), bob, 200, OWNER, "o"),
        ReplaceHold(10**12, book.key("x3"), alice, 200, OWNER, "o"),
        ReleaseHold(held.id, OWNER),
        ReplaceHold(held.id, book.key("x4"), alice, 200, OWNER, "o"),
    ])
    assert [r.status for r in results] == ["hold_owner_mismatch", "hold_account_mismatch", "hold_not_found",
                                          "created", "hold_already_resolved"]
    assert ledger.balance(alice).held == 0 and ledger.balance(bob).held == 0
    ledger.assert_verified()


def test_a_refused_posting_reports_its_index_and_the_rest_still_run(ledger, book):
    alice, bob = book.account("alice"), book.account("bob")
    book.fund(alice, 50)
    results = ledger.apply([
        PostTransfers(book.key("p1"), (Transfer(alice, bob, 10), Transfer(alice, bob, 100))),
        PostTransfers(book.key("p2"), (Transfer(alice, bob, 10),)),
    ])
    assert (results[0].status, results[0].index) == ("insufficient_funds", 0)
    assert results[1].status == "created"
    assert ledger.balance(bob).posted == 10
    ledger.assert_verified()


def test_malformed_commands_are_refused_before_anything_is_sent(ledger, book):
    alice, bob = book.account("alice"), book.account("bob")
    size = journal_size(ledger)
    for bad, code in (([PostTransfers("", (Transfer(alice, bob, 1),))], ErrorCode.invalid_request),
                      ([PostTransfers(book.key(), ())], ErrorCode.invalid_request),
                      ([PostTransfers(book.key(), (Transfer(alice, alice, 1),))], ErrorCode.accounts_must_be_different),
                      ([PlaceHold(book.key(), alice, 0, OWNER, "o")], ErrorCode.invalid_amount),
                      ([PlaceHold(book.key(), alice, 1, "", "o")], ErrorCode.invalid_request),
                      ([PlaceHold(book.key(), "1,2", 1, OWNER, "o")], ErrorCode.invalid_request),
                      (["not a command"], ErrorCode.invalid_request)):
        with pytest.raises(LedgerError) as exc:
            ledger.apply(bad)
        assert exc.value.code is code, bad
    assert ledger.apply([]) == []
    assert journal_size(ledger) == size


def test_keys_and_references_arrive_exactly_whatever_they_contain(ledger, book):
    alice = book.account("alice")
    book.fund(alice, 1_000)
    nasty = ['a"b', "back\\slash", "comma,brace{}", "NULL", " spaced ", "ünïcødé ✓", "\\\"", ""]
    commands = [PlaceHold(book.key(f"h{i}:{text}"), alice, 1, OWNER, text or "-") for i, text in enumerate(nasty)]
    results = ledger.apply(commands)
    assert all(r.status == "created" for r in results)
    for command, result in zip(commands, results):
        hold = ledger.get_hold(result.id)
        assert hold.reference == command.reference
    again = ledger.apply(commands)  # replays: the keys and hashes round-trip exactly
    assert [r.status for r in again] == ["exists"] * len(nasty)
    ledger.assert_verified()


def test_holds_can_be_placed_under_reserved_ids_and_named_before_they_exist(ledger, book):
    alice, bob = book.account("alice"), book.account("bob")
    book.fund(alice, 1_000)
    with ledger.engine.begin() as conn:
        first, second = ledger.reserve_hold_ids(2, conn=conn)
        results = ledger.apply([
            PlaceHold(book.key("h1"), alice, 300, OWNER, "o1", hold_id=first),
            # the same batch captures from it and replaces it, naming it by its reserved id
            PostTransfers(book.key("p1"), (Transfer(alice, bob, 100, first),), kind="fill", hold_owner=OWNER),
            ReplaceHold(first, book.key("h2"), alice, 500, OWNER, "o1", new_hold_id=second),
        ], conn=conn)
    assert [(r.status, r.id) for r in results[::2]] == [("created", first), ("created", second)]
    assert ledger.get_hold(first).state is HoldState.released and ledger.get_hold(first).captured == 100
    assert ledger.get_hold(second).amount == 500
    b = ledger.balance(alice)
    assert (b.posted, b.held) == (900, 500)
    ledger.assert_verified()


def test_lock_available_reads_headroom_and_holds_the_rows_until_commit(ledger, book):
    alice, bob = book.account("alice"), book.account("bob")
    book.fund(alice, 1_000)
    ledger.place_hold(book.key(), alice, 250, owner=OWNER, reference="o")
    with ledger.engine.begin() as conn:
        seen = ledger.lock_available([bob, alice, alice, 10**12], conn=conn)
        assert set(seen) == {alice, bob}
        assert (seen[alice].available, seen[alice].may_go_negative, seen[alice].closed) == (750, False, False)
        assert seen[bob].available == 0
        # another transaction cannot change alice's balance meanwhile
        with ledger.engine.connect() as other:
            other.execute(text("SET lock_timeout = '200ms'"))
            with pytest.raises(DBAPIError):
                ledger.transfer(book.key(), alice, bob, 1, conn=other)
    ledger.assert_verified()


def test_an_id_not_reserved_from_the_sequence_is_refused(ledger, book):
    alice = book.account("alice")
    book.fund(alice, 1_000)
    old = ledger.place_hold(book.key("h0"), alice, 10, owner=OWNER, reference="o")
    results = ledger.apply([PlaceHold(book.key("h1"), alice, 10, OWNER, "o", hold_id=10**15),
                            ReplaceHold(old.id, book.key("h2"), alice, 20, OWNER, "o", new_hold_id=10**15),
                            PlaceHold(book.key("h3"), alice, 10, OWNER, "o", hold_id=0)])
    assert [r.status for r in results] == ["invalid_request"] * 3
    assert ledger.balance(alice).held == 10
    with pytest.raises(LedgerError) as exc:
        ledger.apply([ReleaseHold(old.id, "")])
    assert exc.value.code is ErrorCode.invalid_request
    ledger.assert_verified()
