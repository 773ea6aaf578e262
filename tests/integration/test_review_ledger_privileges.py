"""No process role writes the ledger's tables except through the ledger's own functions (brief H4).

Before migration 0054 custody_api held INSERT, UPDATE on `account_balance` and `hold` and INSERT on
`journal_transaction` and `journal_entry` (custody_worker every write), and the ledger's functions
ran as their caller (SECURITY INVOKER) with no check of who debits what. With the api's
credentials alone, and so with any compromise of the internet-facing process:

1. `UPDATE account_balance SET posted = posted + ...` on its own customer account mints money that
   postings and withdrawals then spend (the projection is what `ledger_post` checks);
2. a balanced posting that debits a firm account which may go negative (equity, an asset location,
   suspense, network fees) and credits its own customer account, whether written by hand into the
   journal or through `ledger_post`;
3. rewriting a `hold` row: someone else's hold released, its amount, account or owner changed.

Each case runs as the role (`SET LOCAL ROLE`) in a transaction that is rolled back, and expects
insufficient_privilege (42501): the missing table privilege, or `ledger_post`'s refusal.
"""
from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ledger.model import AccountKind, Transfer

API, WORKER = "custody_api", "custody_worker"
INSUFFICIENT_PRIVILEGE = "42501"


def attempt(engine, role: str, statements: list[tuple[str, dict]]) -> str | None:
    """Run `statements` as `role` in one rolled-back transaction, the deferred checks included;
    the SQLSTATE the first refused one failed with, or None when all of them went through."""
    with engine.connect() as c:
        tx = c.begin()
        try:
            c.execute(text(f"SET LOCAL ROLE {role}"))
            for sql, params in statements:
                c.execute(text(sql), params)
            c.execute(text("SET CONSTRAINTS ALL IMMEDIATE"))  # what COMMIT would check
            return None
        except DBAPIError as exc:
            return exc.orig.sqlstate
        finally:
            tx.rollback()


@pytest.fixture()
def books(ledger):
    """A funded customer account (the attacker's), another customer's, and the firm's accounts."""
    run = uuid.uuid4().hex[:8]
    ledger.create_asset("BTC", 8)
    out = {
        "equity": ledger.open_account("BTC", AccountKind.equity, f"lp:{run}:equity").id,
        "location": ledger.open_account("BTC", AccountKind.asset_location, f"lp:{run}:location").id,
        "suspense": ledger.open_account("BTC", AccountKind.suspense, f"lp:{run}:suspense").id,
        "network_fees": ledger.open_account("BTC", AccountKind.network_fee_expense, f"lp:{run}:network-fees").id,
        "fees": ledger.open_account("BTC", AccountKind.fee_income, f"lp:{run}:fees").id,
        "mallory": ledger.open_account("BTC", AccountKind.customer, f"customer:lp{run}:BTC", owner=f"lp{run}").id,
        "alice": ledger.open_account("BTC", AccountKind.customer, f"customer:lpa{run}:BTC", owner=f"lpa{run}").id,
        "run": run,
    }
    ledger.transfer(f"lp:{run}:fund-fees", out["equity"], out["fees"], 10_000)
    ledger.transfer(f"lp:{run}:fund-alice", out["equity"], out["alice"], 50_000)
    out["hold"] = ledger.place_hold(f"lp:{run}:hold", out["alice"], 20_000, owner="custody:withdrawal",
                                    reference="lp").id
    return out


# ---- 1. the balance projection ------------------------------------------------------------------

@pytest.mark.parametrize("role", [API, WORKER])
def test_a_process_role_cannot_raise_a_balance_by_hand(engine, ledger, books, role):
    got = attempt(engine, role, [("UPDATE account_balance SET posted = posted + 1000000000000 WHERE account_id = :a",
                                  {"a": books["mallory"]})])
    assert got == INSUFFICIENT_PRIVILEGE
    ledger.assert_verified()


@pytest.mark.parametrize("role", [API, WORKER])
def test_a_process_role_cannot_add_or_delete_balance_rows(engine, ledger, books, role):
    inserted = attempt(engine, role, [("INSERT INTO account_balance (account_id, shard, posted) VALUES (:a, 7, 10)",
                                       {"a": books["mallory"]})])
    deleted = attempt(engine, role, [("DELETE FROM account_balance WHERE account_id = :a", {"a": books["alice"]})])
    assert (inserted, deleted) == (INSUFFICIENT_PRIVILEGE, INSUFFICIENT_PRIVILEGE)
    ledger.assert_verified()


# ---- 2. the journal, by hand or through ledger_post ----------------------------------------------

def test_the_api_role_cannot_write_a_journal_transaction_by_hand(engine, ledger, books):
    key = f"lp:{books['run']}:forged"
    got = attempt(engine, API, [
        ("INSERT INTO journal_transaction (idempotency_key, content_hash, kind) VALUES (:k, 'x', 'transfer')", {"k": key}),
        ("INSERT INTO journal_entry (transaction_id, account_id, asset, amount) "
         "SELECT t.id, e.account_id, 'BTC', e.amount FROM journal_transaction t, "
         "(VALUES (CAST(:d AS bigint), -1000000), (CAST(:c AS bigint), 1000000)) AS e(account_id, amount) "
         "WHERE t.idempotency_key = :k", {"k": key, "d": books["equity"], "c": books["mallory"]}),
    ])
    assert got == INSUFFICIENT_PRIVILEGE
    ledger.assert_verified()


def test_the_worker_role_cannot_write_a_journal_entry_by_hand(engine, ledger, books):
    got = attempt(engine, WORKER, [
        ("INSERT INTO journal_entry (transaction_id, account_id, asset, amount) "
         "SELECT max(id), :a, 'BTC', 1 FROM journal_transaction", {"a": books["mallory"]})])
    assert got == INSUFFICIENT_PRIVILEGE
    ledger.assert_verified()


@pytest.mark.parametrize("source", ["equity", "location", "suspense", "network_fees", "fees"])
def test_the_api_role_cannot_post_from_a_firm_account_to_a_customer(engine, ledger, books, source):
    """Through the ledger's own function: its one-transfer path, then its general path (two transfers)."""
    for n, transfers in enumerate(([Transfer(books[source], books["mallory"], 1_000)],
                                   [Transfer(books[source], books["mallory"], 600),
                                    Transfer(books[source], books["mallory"], 400)])):
        with engine.connect() as c:
            tx = c.begin()
            try:
                c.execute(text(f"SET LOCAL ROLE {API}"))
                try:
                    ledger.post(f"lp:{books['run']}:{source}:{n}", transfers, conn=c)
                    c.execute(text("SET CONSTRAINTS ALL IMMEDIATE"))
                    outcome = "posted"
                except DBAPIError as exc:
                    outcome = exc.orig.sqlstate
            finally:
                tx.rollback()
        assert outcome == INSUFFICIENT_PRIVILEGE, (source, n)
    ledger.assert_verified()


# ---- 3. holds ---------------------------------------------------------------------------------

@pytest.mark.parametrize("role", [API, WORKER])
@pytest.mark.parametrize("change", [
    "state = 'released', released = amount, resolved_at = now()",  # someone else's hold let go
    "amount = 1",
    "account_id = :mallory",
    "owner = 'api:mallory'",
])
def test_a_process_role_cannot_rewrite_a_hold(engine, ledger, books, role, change):
    got = attempt(engine, role, [(f"UPDATE hold SET {change} WHERE id = :h",
                                  {"h": books["hold"], "mallory": books["mallory"]})])
    assert got == INSUFFICIENT_PRIVILEGE
    ledger.assert_verified()


@pytest.mark.parametrize("role", [API, WORKER])
def test_a_process_role_cannot_insert_a_hold_by_hand(engine, ledger, books, role):
    got = attempt(engine, role, [("INSERT INTO hold (idempotency_key, content_hash, account_id, amount, owner, reference) "
                                  "VALUES (:k, 'x', :a, 1, 'custody:withdrawal', 'lp')",
                                  {"k": f"lp:{books['run']}:hold-by-hand", "a": books["alice"]})])
    assert got == INSUFFICIENT_PRIVILEGE
    ledger.assert_verified()
