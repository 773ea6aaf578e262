"""Containment: one withdrawal batch, sweep or rebalance that fails never stops the others.

Guarantees:
- Each row's step (sign, broadcast, track, bump) runs in its own database transaction(s), inside
  `contained()`: an exception from it is caught, recorded and never re-raised, so the job goes on
  with every other row.
- A failure that does not pass by itself (a ledger refusal such as `idempotency_conflict` or
  `insufficient_funds`, a custody error, anything unexpected) sets the row aside: `containment`
  becomes `set_aside` (custody/states.py, CONTAINMENT_TRANSITIONS) in a new transaction, together
  with an incident naming the row, the step, the row's state and the error code. Every job skips a
  set-aside row from then on; its `state` still says where its transaction is, so reconciliation
  keeps explaining its money.
- Severity (`incident_severity`): `critical` once the row's transaction may be on chain (state
  broadcast, confirmed or final, or the failure came after a successful send), which engages the
  kill switch (custody.controls); `warning` when nothing left the firm (open or signed, not sent).
- Passing failures are not set aside (`is_passing`): a node unreachable or refusing (`ChainError`),
  a database that dropped the connection or broke a deadlock (`OperationalError`), a row another
  worker moved meanwhile (`IllegalTransition`). They are logged; the next run retries.
  A signer refusal is not a failure either: the caller keeps its own flow (the batch stays open;
  on `decision_expired`, custody.payouts takes the expired withdrawals out of it). Two workers in
  one step (a lost job lock) do not fail either: custody.payouts locks the batch or version it
  signs, so the second finds the work done and does nothing.
- Nothing is booked twice: a failed step's database transaction rolls back whole, and every
  booking is posted under its idempotency key (`batch:<id>:capture`, `batch:<id>:final`,
  `sweep:<id>:final`, `rebalance:<id>:final`).
- Retry (`reactivate`, an operator through `POST /v1/{withdrawal-batches|sweeps|rebalances}/{id}/retry`,
  audited with the operator's comment): the row is `active` again, its incident is resolved by
  that operator, and the next run of its job does the step again; it then completes with exactly
  one booking. The kill switch stays as it is (releasing it is an admin's decision). A withdrawal batch set aside before
  it was signed is handled by custody.payouts (`Payouts.retry_batch`): abandoned and its
  withdrawals batched again under a new id, because the key that blocked it may be taken for good;
  unless the signer recorded a signature for it (its reply lost, its capture refused after the
  answer): then it stays open on its coins or nonce, so the signer accepts the re-sign.
  A failure after a retry sets the row aside again with a new incident (`set_aside_count`).
"""
from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Callable, TypeVar

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import OperationalError

from chain_adapters.errors import ChainError
from custody.controls import audit, open_incident
from custody.errors import CustodyError, CustodyErrorCode
from custody.states import MACHINES, IllegalTransition, advance

log = logging.getLogger(__name__)
T = TypeVar("T")

CONTAINED = ("batch", "sweep", "rebalance", "cpfp")  # the machines whose rows can be set aside
ON_CHAIN_STATES = frozenset({"broadcast", "confirmed", "final"})  # the row's transaction was sent


class Step(str, enum.Enum):
    """The job step that failed, as recorded in `set_aside_step` and the incident."""

    sign = "sign"  # sign and store (a batch: and capture the holds), in one database transaction
    broadcast = "broadcast"  # record a transaction the node accepted
    track = "track"  # follow it on chain; book it at finality (or fail the batch)
    bump = "bump"  # sign and store a fee-bumped replacement


@dataclass(frozen=True)
class SetAside:
    machine: str
    row_id: int
    incident_id: int
    severity: str


def is_passing(exc: BaseException) -> bool:
    """A failure the next run retries by itself: the node, the database connection, a race."""
    return isinstance(exc, (ChainError, OperationalError, IllegalTransition))


def incident_severity(state: str, step: Step) -> str:
    """`critical` when the money may already be on chain: the row's transaction was broadcast (or
    is confirmed or final), or the failure came after the node accepted it; else `warning`."""
    return "critical" if state in ON_CHAIN_STATES or step is Step.broadcast else "warning"


def error_code(exc: BaseException) -> str:
    """The failure's own code (ledger, custody, signer, chain) or, failing one, its class name."""
    code = getattr(exc, "code", None)
    return str(getattr(code, "value", code)) if code is not None else type(exc).__name__


def contained(engine: Engine, machine: str, row_id: int, state: str, step: Step, work: Callable[[], T],
              *, describe: Callable[[], dict] | None = None) -> T | None:
    """Run one row's step; answer its result, or None when it failed. A passing failure is logged;
    any other sets the row aside with an incident (`describe()` adds to its detail: the row's
    withdrawals, txid...). Never raises for the row's own failure."""
    try:
        return work()
    except Exception as exc:  # noqa: BLE001 - one row must not stop the others; recorded below
        if is_passing(exc):
            log.warning("%s %d: %s failed (%s); retried next run", machine, row_id, step.value, exc)
            return None
        log.exception("%s %d: %s failed; set aside", machine, row_id, step.value)
        set_aside(engine, machine, row_id, state=state, step=step, error=exc, detail=describe() if describe else None)
        return None


def set_aside(engine: Engine, machine: str, row_id: int, *, state: str, step: Step, error: BaseException,
              detail: dict | None = None) -> SetAside | None:
    """Set one row aside with an incident, in one database transaction. None when it is already set
    aside (another worker got there first)."""
    table = MACHINES[machine][0]
    severity = incident_severity(state, step)
    with engine.begin() as c:
        row = c.execute(text(f"SELECT containment, set_aside_count FROM {table} WHERE id = :i FOR UPDATE"),
                        {"i": row_id}).one()
        if row.containment != "active":
            return None
        count = row.set_aside_count + 1
        incident_id = open_incident(c, f"{machine}_set_aside", f"set_aside:{machine}:{row_id}:{count}", {
            "machine": machine, "id": row_id, "step": step.value,
            "state": state, "code": error_code(error), "error": str(error)[:500], "on_chain": severity == "critical",
            **(detail or {})}, severity=severity)
        advance(c, f"{machine}_containment", row_id, "active", "set_aside", set_aside_step=step.value,
                set_aside_incident_id=incident_id, set_aside_count=count)
        audit(c, "custody", f"{machine}.set_aside", f"{machine}:{row_id}",
              {"step": step.value, "code": error_code(error), "incident_id": incident_id, "severity": severity})
    return SetAside(machine, row_id, incident_id, severity)


@dataclass(frozen=True)
class Retried:
    machine: str
    row_id: int
    state: str
    step: str  # the step that had failed
    incident_id: int | None  # the incident that set it aside


def lock_set_aside(c: Connection, machine: str, row_id: int) -> Retried:
    """Lock a set-aside row for its retry, or raise `retry_unknown` / `retry_not_set_aside`."""
    if machine not in CONTAINED:
        raise ValueError(f"{machine} rows are never set aside")
    table = MACHINES[machine][0]
    row = c.execute(text(f"SELECT state, containment, set_aside_step, set_aside_incident_id FROM {table} "
                         "WHERE id = :i FOR UPDATE"), {"i": row_id}).first()
    if row is None:
        raise CustodyError(CustodyErrorCode.retry_unknown, f"no {machine} {row_id}", machine=machine, id=row_id)
    if row.containment != "set_aside":
        raise CustodyError(CustodyErrorCode.retry_not_set_aside, f"{machine} {row_id} is not set aside; nothing to retry",
                           machine=machine, id=row_id, state=row.state)
    return Retried(machine, row_id, row.state, row.set_aside_step, row.set_aside_incident_id)


def reactivate(c: Connection, machine: str, row_id: int, *, by: str, comment: str) -> Retried:
    """An operator retries a set-aside row once its cause is fixed: it is active again (audited),
    the incident that set it aside is resolved by that operator (a new failure opens a new one),
    and the next run of its job does the failed step again. In the caller's transaction. The kill
    switch a critical incident engaged stays engaged: releasing it is an admin's own decision."""
    retried = lock_set_aside(c, machine, row_id)
    advance(c, f"{machine}_containment", row_id, "set_aside", "active")
    c.execute(text("UPDATE incident SET resolved_at = now(), resolved_by = :b WHERE id = :i AND resolved_at IS NULL"),
              {"b": by, "i": retried.incident_id})
    audit(c, by, f"{machine}.retry", f"{machine}:{row_id}",
          {"state": retried.state, "step": retried.step, "incident_id": retried.incident_id, "comment": comment})
    log.info("%s %d retried by %s (was set aside at %s)", machine, row_id, by, retried.step)
    return retried


@dataclass(frozen=True)
class SetAsideRow:
    machine: str
    row_id: int
    state: str
    step: str | None
    incident_id: int | None
    times: int  # how often it was set aside


_SET_ASIDE_SQL = text(
    "SELECT 'batch' AS machine, id, state, set_aside_step, set_aside_incident_id, set_aside_count "
    "FROM withdrawal_batch WHERE containment = 'set_aside' "
    "UNION ALL SELECT 'sweep', id, state, set_aside_step, set_aside_incident_id, set_aside_count "
    "FROM sweep WHERE containment = 'set_aside' "
    "UNION ALL SELECT 'rebalance', id, state, set_aside_step, set_aside_incident_id, set_aside_count "
    "FROM rebalance WHERE containment = 'set_aside' "
    "UNION ALL SELECT 'cpfp', id, state, set_aside_step, set_aside_incident_id, set_aside_count "
    "FROM rebalance_cpfp WHERE containment = 'set_aside' "
    "ORDER BY machine, id")


def set_aside_rows(engine: Engine) -> list[SetAsideRow]:
    """Every set-aside batch, sweep and rebalance, for the operators' list."""
    with engine.connect() as c:
        return [SetAsideRow(r.machine, r.id, r.state, r.set_aside_step, r.set_aside_incident_id, r.set_aside_count)
                for r in c.execute(_SET_ASIDE_SQL)]


def retry(engine: Engine, machine: str, row_id: int, *, by: str, comment: str) -> Retried:
    """`reactivate` in its own database transaction (sweeps and rebalances)."""
    with engine.begin() as c:
        return reactivate(c, machine, row_id, by=by, comment=comment)
