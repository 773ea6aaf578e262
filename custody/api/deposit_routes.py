"""Deposit routes under /v1: deposit addresses, deposits per account, the quarantine queue and its
release action, incidents and the kill switch."""
from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

from custody.api.bodies import CommentIn
from custody.api.deps import Auditor, Backend, ContainerDep, Operator, OperatorOnly, Reader
from custody.api.errors import ApiError, responses
from custody.api.ledger_schemas import Money
from custody.api.paging import PAGED, pager
from custody.api.params import Id, IdPath, IdQuery
from custody.auth import Role
from custody.controls import kill_switch, set_kill_switch
from custody.money_rules import caller_key
from custody.trading import attach
from custody.incidents import Incidents, IncidentView
from ledger.amounts import format_amount

router = APIRouter(prefix="/v1", tags=["deposits"])
AccountDepositsPage = pager("account-deposits", newest_first=True, default=200, maximum=1000)
DepositsPage = pager("deposits", newest_first=True, default=200, maximum=1000)
IncidentsPage = pager("incidents", newest_first=True, default=500, maximum=1000)


class AddressIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={'examples': [{'idempotency_key': 'alice-btc-address-1', 'account_id': 7}]})
    idempotency_key: str = Field(min_length=1, max_length=200)
    account_id: Id


class AddressOut(BaseModel):
    id: int
    chain: str
    address: str
    derivation_index: int
    account_id: int


class DepositOut(BaseModel):
    id: int
    chain: str
    asset: str
    txid: str
    index: int
    address: str
    amount: str
    amount_minor: str
    state: str
    confirmations: int
    block_height: int
    account_id: int
    journal_transaction_id: int | None
    amounts: dict[str, Money] = Field(description="`amount` as {value, minor}")


class DepositReturnOut(BaseModel):
    deposit_id: int
    withdrawal_id: int
    state: str
    decision_reasons: list[str]


class IncidentOut(BaseModel):
    id: int
    kind: str
    severity: str
    detail: dict[str, Any]
    opened_at: dt.datetime
    resolved_at: dt.datetime | None
    resolved_by: str | None
    resolution: dict[str, Any] | None = Field(description="the operator's comment and what the resolution did")


class ReconciliationLineOut(BaseModel):
    """One location of one asset: what the chain holds against what the books say. The bare integers
    are minor units (kept for existing clients); `amounts` gives each as {value, minor}."""

    chain: str
    asset: str
    tier: str
    on_chain: int
    books: int
    in_transit: int
    booked_off_chain: int
    observed_late: int
    observation_mark: int
    node: int | None = Field(None, description="bitcoin: the node's own figure for the tier (its watch-only wallet, read "
                                               "at the same block), beside `on_chain` (custody's wallet index); null when "
                                               "the node's view could not be read at that block")
    difference: int
    amounts: dict[str, Money] = Field(description="on_chain, books, in_transit, booked_off_chain, observed_late, "
                                                  "difference as {value, minor}")


class KillSwitchOut(BaseModel):
    engaged: bool
    reason: str
    changed_by: str


class ReserveAddressOut(BaseModel):
    address: str
    amount: str = Field(description="minor units held at the report's block, as stated in `message`")
    message: str = Field(description="the statement signed (signer.protocol.ReservesStatement)")
    signature: str = Field(description="BIP-322 simple (`smp` + base64, bitcoin) or EIP-191 personal_sign (0x + 65 bytes hex, ethereum)")
    format: str = Field(description="`bip322-simple` or `eip191-personal-sign`")
    amounts: dict[str, Money]


class ReserveLedgerOut(BaseModel):
    last_transaction_id: int
    transactions: int
    journal_digest: str = Field(description="SHA-256 over '<id> <content_hash>\\n' of every journal transaction in id order")
    checks_passed: list[str]


class ReserveLiabilitiesOut(BaseModel):
    root_hash: str
    total: str = Field(description="minor units")
    accounts: int
    leaves: int
    leaves_per_account: int
    amounts: dict[str, Money]


class ReserveHoldingsOut(BaseModel):
    total: str = Field(description="minor units")
    addresses: list[ReserveAddressOut]
    amounts: dict[str, Money]


class ReserveReportOut(BaseModel):
    version: int
    report_id: int
    asset: str
    chain: str
    network: str
    contract: str | None
    height: int
    block_hash: str
    ledger: ReserveLedgerOut
    liabilities: ReserveLiabilitiesOut
    holdings: ReserveHoldingsOut
    disclaimer: str


class ReserveRequestIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={'examples': [{'idempotency_key': 'reserves-2026-12-01'}]})
    idempotency_key: str = Field(min_length=1, max_length=200)
    assets: list[str] | None = Field(default=None, min_length=1, max_length=100,
                                     description="the assets to report (default: every asset of a configured chain with a "
                                                 "customer account)")


class ReserveErrorOut(BaseModel):
    code: str
    message: str


class ReserveJobOut(BaseModel):
    """One requested report: `building` (the worker's progress: leaves hashed of the total, null
    until the build has read the ledger; the last attempt's failure in `error`), then `published`
    (its `report`) or `failed` (`error` says why; request it again under a new key)."""

    report_id: int
    asset: str
    state: Literal["building", "published", "failed"]
    leaves_built: int
    leaves_total: int | None
    attempts: int
    error: ReserveErrorOut | None
    requested_by: str
    requested_at: dt.datetime
    updated_at: dt.datetime
    published_at: dt.datetime | None
    report: ReserveReportOut | None = Field(description="the published report (what the customer's verifier reads); null "
                                                          "before, and for a version-1 report (before migration 0036)")


class ReserveRequestOut(BaseModel):
    created: bool = Field(description="false: the key was used before for the same assets; these are its reports")
    reports: list[ReserveJobOut] = Field(description="one per asset, all built from one ledger snapshot")


class ProofNodeOut(BaseModel):
    hash: str
    sum: str


class ProofLeafOut(BaseModel):
    index: int
    amount: str = Field(description="minor units: this leaf's piece of the balance")
    nonce: str
    steps: list[ProofNodeOut] = Field(description="the sibling of each level, leaf upwards (its side follows from `index`)")


class ReserveProofOut(BaseModel):
    version: int
    report_id: int
    asset: str
    account_id: int
    balance: str = Field(description="minor units: the sum of the account's leaves")
    leaf_count: int
    root: ProofNodeOut
    leaves: list[ProofLeafOut]
    amounts: dict[str, Money] = Field(description="`balance` as {value, minor}")


class ReasonIn(CommentIn):
    """A deposit decision's comment: it must say something (not only whitespace), as the audit
    log records why money was released or returned."""

    comment: str = Field(min_length=1, max_length=1000, pattern=r"\S")


class ReturnIn(ReasonIn):
    model_config = ConfigDict(json_schema_extra={'examples': [{'comment': 'sender asked for it back, ticket 4712', 'destination': 'bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080'}]})
    destination: str | None = Field(default=None, max_length=200, description="default: the deposit's single sender")


class ResolveIn(CommentIn):
    model_config = ConfigDict(json_schema_extra={'examples': [{'comment': 'deposit re-mined in block 812; release', 'decision': 'release'}]})
    decision: Literal["release", "capture"] | None = Field(
        default=None, description="for an incident that holds money: release it to the customer or capture it to suspense")


class KillSwitchIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={'examples': [{'engaged': True, 'reason': 'reconciliation difference on the BTC hot wallet'}]})
    engaged: bool
    reason: str = Field(min_length=1, max_length=1000)


def _deposits(c):
    if c.deposits is None:
        raise ApiError(503, "chains_not_configured", "no chain adapters are configured on this service")
    return c.deposits


def _out(c, row: dict) -> DepositOut:
    decimals = c.ledger.get_asset(row["asset"]).decimals
    return DepositOut(id=row["id"], chain=row["chain"], asset=row["asset"], txid=row["txid"], index=row["output_index"],
                      address=row["address"], amount=format_amount(int(row["amount"]), decimals), amount_minor=str(row["amount"]),
                      state=row["state"], confirmations=row["confirmations"], block_height=row["block_height"],
                      account_id=row["account_id"], journal_transaction_id=row["journal_transaction_id"],
                      amounts={"amount": Money.of(int(row["amount"]), decimals)})


def _money(c, asset: str, figures: dict[str, Any]) -> dict[str, Money]:
    decimals = c.ledger.get_asset(asset).decimals
    return {name: Money.of(int(v), decimals) for name, v in figures.items()}


NO_CHAINS = ("chains_not_configured",)


@router.post("/deposit-addresses", response_model=AddressOut, status_code=201,
             responses=responses("account_not_found", "kind_not_permitted", "asset_not_withdrawable", "invalid_request",
                                 "idempotency_conflict", "conflict", *NO_CHAINS))
def issue_address(body: AddressIn, c: ContainerDep, who: Backend, response: Response) -> AddressOut:
    """The next deposit address for a customer account; the same key (in the caller's namespace,
    like every idempotency key sent over the API) returns the same address."""
    a = c.wallets.issue_address(caller_key(who.name, body.idempotency_key), body.account_id)
    if not a.created:
        response.status_code = 200
    return AddressOut(id=a.id, chain=a.chain, address=a.address, derivation_index=a.derivation_index, account_id=a.account_id)


@router.get("/accounts/{account_id}/deposits", response_model=list[DepositOut],
            responses=responses("account_not_found", *PAGED, *NO_CHAINS))
def account_deposits(account_id: IdPath, c: ContainerDep, _: Reader, page: AccountDepositsPage) -> list[DepositOut]:
    """The account's deposits, newest first (paged: `X-Next-Cursor`)."""
    c.ledger.get_account(account_id)
    rows = _deposits(c).list(account_id=account_id, before_id=page.key, limit=page.fetch)
    return [_out(c, r) for r in page.finish(rows, key=lambda r: r["id"])]


@router.get("/deposits", response_model=list[DepositOut], responses=responses(*PAGED, *NO_CHAINS))
def deposits_by_state(
    c: ContainerDep, _: Auditor, page: DepositsPage,
    state: Literal["seen", "confirming", "final", "credited", "orphaned", "quarantined", "released", "dust"] = "quarantined",
) -> list[DepositOut]:
    """Deposits in one state, newest first (paged: `X-Next-Cursor`)."""
    rows = _deposits(c).list(state=state, before_id=page.key, limit=page.fetch)
    return [_out(c, r) for r in page.finish(rows, key=lambda r: r["id"])]


@router.post("/deposits/{deposit_id}/release", response_model=DepositOut,
             responses=responses("deposit_not_found", "invalid_state", "deposit_reorged_out", *NO_CHAINS))
def release(deposit_id: IdPath, body: ReasonIn, c: ContainerDep, who: OperatorOnly) -> DepositOut:
    """Operator decision: credit a quarantined deposit to its customer (recorded in the audit log)."""
    _deposits(c).release_quarantined(deposit_id, operator=f"api:{who.name}", comment=body.comment)
    return _out(c, next(r for r in c.deposits.list(state="released", limit=1000) if r["id"] == deposit_id))


@router.post("/deposits/{deposit_id}/return", response_model=DepositReturnOut,
             responses=responses("deposit_not_found", "invalid_state", "deposit_reorged_out", "invalid_destination",
                                 "destination_internal", "withdrawals_halted", "withdrawal_rejected", "account_frozen",
                                 "insufficient_funds", "node_unavailable", "wrong_network", *NO_CHAINS))
def return_deposit(deposit_id: IdPath, body: ReturnIn, c: ContainerDep, who: OperatorOnly) -> DepositReturnOut:
    """Operator request: send a quarantined deposit back (a withdrawal from the quarantine account,
    subject to policy; it always waits for operators other than this one, and a destination other
    than the original sender is flagged in `decision_reasons`). Answers the withdrawal id."""
    if c.withdrawals is None:
        raise ApiError(503, "chains_not_configured", "no chain adapters are configured on this service")
    wid = _deposits(c).return_quarantined(deposit_id, operator=f"api:{who.name}", comment=body.comment,
                                          withdrawals=c.withdrawals, destination=body.destination)
    w = c.withdrawals.get(wid)
    return DepositReturnOut(deposit_id=deposit_id, withdrawal_id=wid, state=w.state, decision_reasons=list(w.decision_reasons))


def _incident_out(i: IncidentView) -> IncidentOut:
    return IncidentOut(id=i.id, kind=i.kind, severity=i.severity, detail=i.detail, opened_at=i.opened_at,
                       resolved_at=i.resolved_at, resolved_by=i.resolved_by, resolution=i.resolution)


@router.get("/incidents", response_model=list[IncidentOut], responses=responses(*PAGED))
def incidents(c: ContainerDep, _: Auditor, page: IncidentsPage, open_only: bool = True) -> list[IncidentOut]:
    """Incidents newest first, only unresolved ones unless `open_only=false` (paged: `X-Next-Cursor`)."""
    rows = Incidents(c.engine, c.ledger).list(open_only=open_only, before_id=page.key, limit=page.fetch)
    return [_incident_out(i) for i in page.finish(rows, key=lambda i: i.id)]


@router.post("/incidents/{incident_id}/resolve", response_model=IncidentOut,
             responses=responses("incident_not_found", "incident_decision_invalid", "incident_remainder_held",
                                 "invalid_state", "hold_not_found", "hold_already_resolved", "order_not_found",
                                 "order_not_open", "market_not_found"))
def resolve_incident(incident_id: IdPath, body: ResolveIn, c: ContainerDep, who: OperatorOnly) -> IncidentOut:
    """Operator decision: close an incident with a comment (audited); one that froze a reorged-out
    credit needs `decision` release or capture. The kill switch stays as it is."""
    trading = attach(c)
    i = Incidents(c.engine, c.ledger).resolve(incident_id, operator=f"api:{who.name}", comment=body.comment,
                                              decision=body.decision,
                                              cancel_order=lambda symbol, owner, order_id: trading.cancel(symbol, owner, order_id))
    return _incident_out(i)


@router.post("/reconciliation", response_model=list[ReconciliationLineOut],
             responses=responses("node_unavailable", "wrong_network", *NO_CHAINS))
def reconcile(c: ContainerDep, _: Operator) -> list[ReconciliationLineOut]:
    """Run a reconciliation pass now (every bitcoin and ethereum location, per asset) and answer its
    lines; a difference also opens an incident and engages the kill switch, so it is an operator's
    action (auditors read the incidents)."""
    if c.reconciliation is None:
        raise ApiError(503, "chains_not_configured", "no chain adapters are configured on this service")
    out = []
    # prepare=False: recording coins and walking blocks are the worker's (custody_api may not write
    # them, migration 0022); in the deployed api the hook is absent anyway (custody.roots.common)
    for line in c.reconciliation.run(prepare=False):
        figures = {k: getattr(line, k) for k in ("on_chain", "books", "in_transit", "booked_off_chain", "observed_late")}
        out.append(ReconciliationLineOut(**line.__dict__, difference=line.difference,
                                         amounts=_money(c, line.asset, {**figures, "difference": line.difference})))
    return out


def _report_out(c, report: dict) -> ReserveReportOut:
    asset = report["asset"]
    liabilities, holdings = report["liabilities"], report["holdings"]
    return ReserveReportOut(**{
        **report,
        "liabilities": {**liabilities, "amounts": _money(c, asset, {"total": liabilities["total"]})},
        "holdings": {**holdings, "amounts": _money(c, asset, {"total": holdings["total"]}),
                     "addresses": [{**a, "amounts": _money(c, asset, {"amount": a["amount"]})} for a in holdings["addresses"]]},
    })


def _job_out(c, job, body: dict | None) -> ReserveJobOut:
    return ReserveJobOut(report_id=job.report_id, asset=job.asset, state=job.state, leaves_built=job.leaves_built,
                         leaves_total=job.leaves_total, attempts=job.attempts,
                         error=ReserveErrorOut(code=job.error_code, message=job.error or "") if job.error_code else None,
                         requested_by=job.requested_by, requested_at=job.created_at, updated_at=job.updated_at,
                         published_at=job.published_at, report=_report_out(c, body) if body is not None else None)


def _reserves(c):
    if c.reserves is None:
        raise ApiError(503, "chains_not_configured", "no bitcoin adapter and signer are configured on this service")
    return c.reserves


@router.post("/reserves/reports", status_code=202, response_model=ReserveRequestOut,
             responses=responses("no_customer_accounts", "reserves_request_exists_with_different_assets", *NO_CHAINS))
def publish_reserves(body: ReserveRequestIn, c: ContainerDep, who: Operator) -> ReserveRequestOut:
    """Request proof-of-reserves reports, one per asset with customer accounts (BTC, ETH, each
    token; or those named): answered at once with their ids, `building`. The worker's `reserves`
    job builds them from one verified ledger snapshot, at each chain scanner's block, and publishes
    them (`GET /v1/reserves/reports/{id}`). Not a proof of solvency."""
    reserves = _reserves(c)
    jobs, created = reserves.request(caller_key(who.name, body.idempotency_key), f"api:{who.name}", body.assets)
    return ReserveRequestOut(created=created, reports=[_job_out(c, j, reserves.report(j.report_id) if j.state == "published"
                                                                 else None) for j in jobs])


@router.get("/reserves/reports/{report_id}", response_model=ReserveJobOut, responses=responses("not_found", *NO_CHAINS))
def reserves_report(report_id: IdPath, c: ContainerDep, _: Reader) -> ReserveJobOut:
    """A requested report: its state and the build's progress, and the report once published."""
    reserves = _reserves(c)
    try:
        job = reserves.job(report_id)
    except LookupError as exc:
        raise ApiError(404, "not_found", str(exc)) from None
    return _job_out(c, job, reserves.report(report_id) if job.state == "published" else None)


@router.get("/reserves/reports/{report_id}/proof", response_model=ReserveProofOut,
            responses=responses("not_found", "reserves_report_building", *NO_CHAINS))
def reserves_proof(report_id: IdPath, account_id: IdQuery, c: ContainerDep, _: Reader) -> ReserveProofOut:
    """A customer's inclusion proof in a published report (the backend hands it to that customer
    only); `reserves_report_building` while the report is being built."""
    try:
        proof = _reserves(c).proof(report_id, account_id)
    except LookupError as exc:
        raise ApiError(404, "not_found", str(exc)) from None
    return ReserveProofOut(**proof, amounts=_money(c, proof["asset"], {"balance": proof["balance"]}))


@router.get("/kill-switch", response_model=KillSwitchOut)
def get_kill_switch(c: ContainerDep, _: Reader) -> KillSwitchOut:
    ks = kill_switch(c.engine)
    return KillSwitchOut(engaged=ks.engaged, reason=ks.reason, changed_by=ks.changed_by)


@router.post("/kill-switch", response_model=KillSwitchOut)
def change_kill_switch(body: KillSwitchIn, c: ContainerDep, who: Operator) -> KillSwitchOut:
    """Operators may engage the kill switch; only an admin may release it."""
    if not body.engaged and who.role is not Role.admin:
        raise ApiError(403, "forbidden", "only an admin may release the kill switch")
    with c.engine.begin() as conn:
        set_kill_switch(conn, body.engaged, body.reason, f"api:{who.name}")
    return get_kill_switch(c, who)
