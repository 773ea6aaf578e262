"""Postings: transfers, linked batches, idempotent replays, reversals, statements, totals,
projection rebuilds and closing accounts. Every test ends with the ledger verified (fixture)."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from ledger.errors import ErrorCode
from ledger.model import AccountKind, Transfer
from tests.integration.ledger_helpers import Book, assert_code, failed_checks, journal_size


@pytest.fixture()
def book(ledger) -> Book:
    return Book(ledger)


# ---- transfers --------------------------------------------------------------------------------


def test_transfer_moves_the_amount_between_two_accounts(ledger, book):
    pool = book.account("pool", AccountKind.asset_location)
    alice = book.account("alice")
    r = ledger.transfer(book.key(), pool, alice, 150_000)
    assert r.created
    a, p = ledger.balance(alice), ledger.balance(pool)
    assert (a.posted, a.held, a.available) == (150_000, 0, 150_000)
    assert (p.posted, p.held) == (-150_000, 0)
    assert a.checkpoint == p.checkpoint == r.transaction_id
    assert ledger.transaction_transfers(r.transaction_id) == [Transfer(pool, alice, 150_000)]


def test_a_customer_cannot_be_overdrawn_and_a_refusal_moves_nothing(ledger, book):
    alice, bob = book.account("alice"), book.account("bob")
    book.fund(alice, 100)
    before = journal_size(ledger)
    err = assert_code(ErrorCode.insufficient_funds, ledger.transfer, book.key(), alice, bob, 101)
    assert err.detail["index"] == 0
    assert journal_size(ledger) == before
    assert (book.posted(alice), book.posted(bob)) == (100, 0)
    ledger.transfer(book.key(), alice, bob, 100)  # exactly the balance is fine
    assert (book.posted(alice), book.posted(bob)) == (0, 100)


def test_an_asset_location_account_may_not_go_positive(ledger, book):
    hot = book.account("hot", AccountKind.asset_location)
    alice = book.account("alice")
    ledger.transfer(book.key(), hot, alice, 10)
    book.fund(alice, 100)
    err = assert_code(ErrorCode.limit_exceeded, ledger.transfer, book.key(), alice, hot, 11)
    assert err.detail["index"] == 0
    assert (book.posted(hot), book.posted(alice)) == (-10, 110)
    ledger.transfer(book.key(), alice, hot, 10)  # back to exactly zero is fine
    assert book.posted(hot) == 0


# ---- linked batches ---------------------------------------------------------------------------


def _conversion_book(ledger):
    """BTC -> ETH conversion: one leg per asset through the firm's liquidity accounts."""
    btc = Book(ledger, "BTC", 8)
    ledger.create_asset("ETH", 18)
    accounts = {
        "alice_btc": btc.account("alice:btc"),
        "alice_eth": btc.account("alice:eth", asset="ETH"),
        "liq_btc": btc.account("liq:btc", AccountKind.liquidity),
        "liq_eth": btc.account("liq:eth", AccountKind.liquidity, asset="ETH"),
        "world_eth": btc.account("world:eth", AccountKind.equity, asset="ETH"),
    }
    btc.fund(accounts["alice_btc"], 10_000_000)
    ledger.transfer(btc.key(), accounts["world_eth"], accounts["liq_eth"], 5 * 10**18)
    return btc, accounts


def test_a_linked_multi_asset_batch_commits_as_one_transaction(ledger):
    book, a = _conversion_book(ledger)
    legs = [
        Transfer(a["alice_btc"], a["liq_btc"], 10_000_000),  # 0.1 BTC in
        Transfer(a["liq_eth"], a["alice_eth"], 2 * 10**18),  # 2 ETH out
    ]
    r = ledger.post(book.key("convert"), legs, kind="conversion", metadata={"rate": "20"})
    assert r.created
    assert book.posted(a["alice_btc"]) == 0
    assert book.posted(a["liq_btc"]) == 10_000_000
    assert book.posted(a["alice_eth"]) == 2 * 10**18
    assert book.posted(a["liq_eth"]) == 3 * 10**18
    assert ledger.transaction_transfers(r.transaction_id) == legs
    assert ledger.totals()["BTC"] == 0 and ledger.totals()["ETH"] == 0


@pytest.mark.parametrize(
    ("failing_leg", "code"),
    [
        ("overdraw", ErrorCode.insufficient_funds),
        ("unknown_account", ErrorCode.account_not_found),
        ("cross_asset", ErrorCode.asset_mismatch),
        ("closed", ErrorCode.account_closed),
    ],
)
def test_a_failing_leg_leaves_nothing_behind(ledger, failing_leg, code):
    book, a = _conversion_book(ledger)
    closed = book.account("closed", asset="ETH")
    ledger.close_account(closed)
    bob_eth = book.account("bob:eth", asset="ETH")
    book.ledger.transfer(book.key(), a["world_eth"], bob_eth, 10)
    last = {
        "overdraw": Transfer(bob_eth, a["alice_eth"], 11),
        "unknown_account": Transfer(a["liq_eth"], 10**15, 1),
        "cross_asset": Transfer(a["liq_eth"], a["alice_btc"], 1),
        "closed": Transfer(a["liq_eth"], closed, 1),
    }[failing_leg]
    legs = [
        Transfer(a["alice_btc"], a["liq_btc"], 10_000_000),
        Transfer(a["liq_eth"], a["alice_eth"], 10**18),
        last,
    ]
    balances = {name: book.posted(acc) for name, acc in a.items()}
    before = journal_size(ledger)
    key = book.key("convert")
    err = assert_code(code, ledger.post, key, legs)
    assert err.detail["index"] == 2
    assert journal_size(ledger) == before
    assert {name: book.posted(acc) for name, acc in a.items()} == balances
    # The refused key was not consumed: the corrected batch posts under it.
    assert ledger.post(key, legs[:2]).created


def test_a_batch_is_checked_on_its_net_effect_per_account(ledger, book):
    """A leg that would overdraw alone is fine when an earlier leg of the batch funds it."""
    alice, bob, carol = book.account("alice"), book.account("bob"), book.account("carol")
    book.fund(alice, 50)
    ledger.post(book.key(), [Transfer(alice, bob, 50), Transfer(bob, carol, 50)])
    assert [book.posted(x) for x in (alice, bob, carol)] == [0, 0, 50]
    # ...but the net must still be covered
    assert_code(ErrorCode.insufficient_funds, ledger.post, book.key(), [Transfer(carol, bob, 30), Transfer(carol, alice, 30)])
    assert book.posted(carol) == 50


# ---- idempotency --------------------------------------------------------------------------------


def test_a_replay_returns_the_original_transaction_and_moves_nothing(ledger, book):
    alice, bob = book.account("alice"), book.account("bob")
    book.fund(alice, 1_000)
    key = book.key("deposit:btc:txid:0")
    first = ledger.post(key, [Transfer(alice, bob, 300)], metadata={"why": "test"})
    before = journal_size(ledger)
    for _ in range(3):
        again = ledger.post(key, [Transfer(alice, bob, 300)], metadata={"why": "test"})
        assert again.transaction_id == first.transaction_id
        assert again.created is False
    assert journal_size(ledger) == before
    assert (book.posted(alice), book.posted(bob)) == (700, 300)
    assert len(ledger.statement(bob).lines) == 1


def test_a_replay_answers_even_after_the_account_is_closed(ledger, book):
    alice, bob = book.account("alice"), book.account("bob")
    key = book.key()
    first = book.ledger.post(key, [Transfer(book.world, alice, 5)])
    ledger.transfer(book.key(), alice, bob, 5)
    ledger.close_account(alice)
    again = ledger.post(key, [Transfer(book.world, alice, 5)])
    assert (again.transaction_id, again.created) == (first.transaction_id, False)


@pytest.mark.parametrize(
    "change",
    [
        {"amount": 301},
        {"swap": True},
        {"metadata": {"why": "other"}},
        {"kind": "fee"},
        {"extra_leg": True},
    ],
)
def test_the_same_key_with_other_content_is_an_idempotency_conflict(ledger, book, change):
    alice, bob = book.account("alice"), book.account("bob")
    book.fund(alice, 1_000)
    book.fund(bob, 1_000)
    key = book.key()
    first = ledger.post(key, [Transfer(alice, bob, 300)], metadata={"why": "test"})
    legs = [Transfer(bob, alice, 300) if change.get("swap") else Transfer(alice, bob, change.get("amount", 300))]
    if change.get("extra_leg"):
        legs.append(Transfer(bob, alice, 1))
    err = assert_code(
        ErrorCode.idempotency_conflict,
        ledger.post,
        key,
        legs,
        kind=change.get("kind", "transfer"),
        metadata=change.get("metadata", {"why": "test"}),
    )
    assert err.detail["transaction_id"] == first.transaction_id
    assert (book.posted(alice), book.posted(bob)) == (700, 1_300)


# ---- reversals ----------------------------------------------------------------------------------


def test_a_reversal_compensates_once(ledger, book):
    alice, bob, fee = book.account("alice"), book.account("bob"), book.account("fee", AccountKind.fee_income)
    book.fund(alice, 1_000)
    original = ledger.post(book.key(), [Transfer(alice, bob, 400), Transfer(alice, fee, 5)])
    before = journal_size(ledger)

    key = book.key("reverse")
    rev = ledger.reverse(original.transaction_id, key)
    assert rev.created and rev.transaction_id != original.transaction_id
    assert [book.posted(x) for x in (alice, bob, fee)] == [1_000, 0, 0]
    # compensating rows were added; nothing was edited
    assert journal_size(ledger) == (before[0] + 1, before[1] + 4)
    assert ledger.transaction_transfers(rev.transaction_id) == [Transfer(fee, alice, 5), Transfer(bob, alice, 400)]
    assert ledger.statement(bob).lines[-1].kind == "reversal"

    again = ledger.reverse(original.transaction_id, key)  # a retry of the same reversal
    assert (again.transaction_id, again.created) == (rev.transaction_id, False)
    assert_code(ErrorCode.already_reversed, ledger.reverse, original.transaction_id, book.key("reverse-2"))
    assert [book.posted(x) for x in (alice, bob, fee)] == [1_000, 0, 0]


def test_a_reversal_obeys_the_balance_limits(ledger, book):
    alice, bob, carol = book.account("alice"), book.account("bob"), book.account("carol")
    book.fund(alice, 100)
    paid = ledger.transfer(book.key(), alice, bob, 100)
    ledger.transfer(book.key(), bob, carol, 60)  # bob spent it meanwhile
    assert_code(ErrorCode.insufficient_funds, ledger.reverse, paid.transaction_id, book.key())
    assert [book.posted(x) for x in (alice, bob, carol)] == [0, 40, 60]


def test_reversing_an_unknown_transaction(ledger, book):
    assert_code(ErrorCode.transaction_not_found, ledger.reverse, 10**15, book.key())


# ---- reads ------------------------------------------------------------------------------------


def test_statement_has_running_balances_and_pages(ledger, book):
    alice, bob = book.account("alice"), book.account("bob")
    moves = [500, -120, 300, -80, -600, 1, 7, -8, 250]
    ids = []
    for amount in moves:
        if amount > 0:
            ids.append(book.fund(alice, amount).transaction_id)
        else:
            ids.append(ledger.transfer(book.key(), alice, bob, -amount).transaction_id)

    lines, after, pages = [], None, 0
    while True:
        page = ledger.statement(alice, after=after, limit=4)
        pages += 1
        lines += page.lines
        if page.next_after is None:
            break
        assert len(page.lines) == 4 and page.next_after == page.lines[-1].entry_id
        after = page.next_after
    assert pages == 3
    assert [ln.amount for ln in lines] == moves
    assert [ln.transaction_id for ln in lines] == ids
    running = 0
    for ln in lines:
        running += ln.amount
        assert ln.balance_after == running
    assert running == book.posted(alice) == sum(moves)
    assert [ln.entry_id for ln in lines] == sorted(ln.entry_id for ln in lines)
    assert ledger.statement(alice, limit=1000).lines == lines
    assert ledger.statement(alice, after=lines[-1].entry_id).lines == []
    assert all(ln.idempotency_key.startswith(book.prefix) for ln in lines)
    assert_code(ErrorCode.invalid_request, ledger.statement, alice, limit=0)
    assert_code(ErrorCode.invalid_request, ledger.statement, alice, limit=1001)
    assert_code(ErrorCode.account_not_found, ledger.statement, 10**15)


def test_totals_are_zero_per_asset(ledger):
    book, a = _conversion_book(ledger)
    ledger.post(book.key(), [Transfer(a["alice_btc"], a["liq_btc"], 3), Transfer(a["liq_eth"], a["alice_eth"], 7)])
    totals = ledger.totals()
    assert {"BTC", "ETH"} <= totals.keys()
    assert all(total == 0 for total in totals.values())
    # and not because nothing moved
    assert book.posted(a["liq_eth"]) == 5 * 10**18 - 7


# ---- projection ---------------------------------------------------------------------------------


def test_rebuild_projections_repairs_a_corrupted_projection(ledger, book, engine):
    alice, bob = book.account("alice"), book.account("bob")
    book.fund(alice, 1_000)
    last = ledger.transfer(book.key(), alice, bob, 250)
    hold = ledger.place_hold(book.key(), alice, 100, owner="withdrawals", reference="w1")
    assert failed_checks(ledger) == set()

    with engine.begin() as c:
        c.execute(text("UPDATE account_balance SET posted = posted + 1 WHERE account_id = :a"), {"a": alice})
        c.execute(text("UPDATE account_balance SET held = 0, last_transaction_id = 0 WHERE account_id = :a"), {"a": alice})
        c.execute(text("UPDATE account_balance SET posted = 999999 WHERE account_id = :a"), {"a": bob})
    assert "projection_matches_journal" in failed_checks(ledger)
    bad = {p[0] for c in ledger.verify() if c.name == "projection_matches_journal" for p in c.problems}
    assert bad == {alice, bob}

    assert ledger.rebuild_projections() == 2
    assert failed_checks(ledger) == set()
    a = ledger.balance(alice)
    assert (a.posted, a.held, a.available, a.checkpoint) == (750, 100, 650, last.transaction_id)
    assert book.posted(bob) == 250
    assert ledger.rebuild_projections() == 0  # nothing left to repair
    ledger.release_hold(hold.id, owner="withdrawals")
    assert ledger.balance(alice).held == 0


# ---- closing accounts -----------------------------------------------------------------------------


def test_close_account_rules(ledger, book):
    alice, bob = book.account("alice"), book.account("bob")
    book.fund(alice, 100)
    assert_code(ErrorCode.account_not_empty, ledger.close_account, alice)

    hold = ledger.place_hold(book.key(), alice, 100, owner="withdrawals", reference="w1")
    ledger.capture_hold(book.key(), hold.id, [Transfer(alice, bob, 100)], owner="withdrawals")
    assert book.posted(alice) == 0
    closed = ledger.close_account(alice)
    assert closed.closed
    assert ledger.close_account(alice).closed  # closing twice is a no-op

    assert_code(ErrorCode.account_closed, ledger.transfer, book.key(), bob, alice, 1)
    assert_code(ErrorCode.account_closed, ledger.transfer, book.key(), alice, bob, 1)
    assert_code(ErrorCode.account_closed, ledger.place_hold, book.key(), alice, 1, owner="o", reference="r")
    assert book.posted(bob) == 100
    assert ledger.get_account(alice).closed and not ledger.get_account(bob).closed
    assert_code(ErrorCode.account_not_found, ledger.close_account, 10**15)


def test_an_account_with_open_holds_cannot_be_closed(ledger, book):
    # A zero balance with a pending hold is possible on an account that may go negative.
    suspense = book.account("suspense", AccountKind.suspense)
    hold = ledger.place_hold(book.key(), suspense, 10, owner="recon", reference="r1")
    assert_code(ErrorCode.account_has_open_holds, ledger.close_account, suspense)
    assert not ledger.get_account(suspense).closed
    ledger.release_hold(hold.id, owner="recon")
    assert ledger.close_account(suspense).closed


# ---- range ------------------------------------------------------------------------------------


def test_balances_beyond_numeric_78_are_refused_with_a_code(ledger, book):
    """Amounts up to 10^78-1 are valid, so two of them must not crash the database write."""
    from ledger.model import MAX_AMOUNT

    x, y = book.account("x", AccountKind.equity), book.account("y", AccountKind.equity)
    ledger.transfer(book.key(), book.world, x, MAX_AMOUNT)
    before = journal_size(ledger)
    err = assert_code(ErrorCode.limit_exceeded, ledger.transfer, book.key(), book.world, x, 1)
    assert err.detail["index"] == 0
    # net effect in range, but a running balance_after in between would not be
    legs = [Transfer(y, book.world, 1), Transfer(book.world, x, MAX_AMOUNT), Transfer(x, book.world, MAX_AMOUNT)]
    assert assert_code(ErrorCode.limit_exceeded, ledger.post, book.key(), legs).detail["index"] == 1
    ledger.place_hold(book.key(), y, MAX_AMOUNT, owner="recon", reference="r")
    assert_code(ErrorCode.limit_exceeded, ledger.place_hold, book.key(), y, 1, owner="recon", reference="r2")
    assert journal_size(ledger) == before
    assert book.posted(x) == MAX_AMOUNT
    ledger.transfer(book.key(), x, book.world, MAX_AMOUNT)  # the other direction is fine
    assert book.posted(x) == 0
