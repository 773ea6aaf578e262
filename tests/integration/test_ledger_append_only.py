"""The journal cannot be edited, even by SQL issued directly against the database.

Triggers refuse UPDATE, DELETE and TRUNCATE on journal_transaction and journal_entry; a deferred
constraint refuses, at COMMIT, a transaction whose entries do not balance; and a committed journal
transaction cannot gain entries later.
"""
from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ledger.model import Transfer
from tests.integration.ledger_helpers import Book, failed_checks, journal_size


@pytest.fixture()
def posted(ledger):
    """A committed two-entry transaction: (book, transaction id, alice, bob)."""
    book = Book(ledger)
    alice, bob = book.account("alice"), book.account("bob")
    book.fund(alice, 1_000)
    r = ledger.transfer(book.key(), alice, bob, 400)
    return book, r.transaction_id, alice, bob


def _refused(engine, sql: str, params: dict | None = None) -> str:
    """Run `sql` in its own transaction; assert the database refuses it; return the error text."""
    with pytest.raises(DBAPIError) as exc:
        with engine.begin() as c:
            c.execute(text(sql), params or {})
    return str(exc.value.orig)


def _journal_rows(engine, tx_id: int):
    with engine.connect() as c:
        head = c.execute(text("SELECT * FROM journal_transaction WHERE id = :t"), {"t": tx_id}).one()
        entries = c.execute(text("SELECT * FROM journal_entry WHERE transaction_id = :t ORDER BY id"), {"t": tx_id}).all()
    return tuple(head), [tuple(e) for e in entries]


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE journal_entry SET amount = amount * 2 WHERE transaction_id = :t",
        "UPDATE journal_entry SET account_id = account_id WHERE transaction_id = :t",  # even a no-op
        "DELETE FROM journal_entry WHERE transaction_id = :t",
        "UPDATE journal_transaction SET kind = 'edited' WHERE id = :t",
        "UPDATE journal_transaction SET idempotency_key = idempotency_key || '-x' WHERE id = :t",
        "DELETE FROM journal_transaction WHERE id = :t",
    ],
)
def test_update_and_delete_on_the_journal_are_refused(ledger, engine, posted, sql):
    book, tx_id, alice, bob = posted
    before = _journal_rows(engine, tx_id)
    message = _refused(engine, sql, {"t": tx_id})
    assert "append-only" in message
    assert _journal_rows(engine, tx_id) == before
    assert (book.posted(alice), book.posted(bob)) == (600, 400)


@pytest.mark.parametrize("table", ["journal_entry", "journal_transaction"])
def test_truncate_on_the_journal_is_refused(ledger, engine, posted, table):
    size = journal_size(ledger)
    message = _refused(engine, f"TRUNCATE {table} CASCADE")
    assert "append-only" in message
    assert journal_size(ledger) == size


def test_an_unbalanced_transaction_inserted_in_sql_fails_at_commit(ledger, engine, posted):
    book, _, alice, bob = posted
    size = journal_size(ledger)
    key = f"{book.prefix}:raw-unbalanced"
    with pytest.raises(DBAPIError) as exc:
        with engine.begin() as c:
            tx_id = c.execute(
                text("INSERT INTO journal_transaction (idempotency_key, content_hash, kind) "
                     "VALUES (:k, 'x', 'raw') RETURNING id"),
                {"k": key},
            ).scalar_one()
            c.execute(
                text("INSERT INTO journal_entry (transaction_id, account_id, asset, amount, balance_after) "
                     "VALUES (:t, :a, 'BTC', -10, 590), (:t, :b, 'BTC', 9, 409)"),
                {"t": tx_id, "a": alice, "b": bob},
            )
            # Inside the transaction the rows are there: the constraint is deferred to COMMIT...
            assert c.execute(text("SELECT count(*) FROM journal_entry WHERE transaction_id = :t"), {"t": tx_id}).scalar() == 2
        # ...where it refuses (the `with` block commits on exit).
    assert "does not balance" in str(exc.value.orig)
    assert journal_size(ledger) == size
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM journal_transaction WHERE idempotency_key = :k"), {"k": key}).scalar() == 0


def test_a_transaction_without_entries_fails_at_commit(ledger, engine, posted):
    book, *_ = posted
    with pytest.raises(DBAPIError) as exc:
        with engine.begin() as c:
            c.execute(
                text("INSERT INTO journal_transaction (idempotency_key, content_hash, kind) VALUES (:k, 'x', 'raw')"),
                {"k": f"{book.prefix}:raw-empty"},
            )
    assert "has no entries" in str(exc.value.orig)


def test_a_balanced_transaction_inserted_in_sql_does_commit(ledger, engine, posted):
    """The control for the two tests above: the guard refuses imbalance, not raw inserts as such."""
    book, _, alice, bob = posted
    size = journal_size(ledger)
    with engine.begin() as c:
        tx_id = c.execute(
            text("INSERT INTO journal_transaction (idempotency_key, content_hash, kind) "
                 "VALUES (:k, 'x', 'raw') RETURNING id"),
            {"k": f"{book.prefix}:raw-balanced"},
        ).scalar_one()
        c.execute(
            text("INSERT INTO journal_entry (transaction_id, account_id, asset, amount, balance_after) "
                 "VALUES (:t, :a, 'BTC', -10, 590), (:t, :b, 'BTC', 10, 410)"),
            {"t": tx_id, "a": alice, "b": bob},
        )
    assert journal_size(ledger) == (size[0] + 1, size[1] + 2)
    # The projection was bypassed, which verify() notices and a rebuild repairs from the journal.
    assert "projection_matches_journal" in failed_checks(ledger)
    assert ledger.rebuild_projections() == 2
    assert (book.posted(alice), book.posted(bob)) == (590, 410)


def test_a_committed_transaction_cannot_gain_entries(ledger, engine, posted):
    book, tx_id, alice, bob = posted
    before = _journal_rows(engine, tx_id)
    # Balanced on its own, so only the same-transaction guard can refuse it.
    message = _refused(
        engine,
        "INSERT INTO journal_entry (transaction_id, account_id, asset, amount, balance_after) "
        "VALUES (:t, :a, 'BTC', -1, 599), (:t, :b, 'BTC', 1, 401)",
        {"t": tx_id, "a": alice, "b": bob},
    )
    assert "database transaction that created it" in message
    assert _journal_rows(engine, tx_id) == before


def test_the_ledger_corrects_by_compensation_not_edits(ledger, engine, posted):
    book, tx_id, alice, bob = posted
    before = _journal_rows(engine, tx_id)
    rev = ledger.reverse(tx_id, book.key(f"reverse:{uuid.uuid4().hex[:6]}"))
    assert _journal_rows(engine, tx_id) == before  # the original is untouched
    assert ledger.transaction_transfers(rev.transaction_id) == [Transfer(bob, alice, 400)]
    assert (book.posted(alice), book.posted(bob)) == (1_000, 0)


@pytest.mark.parametrize("case", ["no_such_account", "other_asset", "no_such_hold"])
def test_entries_inserted_in_sql_must_name_real_rows(ledger, engine, posted, case):
    """The statement trigger on journal_entry: an entry names an existing account, carries its
    asset, and a capture names an existing hold (checked once per INSERT statement)."""
    book, _, alice, bob = posted
    size = journal_size(ledger)
    account, asset, hold = {
        "no_such_account": (10**12, "BTC", None),
        "other_asset": (alice, "USDT", None),
        "no_such_hold": (alice, "BTC", 10**12),
    }[case]
    with pytest.raises(DBAPIError) as exc:
        with engine.begin() as c:
            tx_id = c.execute(
                text("INSERT INTO journal_transaction (idempotency_key, content_hash, kind) "
                     "VALUES (:k, 'x', 'raw') RETURNING id"),
                {"k": f"{book.prefix}:raw-{case}"},
            ).scalar_one()
            c.execute(
                text("INSERT INTO journal_entry (transaction_id, account_id, asset, amount, hold_id) "
                     "VALUES (:t, :a, :asset, -10, :h), (:t, :b, 'BTC', 10, NULL)"),
                {"t": tx_id, "a": account, "asset": asset, "b": bob, "h": hold},
            )
    assert exc.value.orig.sqlstate == "23503"  # foreign_key_violation
    assert journal_size(ledger) == size


def test_a_balance_row_needs_an_existing_account_and_verify_reports_an_orphan(ledger, engine, posted):
    book, _, alice, _ = posted
    assert "23503" in _refused_state(engine, "INSERT INTO account_balance (account_id, shard) VALUES (:a, 0)", {"a": 10**12})
    assert "23503" in _refused_state(engine, "UPDATE account_balance SET account_id = :a WHERE account_id = :b",
                                     {"a": 10**12, "b": alice})
    # Past the write-time guard (its trigger disabled for the test), verify() still reports it.
    assert "projection_matches_journal" not in failed_checks(ledger)
    with engine.begin() as c:
        c.execute(text("ALTER TABLE account_balance DISABLE TRIGGER account_balance_account_exists"))
        c.execute(text("INSERT INTO account_balance (account_id, shard) VALUES (:a, 0)"), {"a": 10**12})
        c.execute(text("ALTER TABLE account_balance ENABLE TRIGGER account_balance_account_exists"))
    try:
        assert "projection_matches_journal" in failed_checks(ledger)
    finally:
        with engine.begin() as c:
            c.execute(text("DELETE FROM account_balance WHERE account_id = :a"), {"a": 10**12})
    assert "projection_matches_journal" not in failed_checks(ledger)


def _refused_state(engine, sql: str, params: dict) -> str:
    with pytest.raises(DBAPIError) as exc:
        with engine.begin() as c:
            c.execute(text(sql), params)
    return exc.value.orig.sqlstate


def test_a_direct_insert_after_a_posting_in_the_same_transaction_is_still_checked(ledger, engine, posted):
    """ledger_post marks only its own INSERT as checked (a transaction-local setting it clears
    right after); a later INSERT in the same database transaction meets the trigger."""
    book, _, alice, bob = posted
    size = journal_size(ledger)
    with pytest.raises(DBAPIError) as exc:
        with engine.begin() as c:
            tx_id = ledger.transfer(book.key(), alice, bob, 1, conn=c).transaction_id
            assert c.execute(text("SELECT current_setting('ledger.entries_written_by', true)")).scalar() == ""
            c.execute(
                text("INSERT INTO journal_entry (transaction_id, account_id, asset, amount) "
                     "VALUES (:t, :a, 'BTC', -1), (:t, :b, 'USDT', 1)"),
                {"t": tx_id, "a": alice, "b": bob},
            )
    assert exc.value.orig.sqlstate == "23503"
    assert journal_size(ledger) == size


@pytest.mark.parametrize("how", ["SET", "SET LOCAL"])
def test_naming_a_committed_transaction_in_the_setting_adds_nothing_to_it(ledger, engine, posted, how):
    """ledger_post names its journal transaction to the reference trigger; doing the same by hand
    for a committed journal transaction does not let an entry join it."""
    book, tx_id, alice, bob = posted
    before = _journal_rows(engine, tx_id)
    with pytest.raises(DBAPIError) as exc:
        with engine.begin() as c:
            c.execute(text(f"{how} ledger.entries_written_by = '{tx_id}'"))
            c.execute(
                text("INSERT INTO journal_entry (transaction_id, account_id, asset, amount, hold_id) "
                     "VALUES (:t, :a, 'BTC', 1000, 999999999999)"),
                {"t": tx_id, "a": alice},
            )
    assert exc.value.orig.sqlstate == "23503"
    assert _journal_rows(engine, tx_id) == before
    with engine.connect() as c:  # a session-level SET must not outlive the failed transaction's use
        c.execute(text("RESET ledger.entries_written_by"))


def test_a_hold_cannot_be_renumbered(ledger, engine, posted):
    book, _, alice, _ = posted
    hold = ledger.place_hold(book.key(), alice, 5, owner="t", reference="r")
    message = _refused(engine, "UPDATE hold SET id = id + 1000000000 WHERE id = :h", {"h": hold.id})
    assert "refused" in message
    ledger.release_hold(hold.id, owner="t")
