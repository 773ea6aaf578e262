"""Many connections racing on one account: no overdraft, no lost update, no double posting.

Each worker is a thread calling the ledger, which takes its own connection from the engine pool
for every command, so the races happen in PostgreSQL, not in Python. A `threading.Barrier`
releases the workers together.
"""
from __future__ import annotations

import random

import pytest

from ledger.errors import ErrorCode, LedgerError
from ledger.model import AccountKind, HoldState, Transfer
from tests.integration.ledger_helpers import Book, failed_checks, journal_size, race

WORKERS = 16
OWNER = "withdrawals"


@pytest.fixture()
def book(ledger) -> Book:
    return Book(ledger)


def _codes(results: list[object]) -> list[ErrorCode]:
    return [r.code for r in results if isinstance(r, LedgerError)]


def test_sixteen_workers_cannot_overdraw_one_account(ledger, book):
    funding = 10_000
    source = book.account("source")
    sinks = [book.account(f"sink{i}") for i in range(WORKERS)]
    book.fund(source, funding)
    rng = random.Random(7)
    plan = [[rng.randint(50, 150) for _ in range(10)] for _ in range(WORKERS)]
    assert sum(map(sum, plan)) > funding  # together they ask for more than there is

    def work(i: int) -> list[tuple[int, object]]:
        outcomes = []
        for j, amount in enumerate(plan[i]):
            try:
                outcomes.append((amount, ledger.transfer(book.key(f"w{i}:{j}"), source, sinks[i], amount)))
            except LedgerError as err:
                outcomes.append((amount, err))
        return outcomes

    results = race(WORKERS, work)
    outcomes = [o for worker in results for o in worker]
    won = [amount for amount, r in outcomes if not isinstance(r, LedgerError)]
    lost = [r for _, r in outcomes if isinstance(r, LedgerError)]
    assert won and lost
    assert {e.code for e in lost} == {ErrorCode.insufficient_funds}
    final = ledger.balance(source)
    assert final.posted >= 0
    assert final.posted == funding - sum(won)
    # every refused debit really did not fit when it was refused: the smallest loser exceeds what is left
    assert min(amount for amount, r in outcomes if isinstance(r, LedgerError)) > final.posted
    for i, sink in enumerate(sinks):
        assert ledger.balance(sink).posted == sum(a for a, r in results[i] if not isinstance(r, LedgerError))
    # no lost update: one statement line per successful debit, running balances intact
    assert len(ledger.statement(source, limit=1000).lines) == 1 + len(won)
    assert failed_checks(ledger) == set()


@pytest.mark.parametrize("round_", range(5))
def test_two_simultaneous_withdrawals_of_30000_against_40000(ledger, book, round_):
    alice, out = book.account("alice"), book.account("out", AccountKind.in_flight)
    book.fund(alice, 40_000)
    results = race(2, lambda i: ledger.transfer(book.key(f"withdrawal:{i}"), alice, out, 30_000))
    assert sum(not isinstance(r, LedgerError) for r in results) == 1
    assert _codes(results) == [ErrorCode.insufficient_funds]
    assert (book.posted(alice), book.posted(out)) == (10_000, 30_000)


@pytest.mark.parametrize("round_", range(3))
def test_concurrent_replays_of_one_key_post_once(ledger, book, round_):
    alice, bob = book.account("alice"), book.account("bob")
    book.fund(alice, 1_000)
    key = book.key("deposit:btc:txid:0")
    results = race(WORKERS, lambda i: ledger.transfer(key, alice, bob, 250))
    assert not _codes(results)
    assert len({r.transaction_id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert (book.posted(alice), book.posted(bob)) == (750, 250)


def test_concurrent_posts_of_one_key_with_different_content_post_one_of_them(ledger, book):
    alice, bob, carol = book.account("alice"), book.account("bob"), book.account("carol")
    book.fund(alice, 1_000)
    key = book.key()
    # even workers pay bob, odd ones pay carol: disjoint locks, so the key's unique constraint decides
    results = race(WORKERS, lambda i: ledger.transfer(key, alice, bob if i % 2 == 0 else carol, 100))
    created = [i for i, r in enumerate(results) if not isinstance(r, LedgerError) and r.created]
    assert len(created) == 1
    winner_parity = created[0] % 2
    for i, r in enumerate(results):
        if i % 2 == winner_parity:
            assert not isinstance(r, LedgerError) and r.transaction_id == results[created[0]].transaction_id
        else:
            assert isinstance(r, LedgerError) and r.code is ErrorCode.idempotency_conflict
    assert book.posted(alice) == 900
    assert book.posted(bob) + book.posted(carol) == 100


def test_concurrent_hold_placement_cannot_over_reserve(ledger, book):
    alice = book.account("alice")
    book.fund(alice, 1_000)
    results = race(WORKERS, lambda i: ledger.place_hold(book.key(f"h{i}"), alice, 100, owner=OWNER, reference=f"w{i}"))
    placed = [r for r in results if not isinstance(r, LedgerError)]
    assert len(placed) == 10
    assert _codes(results) == [ErrorCode.insufficient_funds] * 6
    b = ledger.balance(alice)
    assert (b.posted, b.held, b.available) == (1_000, 1_000, 0)
    for h in placed:
        ledger.release_hold(h.id, owner=OWNER)


def test_holds_and_debits_racing_cannot_over_reserve(ledger, book):
    alice, out = book.account("alice"), book.account("out", AccountKind.in_flight)
    book.fund(alice, 1_000)

    def work(i: int):
        if i % 2:
            return ledger.place_hold(book.key(f"h{i}"), alice, 150, owner=OWNER, reference=f"w{i}")
        return ledger.transfer(book.key(f"t{i}"), alice, out, 150)

    results = race(WORKERS, work)
    assert len([r for r in results if not isinstance(r, LedgerError)]) == 6  # 6 * 150 <= 1000 < 7 * 150
    assert set(_codes(results)) == {ErrorCode.insufficient_funds}
    b = ledger.balance(alice)
    assert b.available == 100 and b.posted + book.posted(out) == 1_000
    for r in results:
        if not isinstance(r, LedgerError) and hasattr(r, "state"):
            ledger.release_hold(r.id, owner=OWNER)


def test_concurrent_replays_of_a_hold_key_hold_once(ledger, book):
    alice = book.account("alice")
    book.fund(alice, 1_000)
    key = book.key()
    results = race(WORKERS, lambda i: ledger.place_hold(key, alice, 300, owner=OWNER, reference="w1"))
    assert not _codes(results)
    assert len({h.id for h in results}) == 1 and sum(h.created for h in results) == 1
    assert ledger.balance(alice).held == 300
    ledger.release_hold(results[0].id, owner=OWNER)


@pytest.mark.parametrize("round_", range(3))
def test_a_hold_resolves_exactly_once_under_racing_capture_and_release(ledger, book, round_):
    alice, out = book.account("alice"), book.account("out", AccountKind.in_flight)
    book.fund(alice, 1_000)
    hold = ledger.place_hold(book.key(), alice, 100, owner=OWNER, reference="w1")

    def work(i: int):
        if i % 2:
            return ledger.release_hold(hold.id, owner=OWNER)
        return ledger.capture_hold(book.key(f"c{i}"), hold.id, [Transfer(alice, out, 100)], owner=OWNER)

    results = race(WORKERS, work)
    final = ledger.get_hold(hold.id)
    captures = [r for i, r in enumerate(results) if i % 2 == 0 and not isinstance(r, LedgerError)]
    assert set(_codes(results)) <= {ErrorCode.hold_already_resolved}
    if final.state is HoldState.captured:
        assert len(captures) == 1
        assert all(isinstance(r, LedgerError) for i, r in enumerate(results) if i % 2)
        assert (book.posted(alice), book.posted(out)) == (900, 100)
    else:
        assert final.state is HoldState.released and not captures
        assert (book.posted(alice), book.posted(out)) == (1_000, 0)
    assert ledger.balance(alice).held == 0


@pytest.mark.parametrize("round_", range(3))
def test_expiry_racing_the_owners_release_resolves_the_hold_once(ledger, book, round_):
    import datetime as dt

    alice = book.account("alice")
    book.fund(alice, 1_000)
    now = dt.datetime.now(dt.timezone.utc)
    hold = ledger.place_hold(book.key(), alice, 400, owner=OWNER, reference="w1", expires_at=now + dt.timedelta(hours=1))
    later = now + dt.timedelta(hours=2)

    def work(i: int):
        return ledger.expire_holds(now=later) if i % 2 else ledger.release_hold(hold.id, owner=OWNER)

    results = race(8, work)
    final = ledger.get_hold(hold.id)
    expired_by = [r for i, r in enumerate(results) if i % 2 and hold.id in r]
    if final.state is HoldState.expired:
        assert len(expired_by) == 1
        assert all(isinstance(r, LedgerError) and r.code is ErrorCode.hold_already_resolved
                   for i, r in enumerate(results) if i % 2 == 0)
    else:
        assert final.state is HoldState.released and not expired_by
        assert not _codes(results)  # the other releases are retries answering the same hold
    assert (final.captured, final.released) == (0, 400)
    b = ledger.balance(alice)
    assert (b.posted, b.held, b.available) == (1_000, 0, 1_000)


def test_transfers_in_both_directions_do_not_deadlock_or_lose_money(ledger, book):
    accounts = [book.account(f"a{i}") for i in range(4)]
    for a in accounts:
        book.fund(a, 500)
    rng = random.Random(11)
    plan = [[(rng.sample(accounts, 2), rng.randint(1, 200)) for _ in range(15)] for _ in range(WORKERS)]

    def work(i: int):
        out = []
        for j, ((src, dst), amount) in enumerate(plan[i]):
            legs = [Transfer(src, dst, amount), Transfer(dst, src, amount // 2 + 1)]  # touches both, both ways
            try:
                out.append(ledger.post(book.key(f"w{i}:{j}"), legs))
            except LedgerError as err:
                out.append(err)
        return out

    results = [r for worker in race(WORKERS, work) for r in worker]
    assert set(_codes(results)) <= {ErrorCode.insufficient_funds}
    assert any(not isinstance(r, LedgerError) for r in results)
    assert sum(book.posted(a) for a in accounts) == 2_000
    assert all(book.posted(a) >= 0 for a in accounts)


@pytest.mark.parametrize("legs", [1, 2], ids=["one-transfer path", "general path"])
def test_a_posting_waiting_on_a_close_is_refused_and_writes_nothing(ledger, book, engine, legs):
    """close_account locks the balance rows, then closes. A posting that read the account as open
    and then waited for those locks must see the close once it has them: account_closed, at the
    first transfer that touches the closed account, and nothing written."""
    import threading
    import time

    payer = book.account("payer")
    other = book.account("other")
    closing = book.account("closing")
    book.fund(payer, 1_000)
    transfers = [Transfer(payer, closing, 10)] if legs == 1 else [Transfer(payer, other, 5), Transfer(payer, closing, 10)]
    key = book.key()
    size = journal_size(ledger)
    outcome: list[object] = []
    with engine.begin() as c:
        ledger.close_account(closing, conn=c)  # holds the balance row's lock until this commits

        def post() -> None:
            try:
                outcome.append(ledger.post(key, transfers))
            except LedgerError as exc:
                outcome.append(exc)

        worker = threading.Thread(target=post)
        worker.start()
        time.sleep(0.5)  # the posting has read the account as open and now waits for its lock
        assert worker.is_alive() and not outcome
    worker.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], LedgerError), outcome
    assert outcome[0].code is ErrorCode.account_closed
    assert outcome[0].detail["index"] == legs - 1
    assert journal_size(ledger) == size
    assert book.posted(payer) == 1_000 and book.posted(closing) == 0


@pytest.mark.parametrize("legs", [1, 2], ids=["one-transfer path", "general path"])
def test_a_replay_answers_without_waiting_for_the_accounts_locks(ledger, book, engine, legs):
    """A key already posted answers at once, before any lock: a replay never waits behind (or
    deadlocks with) a transaction holding the accounts' balance rows."""
    import threading

    from sqlalchemy import text

    payer, payee, other = book.account("payer"), book.account("payee"), book.account("other")
    book.fund(payer, 1_000)
    transfers = [Transfer(payer, payee, 10)] if legs == 1 else [Transfer(payer, payee, 5), Transfer(payer, other, 5)]
    key = book.key()
    first = ledger.post(key, transfers)
    outcome: list[object] = []
    with engine.begin() as c:
        c.execute(text("SELECT 1 FROM account_balance WHERE account_id = ANY (:a) FOR UPDATE"),
                  {"a": [payer, payee, other]})
        worker = threading.Thread(target=lambda: outcome.append(ledger.post(key, transfers)))
        worker.start()
        worker.join(5)
        answered_while_locked = not worker.is_alive()
    worker.join(10)
    assert answered_while_locked, "the replay waited for the balance rows' locks"
    assert outcome == [type(first)(first.transaction_id, False)]
    assert book.posted(payer) == 1_000 - 10


@pytest.mark.parametrize("legs", [1, 2], ids=["one-transfer path", "general path"])
def test_a_repeatable_read_posting_waiting_on_a_close_fails_to_serialize(ledger, book, engine, legs):
    """At REPEATABLE READ a posting's snapshot predates a close it waited for; it must fail
    (serialization failure, nothing written) rather than post to the closed account."""
    import threading
    import time

    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    payer, other, closing = book.account("payer"), book.account("other"), book.account("closing")
    book.fund(payer, 1_000)
    transfers = [Transfer(payer, closing, 10)] if legs == 1 else [Transfer(payer, other, 5), Transfer(payer, closing, 10)]
    size = journal_size(ledger)
    outcome: list[object] = []

    def post() -> None:
        try:
            with engine.connect().execution_options(isolation_level="REPEATABLE READ") as rr, rr.begin():
                rr.execute(text("SELECT 1"))  # the snapshot is taken here, before the close commits
                ready.set()
                outcome.append(ledger.post(book.key(), transfers, conn=rr))
        except DBAPIError as exc:
            outcome.append(exc)

    ready = threading.Event()
    with engine.begin() as c:
        ledger.close_account(closing, conn=c)
        worker = threading.Thread(target=post)
        worker.start()
        assert ready.wait(5)
        time.sleep(0.5)  # the posting now waits for the closing account's balance row
    worker.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], DBAPIError), outcome
    assert outcome[0].orig.sqlstate == "40001"
    assert journal_size(ledger) == size
    assert book.posted(closing) == 0
