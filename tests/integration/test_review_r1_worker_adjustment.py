"""Review R1 (branch int, 0051/0054): custody_worker alone debits liquidity under an adjustment it wrote.

The liquidity guard lets custody_worker debit a liquidity account when the posting's key is
`treasury-adjustment:<id>` of an adjustment in state `approved` whose stored legs it posts exactly.
Nothing in the database ties `approved` to an operator: custody_worker holds INSERT, UPDATE and
DELETE on `treasury_adjustment` and `treasury_adjustment_vote`, so it writes a row already
`approved`, with legs of its choice and no vote, and posts it (custody_api, which INSERTs
`treasury_adjustment` with any `state`, can write the row too). 0051 calls the worker "trusted to
have verified the signatures"; the brief asks whether a compromised worker can debit liquidity
outside an operator-approved adjustment: it can. Everything runs in one rolled-back transaction.
"""
from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ledger.model import AccountKind, Transfer


def test_worker_role_cannot_drain_liquidity_under_an_adjustment_it_approved_itself(engine, ledger):
    run = uuid.uuid4().hex[:6].upper()
    asset = f"W{run}"
    ledger.create_asset(asset, 8)
    equity = ledger.open_account(asset, AccountKind.equity, f"equity:{asset}").id
    liquidity = ledger.open_account(asset, AccountKind.liquidity, f"convert:liquidity:{asset}").id
    mallory = ledger.open_account(asset, AccountKind.customer, f"customer:w{run.lower()}:{asset}",
                                  owner=f"w{run.lower()}").id
    ledger.transfer(f"r1w:{run}:fund", equity, liquidity, 100_000)
    with engine.connect() as c:
        tx = c.begin()
        try:
            c.execute(text("SET LOCAL ROLE custody_worker"))
            try:
                with c.begin_nested():
                    adj = c.execute(text(
                        "INSERT INTO treasury_adjustment (idempotency_key, proposed_by, reason, transfers, quorum, state) "
                        "VALUES (:k, 'nobody', 'forged', CAST(:t AS jsonb), 2, 'approved') RETURNING id"),
                        {"k": f"r1w:{run}", "t": json.dumps([{"debit_account_id": liquidity,
                                                              "credit_account_id": mallory, "amount": "100000"}])}
                    ).scalar_one()
                    ledger.post(f"treasury-adjustment:{adj}", [Transfer(liquidity, mallory, 100_000)], conn=c)
                    c.execute(text("SET CONSTRAINTS ALL IMMEDIATE"))
                outcome = "posted"
            except DBAPIError as exc:
                outcome = exc.orig.sqlstate
            got = c.execute(text("SELECT coalesce(sum(posted), 0) FROM account_balance WHERE account_id = :a"),
                            {"a": mallory}).scalar_one()
        finally:
            tx.rollback()
    assert outcome == "42501" and got == 0, (outcome, got)
    ledger.verify()
