"""Jobs that need no chain: the outbox dispatcher (at least once, in order, retried after a sink
failure) and the verification job (a broken projection engages the kill switch)."""
from __future__ import annotations

import uuid

from sqlalchemy import text

from custody.container import Container
from custody.controls import emit, kill_switch, set_kill_switch
from custody.jobs import OutboxDispatcher, build_scheduler, verify_books
from custody.settings import Settings
from ledger.model import AccountKind
from ledger.service import Ledger


def test_outbox_delivers_in_order_and_retries(engine, ledger):
    run = uuid.uuid4().hex[:8]
    drain = OutboxDispatcher(engine, lambda topic, payload: None)
    while drain.dispatch():  # earlier suites' events first, so this test's three are next in line
        pass
    with engine.begin() as c:
        for i in range(3):
            emit(c, "batch.signed", f"test:{run}:{i}", {"i": i}, aggregate=f"test:{run}")
    seen, fail_once = [], {"armed": True}

    def sink(topic, payload):
        if not payload["event_key"].startswith(f"test:{run}"):
            return
        if payload["data"]["i"] == 1 and fail_once["armed"]:
            fail_once["armed"] = False
            raise RuntimeError("consumer down")
        seen.append((payload["data"]["i"], payload["aggregate_seq"]))

    d = OutboxDispatcher(engine, sink)
    d.dispatch()
    assert seen == [(0, 1)]  # stopped at the failure, keeping order
    d.dispatch()
    assert seen == [(0, 1), (1, 2), (2, 3)]
    with engine.connect() as c:
        rows = c.execute(text("SELECT attempts, delivered_at IS NOT NULL FROM outbox WHERE event_key LIKE :k ORDER BY id"),
                         {"k": f"test:{run}:%"}).all()
    assert [tuple(r) for r in rows] == [(1, True), (2, True), (1, True)]


def test_failed_verification_engages_kill_switch(engine, ledger):
    container = Container(settings=Settings(environment="test"), engine=engine, ledger=Ledger(engine))
    ledger.create_asset("BTC", 8)
    acct = ledger.open_account("BTC", AccountKind.customer, f"jobs:{uuid.uuid4().hex[:8]}")
    assert verify_books(container) == []
    with engine.begin() as c:
        c.execute(text("UPDATE account_balance SET posted = posted + 1 WHERE account_id = :a"), {"a": acct.id})
    try:
        assert verify_books(container) == ["projection_matches_journal"]
        assert kill_switch(engine).engaged
    finally:
        ledger.rebuild_projections()
        with engine.begin() as c:
            set_kill_switch(c, False, "test: projection rebuilt", "op-test")
    assert build_scheduler(container).get_job("verify") is not None
