"""Withdrawal routes under /v1: request (backend), read, the approval queue and operator decisions;
destination allowlists (backend) and the operators' queue of allowlist loosenings.

An approval is signed: the approver reads `GET /v1/withdrawals/{id}/approval-payload` (the exact
bytes, their base64 and the WebAuthn challenge), signs them with their own key and sends the
signature with `POST /v1/withdrawals/{id}/approve` (codes in custody/errors.py, signer/approvals.py).
"""
from __future__ import annotations

import base64
import binascii
import datetime as dt
from typing import Literal

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from custody.api.bodies import CommentIn
from custody.api.params import Id, IdPath
from custody.api.deps import Auditor, Backend, ContainerDep, OperatorOnly, Reader
from custody.api.errors import ApiError, responses
from custody.api.ledger_schemas import Money
from custody.api.paging import PAGED, pager
from custody.errors import CustodyError, CustodyErrorCode
from custody.withdrawals import AllowlistChangeView, AllowlistView, ApprovalPayloadView, WithdrawalView
from signer.approvals import ApprovalSignature, b64url, format_expiry, webauthn_challenge
from ledger.amounts import format_amount, parse_amount

router = APIRouter(prefix="/v1", tags=["withdrawals"])
WithdrawalsPage = pager("withdrawals", newest_first=False, default=200, maximum=1000)
AllowlistChangesPage = pager("allowlist-changes", newest_first=False, default=200, maximum=1000)


class WithdrawalIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={'examples': [{'client_withdrawal_id': 'alice-w-0001', 'account_id': 7, 'amount': '0.25', 'destination': 'bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080', 'priority': 'normal'}]})
    client_withdrawal_id: str = Field(min_length=1, max_length=200)
    account_id: Id
    amount: str = Field(description='decimal string in the asset\'s units, e.g. "0.25"')
    destination: str = Field(min_length=1, max_length=200)
    priority: Literal["normal", "fast"] = "normal"


class AllowlistPolicyIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={'examples': [{'mode': 'enforce', 'cooling_off_seconds': 86400, 'approvals': 1}]})
    mode: Literal["enforce", "review"]
    cooling_off_seconds: int = Field(default=0, ge=0, le=90 * 86400)
    approvals: int = Field(default=1, ge=1, le=10)


class AllowlistEntryIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={'examples': [{'address': 'bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080'}]})
    address: str = Field(min_length=1, max_length=200)


class AllowlistChangeOut(BaseModel):
    id: int
    account_id: int
    mode: str
    cooling_off_seconds: int
    approvals: int
    loosens: list[str]
    requested_by: str
    requested_at: str
    state: str
    decided_by: str | None
    decided_at: str | None
    comment: str | None


class AllowlistOut(BaseModel):
    """The rule in force now (mode null: no allowlist) and the loosening waiting for an operator."""

    account_id: int
    mode: str | None
    cooling_off_seconds: int
    approvals: int
    version: int
    pending_change: AllowlistChangeOut | None


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
    decision_reasons: list[str] = Field(default_factory=list, description="why the decision needs operators (or rejected)")
    batch_id: int | None
    hold_id: int | None = Field(description="the ledger hold on amount + fee_quoted (`GET /v1/holds/{hold_id}`); "
                                            "null until it is placed")
    amounts: dict[str, Money] = Field(description="`amount` and `fee_quoted` as {value, minor}")


class DestinationRemovedOut(BaseModel):
    account_id: int
    address: str
    removed: bool


class DestinationAllowedOut(BaseModel):
    account_id: int
    address: str


class ApprovalSignatureIn(BaseModel):
    """The approver's signature over the approval payload: Ed25519 over the payload bytes, or a
    WebAuthn assertion whose challenge is SHA-256 of them (with its authenticator data and client
    data JSON). Binary fields are standard base64."""

    model_config = ConfigDict(extra="forbid")
    key_id: str = Field(min_length=1, max_length=200)
    scheme: Literal["ed25519", "webauthn"]
    signature: str = Field(min_length=1, max_length=4096)
    authenticator_data: str | None = Field(default=None, max_length=4096)
    client_data_json: str | None = Field(default=None, max_length=16384)


class ApproveIn(BaseModel):
    """An operator's approval: the comment for the audit log and their signature (required; a
    missing one is `approval_signature_required`)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={'examples': [{'comment': 'destination confirmed with the customer', 'signature': {'key_id': 'ops-anna-ed25519', 'scheme': 'ed25519', 'signature': 'c2lnbmF0dXJlIGJ5dGVzIGluIGJhc2U2NA=='}}]})
    comment: str = Field(min_length=1, max_length=1000)
    signature: ApprovalSignatureIn | None = None


class ApprovalPayloadOut(BaseModel):
    """What an approver signs. `payload` is the exact text (UTF-8), `payload_base64` its bytes,
    `challenge` the WebAuthn challenge (base64url of SHA-256 of the bytes); the other fields are
    what the payload states, for a person to read before signing."""

    withdrawal_id: int
    decision_id: int
    state: str
    chain: str
    asset: str
    amount: str = Field(description="decimal string in the asset's units (the payload states minor units)")
    amount_minor: str
    destination: str
    policy_version: str
    expires_at: str
    payload: str
    payload_base64: str
    challenge: str


def _bytes(value: str | None, what: str) -> bytes | None:
    if value is None:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise CustodyError(CustodyErrorCode.approval_signature_malformed, f"{what} is not valid base64") from None


def _signature(body: ApproveIn) -> ApprovalSignature | None:
    return signature_of(body.signature)


def signature_of(s: ApprovalSignatureIn | None) -> ApprovalSignature | None:
    """The typed signature of a request's `signature` object (binary fields decoded)."""
    if s is None:
        return None
    return ApprovalSignature(s.key_id, s.scheme, _bytes(s.signature, "signature") or b"",
                             _bytes(s.authenticator_data, "authenticator_data"), _bytes(s.client_data_json, "client_data_json"))


def _svc(c):
    if c.withdrawals is None:
        raise ApiError(503, "chains_not_configured", "withdrawals need chain adapters, which are not configured")
    return c.withdrawals


def _out(c, w: WithdrawalView) -> WithdrawalOut:
    d = c.ledger.get_asset(w.asset).decimals
    return WithdrawalOut(id=w.id, client_withdrawal_id=w.client_withdrawal_id, account_id=w.account_id, asset=w.asset,
                         amount=format_amount(w.amount, d), fee_quoted=format_amount(w.fee_quoted, d), destination=w.destination,
                         priority=w.priority, state=w.state, reject_reasons=list(w.reject_reasons),
                         decision_reasons=list(w.decision_reasons), batch_id=w.batch_id, hold_id=w.hold_id,
                         amounts={"amount": Money.of(w.amount, d), "fee_quoted": Money.of(w.fee_quoted, d)})


NO_CHAINS = ("chains_not_configured",)
DECIDE = ("withdrawal_not_found", "invalid_state", "already_acted", "decision_expired", "requester_cannot_approve",
          "withdrawals_halted", *NO_CHAINS)
ALLOWLIST = ("account_not_found", "kind_not_permitted", *NO_CHAINS)


@router.post("/withdrawals", response_model=WithdrawalOut, status_code=201,
    responses=responses("account_not_found", "invalid_amount", "excess_precision", "withdrawals_halted", "invalid_destination", "destination_zero_address", "destination_burn_address", "destination_precompile", "destination_token_contract", "destination_internal", "destination_contract_not_allowlisted", "destination_would_revert", "asset_not_withdrawable", "withdrawal_rejected", "insufficient_funds", "account_frozen", "account_closed", "kind_not_permitted", "idempotency_conflict", "conflict", "node_unavailable", "wrong_network", *NO_CHAINS))
def request_withdrawal(body: WithdrawalIn, c: ContainerDep, who: Backend, response: Response) -> WithdrawalOut:
    """Request a withdrawal; the same client_withdrawal_id for the same account answers 200."""
    account = c.ledger.get_account(body.account_id)
    amount = parse_amount(body.amount, c.ledger.get_asset(account.asset).decimals)
    w = _svc(c).request(client_withdrawal_id=body.client_withdrawal_id, account_id=body.account_id, amount=amount,
                        destination=body.destination, requested_by=f"api:{who.name}", priority=body.priority)
    if not w.created:
        response.status_code = 200
    return _out(c, w)


@router.get("/withdrawals/{withdrawal_id}", response_model=WithdrawalOut,
    responses=responses("withdrawal_not_found", *NO_CHAINS))
def get_withdrawal(withdrawal_id: IdPath, c: ContainerDep, _: Reader) -> WithdrawalOut:
    return _out(c, _svc(c).get(withdrawal_id))


@router.get("/withdrawals", response_model=list[WithdrawalOut],
    responses=responses(*PAGED, *NO_CHAINS))
def list_withdrawals(c: ContainerDep, _: Auditor, page: WithdrawalsPage,
                     state: str = Query("pending_approval", max_length=64)) -> list[WithdrawalOut]:
    """The approval queue by default (state=pending_approval), oldest first (paged: `X-Next-Cursor`)."""
    rows = _svc(c).list(state=state, after_id=page.key, limit=page.fetch)
    return [_out(c, w) for w in page.finish(rows, key=lambda w: w.id)]


@router.get("/withdrawals/{withdrawal_id}/approval-payload", response_model=ApprovalPayloadOut,
    responses=responses("withdrawal_not_found", "invalid_state", *NO_CHAINS))
def approval_payload(withdrawal_id: IdPath, c: ContainerDep, _: Auditor) -> ApprovalPayloadOut:
    """The canonical payload an approver signs for this withdrawal under its current decision."""
    p: ApprovalPayloadView = _svc(c).approval_payload(withdrawal_id)
    return ApprovalPayloadOut(
        withdrawal_id=p.withdrawal_id, decision_id=p.decision_id, state=p.state, chain=p.chain, asset=p.asset,
        amount=format_amount(p.amount, c.ledger.get_asset(p.asset).decimals), amount_minor=str(p.amount),
        destination=p.destination, policy_version=p.policy_version, expires_at=format_expiry(p.expires_at),
        payload=p.payload.decode("utf-8"), payload_base64=base64.b64encode(p.payload).decode("ascii"),
        challenge=b64url(webauthn_challenge(p.payload)))


@router.post("/withdrawals/{withdrawal_id}/approve", response_model=WithdrawalOut,
    responses=responses(*DECIDE, "approval_signature_required", "approval_signature_malformed", "approver_unknown", "approval_scheme_mismatch", "approval_signature_invalid", "approver_not_caller"))
def approve(withdrawal_id: IdPath, body: ApproveIn, c: ContainerDep, who: OperatorOnly) -> WithdrawalOut:
    """Approve with the operator's own signature over `GET .../approval-payload` (see ApproveIn)."""
    return _out(c, _svc(c).approve(withdrawal_id, operator=f"api:{who.name}", comment=body.comment,
                                   signature=_signature(body)))


@router.post("/withdrawals/{withdrawal_id}/reject", response_model=WithdrawalOut,
    responses=responses(*DECIDE))
def reject(withdrawal_id: IdPath, body: CommentIn, c: ContainerDep, who: OperatorOnly) -> WithdrawalOut:
    return _out(c, _svc(c).reject(withdrawal_id, operator=f"api:{who.name}", comment=body.comment))


def _change_out(ch: AllowlistChangeView) -> AllowlistChangeOut:
    return AllowlistChangeOut(id=ch.id, account_id=ch.account_id, mode=ch.mode, cooling_off_seconds=int(ch.cooling_off.total_seconds()),
                              approvals=ch.approvals, loosens=list(ch.loosens), requested_by=ch.requested_by,
                              requested_at=ch.requested_at.isoformat(), state=ch.state, decided_by=ch.decided_by,
                              decided_at=ch.decided_at.isoformat() if ch.decided_at else None, comment=ch.comment)


def _allowlist_out(a: AllowlistView) -> AllowlistOut:
    return AllowlistOut(account_id=a.account_id, mode=a.mode, cooling_off_seconds=int(a.cooling_off.total_seconds()),
                        approvals=a.approvals, version=a.version, pending_change=_change_out(a.pending) if a.pending else None)


@router.put("/accounts/{account_id}/allowlist", response_model=AllowlistOut,
    responses=responses(*ALLOWLIST, "kind_not_permitted"))
def set_allowlist(account_id: IdPath, body: AllowlistPolicyIn, c: ContainerDep, who: Backend, response: Response) -> AllowlistOut:
    """Turn on or change an account's destination allowlist (the backend relays the customer's choice).
    What tightens applies at once (200); what loosens waits for an operator (202, `pending_change`)."""
    view = _svc(c).set_allowlist(account_id, mode=body.mode, cooling_off=dt.timedelta(seconds=body.cooling_off_seconds),
                                 approvals=body.approvals, by=f"api:{who.name}")
    if view.pending is not None:
        response.status_code = 202
    return _allowlist_out(view)


@router.get("/accounts/{account_id}/allowlist", response_model=AllowlistOut,
    responses=responses(*ALLOWLIST))
def get_allowlist(account_id: IdPath, c: ContainerDep, _: Reader) -> AllowlistOut:
    return _allowlist_out(_svc(c).allowlist(account_id))


@router.delete("/accounts/{account_id}/allowlist/{address}", response_model=DestinationRemovedOut,
               responses=responses(*ALLOWLIST, "kind_not_permitted"))
def remove_destination(account_id: IdPath, address: str, c: ContainerDep, who: Backend) -> dict:
    """Take a destination off the allowlist (a tightening: at once)."""
    return {"account_id": account_id, "address": address,
            "removed": _svc(c).remove_destination(account_id, address, by=f"api:{who.name}")}


@router.get("/allowlist-changes", response_model=list[AllowlistChangeOut],
    responses=responses(*PAGED, *NO_CHAINS))
def allowlist_changes(c: ContainerDep, _: Auditor, page: AllowlistChangesPage,
                      state: Literal["pending", "approved", "rejected", "superseded"] = "pending") -> list[AllowlistChangeOut]:
    """The operators' queue of allowlist loosenings (pending by default), oldest first (paged: `X-Next-Cursor`)."""
    rows = _svc(c).allowlist_changes(state=state, after_id=page.key, limit=page.fetch)
    return [_change_out(ch) for ch in page.finish(rows, key=lambda ch: ch.id)]


@router.post("/allowlist-changes/{change_id}/approve", response_model=AllowlistChangeOut,
    responses=responses("allowlist_change_not_found", "invalid_state", "requester_cannot_approve", "already_acted", *NO_CHAINS))
def approve_allowlist_change(change_id: IdPath, body: CommentIn, c: ContainerDep, who: OperatorOnly) -> AllowlistChangeOut:
    """Operator decision: the loosening takes effect (entries already added keep their cooling-off)."""
    return _change_out(_svc(c).approve_allowlist_change(change_id, operator=f"api:{who.name}", comment=body.comment))


@router.post("/allowlist-changes/{change_id}/reject", response_model=AllowlistChangeOut,
    responses=responses("allowlist_change_not_found", "invalid_state", "already_acted", *NO_CHAINS))
def reject_allowlist_change(change_id: IdPath, body: CommentIn, c: ContainerDep, who: OperatorOnly) -> AllowlistChangeOut:
    return _change_out(_svc(c).reject_allowlist_change(change_id, operator=f"api:{who.name}", comment=body.comment))


@router.post("/accounts/{account_id}/allowlist", status_code=201, response_model=DestinationAllowedOut,
             responses=responses(*ALLOWLIST, "kind_not_permitted", "invalid_destination", "destination_zero_address",
                                 "destination_burn_address", "destination_precompile", "destination_token_contract",
                                 "destination_internal", "invalid_state"))
def allow_destination(account_id: IdPath, body: AllowlistEntryIn, c: ContainerDep, who: Backend) -> dict:
    return {"account_id": account_id, "address": _svc(c).allow_destination(account_id, body.address, by=f"api:{who.name}")}
