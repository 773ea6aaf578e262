"""Containment's pure decisions: which failures pass by themselves, the incident's severity (critical
once the money may be on chain), the code an incident names, the containment machine's table, and
that the payouts job runs every step even when one raises."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from sqlalchemy.exc import IntegrityError, OperationalError

from chain_adapters.errors import ChainError, NodeUnavailable
from custody.containment import Step, error_code, incident_severity, is_passing
from custody.errors import CustodyError, CustodyErrorCode
from custody.jobs import payouts_once
from custody.states import CONTAINMENT_TRANSITIONS, COLUMNS, IllegalTransition, check
from ledger.errors import ErrorCode, LedgerError


@pytest.mark.parametrize("state, step, severity", [
    ("open", Step.sign, "warning"),  # nothing stored, nothing sent
    ("signed", Step.broadcast, "critical"),  # the node accepted it; recording it failed
    ("broadcast", Step.track, "critical"),
    ("confirmed", Step.track, "critical"),
    ("broadcast", Step.bump, "critical"),
    ("final", Step.track, "critical"),
])
def test_severity_is_critical_once_the_money_may_be_on_chain(state, step, severity):
    assert incident_severity(state, step) == severity


def test_passing_failures_are_the_node_the_connection_and_a_race():
    assert is_passing(ChainError("node refused"))
    assert is_passing(NodeUnavailable("node down"))
    assert is_passing(OperationalError("SELECT 1", {}, Exception("deadlock detected")))
    assert is_passing(IllegalTransition("moved meanwhile"))
    for exc in (LedgerError(ErrorCode.idempotency_conflict), LedgerError(ErrorCode.insufficient_funds),
                CustodyError(CustodyErrorCode.invalid_state, "x"), IntegrityError("INSERT", {}, Exception("dup")),
                KeyError("bug"), ValueError("bug")):
        assert not is_passing(exc), exc


def test_error_code_names_the_code_or_the_class():
    assert error_code(LedgerError(ErrorCode.idempotency_conflict)) == "idempotency_conflict"
    assert error_code(CustodyError(CustodyErrorCode.invalid_state, "x")) == "invalid_state"
    assert error_code(KeyError("x")) == "KeyError"


def test_containment_machine_table():
    assert dict(CONTAINMENT_TRANSITIONS) == {"active": {"set_aside"}, "set_aside": {"active"}}
    assert COLUMNS == {"batch_containment": "containment", "sweep_containment": "containment",
                       "rebalance_containment": "containment", "cpfp_containment": "containment"}
    check("batch_containment", "active", "set_aside")
    check("sweep_containment", "set_aside", "active")
    with pytest.raises(IllegalTransition):
        check("rebalance_containment", "set_aside", "set_aside")


def test_retry_codes_in_the_table():
    assert CustodyErrorCode.retry_unknown.http_status == 404
    assert CustodyErrorCode.retry_not_set_aside.http_status == 409


def test_payouts_job_runs_every_step_when_one_raises():
    called: list[str] = []

    def step(name: str, fails: bool = False):
        def run():
            called.append(name)
            if fails:
                raise LedgerError(ErrorCode.idempotency_conflict)
        run.__name__ = name
        return run

    payouts = SimpleNamespace(sync_hot_wallet=step("sync"), batch_bitcoin=step("batch_bitcoin", fails=True),
                              batch_ethereum=step("batch_ethereum"), sign_open_batches=step("sign", fails=True),
                              broadcast=step("broadcast"), track=step("track"), bump_fees=step("bump"))
    payouts_once(SimpleNamespace(payouts=payouts, adapters={"bitcoin": None, "ethereum": None}))
    assert called == ["sync", "batch_bitcoin", "batch_ethereum", "sign", "broadcast", "track", "bump"]
