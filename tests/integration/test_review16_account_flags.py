"""Review 16 (R1): custody_api may UPDATE every column of `account` (role grants: table-level UPDATE),
so it rewrites the flags the ledger's limits and the liquidity guard read: `may_go_negative` on a
customer account lets it post from an empty account (money from nothing), `kind` turns a liquidity
account into a customer one for the guard (migration 0048's statement trigger reads `kind`).
Everything runs in one transaction as custody_api, rolled back.
"""
from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ledger.errors import LedgerError
from ledger.model import AccountKind, Transfer


@pytest.mark.parametrize("flag", ["may_go_negative = true", "kind = 'customer'"])
def test_api_role_cannot_rewrite_the_flags_the_ledger_checks(engine, ledger, flag):
    run = uuid.uuid4().hex[:8]
    ledger.create_asset("BTC", 8)
    world = ledger.open_account("BTC", AccountKind.equity, f"r16f:{run}:world").id
    liquidity = ledger.open_account("BTC", AccountKind.liquidity, f"r16f:{run}:liquidity").id
    mallory = ledger.open_account("BTC", AccountKind.customer, f"r16f:{run}:mallory").id
    other = ledger.open_account("BTC", AccountKind.customer, f"r16f:{run}:other").id
    ledger.transfer(f"r16f:{run}:fund", world, liquidity, 100_000)
    source = mallory if flag.startswith("may_go_negative") else liquidity  # mallory holds nothing
    with engine.connect() as c:
        tx = c.begin()
        try:
            c.execute(text("SET LOCAL ROLE custody_api"))
            try:
                c.execute(text(f"UPDATE account SET {flag} WHERE id = :a"), {"a": source})
                ledger.post(f"r16f:{run}:take", [Transfer(source, other, 50_000)], conn=c)
                c.execute(text("SET CONSTRAINTS ALL IMMEDIATE"))  # the deferred checks COMMIT would run
                outcome = "posted"
            except (DBAPIError, LedgerError) as exc:
                outcome = type(exc).__name__
        finally:
            tx.rollback()
    assert outcome != "posted"
    ledger.verify()
