"""Treasury adjustments in the tests: the worker's `adjustments` job run by hand, as the worker's
database role.

In deployment only the worker posts an adjustment, logged in as custody_worker, the one process
role the liquidity guard (migration 0051) lets debit a liquidity account, and only with an approved
adjustment's exact legs. A test's own engine connects as the database owner, which the guard does
not judge, so `run_adjustments_job` runs the job on an engine whose sessions are custody_worker
(`SET ROLE`), with the container's approver keys and quorum: what the deployed job would do.
Approving one over HTTP is tests/approvers.py's `approve_over_api(..., resource=ADJUSTMENTS)`.
"""
from __future__ import annotations

from custody.adjustments import TreasuryAdjustments
from ledger.service import Ledger
from tests.integration.test_db_roles import as_role

WORKER = "custody_worker"


def run_adjustments_job(container) -> list[int]:
    """`TreasuryAdjustments.post_approved()` as custody_worker on the container's database, with
    its approver registry and quorum; the ids posted."""
    engine = as_role(container.engine.url.render_as_string(hide_password=False), WORKER, login=False)
    try:
        worker = TreasuryAdjustments(engine, Ledger(engine), quorum=container.settings.treasury_adjustment_quorum,
                                     approvers=container.approvers)
        return worker.post_approved()
    finally:
        engine.dispose()
