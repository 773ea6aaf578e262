"""containment on the database, without a chain: a rebalance row whose step fails is set aside
with an incident of the right severity (warning before anything is sent, critical once its
transaction is on chain), once; a passing failure (the node) is only logged; the operator's retry
makes it active again and resolves the incident, refuses an unknown id or a row that is not set
aside, and a failure after the retry opens a new incident."""
from __future__ import annotations

import logging
import uuid

from sqlalchemy import text

from chain_adapters.errors import ChainError
from custody.containment import Step, contained, retry, set_aside
from custody.controls import kill_switch, set_kill_switch
from custody.errors import CustodyErrorCode
from ledger.errors import ErrorCode, LedgerError
from regtest.util import assert_equal, assert_raises_code

log = logging.getLogger(__name__)


def new_rebalance(engine, state: str) -> int:
    """A rebalance row on a chain of its own (at most one is in progress per chain and asset)."""
    with engine.begin() as c:
        return c.execute(text(
            "INSERT INTO rebalance (chain, asset, source_tier, destination_tier, state, destination, destination_index, "
            "amount, fee, fee_rate, spendable, ceiling, target) VALUES (:ch, 'BTC', 'hot', 'cold', :s, :d, 0, 1000, 10, 1, "
            "2000, 1500, 500) RETURNING id"),
            {"ch": f"test-{uuid.uuid4().hex[:8]}", "s": state, "d": f"dest-{uuid.uuid4().hex}"}).scalar_one()


def row(engine, rebalance_id: int):
    with engine.connect() as c:
        return c.execute(text("SELECT containment, set_aside_step, set_aside_incident_id, set_aside_count FROM rebalance "
                              "WHERE id = :r"), {"r": rebalance_id}).one()


def incident(engine, incident_id: int):
    with engine.connect() as c:
        return c.execute(text("SELECT kind, severity, detail, resolved_by FROM incident WHERE id = :i"), {"i": incident_id}).one()


def failing(exc: Exception):
    def work():
        raise exc
    return work


def test_set_aside_once_with_its_severity_and_retried(engine, ledger):
    ledger.create_asset("BTC", 8)
    unsent, sent = new_rebalance(engine, "open"), new_rebalance(engine, "broadcast")
    try:
        log.info("a node error passes: logged, retried next run, not set aside")
        assert contained(engine, "rebalance", sent, "broadcast", Step.track, failing(ChainError("node busy"))) is None
        assert_equal(row(engine, sent).containment, "active")

        log.info("a refused signing store before anything was sent: set aside, warning, withdrawals go on")
        assert contained(engine, "rebalance", unsent, "open", Step.sign, failing(KeyError("bug")),
                         describe=lambda: {"amount": 1000}) is None
        first = row(engine, unsent)
        assert_equal((first.containment, first.set_aside_step, first.set_aside_count), ("set_aside", "sign", 1))
        seen = incident(engine, first.set_aside_incident_id)
        assert_equal((seen.kind, seen.severity, seen.detail["code"], seen.detail["amount"]),
                     ("rebalance_set_aside", "warning", "KeyError", 1000))
        assert not kill_switch(engine).engaged

        log.info("a refused booking once on chain: set aside, critical, the kill switch engages; only once")
        refused = LedgerError(ErrorCode.insufficient_funds)
        assert contained(engine, "rebalance", sent, "broadcast", Step.track, failing(refused)) is None
        assert_equal(incident(engine, row(engine, sent).set_aside_incident_id).severity, "critical")
        assert kill_switch(engine).engaged
        assert set_aside(engine, "rebalance", sent, state="broadcast", step=Step.track, error=refused) is None

        log.info("the operator retries: active again, the incident resolved; again, or an unknown id, is refused")
        retried = retry(engine, "rebalance", sent, by="op-carol", comment="hold released")
        assert_equal((retried.state, retried.step), ("broadcast", "track"))
        assert_equal(row(engine, sent).containment, "active")
        assert_equal(incident(engine, retried.incident_id).resolved_by, "op-carol")
        assert_raises_code(CustodyErrorCode.retry_not_set_aside, retry, engine, "rebalance", sent, by="op-carol", comment="x")
        assert_raises_code(CustodyErrorCode.retry_unknown, retry, engine, "rebalance", 2**62, by="op-carol", comment="x")

        log.info("it fails again after the retry: a new incident, not the resolved one")
        assert contained(engine, "rebalance", sent, "broadcast", Step.track, failing(refused)) is None
        again = row(engine, sent)
        assert_equal((again.containment, again.set_aside_count), ("set_aside", 2))
        assert again.set_aside_incident_id != retried.incident_id
        assert_equal(incident(engine, again.set_aside_incident_id).resolved_by, None)
    finally:
        with engine.begin() as c:
            c.execute(text("UPDATE rebalance SET state = 'abandoned' WHERE id = ANY(:r)"), {"r": [unsent, sent]})
            set_kill_switch(c, False, "test: containment checked", "op-test")
