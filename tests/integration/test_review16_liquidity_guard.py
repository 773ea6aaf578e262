"""Review 16 (R1, perf merge): the liquidity guard that migration 0048 turned into one statement
trigger (journal_entry_liquidity_guard) still trusts database rows the api role writes itself.

custody_api holds INSERT on treasury_adjustment and treasury_adjustment_vote (role grants), and
calls ledger_post as itself (SECURITY INVOKER). The guard lets a custody_api debit of a liquidity
account through when the posting's key is `treasury-adjustment:<id>` of a `proposed` adjustment
with `quorum` approving votes that names the leg's debit account and amount: it checks neither
the credit account nor how many legs use the one approved transfer. So custody_api alone (no
operator) proposes, "approves" under invented operator names and drains a liquidity account into
a customer account of its choosing, twice the approved amount in one posting.
Everything runs in one transaction, rolled back.

Fixed by migration 0051: custody_api never debits a liquidity account; only custody_worker posts an
approved adjustment, with exactly its stored legs, after verifying its approvers' signatures.
"""
from __future__ import annotations

import json
import uuid

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ledger.model import AccountKind, Transfer


def test_api_role_cannot_drain_liquidity_with_a_forged_adjustment(engine, ledger):
    run = uuid.uuid4().hex[:8]
    ledger.create_asset("BTC", 8)
    world = ledger.open_account("BTC", AccountKind.equity, f"r16:{run}:world").id
    liquidity = ledger.open_account("BTC", AccountKind.liquidity, f"r16:{run}:liquidity").id
    treasury = ledger.open_account("BTC", AccountKind.customer, f"r16:{run}:treasury").id
    mallory = ledger.open_account("BTC", AccountKind.customer, f"r16:{run}:mallory").id
    ledger.transfer(f"r16:{run}:fund", world, liquidity, 100_000)
    with engine.connect() as c:
        tx = c.begin()
        try:
            c.execute(text("SET LOCAL ROLE custody_api"))  # everything below is the api role alone
            adj = c.execute(text(
                "INSERT INTO treasury_adjustment (idempotency_key, proposed_by, reason, transfers, quorum, state) "
                "VALUES (:k, 'nobody', 'forged', CAST(:t AS jsonb), 1, 'proposed') RETURNING id"),
                {"k": f"r16:{run}", "t": json.dumps([{"debit_account_id": liquidity, "credit_account_id": treasury,
                                                      "amount": "500"}])}).scalar_one()
            c.execute(text("INSERT INTO treasury_adjustment_vote (adjustment_id, operator, decision, comment) "
                           "VALUES (:a, 'invented', 'approve', 'ok')"), {"a": adj})
            try:
                with c.begin_nested():  # a refusal rolls back to here, so what mallory holds can still be read
                    ledger.post(f"treasury-adjustment:{adj}",
                                [Transfer(liquidity, mallory, 500), Transfer(liquidity, mallory, 500)], conn=c)
                    c.execute(text("SET CONSTRAINTS ALL IMMEDIATE"))  # the deferred checks COMMIT would run
                outcome = "posted"
            except DBAPIError as exc:
                outcome = exc.orig.sqlstate
            drained = c.execute(text("SELECT coalesce(sum(posted), 0) FROM account_balance WHERE account_id = :a"),
                                {"a": mallory}).scalar_one()
        finally:
            tx.rollback()
    assert outcome == "42501", (outcome, drained)
    ledger.verify()
