"""Review R1 (branch int, 0052/0054): custody_api and the accounts it does not own.

0054 moved closing into `ledger_close_account` (lock, check empty, close), but custody_api keeps
UPDATE (closed_at) on `account` (0049/0052), so it closes any account whatever it holds (the house's
liquidity, a hot location, a customer's funded account: every posting to it is then refused
`account_closed`, and a closed account with a balance is a state the ledger's own close never makes)
and re-opens a closed one. `ledger_close_account` itself has no owner check either, and
`ledger_rebuild_projections` (EXCLUSIVE lock on every balance row) is EXECUTE for custody_api.
Everything runs in one rolled-back transaction per test.
"""
from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ledger.model import AccountKind


def _as_api(engine, body, role="custody_api"):
    with engine.connect() as c:
        tx = c.begin()
        try:
            c.execute(text(f"SET LOCAL ROLE {role}"))
            try:
                with c.begin_nested():
                    return body(c)
            except DBAPIError as exc:
                return exc.orig.sqlstate
        finally:
            tx.rollback()


def test_api_role_cannot_close_a_funded_account(engine, ledger):
    run = uuid.uuid4().hex[:6].upper()
    asset = f"A{run}"
    ledger.create_asset(asset, 8)
    equity = ledger.open_account(asset, AccountKind.equity, f"equity:{asset}").id
    liquidity = ledger.open_account(asset, AccountKind.liquidity, f"convert:liquidity:{asset}").id
    ledger.transfer(f"r1a:{run}:fund", equity, liquidity, 500)

    def close(c):
        return c.execute(text("UPDATE account SET closed_at = now() WHERE id = :a AND closed_at IS NULL RETURNING id"),
                         {"a": liquidity}).all()

    outcome = _as_api(engine, close)
    assert outcome == "42501" or outcome == [], outcome
    ledger.verify()


def test_api_role_cannot_run_the_projection_rebuild(engine, ledger):
    outcome = _as_api(engine, lambda c: c.execute(text("SELECT ledger_rebuild_projections()")).scalar_one())
    assert outcome == "42501", outcome
    ledger.verify()
