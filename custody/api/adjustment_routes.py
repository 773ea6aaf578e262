"""Treasury adjustment routes under /v1 (custody.adjustments): maker-checker journal entries.

- `POST /v1/treasury/adjustments` (operator): propose legs (any accounts, amounts as decimal strings
  in the debit account's asset) with a reason and an idempotency key (in the proposer's namespace);
  optionally the journal transaction it corrects. Nothing moves yet. A replay answers 200.
- `GET /v1/treasury/adjustments/{id}/approval-payload` (operator, auditor): what an operator signs
  to approve it (kind `adjustment-approval`: id, legs in order, reason, quorum, proposer).
- `POST /v1/treasury/adjustments/{id}/approve` (operator, never the proposer; body `{"comment",
  "signature"}` as for a withdrawal): a signed approval, verified against custody's approver keys
  (the key must be the caller's own). The one that completes the quorum answers the adjustment
  `approved` (short of it: still `proposed`), unless the ledger's dry run of the posting refuses it
  (its code; nothing recorded). The worker's `adjustments` job verifies the signatures again and
  posts it (`posted`).
- `POST /v1/treasury/adjustments/{id}/reject` (operator, with a comment): ends it unposted (while
  `proposed` or `approved`).
- `GET /v1/treasury/adjustments[?state=]` (newest first, paged: custody.api.paging), `GET /v1/treasury/adjustments/{id}` (auditor, operator).
"""
from __future__ import annotations

import base64
import datetime as dt
from typing import Literal

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from custody.adjustments import AdjustmentView, approval_payload
from custody.api.bodies import CommentIn
from custody.api.params import Id, IdPath
from custody.api.deps import Auditor, ContainerDep, OperatorOnly
from custody.api.errors import responses
from custody.api.ledger_schemas import Money
from custody.api.paging import PAGED, pager
from custody.api.withdrawal_routes import ApproveIn, _signature
from custody.container import Container
from custody.money_rules import caller_key
from ledger.amounts import parse_amount
from ledger.model import Transfer
from signer.approvals import b64url, webauthn_challenge

router = APIRouter(prefix="/v1/treasury", tags=["treasury"])
AdjustmentsPage = pager("adjustments", newest_first=True, default=200, maximum=1000)


class AdjustmentLegIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    debit_account_id: Id
    credit_account_id: Id
    amount: str = Field(min_length=1, max_length=100, description='decimal string in the asset\'s units, e.g. "0.5"')


class AdjustmentIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={'examples': [{'idempotency_key': 'adj-2026-11-fee-refund', 'reason': 'refund a fee charged twice, ticket 4713', 'transfers': [{'debit_account_id': 3, 'credit_account_id': 7, 'amount': '0.0001'}], 'corrects_transaction_id': 120}]})
    idempotency_key: str = Field(min_length=1, max_length=200)
    reason: str = Field(min_length=1, max_length=2000)
    transfers: list[AdjustmentLegIn] = Field(min_length=1, max_length=100)
    corrects_transaction_id: Id | None = None


class AdjustmentLegOut(BaseModel):
    debit_account_id: int
    credit_account_id: int
    amount: Money


class AdjustmentOut(BaseModel):
    id: int
    state: str
    proposed_by: str
    reason: str
    transfers: list[AdjustmentLegOut]
    corrects_transaction_id: int | None
    quorum: int
    approved_by: list[str]
    rejected_by: str | None
    transaction_id: int | None
    created_at: dt.datetime


class AdjustmentPayloadOut(BaseModel):
    """What an approver signs. `payload` is the exact text (UTF-8), `payload_base64` its bytes,
    `challenge` the WebAuthn challenge (base64url of SHA-256 of the bytes)."""

    adjustment_id: int
    state: str
    payload: str
    payload_base64: str
    challenge: str


def _out(c: Container, a: AdjustmentView) -> AdjustmentOut:
    legs = []
    for t in a.legs:
        decimals = c.ledger.get_asset(c.ledger.get_account(t.debit_account_id).asset).decimals
        legs.append(AdjustmentLegOut(debit_account_id=t.debit_account_id, credit_account_id=t.credit_account_id,
                                     amount=Money.of(t.amount, decimals)))
    return AdjustmentOut(id=a.id, state=a.state, proposed_by=a.proposed_by, reason=a.reason, transfers=legs,
                         corrects_transaction_id=a.corrects_transaction_id, quorum=a.quorum,
                         approved_by=list(a.approved_by), rejected_by=a.rejected_by, transaction_id=a.transaction_id,
                         created_at=a.created_at)


@router.post("/adjustments", response_model=AdjustmentOut, status_code=201,
    responses=responses("account_not_found", "transaction_not_found", "invalid_amount", "excess_precision", "accounts_must_be_different", "asset_mismatch", "idempotency_conflict", "conflict"))
def propose(body: AdjustmentIn, c: ContainerDep, who: OperatorOnly, response: Response) -> AdjustmentOut:
    legs = []
    for t in body.transfers:
        decimals = c.ledger.get_asset(c.ledger.get_account(t.debit_account_id).asset).decimals
        legs.append(Transfer(t.debit_account_id, t.credit_account_id, parse_amount(t.amount, decimals)))
    view = c.adjustments.propose(caller_key(who.name, body.idempotency_key), by=f"api:{who.name}", reason=body.reason,
                                 legs=legs, corrects_transaction_id=body.corrects_transaction_id)
    if not view.created:
        response.status_code = 200
    return _out(c, view)


@router.get("/adjustments/{adjustment_id}/approval-payload", response_model=AdjustmentPayloadOut,
    responses=responses("adjustment_not_found"))
def get_approval_payload(adjustment_id: IdPath, c: ContainerDep, _: Auditor) -> AdjustmentPayloadOut:
    """The canonical payload an approver signs for this adjustment."""
    view = c.adjustments.get(adjustment_id)
    payload = approval_payload(view)
    return AdjustmentPayloadOut(adjustment_id=adjustment_id, state=view.state,
                                payload=payload.decode("utf-8"), payload_base64=base64.b64encode(payload).decode("ascii"),
                                challenge=b64url(webauthn_challenge(payload)))


@router.post("/adjustments/{adjustment_id}/approve", response_model=AdjustmentOut,
    responses=responses("adjustment_not_found", "invalid_state", "proposer_cannot_approve", "approval_signature_required", "approval_signature_malformed", "approver_unknown", "approval_scheme_mismatch", "approval_signature_invalid", "approver_not_caller", "already_acted", "insufficient_funds", "limit_exceeded", "account_closed", "account_not_found", "accounts_must_be_different", "asset_mismatch", "idempotency_conflict", "conflict"))
def approve(adjustment_id: IdPath, body: ApproveIn, c: ContainerDep, who: OperatorOnly) -> AdjustmentOut:
    """Approve with the operator's own signature over `GET .../approval-payload` (see ApproveIn):
    `approved` once the quorum is reached (the worker then posts it), else still `proposed`."""
    return _out(c, c.adjustments.approve(adjustment_id, by=f"api:{who.name}", comment=body.comment,
                                         signature=_signature(body)))


@router.post("/adjustments/{adjustment_id}/reject", response_model=AdjustmentOut,
    responses=responses("adjustment_not_found", "invalid_state", "already_acted"))
def reject(adjustment_id: IdPath, body: CommentIn, c: ContainerDep, who: OperatorOnly) -> AdjustmentOut:
    return _out(c, c.adjustments.reject(adjustment_id, by=f"api:{who.name}", comment=body.comment))


@router.get("/adjustments", response_model=list[AdjustmentOut], responses=responses(*PAGED))
def list_adjustments(c: ContainerDep, _: Auditor, page: AdjustmentsPage,
                     state: Literal["proposed", "approved", "posted", "rejected"] | None = Query(default=None)) -> list[AdjustmentOut]:
    """Adjustments newest first (paged: `X-Next-Cursor`)."""
    rows = c.adjustments.list(state=state, before_id=page.key, limit=page.fetch)
    return [_out(c, a) for a in page.finish(rows, key=lambda a: a.id)]


@router.get("/adjustments/{adjustment_id}", response_model=AdjustmentOut,
    responses=responses("adjustment_not_found"))
def get_adjustment(adjustment_id: IdPath, c: ContainerDep, _: Auditor) -> AdjustmentOut:
    return _out(c, c.adjustments.get(adjustment_id))
