"""Containment routes under /v1: what is set aside, and the operator's retry (custody.containment).

A withdrawal batch, sweep or rebalance whose signing or booking failed is set aside: its jobs skip
it, and an incident (critical once its transaction is on chain, which halts withdrawals) says why.
Once the cause is fixed, an operator retries it:

- `GET /v1/set-aside` (auditor, operator): every set-aside batch, sweep and rebalance, with the
  step that failed and its incident.
- `POST /v1/withdrawal-batches/{id}/retry`, `POST /v1/sweeps/{id}/retry`,
  `POST /v1/rebalances/{id}/retry` (operator, with a comment; audited): the row is active again.
  A batch set aside before it was signed is abandoned and its withdrawals are batched again under
  a new id; any other row's failed step runs again on its job's next run, and books exactly once.
  Unknown id: `retry_unknown` (404); not set aside: `retry_not_set_aside` (409).
The retry resolves the incident that set the row aside (in the operator's name; a new failure
opens a new one); releasing the kill switch a critical one engaged stays an admin's decision
(`POST /v1/kill-switch`).
"""
from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from custody.api.bodies import CommentIn
from custody.api.deps import Auditor, ContainerDep, OperatorOnly
from custody.api.params import IdPath
from custody.api.errors import ApiError, responses
from custody.api.paging import PAGED, pager
from custody.containment import Retried, set_aside_rows

router = APIRouter(prefix="/v1", tags=["containment"])
SetAsidePage = pager("set-aside", newest_first=False, default=1000, maximum=1000, key_type=tuple)


class RetriedOut(BaseModel):
    kind: str  # batch, sweep or rebalance
    id: int
    state: str  # as it was when set aside ("open" for a batch means: abandoned now, withdrawals re-batched)
    failed_step: str  # sign, broadcast, track or bump
    incident_id: int | None
    containment: str  # "active" after a retry


class SetAsideOut(BaseModel):
    kind: str
    id: int
    state: str
    failed_step: str | None
    incident_id: int | None
    times_set_aside: int


def _out(r: Retried) -> RetriedOut:
    return RetriedOut(kind=r.machine, id=r.row_id, state=r.state, failed_step=r.step, incident_id=r.incident_id,
                      containment="active")


def _require(service: object, what: str) -> object:
    if service is None:
        raise ApiError(503, "chains_not_configured", f"{what} need chain adapters, which are not configured")
    return service


@router.get("/set-aside", response_model=list[SetAsideOut], responses=responses(*PAGED))
def list_set_aside(c: ContainerDep, _: Auditor, page: SetAsidePage) -> list[SetAsideOut]:
    """Set-aside batches, sweeps and rebalances by kind, then id (paged: `X-Next-Cursor`)."""
    rows = page.slice(set_aside_rows(c.engine), key=lambda r: (r.machine, r.row_id))
    return [SetAsideOut(kind=r.machine, id=r.row_id, state=r.state, failed_step=r.step, incident_id=r.incident_id,
                        times_set_aside=r.times) for r in rows]


@router.post("/withdrawal-batches/{batch_id}/retry", response_model=RetriedOut,
    responses=responses("retry_unknown", "retry_not_set_aside", "chains_not_configured"))
def retry_batch(batch_id: IdPath, body: CommentIn, c: ContainerDep, who: OperatorOnly) -> RetriedOut:
    """Operator decision: the cause of a set-aside withdrawal batch is fixed; work on it again."""
    return _out(_require(c.payouts, "withdrawal batches").retry_batch(batch_id, by=f"api:{who.name}", comment=body.comment))


@router.post("/sweeps/{sweep_id}/retry", response_model=RetriedOut,
    responses=responses("retry_unknown", "retry_not_set_aside", "chains_not_configured"))
def retry_sweep(sweep_id: IdPath, body: CommentIn, c: ContainerDep, who: OperatorOnly) -> RetriedOut:
    """Operator decision: the cause of a set-aside sweep is fixed; work on it again."""
    return _out(_require(c.sweeps, "sweeps").retry(sweep_id, by=f"api:{who.name}", comment=body.comment))


@router.post("/rebalances/{rebalance_id}/retry", response_model=RetriedOut,
    responses=responses("retry_unknown", "retry_not_set_aside", "chains_not_configured"))
def retry_rebalance(rebalance_id: IdPath, body: CommentIn, c: ContainerDep, who: OperatorOnly) -> RetriedOut:
    """Operator decision: the cause of a set-aside rebalance is fixed; work on it again."""
    return _out(_require(c.rebalances, "rebalances").retry(rebalance_id, by=f"api:{who.name}", comment=body.comment))
