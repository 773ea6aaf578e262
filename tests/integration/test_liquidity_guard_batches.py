"""The liquidity guard (migration 0033's rule, one call per statement since 0048, trusting no api row
since 0051) judges every leg of a batch: custody_api may never debit a liquidity account;
custody_worker may only under the key `treasury-adjustment:<id>` of an `approved` adjustment, with
the posting's legs exactly the adjustment's transfers (accounts, amounts, order, number). A batch
with one leg the role may not write is refused whole (42501); one with no liquidity debit is posted.

Each case runs in a transaction as the role (SET LOCAL ROLE) and is rolled back.
"""
from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ledger.model import AccountKind, Transfer

API, WORKER = "custody_api", "custody_worker"


@pytest.fixture()
def accounts(ledger):
    run = uuid.uuid4().hex[:8]
    ledger.create_asset("BTC", 8)
    world = ledger.open_account("BTC", AccountKind.equity, f"guard:{run}:world").id
    liquidity = ledger.open_account("BTC", AccountKind.liquidity, f"guard:{run}:liquidity").id
    alice = ledger.open_account("BTC", AccountKind.customer, f"guard:{run}:alice").id
    bob = ledger.open_account("BTC", AccountKind.customer, f"guard:{run}:bob").id
    ledger.transfer(f"guard:{run}:fund-l", world, liquidity, 100_000)
    ledger.transfer(f"guard:{run}:fund-a", world, alice, 100_000)
    return run, world, liquidity, alice, bob


def _adjustment(c, run: str, legs: list[tuple[int, int, int]], state: str) -> int:
    """An adjustment row as the owner writes it (the roles' privileges are not what is tested here)."""
    return c.execute(text(
        "INSERT INTO treasury_adjustment (idempotency_key, proposed_by, reason, transfers, quorum, state) "
        "VALUES (:k, 'ops1', 'drain', CAST(:t AS jsonb), 1, :s) RETURNING id"),
        {"k": f"guard:{run}:{uuid.uuid4().hex[:6]}", "s": state,
         "t": json.dumps([{"debit_account_id": d, "credit_account_id": cr, "amount": str(a)} for d, cr, a in legs])}
    ).scalar_one()


def _post_as(role: str, engine, ledger, key_of, transfers_of, state: str, accounts) -> str:
    """'posted' or the SQLSTATE of the refusal; everything rolled back."""
    run, world, liquidity, alice, bob = accounts
    with engine.connect() as c:
        tx = c.begin()
        try:
            adj = _adjustment(c, run, [(liquidity, bob, 500), (liquidity, alice, 300)], state)
            c.execute(text(f"SET LOCAL ROLE {role}"))
            try:
                ledger.post(key_of(adj), transfers_of(accounts), conn=c)
                c.execute(text("SET CONSTRAINTS ALL IMMEDIATE"))
                return "posted"
            except DBAPIError as exc:
                return exc.orig.sqlstate
        finally:
            tx.rollback()


def _approved(a):
    return [Transfer(a[2], a[4], 500), Transfer(a[2], a[3], 300)]


CASES = [
    ("no liquidity debit", "plain", lambda a: [Transfer(a[3], a[4], 5), Transfer(a[4], a[3], 2)], "approved",
     {API: "posted", WORKER: "posted"}),
    # an equity debit into a customer: not the guard's refusal but ledger_post's (migration 0054)
    ("no liquidity debit, an equity one", "plain", lambda a: [Transfer(a[3], a[4], 5), Transfer(a[1], a[3], 7)],
     "approved", {API: "42501", WORKER: "posted"}),
    ("liquidity debit third", "plain",
     lambda a: [Transfer(a[3], a[4], 5), Transfer(a[1], a[3], 7), Transfer(a[2], a[4], 500)], "approved",
     {API: "42501", WORKER: "42501"}),
    ("the approved legs", "adjustment", _approved, "approved", {API: "42501", WORKER: "posted"}),
    ("the legs of a proposed one", "adjustment", _approved, "proposed", {API: "42501", WORKER: "42501"}),
    ("the legs of a posted one", "adjustment", _approved, "posted", {API: "42501", WORKER: "42501"}),
    ("another amount", "adjustment", lambda a: [Transfer(a[2], a[4], 501), Transfer(a[2], a[3], 300)], "approved",
     {API: "42501", WORKER: "42501"}),
    ("another credit account", "adjustment", lambda a: [Transfer(a[2], a[3], 500), Transfer(a[2], a[3], 300)], "approved",
     {API: "42501", WORKER: "42501"}),
    ("the legs swapped", "adjustment", lambda a: list(reversed(_approved(a))), "approved", {API: "42501", WORKER: "42501"}),
    ("one leg of two", "adjustment", lambda a: _approved(a)[:1], "approved", {API: "42501", WORKER: "42501"}),
    ("a leg twice", "adjustment", lambda a: _approved(a) + _approved(a)[:1], "approved", {API: "42501", WORKER: "42501"}),
    ("plus a leg it does not name", "adjustment", lambda a: _approved(a) + [Transfer(a[1], a[3], 9)], "approved",
     {API: "42501", WORKER: "42501"}),
]


@pytest.mark.parametrize("role", (API, WORKER))
@pytest.mark.parametrize("case, key, legs, state, expected", CASES, ids=[c[0] for c in CASES])
def test_liquidity_debits_of_a_batch_are_judged_leg_by_leg(engine, ledger, accounts, role, case, key, legs, state,
                                                          expected):
    def key_of(adj: int) -> str:
        return f"treasury-adjustment:{adj}" if key == "adjustment" else f"guard:{accounts[0]}:{uuid.uuid4().hex[:6]}"

    assert _post_as(role, engine, ledger, key_of, legs, state, accounts) == expected[role], case
    ledger.verify()


def test_entries_added_to_an_approved_posting_in_a_second_statement_are_refused(engine, ledger, accounts):
    """The guard compares the whole journal transaction, not only the statement's entries: the
    worker posting the approved legs and then INSERTing one more liquidity debit into the same
    transaction is refused."""
    run, world, liquidity, alice, bob = accounts
    with engine.connect() as c:
        tx = c.begin()
        try:
            adj = _adjustment(c, run, [(liquidity, bob, 500)], "approved")
            c.execute(text(f"SET LOCAL ROLE {WORKER}"))
            posted = ledger.post(f"treasury-adjustment:{adj}", [Transfer(liquidity, bob, 500)], conn=c)
            with pytest.raises(DBAPIError) as refused:
                c.execute(text("INSERT INTO journal_entry (transaction_id, account_id, asset, amount) "
                               "VALUES (:t, :l, 'BTC', -500), (:t, :b, 'BTC', 500)"),
                          {"t": posted.transaction_id, "l": liquidity, "b": alice})
        finally:
            tx.rollback()
    assert refused.value.orig.sqlstate == "42501"
    ledger.verify()
