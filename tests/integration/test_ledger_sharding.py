"""Hot accounts with a sharded balance projection (`balance_shards` > 1).

A posting that cannot break a sharded account's limits locks one free shard; one that could locks
every shard and checks the sum. These tests race many connections on such accounts and check that
no update is lost, no limit is broken, nothing deadlocks, statements page without skipping an
entry while writers are busy, holds work on shard 0, and `verify()` sees a corrupted shard.
"""
from __future__ import annotations

import random
import threading

import psycopg
import pytest
from sqlalchemy import text

from ledger.errors import ErrorCode, LedgerError
from ledger.model import DEFAULT_SHARDS, HOT_SHARDS, AccountKind, Transfer
from tests.integration.ledger_helpers import Book, assert_code, failed_checks, race

WORKERS = 16
OWNER = "recon"


@pytest.fixture()
def book(ledger) -> Book:
    return Book(ledger)


def shard_rows(ledger, account_id: int) -> list[tuple[int, int, int]]:
    with ledger.engine.connect() as c:
        return [tuple(r) for r in c.execute(
            text("SELECT shard, posted, held FROM account_balance WHERE account_id = :a ORDER BY shard"),
            {"a": account_id},
        )]


def test_firm_accounts_are_sharded_by_default_and_customers_are_not(ledger, book):
    fee = ledger.get_account(book.account("fee", AccountKind.fee_income))
    alice = ledger.get_account(book.account("alice"))
    assert fee.balance_shards == DEFAULT_SHARDS[AccountKind.fee_income] == HOT_SHARDS
    assert alice.balance_shards == 1
    assert [s for s, _, _ in shard_rows(ledger, fee.id)] == list(range(HOT_SHARDS))
    custom = ledger.get_account(book.account("custom", balance_shards=4))
    assert custom.balance_shards == 4
    # reopening is idempotent; naming another shard count for the same name is a conflict
    assert ledger.open_account(book.asset, AccountKind.customer, f"{book.prefix}:custom").id == custom.id
    assert_code(ErrorCode.idempotency_conflict, ledger.open_account, book.asset, AccountKind.customer,
                f"{book.prefix}:custom", balance_shards=2)
    for bad in (0, 65, True, "4"):
        assert_code(ErrorCode.invalid_request, book.account, f"bad{bad!r}", balance_shards=bad)


def test_sixteen_workers_crediting_one_fee_account_lose_no_update(ledger, book):
    fee = book.account("fee", AccountKind.fee_income)
    payers = [book.account(f"payer{i}") for i in range(WORKERS)]
    for p in payers:
        book.fund(p, 10_000)
    per_worker = 25

    def work(i: int) -> int:
        paid = 0
        for j in range(per_worker):
            amount = 1 + (i * per_worker + j) % 7
            ledger.post(book.key(f"w{i}:{j}"), [Transfer(payers[i], fee, amount)])
            paid += amount
        return paid

    paid = race(WORKERS, work)
    assert book.posted(fee) == sum(paid)
    assert sum(posted for _, posted, _ in shard_rows(ledger, fee)) == sum(paid)
    # the credits really spread: more than one shard took postings
    assert sum(1 for _, posted, _ in shard_rows(ledger, fee) if posted) > 1
    assert len(ledger.statement(fee, limit=1000).lines) == WORKERS * per_worker
    assert failed_checks(ledger) == set()


def test_debits_racing_credits_on_a_hot_account_never_overdraw_it(ledger, book):
    """fee_income may not go negative: credits take one shard, debits lock all and check the sum."""
    fee = book.account("fee", AccountKind.fee_income)
    payer, payee = book.account("payer"), book.account("payee")
    book.fund(payer, 100_000)
    book.fund(fee, 1_000)
    rng = random.Random(5)
    plan = [[rng.randint(50, 150) for _ in range(12)] for _ in range(WORKERS)]

    def work(i: int) -> list[tuple[str, int, object]]:
        out = []
        for j, amount in enumerate(plan[i]):
            if i % 2:  # credit: cannot break the limit, one shard
                out.append(("credit", amount, ledger.transfer(book.key(f"c{i}:{j}"), payer, fee, amount // 10)))
            else:  # debit: could overdraw, every shard
                try:
                    out.append(("debit", amount, ledger.transfer(book.key(f"d{i}:{j}"), fee, payee, amount)))
                except LedgerError as err:
                    out.append(("debit", amount, err))
        return out

    outcomes = [o for worker in race(WORKERS, work) for o in worker]
    refused = [r for _, _, r in outcomes if isinstance(r, LedgerError)]
    assert refused and {e.code for e in refused} == {ErrorCode.insufficient_funds}
    credited = sum(a // 10 for kind, a, r in outcomes if kind == "credit")
    debited = sum(a for kind, a, r in outcomes if kind == "debit" and not isinstance(r, LedgerError))
    assert book.posted(fee) == 1_000 + credited - debited >= 0
    assert book.posted(payee) == debited
    assert failed_checks(ledger) == set()


def test_credits_racing_into_a_pool_that_may_not_go_positive_stop_at_zero(ledger, book):
    """asset_location may not go positive: a credit could break that, so it locks every shard."""
    pool = book.account("pool", AccountKind.asset_location)
    customer = book.account("customer")
    ledger.transfer(book.key("deposit"), pool, customer, 1_000)  # pool -1000: coins on chain
    book.fund(customer, 10_000)  # the customer can pay for every attempt; only the pool refuses
    assert ledger.balance(pool).posted == -1_000
    results = race(WORKERS, lambda i: ledger.transfer(book.key(f"w{i}"), customer, pool, 100))
    assert sum(not isinstance(r, LedgerError) for r in results) == 10
    assert {r.code for r in results if isinstance(r, LedgerError)} == {ErrorCode.limit_exceeded}
    assert book.posted(pool) == 0


def test_mixed_batches_across_sharded_accounts_do_not_deadlock(ledger, book):
    """Batches touching several sharded accounts in both directions: some legs lock one shard,
    some every shard, in (account, shard) order, so the race finishes without a deadlock error."""
    fees = [book.account(f"fee{i}", AccountKind.fee_income) for i in range(3)]
    suspense = book.account("suspense", AccountKind.suspense)
    customers = [book.account(f"c{i}") for i in range(4)]
    for f in fees:
        book.fund(f, 5_000)
    for c in customers:
        book.fund(c, 5_000)
    rng = random.Random(3)
    plan = [[(rng.sample(fees, 2), rng.choice(customers), rng.randint(1, 300)) for _ in range(10)]
            for _ in range(WORKERS)]

    def work(i: int) -> list[object]:
        out = []
        for j, ((f1, f2), cust, amount) in enumerate(plan[i]):
            legs = [Transfer(cust, f1, amount), Transfer(f2, suspense, amount), Transfer(suspense, cust, amount // 2)]
            try:
                out.append(ledger.post(book.key(f"w{i}:{j}"), legs))
            except LedgerError as err:
                out.append(err)
        return out

    results = [r for worker in race(WORKERS, work) for r in worker]
    assert set(r.code for r in results if isinstance(r, LedgerError)) <= {ErrorCode.insufficient_funds}
    assert any(not isinstance(r, LedgerError) for r in results)
    everyone = fees + customers + [suspense]
    assert sum(book.posted(a) for a in everyone) == 3 * 5_000 + 4 * 5_000
    assert failed_checks(ledger) == set()


def test_a_sharded_statement_pages_without_skipping_entries_while_writers_post(ledger, book):
    fee = book.account("fee", AccountKind.fee_income)
    payers = [book.account(f"payer{i}") for i in range(8)]
    for p in payers:
        book.fund(p, 1_000_000)
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        j = 0
        try:
            while not stop.is_set() and j < 150:
                ledger.transfer(book.key(f"w{i}:{j}"), payers[i], fee, 1 + j % 5)
                j += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(len(payers))]
    for t in threads:
        t.start()
    seen = []
    try:
        after = None
        for _ in range(60):  # page while the writers are busy, small pages, from the start
            page = ledger.statement(fee, after=after, limit=7)
            seen.extend(page.lines)
            after = seen[-1].entry_id if seen else None
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors
    while True:  # catch up once the writers have stopped
        page = ledger.statement(fee, after=after, limit=50)
        seen.extend(page.lines)
        after = seen[-1].entry_id if seen else None
        if page.next_after is None:
            break
    ids = [line.entry_id for line in seen]
    assert ids == sorted(set(ids))  # strictly increasing: no line twice
    with ledger.engine.connect() as c:  # none skipped: every entry of the account was seen
        assert ids == c.execute(text("SELECT id FROM journal_entry WHERE account_id = :a ORDER BY id"),
                                {"a": fee}).scalars().all()
    running = 0
    for line in seen:
        running += line.amount
        assert line.balance_after == running
    assert running == book.posted(fee)


def test_entries_of_sharded_accounts_store_no_running_balance(ledger, book):
    fee, alice = book.account("fee", AccountKind.fee_income), book.account("alice")
    book.fund(alice, 100)
    tx = ledger.transfer(book.key(), alice, fee, 30).transaction_id
    with ledger.engine.connect() as c:
        stored = dict(c.execute(text("SELECT account_id, balance_after FROM journal_entry WHERE transaction_id = :t"),
                                {"t": tx}).all())
    assert stored == {alice: 70, fee: None}
    assert [ln.balance_after for ln in ledger.statement(fee).lines] == [30]


def test_holds_on_a_sharded_account_live_on_shard_zero(ledger, book):
    suspense = book.account("suspense", AccountKind.suspense)
    fee = book.account("fee", AccountKind.fee_income)
    book.fund(fee, 500)
    hold = ledger.place_hold(book.key(), fee, 200, owner=OWNER, reference="r")
    assert_code(ErrorCode.insufficient_funds, ledger.place_hold, book.key(), fee, 301, owner=OWNER, reference="r2")
    b = ledger.balance(fee)
    assert (b.posted, b.held, b.available) == (500, 200, 300)
    assert [held for _, _, held in shard_rows(ledger, fee)] == [200] + [0] * (HOT_SHARDS - 1)
    ledger.capture_hold(book.key(), hold.id, [Transfer(fee, suspense, 50)], owner=OWNER, final=True)
    b = ledger.balance(fee)
    assert (b.posted, b.held, b.available) == (450, 0, 450)
    assert_code(ErrorCode.account_not_empty, ledger.close_account, fee)
    ledger.transfer(book.key(), fee, suspense, 450)
    assert ledger.close_account(fee).closed


def test_place_and_release_are_one_statement_each(ledger, book, monkeypatch):
    alice = book.account("alice")
    book.fund(alice, 1_000)
    statements: list[str] = []
    # Counted at the driver: the ledger runs its function statements on the psycopg connection
    # directly, and SQLAlchemy's own statements pass through the same method.
    execute = psycopg.Cursor.execute

    def counting(cursor, query, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        statements.append(str(query))
        return execute(cursor, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counting)
    hold = ledger.place_hold(book.key(), alice, 100, owner=OWNER, reference="r")
    placed = len(statements)
    ledger.release_hold(hold.id, owner=OWNER)
    released = len(statements) - placed
    ledger.transfer(book.key(), alice, book.world, 1)
    posted = len(statements) - placed - released
    monkeypatch.undo()
    assert (placed, released, posted) == (1, 1, 1), statements


def test_verify_catches_a_corrupted_shard_and_rebuild_repairs_it(ledger, book):
    fee, alice = book.account("fee", AccountKind.fee_income), book.account("alice")
    book.fund(alice, 1_000)
    for i in range(5):
        ledger.transfer(book.key(), alice, fee, 10 + i)
    assert failed_checks(ledger) == set()
    with ledger.engine.begin() as c:  # moving value between shards keeps the sum: still consistent
        c.execute(text("UPDATE account_balance SET posted = posted + 5 WHERE account_id = :a AND shard = 1"), {"a": fee})
        c.execute(text("UPDATE account_balance SET posted = posted - 5 WHERE account_id = :a AND shard = 2"), {"a": fee})
    assert failed_checks(ledger) == set()
    with ledger.engine.begin() as c:
        c.execute(text("UPDATE account_balance SET posted = posted + 1 WHERE account_id = :a AND shard = 3"), {"a": fee})
    assert failed_checks(ledger) == {"projection_matches_journal"}
    assert ledger.rebuild_projections() == 1
    assert failed_checks(ledger) == set()
    assert book.posted(fee) == sum(10 + i for i in range(5))
    with ledger.engine.begin() as c:  # a missing shard row is caught too, and recreated
        c.execute(text("DELETE FROM account_balance WHERE account_id = :a AND shard = 7"), {"a": fee})
    assert failed_checks(ledger) == {"projection_matches_journal"}
    assert ledger.rebuild_projections() == 1
    assert failed_checks(ledger) == set()
    assert len(shard_rows(ledger, fee)) == HOT_SHARDS
