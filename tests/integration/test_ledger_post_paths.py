"""ledger_post's one-transfer path (migration 0010, step 0) answers and writes exactly as 0008's
set-based function did, for the postings it takes and for those it hands to the general path.

Each random posting runs twice inside one database transaction: first through 0008's function
(installed for this test under another name), then, after rolling back to a savepoint, through
the current one. Both must give the same status, failed transfer index and (for a replay) journal
transaction, and leave the same balances, entries and journal transaction behind. The cases are
drawn to sit on the edges the checks look at: amounts around the available balance, the limits of
asset locations, closed, missing, sharded and other-asset accounts, the same account on both
sides, replays with the same and other content, and amounts near the NUMERIC(78,0) range.
"""
from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest

from ledger.model import AccountKind, Transfer, content_hash
from tests.integration.ledger_helpers import Book

_MIGRATION = Path(__file__).resolve().parents[2] / "migrations" / "versions" / "0008_lean_posting.py"
_POST = ("SELECT status, transaction_id, failed_index FROM {fn}("
         "%s, %s, %s, %s::jsonb, %s::bigint[], %s::bigint[], %s::numeric[], %s::bigint[], NULL, NULL)")


def _reference_function() -> str:
    spec = importlib.util.spec_from_file_location("lean_posting_0008", _MIGRATION)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sql = module.POST_FUNCTION
    assert sql.count("FUNCTION ledger_post(") == 1
    return sql.replace("FUNCTION ledger_post(", "FUNCTION test_ledger_post_0008(")


def _state(cur, accounts: list[int], key: str) -> tuple:
    cur.execute("SELECT account_id, shard, posted, held FROM account_balance WHERE account_id = ANY (%s) "
                "ORDER BY account_id, shard", (accounts,))
    balances = cur.fetchall()
    cur.execute("SELECT t.content_hash, t.kind, t.metadata, "
                "       array_agg(json_build_array(e.account_id, e.asset, e.amount::text, e.balance_after::text, e.hold_id)"
                "                 ORDER BY e.id) "
                "  FROM journal_transaction t JOIN journal_entry e ON e.transaction_id = t.id "
                " WHERE t.idempotency_key = %s GROUP BY t.id", (key,))
    return balances, cur.fetchall()


@pytest.fixture()
def raw(engine):
    """A driver connection in one database transaction, with 0008's function created in it; the
    test commits at its end, and a failed test's work (the function included) is rolled back."""
    proxied = engine.raw_connection()
    conn = proxied.driver_connection
    try:
        with conn.cursor() as cur:
            cur.execute(_reference_function())
        yield conn
        conn.rollback()  # a test that failed before committing leaves nothing behind
        with conn.cursor() as cur:
            cur.execute("DROP FUNCTION IF EXISTS test_ledger_post_0008(text, text, text, jsonb, bigint[], bigint[], "
                        "numeric[], bigint[], text, bigint)")
        conn.commit()
    finally:
        proxied.close()


def test_the_one_transfer_path_answers_and_writes_as_0008(ledger, raw):
    book = Book(ledger, "USDT", 6)
    other = Book(ledger, "BTC", 8)
    customers = [book.account(f"c{i}") for i in range(4)]
    for i, acc in enumerate(customers[:3]):
        book.fund(acc, 1_000 * (i + 1))
    ledger.place_hold(book.key(), customers[1], 300, owner="test", reference="held")  # available = posted - held
    location = book.account("vault", AccountKind.asset_location, balance_shards=1)
    book.fund(customers[3], 500, source=location)  # coins arrived: the location stands at -500
    sharded = book.account("fees", AccountKind.fee_income, balance_shards=4)
    book.fund(sharded, 100)
    closed = book.account("closed")
    ledger.close_account(closed)
    foreign = other.account("btc")
    other.fund(foreign, 10**8)
    huge = book.account("huge", AccountKind.suspense, balance_shards=1)  # either sign: reaches the range's edge
    book.fund(huge, 10**77)
    pool = customers + [location, sharded, closed, foreign, huge, book.world, 10**12]
    accounts = [a for a in pool if a != 10**12]
    plain = customers + [location, huge]  # one shard, open, one asset: what the one-transfer path takes

    rng = random.Random(20261130)
    keys: list[tuple[str, list, list, list]] = []
    paths = {"fast": 0, "general": 0}
    fast_answers: set[str] = set()
    with raw.cursor() as cur:
        c_max = 10**78 - 1
        edge = book.key("edge")
        scripted = [  # the boundaries first, each on the one-transfer path
            (edge, [customers[0]], [customers[1]], [1_000]),  # exactly the available balance
            (book.key(), [customers[0]], [customers[1]], [1]),  # one more than that
            (edge, [customers[0]], [customers[1]], [1_000]),  # a replay
            (edge, [customers[0]], [customers[1]], [999]),  # the key with other content
            (book.key(), [customers[2]], [location], [500]),  # the location back to exactly zero
            (book.key(), [customers[2]], [location], [1]),  # and above it
            (book.key(), [huge], [customers[3]], [c_max]),  # a credit past the NUMERIC(78,0) range
            (book.key(), [huge], [customers[2]], [c_max - 10**77 - 1]),  # near the range, inside it
            (book.key(), [huge], [customers[1]], [3 * 10**77]),  # a debit past it (suspense has no limit)
        ]
        for n in range(len(scripted) + 800):
            roll = rng.random()
            if n < len(scripted):
                key, debits, credits, amounts = scripted[n]
            elif keys and roll < 0.12:  # a replay, with the same or other content
                key, debits, credits, amounts = rng.choice(keys)
                if rng.random() < 0.5:
                    amounts = [amounts[0] + 1] + amounts[1:]
            else:
                key = book.key()
                legs = 1 if rng.random() < 0.85 else 2
                side = lambda: rng.choice(plain if rng.random() < 0.75 else pool)  # noqa: E731
                debits = [side() for _ in range(legs)]
                credits = [side() for _ in range(legs)]
                amounts = [rng.choice([1, 7, 499, 500, 501, 999, 1_000, 1_001, 2_999, 3_000, 3_001,
                                       rng.randint(1, 4_000), 10**77, 3 * 10**77]) for _ in range(legs)]
                if rng.random() < 0.3:  # exactly what the debited account has available, or one more
                    cur.execute("SELECT sum(posted) - sum(held) FROM account_balance WHERE account_id = %s",
                                (debits[0],))
                    available = cur.fetchone()[0]
                    if available is not None and available > 0:
                        amounts[0] = int(available) + rng.choice([0, 0, 1])
            fast = len(debits) == 1 and debits[0] != credits[0] and {debits[0], credits[0]} <= set(plain)
            paths["fast" if fast else "general"] += 1
            transfers = [Transfer(d, c, a) for d, c, a in zip(debits, credits, amounts)]
            kind = rng.choice(["transfer", "deposit"])
            metadata = rng.choice([{}, {"note": f"n{n}"}])
            digest = content_hash(kind, transfers, {"metadata": metadata, "reverses": None})
            args = (key, digest, kind, json.dumps(metadata), debits, credits, amounts, [None] * len(debits))
            cur.execute("SAVEPOINT probe")
            cur.execute(_POST.format(fn="test_ledger_post_0008"), args)
            expected = cur.fetchone()
            expected_state = _state(cur, accounts, key)
            cur.execute("ROLLBACK TO SAVEPOINT probe")
            cur.execute(_POST.format(fn="ledger_post"), args)
            got = cur.fetchone()
            got_state = _state(cur, accounts, key)
            cur.execute("RELEASE SAVEPOINT probe")
            context = f"posting {n}: key {key}, {debits} -> {credits}, {amounts}"
            assert got[0] == expected[0], context
            assert got[2] == expected[2], context
            if got[0] != "created":  # a replay names the original; a refusal names nothing
                assert got[1] == expected[1], context
            assert json.dumps(got_state, default=str) == json.dumps(expected_state, default=str), context
            if got[0] == "created":
                keys.append((key, debits, credits, amounts))
            if fast:
                fast_answers.add(got[0])
    raw.commit()  # what the current function wrote stays: the ledger fixture verifies it
    # The draw must have exercised both paths and every answer the one-transfer path can give.
    assert paths["fast"] > 200 and paths["general"] > 50, paths
    assert fast_answers >= {"created", "exists", "idempotency_conflict", "insufficient_funds", "limit_exceeded"}, fast_answers
