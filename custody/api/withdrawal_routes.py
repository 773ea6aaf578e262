"""Withdrawal routes under /v1: request (backend), read, the approval queue and operator decisions."""
from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from custody.api.bodies import CommentIn
from custody.api.deps import Auditor, Backend, ContainerDep, Operator, Reader
from custody.api.errors import ApiError
from custody.api.params import Id, IdPath
from custody.withdrawals import WithdrawalView
from ledger.amounts import format_amount, parse_amount

router = APIRouter(prefix="/v1", tags=["withdrawals"])


class WithdrawalIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    client_withdrawal_id: str = Field(min_length=1, max_length=200)
    account_id: Id
    amount: str = Field(description='decimal string in the asset\'s units, e.g. "0.25"')
    destination: str = Field(min_length=1, max_length=200)
    priority: Literal["normal", "fast"] = "normal"


class AllowlistPolicyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["enforce", "review"]
    cooling_off_seconds: int = Field(default=0, ge=0, le=90 * 86400)
    approvals: int = Field(default=1, ge=1, le=10)


class AllowlistEntryIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    address: str = Field(min_length=1, max_length=200)


class WithdrawalOut(BaseModel):
    id: int
    client_withdrawal_id: str
    account_id: int
    asset: str
    amount: str
    fee_quoted: str
    destination: str
    priority: str
    state: str
    reject_reasons: list[str]
    batch_id: int | None


def _svc(c):
    if c.withdrawals is None:
        raise ApiError(503, "chains_not_configured", "withdrawals need chain adapters, which are not configured")
    return c.withdrawals


def _out(c, w: WithdrawalView) -> WithdrawalOut:
    d = c.ledger.get_asset(w.asset).decimals
    return WithdrawalOut(id=w.id, client_withdrawal_id=w.client_withdrawal_id, account_id=w.account_id, asset=w.asset,
                         amount=format_amount(w.amount, d), fee_quoted=format_amount(w.fee_quoted, d), destination=w.destination,
                         priority=w.priority, state=w.state, reject_reasons=list(w.reject_reasons), batch_id=w.batch_id)


@router.post("/withdrawals", response_model=WithdrawalOut, status_code=201)
def request_withdrawal(body: WithdrawalIn, c: ContainerDep, who: Backend, response: Response) -> WithdrawalOut:
    """Request a withdrawal; the same client_withdrawal_id for the same account answers 200."""
    account = c.ledger.get_account(body.account_id)
    amount = parse_amount(body.amount, c.ledger.get_asset(account.asset).decimals)
    w = _svc(c).request(client_withdrawal_id=body.client_withdrawal_id, account_id=body.account_id, amount=amount,
                        destination=body.destination, requested_by=f"api:{who.name}", priority=body.priority)
    if not w.created:
        response.status_code = 200
    return _out(c, w)


@router.get("/withdrawals/{withdrawal_id}", response_model=WithdrawalOut)
def get_withdrawal(withdrawal_id: IdPath, c: ContainerDep, _: Reader) -> WithdrawalOut:
    return _out(c, _svc(c).get(withdrawal_id))


@router.get("/withdrawals", response_model=list[WithdrawalOut])
def list_withdrawals(c: ContainerDep, _: Auditor, state: str = "pending_approval",
                     limit: int = Query(200, ge=1, le=1000)) -> list[WithdrawalOut]:
    """The approval queue by default (state=pending_approval)."""
    return [_out(c, w) for w in _svc(c).list(state=state, limit=limit)]


@router.post("/withdrawals/{withdrawal_id}/approve", response_model=WithdrawalOut)
def approve(withdrawal_id: IdPath, body: CommentIn, c: ContainerDep, who: Operator) -> WithdrawalOut:
    return _out(c, _svc(c).approve(withdrawal_id, operator=f"api:{who.name}", comment=body.comment))


@router.post("/withdrawals/{withdrawal_id}/reject", response_model=WithdrawalOut)
def reject(withdrawal_id: IdPath, body: CommentIn, c: ContainerDep, who: Operator) -> WithdrawalOut:
    return _out(c, _svc(c).reject(withdrawal_id, operator=f"api:{who.name}", comment=body.comment))


@router.put("/accounts/{account_id}/allowlist")
def set_allowlist(account_id: IdPath, body: AllowlistPolicyIn, c: ContainerDep, who: Backend) -> dict:
    """Turn on or change an account's destination allowlist (the backend relays the customer's choice)."""
    import datetime as dt

    _svc(c).set_allowlist(account_id, mode=body.mode, cooling_off=dt.timedelta(seconds=body.cooling_off_seconds),
                          approvals=body.approvals, by=f"api:{who.name}")
    return {"account_id": account_id, "mode": body.mode, "cooling_off_seconds": body.cooling_off_seconds,
            "approvals": body.approvals}


@router.post("/accounts/{account_id}/allowlist", status_code=201)
def allow_destination(account_id: IdPath, body: AllowlistEntryIn, c: ContainerDep, who: Backend) -> dict:
    return {"account_id": account_id, "address": _svc(c).allow_destination(account_id, body.address, by=f"api:{who.name}")}
