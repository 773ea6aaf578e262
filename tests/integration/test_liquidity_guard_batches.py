"""The liquidity guard (migration 0033's rule, one call per statement since 0045) judges every leg of
a batch: custody_api may debit a liquidity account only in a leg of a proposed treasury adjustment
with its quorum (key `treasury-adjustment:<id>`, the leg's account and amount among the
adjustment's transfers), wherever that leg stands in the batch; a batch with one leg it may not
write is refused whole (42501), one with none is posted.

Each case runs in a transaction as custody_api (SET LOCAL ROLE) and is rolled back.
"""
from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ledger.model import AccountKind, Transfer


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


def _adjustment(c, run: str, debit: int, credit: int, amount: int, approvals: int) -> int:
    adj = c.execute(text(
        "INSERT INTO treasury_adjustment (idempotency_key, proposed_by, reason, transfers, quorum, state) "
        "VALUES (:k, 'ops1', 'drain', CAST(:t AS jsonb), 1, 'proposed') RETURNING id"),
        {"k": f"guard:{run}:{uuid.uuid4().hex[:6]}",
         "t": json.dumps([{"debit_account_id": debit, "credit_account_id": credit, "amount": str(amount)}])}).scalar_one()
    for n in range(approvals):
        c.execute(text("INSERT INTO treasury_adjustment_vote (adjustment_id, operator, decision, comment) "
                       "VALUES (:a, :o, 'approve', 'ok')"), {"a": adj, "o": f"ops{n + 2}"})
    return adj


def _post_as_api(engine, ledger, key_of, transfers_of, approvals: int, accounts) -> str:
    """'posted' or the SQLSTATE of the refusal; everything rolled back."""
    run, world, liquidity, alice, bob = accounts
    with engine.connect() as c:
        tx = c.begin()
        try:
            adj = _adjustment(c, run, liquidity, bob, 500, approvals)
            c.execute(text("SET LOCAL ROLE custody_api"))
            try:
                ledger.post(key_of(adj), transfers_of(accounts), conn=c)
                return "posted"
            except DBAPIError as exc:
                return exc.orig.sqlstate
        finally:
            tx.rollback()


@pytest.mark.parametrize("case, key, legs, approvals, expected", [
    ("no liquidity debit", "plain", lambda a: [Transfer(a[3], a[4], 5), Transfer(a[1], a[3], 7)], 1, "posted"),
    ("liquidity debit third", "plain",
     lambda a: [Transfer(a[3], a[4], 5), Transfer(a[1], a[3], 7), Transfer(a[2], a[4], 500)], 1, "42501"),
    ("adjustment with quorum", "adjustment", lambda a: [Transfer(a[2], a[4], 500)], 1, "posted"),
    ("adjustment without quorum", "adjustment", lambda a: [Transfer(a[2], a[4], 500)], 0, "42501"),
    ("adjustment, other amount", "adjustment", lambda a: [Transfer(a[2], a[4], 501)], 1, "42501"),
    ("adjustment plus a leg it does not name", "adjustment",
     lambda a: [Transfer(a[2], a[4], 500), Transfer(a[2], a[3], 499)], 1, "42501"),
])
def test_liquidity_debits_of_a_batch_are_judged_leg_by_leg(engine, ledger, accounts, case, key, legs, approvals, expected):
    def key_of(adj: int) -> str:
        return f"treasury-adjustment:{adj}" if key == "adjustment" else f"guard:{accounts[0]}:{uuid.uuid4().hex[:6]}"

    assert _post_as_api(engine, ledger, key_of, legs, approvals, accounts) == expected, case
