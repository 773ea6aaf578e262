"""No planner trap: every statement inside the ledger's functions is priced below JIT's threshold.

Migration 0029_no_planner_trap removed `enable_seqscan = off` (and the hash and merge join
switches) from the ledger's PL/pgSQL functions: before PostgreSQL 18 a disabled node type costs
10^10 more, so PostgreSQL 15 priced a one-row lookup inside `ledger_place_hold` at ~10 billion and
JIT-compiled it on every call (10-49 ms a hold). Here each function runs (`ledger_post` with its
statement trigger `ledger_entries_references`, `ledger_place_hold`, `ledger_resolve_hold` through a
release and a final capture, `ledger_apply`) under auto_explain with nested statements, its plans
sent to this connection as notices, on two servers: the configured one (DATABASE_URL; CI and the
machine run PostgreSQL 15) and the embedded PostgreSQL 18. Every plan's total cost must be below
the server's `jit_above_cost`, no plan may be JIT-compiled, and the one-row lookups by key must use
an index. Fails on the code before 0029 on PostgreSQL 15 (costs of ~10^10).

Needs a superuser on both servers (`LOAD 'auto_explain'`), as the suite's owner URL is.
"""
from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text

from ledger.model import AccountKind, PlaceHold, PostTransfers, ReleaseHold, Transfer
from ledger.service import Ledger
from tests.integration.own_database import own_database

log = logging.getLogger(__name__)
OWNER = "matching:PLANS"
FUNCTION_TABLES = ("account_balance", "journal_transaction", "journal_entry", "hold")


def _walk(plan: dict):
    yield plan
    for child in plan.get("Plans", ()):
        yield from _walk(child)


def _server(which: str, database_url: str) -> str:
    if which == "configured":
        return database_url
    from custody.database import embedded_server_url

    return embedded_server_url(Path(os.environ["STATE_DIR"]))


@pytest.mark.parametrize("which", ["configured", "embedded"])
def test_no_plan_inside_the_ledger_functions_reaches_jit(database_url, which):
    with own_database(_server(which, database_url), "plans") as engine:
        ledger = Ledger(engine)
        ledger.create_asset("USDT", 6)
        world = ledger.open_account("USDT", AccountKind.equity, "plans:world").id
        accounts = [ledger.open_account("USDT", AccountKind.customer, f"plans:c{i}").id for i in range(40)]
        fee = ledger.open_account("USDT", AccountKind.fee_income, "plans:fee").id
        for i, a in enumerate(accounts):  # some history, so the tables are past their first page
            ledger.post(f"plans:fund:{i}", [Transfer(world, a, 10**12)])
        for i in range(200):
            ledger.post(f"plans:warm:{i}", [Transfer(accounts[i % 40], accounts[(i + 1) % 40], 1)])
        with engine.connect() as c:
            c.execute(text("ANALYZE"))
            c.commit()

        plans: list[dict] = []
        with engine.connect() as c:
            raw = c.connection.driver_connection
            version = c.execute(text("SHOW server_version")).scalar_one()
            threshold = float(c.execute(text("SHOW jit_above_cost")).scalar_one())
            for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                            "SET auto_explain.log_nested_statements = on", "SET auto_explain.log_format = json",
                            "SET auto_explain.log_level = notice", "SET client_min_messages = notice"):
                c.exec_driver_sql(setting)
            raw.add_notice_handler(lambda d: plans.append(json.loads(d.message_primary.split("plan:", 1)[1]))
                                   if d.message_primary and "plan:" in d.message_primary else None)
            run = uuid.uuid4().hex[:8]
            ledger.post(f"{run}:p", [Transfer(accounts[0], accounts[1], 5), Transfer(accounts[0], fee, 1)], conn=c)
            hold = ledger.place_hold(f"{run}:h1", accounts[2], 100, owner=OWNER, reference="o1", conn=c)
            ledger.release_hold(hold.id, owner=OWNER, conn=c)
            hold = ledger.place_hold(f"{run}:h2", accounts[3], 100, owner=OWNER, reference="o2", conn=c)
            ledger.capture_hold(f"{run}:cap", hold.id, [Transfer(accounts[3], accounts[4], 60)], owner=OWNER,
                                final=True, conn=c)
            held = ledger.place_hold(f"{run}:h3", accounts[5], 50, owner=OWNER, reference="o3", conn=c)
            results = ledger.apply([
                PlaceHold(f"{run}:h4", accounts[6], 70, OWNER, "o4"),
                PostTransfers(f"{run}:fill", (Transfer(accounts[5], accounts[7], 20, held.id),), kind="fill",
                              hold_owner=OWNER),
                ReleaseHold(held.id, OWNER),
            ], conn=c)
            assert [r.status for r in results] == ["created", "created", "created"]
            c.commit()
        log.info("PostgreSQL %s: %d plans captured, jit_above_cost %s", version, len(plans), threshold)
        inner = [p for p in plans if any(t in p["Query Text"] for t in FUNCTION_TABLES)
                 and "ledger_" not in p["Query Text"].split("FROM", 1)[-1][:40]]
        assert len(inner) >= 10, f"auto_explain reported too few statements from inside the functions: {plans!r}"
        worst = max(plans, key=lambda p: p["Plan"]["Total Cost"])
        log.info("the costliest plan (%s): %s", worst["Plan"]["Total Cost"], worst["Query Text"][:200])
        assert worst["Plan"]["Total Cost"] < threshold, (version, worst["Query Text"], worst["Plan"])
        assert not [p for p in plans if "JIT" in p], "a plan was JIT-compiled"
        lookups = [n for p in plans for n in _walk(p["Plan"])
                   if n.get("Relation Name") in ("journal_transaction", "hold") and n["Node Type"].endswith("Scan")]
        assert lookups, "no lookup of journal_transaction or hold was captured"
        assert all("Index" in n["Node Type"] for n in lookups), [(n["Relation Name"], n["Node Type"]) for n in lookups]
        ledger.assert_verified()
