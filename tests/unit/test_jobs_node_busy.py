"""A job step that finds the node busy (NodeBusy: an operator's scantxoutset, a wallet rescan)
costs one warning line and the tick: no traceback, and the job's later steps still run."""
from __future__ import annotations

import logging

from chain_adapters.bitcoin import bitcoind_error
from custody.jobs import run_steps
from regtest.util import assert_equal


def test_a_busy_node_is_one_warning_and_the_next_step_still_runs(caplog):
    ran = []

    def scan_step() -> None:
        raise bitcoind_error(-8, 'Scan already in progress, use action "abort" or "status"')

    def next_step() -> None:
        ran.append("next")

    with caplog.at_level(logging.WARNING, logger="custody.jobs"):
        run_steps("payouts", [scan_step, next_step])
    assert_equal(ran, ["next"])
    records = [r for r in caplog.records if r.name == "custody.jobs"]
    assert_equal(len(records), 1)
    assert_equal(records[0].levelno, logging.WARNING)
    assert records[0].exc_info is None, "a busy node must not log a traceback"
    assert "node busy" in records[0].getMessage() and "payouts:scan_step" in records[0].getMessage()
