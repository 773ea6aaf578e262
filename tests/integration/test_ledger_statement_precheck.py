"""A caller's `StatementPrecheck` is read in the posting's (or hold's) own statement: when it finds a
row, its `refuse` raises and the ledger's function never ran (nothing is written under the key, which
stays free); when it finds none, the posting or hold is made as without it, in one round trip.
custody's freeze check (`frozen_precheck`) is one (tests/integration/test_review_deposit_boundaries.py
covers it over the API)."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from ledger.errors import ErrorCode
from ledger.model import Transfer
from ledger.service import StatementPrecheck
from tests.integration.ledger_helpers import Book, assert_code


class Refused(Exception):
    pass


def _refuse(row: dict) -> None:
    raise Refused(row)


def _check(refuse: bool) -> StatementPrecheck:
    return StatementPrecheck("SELECT 42 AS incident_id, CAST(%(acct)s AS bigint) AS account_id WHERE %(on)s",
                             {"acct": 7, "on": refuse}, _refuse)


@pytest.fixture()
def book(ledger) -> Book:
    return Book(ledger)


def test_a_refusing_precheck_stops_the_posting_before_it_starts(engine, ledger, book):
    alice, bob = book.account("alice"), book.account("bob")
    book.fund(alice, 1_000)
    key = book.key("p")
    with pytest.raises(Refused) as refused:
        ledger.post(key, [Transfer(alice, bob, 10)], precheck=_check(True))
    assert refused.value.args[0] == {"incident_id": 42, "account_id": 7}
    assert ledger.balance(bob).posted == 0
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM journal_transaction WHERE idempotency_key = :k"),
                         {"k": key}).scalar_one() == 0
    hold_key = book.key("h")
    with pytest.raises(Refused):
        ledger.place_hold(hold_key, alice, 5, owner="t", reference="r", precheck=_check(True))
    assert ledger.balance(alice).held == 0
    # both keys are still free: the same calls without the refusal succeed
    assert ledger.post(key, [Transfer(alice, bob, 10)], precheck=_check(False)).created
    assert ledger.place_hold(hold_key, alice, 5, owner="t", reference="r", precheck=_check(False)).created
    assert (ledger.balance(bob).posted, ledger.balance(alice).held) == (10, 5)


def test_a_passing_precheck_leaves_the_ledger_answers_as_they_are(engine, ledger, book):
    alice, bob = book.account("alice"), book.account("bob")
    book.fund(alice, 100)
    key = book.key("p")
    first = ledger.post(key, [Transfer(alice, bob, 10)], precheck=_check(False))
    again = ledger.post(key, [Transfer(alice, bob, 10)], precheck=_check(False))
    assert (first.created, again.created, again.transaction_id) == (True, False, first.transaction_id)
    assert_code(ErrorCode.insufficient_funds, ledger.post, book.key(), [Transfer(alice, bob, 1_000)],
                precheck=_check(False))
    assert_code(ErrorCode.idempotency_conflict, ledger.post, key, [Transfer(alice, bob, 11)], precheck=_check(False))
    with engine.connect() as c:  # inside a caller's transaction as well
        tx = c.begin()
        try:
            assert ledger.post(book.key(), [Transfer(alice, bob, 1)], conn=c, precheck=_check(False)).created
            with pytest.raises(Refused):
                ledger.post(book.key(), [Transfer(alice, bob, 1)], conn=c, precheck=_check(True))
        finally:
            tx.rollback()
    assert ledger.balance(bob).posted == 10
