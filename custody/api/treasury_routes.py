"""Treasury routes under /v1: the rebalances between the firm's wallet tiers (custody.rebalances)
and booking treasury funding of the ethereum hot wallet (custody.payouts).

- `GET /v1/rebalances` (auditor, operator): the latest rebalances with their state, amounts (decimal
  strings and minor units), fee, the thresholds and spendable balance that triggered each, and the
  transaction id once signed; newest first, paged (custody.api.paging). Each figure is repeated in
  `amounts` as {value, minor}.
- `POST /v1/rebalances/run` (operator): decide now: open a hot -> cold rebalance if the thresholds
  call for one (its coins reserved, state `open`, no txid yet) and answer the latest rebalances,
  the new one first. Signing, broadcast and tracking stay with the worker's rebalance job (every
  30 s), which signs the open rebalance on its next run: the API process's signer client may not
  ask for a rebalance to be signed (least privilege; signer/config.py `clients`).
- `POST /v1/rebalances/{id}/abandon` (operator, with a comment): give up an open rebalance that was
  never signed and stored; its hot coins are freed. Anything else is `invalid_state` (409).
- `POST /v1/rebalances/cold-to-hot` (operator, body `{"amount": "1.5"}` in BTC): build the unsigned
  PSBT moving that much from the watch-only cold wallet to the hot receive address (change to a
  fresh cold address) and open the rebalance; answers it with the PSBT (base64).
- `GET /v1/rebalances/{id}/psbt` (operator): the unsigned PSBT of an open cold -> hot move, to sign
  offline. `POST /v1/rebalances/{id}/psbt` (operator, body `{"psbt": "<base64>"}`): import the
  signed PSBT; custody checks it is exactly the transaction it built, every signature and the fee
  bounds, and stores it (`signed`); the worker broadcasts it. Refusals: `psbt_*` codes (422).
- `GET /v1/rebalances/{id}/approval-payload` (operator, auditor): what an operator signs to approve
  a warm -> hot refill (kind `rebalance-approval`). `POST /v1/rebalances/{id}/approve` (operator
  only, body `{"comment", "signature"}` as for a withdrawal): a signed approval, verified against
  custody's approver keys; the signer verifies it again and signs the refill only once the
  quorum is reached.
- `GET /v1/eth-rebalances` (auditor, operator): the ethereum rebalances (custody.eth_rebalances:
  hot -> warm/cold over the ceiling, warm -> hot refills) with their state, amounts, thresholds,
  approvals so far and the transaction once signed; newest first, paged.
  `GET /v1/eth-rebalances/{id}/approval-payload` and `POST /v1/eth-rebalances/{id}/approve` are the
  bitcoin refill's two routes for an ethereum refill (payload chain "ethereum"), served by the same
  functions (`_refill_payload_out`, `_approve`): same body, same checks, same codes.
- `POST /v1/treasury/hot-funding` (operator, body `{"chain": "ethereum", "txid": "0x..."}`): book
  what one final treasury transaction paid the ethereum hot address, read from the chain (its ether
  value, each configured token's Transfer log); answers the items (asset, amount as a decimal string
  and minor units, journal transaction id, created or already booked). Again for the same txid it
  books nothing more. Refusals are custody codes (`funding_not_mined`, `funding_reverted`,
  `funding_not_final`, `funding_not_to_hot`, `funding_own_transaction`); `chain: "bitcoin"` is an
  `invalid_request` (422): the hot-wallet sync books bitcoin funding by itself.
Without chain adapters the service answers `chains_not_configured` (503).
"""
from __future__ import annotations

import base64
from typing import Any, Callable, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import text

from custody.api.bodies import CommentIn
from custody.api.deps import Auditor, ContainerDep, Operator, OperatorOnly
from custody.api.errors import ApiError, responses
from custody.api.ledger_schemas import Money
from custody.api.paging import PAGED, pager
from custody.api.params import IdPath
from custody.api.withdrawal_routes import ApproveIn, _signature
from custody.container import Container
from custody.states import IllegalTransition
from ledger.amounts import format_amount, parse_amount

router = APIRouter(prefix="/v1", tags=["treasury"])
RebalancesPage = pager("rebalances", newest_first=True, default=50, maximum=500)
EthRebalancesPage = pager("eth-rebalances", newest_first=True, default=50, maximum=500)


class RebalanceOut(BaseModel):
    id: int
    chain: str
    asset: str
    source_tier: str
    destination_tier: str
    state: str
    destination: str
    amount: str
    amount_minor: str
    fee: str
    fee_minor: str
    spendable_minor: str
    ceiling_minor: str
    target_minor: str
    txid: str | None
    confirmations: int
    created_at: str
    updated_at: str
    amounts: dict[str, Money] = Field(description="`amount`, `fee`, `spendable`, `ceiling` and `target` as {value, minor}")


class ColdToHotIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"amount": "1.5"}]})
    amount: str = Field(min_length=1, max_length=40, description="BTC, a decimal string (at most 8 decimals)")


class PsbtIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"psbt": "cHNidP8BAA=="}]})
    psbt: str = Field(min_length=1, max_length=1_000_000, description="the signed PSBT, base64 (BIP 174)")


class PsbtOut(BaseModel):
    rebalance: RebalanceOut
    psbt: str | None = Field(description="the unsigned PSBT, base64 (null once signed)")


class RefillPayloadOut(BaseModel):
    rebalance_id: int
    amount_minor: str
    destination: str
    payload: str
    payload_base64: str


class RefillApprovedOut(BaseModel):
    rebalance: RebalanceOut
    approvals: int = Field(description="distinct operators who approved it so far")


class EthRebalanceOut(BaseModel):
    id: int
    chain: Literal["ethereum"] = "ethereum"
    asset: str
    source_tier: str
    destination_tier: str
    state: str
    destination: str
    amount: str
    amount_minor: str
    spendable_minor: str
    ceiling_minor: str
    target_minor: str
    floor_minor: str | None
    approvals_required: int = Field(description="a refill's operator quorum (0: no approval needed)")
    approvals: int = Field(description="distinct operator keys that approved it so far")
    nonce: int | None = Field(description="the sender's nonce, taken when it is signed")
    gas_limit: int
    max_fee_wei: str
    txid: str | None
    fee_minor: str | None = Field(description="gas burnt (wei), once mined")
    confirmations: int
    created_at: str
    updated_at: str
    amounts: dict[str, Money] = Field(description="`amount`, `spendable`, `ceiling` and `target` as {value, minor}")


class EthRefillApprovedOut(BaseModel):
    rebalance: EthRebalanceOut
    approvals: int = Field(description="distinct operators who approved it so far")


class HotFundingIn(BaseModel):
    chain: Literal["ethereum"] = Field(description="ethereum only: bitcoin funding of the hot wallet is booked "
                                                   "automatically by the hot-wallet sync")
    txid: str = Field(pattern=r"^0x[0-9a-fA-F]{64}$", description="an ethereum transaction hash")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"chain": "ethereum", "txid": "0x" + "ab" * 32}]})


class HotFundingOut(BaseModel):
    chain: str
    txid: str
    asset: str
    source: str  # "value" (the transaction's ether) or "log<index>" (an ERC-20 Transfer log)
    amount: str
    amount_minor: str
    journal_transaction_id: int
    created: bool  # False: booked before; nothing moved now


def _rebalances(c: Container) -> Any:
    if c.rebalances is None:
        raise ApiError(503, "chains_not_configured", "no chain adapters are configured on this service")
    return c.rebalances


def _latest(c: Container, select: str, *, state: str | None, limit: int, rebalance_id: int | None,
            before_id: int | None) -> list:
    """The rows of `select` (a SELECT ... FROM <table> r) newest first: in one state (None: any),
    the one with `rebalance_id`, below `before_id`, at most `limit`."""
    with c.engine.connect() as conn:
        return conn.execute(text(
            f"{select} WHERE (CAST(:s AS text) IS NULL OR r.state = :s) AND (CAST(:i AS bigint) IS NULL OR r.id = :i) "
            "AND (CAST(:b AS bigint) IS NULL OR r.id < :b) ORDER BY r.id DESC LIMIT :l"),
            {"s": state, "i": rebalance_id, "b": before_id, "l": limit}).all()


def _list(c: Container, *, state: str | None = None, limit: int = 1, rebalance_id: int | None = None,
          before_id: int | None = None) -> list[RebalanceOut]:
    """The latest rebalances (optionally in one state, below `before_id`: the next page of a
    walk), or the one with `rebalance_id`."""
    rows = _latest(c, "SELECT id, chain, asset, source_tier, destination_tier, state, destination, amount, fee, spendable, "
                      "ceiling, target, txid, confirmations, created_at, updated_at FROM rebalance r",
                   state=state, limit=limit, rebalance_id=rebalance_id, before_id=before_id)
    out = []
    for r in rows:
        decimals = c.ledger.get_asset(r.asset).decimals
        out.append(RebalanceOut(
            id=r.id, chain=r.chain, asset=r.asset, source_tier=r.source_tier, destination_tier=r.destination_tier,
            state=r.state, destination=r.destination,
            amount=format_amount(int(r.amount), decimals), amount_minor=str(int(r.amount)),
            fee=format_amount(int(r.fee), decimals), fee_minor=str(int(r.fee)),
            spendable_minor=str(int(r.spendable)), ceiling_minor=str(int(r.ceiling)), target_minor=str(int(r.target)),
            txid=r.txid, confirmations=r.confirmations,
            created_at=r.created_at.isoformat(), updated_at=r.updated_at.isoformat(),
            amounts={name: Money.of(int(getattr(r, name)), decimals)
                     for name in ("amount", "fee", "spendable", "ceiling", "target")}))
    return out


@router.get("/rebalances", response_model=list[RebalanceOut], responses=responses(*PAGED))
def list_rebalances(c: ContainerDep, _: Auditor, page: RebalancesPage,
                    state: str | None = Query(default=None, max_length=40)) -> list[RebalanceOut]:
    """Rebalances newest first (paged: `X-Next-Cursor`)."""
    return page.finish(_list(c, state=state, before_id=page.key, limit=page.fetch), key=lambda r: r.id)


@router.post("/rebalances/run", response_model=list[RebalanceOut],
    responses=responses("chains_not_configured", "node_unavailable", "wrong_network", "signer_refused", "withdrawals_halted"))
def run_rebalances(c: ContainerDep, _: Operator) -> list[RebalanceOut]:
    """Decide now (custody.rebalances `decide_bitcoin`: open a rebalance if one is due, nothing
    signed); answers the latest rebalances, a new `open` one first. The worker signs it next run."""
    _rebalances(c).decide_bitcoin()
    return _list(c, limit=10)


@router.post("/rebalances/{rebalance_id}/abandon", response_model=RebalanceOut,
    responses=responses("not_found", "invalid_state", "chains_not_configured"))
def abandon_rebalance(rebalance_id: IdPath, body: CommentIn, c: ContainerDep, who: Operator) -> RebalanceOut:
    """Operator decision: give up an open rebalance (never signed and stored); its coins are freed."""
    rebalances = _rebalances(c)
    with c.engine.connect() as conn:
        state = conn.execute(text("SELECT state FROM rebalance WHERE id = :i"), {"i": rebalance_id}).scalar()
    if state is None:
        raise ApiError(404, "not_found", f"no rebalance {rebalance_id}")
    if state != "open":
        raise ApiError(409, "invalid_state", f"rebalance {rebalance_id} is {state}; only an open one can be abandoned")
    try:
        rebalances.abandon(rebalance_id, by=f"api:{who.name}", reason=body.comment)
    except IllegalTransition:  # the job moved it on meanwhile
        raise ApiError(409, "invalid_state", f"rebalance {rebalance_id} is no longer open") from None
    (row,) = _list(c, rebalance_id=rebalance_id)
    return row


def _one(c: Container, rebalance_id: int, listing: Callable[..., list] | None = None) -> Any:
    """The row `rebalance_id` of `listing` (default `_list`: bitcoin; `_eth_list`), or rebalance_not_found."""
    rows = (listing or _list)(c, rebalance_id=rebalance_id)
    if not rows:
        raise ApiError(404, "rebalance_not_found", f"no rebalance {rebalance_id}")
    return rows[0]


PSBT_CODES = ("psbt_malformed", "psbt_transaction_mismatch", "psbt_not_signed", "psbt_signature_invalid", "psbt_fee_out_of_bounds")


@router.post("/rebalances/cold-to-hot", response_model=PsbtOut, status_code=201,
    responses=responses("chains_not_configured", "node_unavailable", "invalid_amount", "withdrawals_halted",
                        "rebalance_wallet_missing", "rebalance_in_progress", "rebalance_insufficient_funds"))
def open_cold_to_hot(body: ColdToHotIn, c: ContainerDep, who: Operator) -> PsbtOut:
    """Build the unsigned PSBT of a cold -> hot move (our hot receive address only) and open it."""
    rebalances = _rebalances(c)
    amount = parse_amount(body.amount, c.ledger.get_asset("BTC").decimals)
    rebalance_id = rebalances.open_cold_to_hot(amount, by=f"api:{who.name}")
    return PsbtOut(rebalance=_one(c, rebalance_id), psbt=rebalances.export_psbt(rebalance_id))


@router.get("/rebalances/{rebalance_id}/psbt", response_model=PsbtOut,
    responses=responses("chains_not_configured", "rebalance_not_found", "invalid_state"))
def export_psbt(rebalance_id: IdPath, c: ContainerDep, _: Operator) -> PsbtOut:
    """The unsigned PSBT of an open cold -> hot move (base64), to be signed offline with the cold key."""
    return PsbtOut(rebalance=_one(c, rebalance_id), psbt=_rebalances(c).export_psbt(rebalance_id))


@router.post("/rebalances/{rebalance_id}/psbt", response_model=PsbtOut,
    responses=responses("chains_not_configured", "rebalance_not_found", "invalid_state", *PSBT_CODES))
def import_psbt(rebalance_id: IdPath, body: PsbtIn, c: ContainerDep, who: Operator) -> PsbtOut:
    """Import the signed PSBT: checked against what custody built, then stored for the worker to send."""
    _rebalances(c).import_psbt(rebalance_id, body.psbt, by=f"api:{who.name}")
    return PsbtOut(rebalance=_one(c, rebalance_id), psbt=None)


# A refill's approval routes, bitcoin (`/v1/rebalances/...`, custody.rebalances) and ethereum
# (`/v1/eth-rebalances/...`, custody.eth_rebalances): both services answer `refill_payload(id)` and
# `approve_refill(id, operator=, signature=)` with the same checks and codes, so one pair of
# functions serves both and each route only names its service and its row.
REFILL_PAYLOAD_CODES = ("chains_not_configured", "rebalance_not_found")
REFILL_APPROVE_CODES = ("chains_not_configured", "rebalance_not_found", "refill_expired", "invalid_state", "already_acted",
                        "approval_signature_required", "approval_signature_malformed", "approver_unknown",
                        "approval_scheme_mismatch", "approval_signature_invalid", "approver_not_caller")


def _refill_payload_out(service: Any, rebalance_id: int, row: Callable[[], Any]) -> RefillPayloadOut:
    """The payload of refill `rebalance_id` (the service refuses anything but a refill first), with
    the figures of its row."""
    payload = service.refill_payload(rebalance_id)
    r = row()
    return RefillPayloadOut(rebalance_id=rebalance_id, amount_minor=r.amount_minor, destination=r.destination,
                            payload=payload.decode("utf-8"), payload_base64=base64.b64encode(payload).decode("ascii"))


def _approve(service: Any, rebalance_id: int, body: ApproveIn, who: Any) -> int:
    """Store the calling operator's signed approval (verified at the door against custody's
    approver registry: the key must be the caller's own; one approval per key); how many so far."""
    return service.approve_refill(rebalance_id, operator=f"api:{who.name}", signature=_signature(body))


@router.get("/rebalances/{rebalance_id}/approval-payload", response_model=RefillPayloadOut,
    responses=responses(*REFILL_PAYLOAD_CODES))
def refill_payload(rebalance_id: IdPath, c: ContainerDep, _: Auditor) -> RefillPayloadOut:
    """What an operator signs to approve a warm -> hot refill."""
    return _refill_payload_out(_rebalances(c), rebalance_id, lambda: _one(c, rebalance_id))


@router.post("/rebalances/{rebalance_id}/approve", response_model=RefillApprovedOut,
    responses=responses(*REFILL_APPROVE_CODES))
def approve_refill(rebalance_id: IdPath, body: ApproveIn, c: ContainerDep, who: OperatorOnly) -> RefillApprovedOut:
    """Approve a warm -> hot refill with the operator's own signature over its approval payload."""
    approvals = _approve(_rebalances(c), rebalance_id, body, who)
    return RefillApprovedOut(rebalance=_one(c, rebalance_id), approvals=approvals)


# ---- ethereum rebalances ----------------------------------------------------------------------

def _eth_rebalances(c: Container, rebalance_id: int) -> Any:
    """The ethereum rebalance service; without one (no `[treasury.ethereum]`), a row that does not
    exist is still `rebalance_not_found` (404), as it is with one: only an existing row's action
    needs the service (`chains_not_configured`, 503)."""
    if c.eth_rebalances is None:
        _one(c, rebalance_id, _eth_list)
        raise ApiError(503, "chains_not_configured", "no ethereum rebalances are configured on this service")
    return c.eth_rebalances


def _eth_list(c: Container, *, state: str | None = None, limit: int = 1, rebalance_id: int | None = None,
              before_id: int | None = None) -> list[EthRebalanceOut]:
    """The latest ethereum rebalances (optionally in one state, below `before_id`), or the one with `rebalance_id`."""
    rows = _latest(c, "SELECT r.*, (SELECT count(*) FROM eth_rebalance_approval a WHERE a.rebalance_id = r.id) AS approvals "
                      "FROM eth_rebalance r", state=state, limit=limit, rebalance_id=rebalance_id, before_id=before_id)
    out = []
    for r in rows:
        decimals = c.ledger.get_asset(r.asset).decimals
        out.append(EthRebalanceOut(
            id=r.id, asset=r.asset, source_tier=r.source_tier, destination_tier=r.destination_tier, state=r.state,
            destination=r.destination, amount=format_amount(int(r.amount), decimals), amount_minor=str(int(r.amount)),
            spendable_minor=str(int(r.spendable)), ceiling_minor=str(int(r.ceiling)), target_minor=str(int(r.target)),
            floor_minor=None if r.floor is None else str(int(r.floor)), approvals_required=r.approvals_required,
            approvals=r.approvals, nonce=None if r.nonce is None else int(r.nonce), gas_limit=int(r.gas_limit),
            max_fee_wei=str(int(r.max_fee_wei)), txid=r.txid, fee_minor=None if r.fee is None else str(int(r.fee)),
            confirmations=r.confirmations, created_at=r.created_at.isoformat(), updated_at=r.updated_at.isoformat(),
            amounts={name: Money.of(int(getattr(r, name)), decimals) for name in ("amount", "spendable", "ceiling", "target")}))
    return out


@router.get("/eth-rebalances", response_model=list[EthRebalanceOut], responses=responses(*PAGED))
def list_eth_rebalances(c: ContainerDep, _: Auditor, page: EthRebalancesPage,
                        state: str | None = Query(default=None, max_length=40)) -> list[EthRebalanceOut]:
    """Ethereum rebalances newest first (paged: `X-Next-Cursor`)."""
    return page.finish(_eth_list(c, state=state, before_id=page.key, limit=page.fetch), key=lambda r: r.id)


@router.get("/eth-rebalances/{rebalance_id}/approval-payload", response_model=RefillPayloadOut,
    responses=responses(*REFILL_PAYLOAD_CODES))
def eth_refill_payload(rebalance_id: IdPath, c: ContainerDep, _: Auditor) -> RefillPayloadOut:
    """What an operator signs to approve an ethereum warm -> hot refill (payload chain "ethereum")."""
    return _refill_payload_out(_eth_rebalances(c, rebalance_id), rebalance_id, lambda: _one(c, rebalance_id, _eth_list))


@router.post("/eth-rebalances/{rebalance_id}/approve", response_model=EthRefillApprovedOut,
    responses=responses(*REFILL_APPROVE_CODES))
def approve_eth_refill(rebalance_id: IdPath, body: ApproveIn, c: ContainerDep, who: OperatorOnly) -> EthRefillApprovedOut:
    """Approve an ethereum warm -> hot refill with the operator's own signature over its approval payload."""
    approvals = _approve(_eth_rebalances(c, rebalance_id), rebalance_id, body, who)
    return EthRefillApprovedOut(rebalance=_one(c, rebalance_id, _eth_list), approvals=approvals)


@router.post("/treasury/hot-funding", response_model=list[HotFundingOut],
    responses=responses("chains_not_configured", "node_unavailable", "wrong_network", "funding_not_mined", "funding_reverted", "funding_not_final", "funding_not_to_hot", "funding_own_transaction", "conflict"))
def book_hot_funding(body: HotFundingIn, c: ContainerDep, who: Operator) -> list[HotFundingOut]:
    """Operator action: book an ethereum hot-wallet funding transaction from the chain's figures."""
    if c.payouts is None or "ethereum" not in c.adapters:
        raise ApiError(503, "chains_not_configured", "no ethereum adapter is configured on this service")
    items = c.payouts.book_ethereum_funding(body.txid, by=f"api:{who.name}")
    return [HotFundingOut(chain="ethereum", txid=body.txid.lower(), asset=i["asset"], source=i["source"],
                          amount=format_amount(i["amount"], c.ledger.get_asset(i["asset"]).decimals),
                          amount_minor=str(i["amount"]), journal_transaction_id=i["transaction_id"], created=i["created"])
            for i in items]
