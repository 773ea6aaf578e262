"""Request and response models of the custody API, one per schema of its OpenAPI document.

Written by scripts/gen_client.py from the served document: do not edit; run it again after an API
change (tests/unit/test_client_contract.py fails until then). Request models refuse unknown fields,
as the API does; response models ignore fields a newer service adds.
"""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from custody.client.types import Amount, Minor, Money


def new_key() -> str:
    """A fresh idempotency key: one per logical call, kept across its retries."""
    return uuid.uuid4().hex


AccountKind = Literal['customer', 'fee_income', 'liquidity', 'in_flight', 'asset_location', 'network_fee_expense', 'suspense', 'quarantine', 'dust', 'equity']


OrderType = Literal['limit', 'market', 'stop', 'stop_limit']


Side = Literal['buy', 'sell']


StpPolicy = Literal['cancel_newest', 'cancel_oldest', 'decrement_both']


TimeInForce = Literal['gtc', 'ioc', 'fok']


class AcceptIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    idempotency_key: str = Field(default_factory=new_key)


class AcceptOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    transaction_id: int
    created: bool
    quote: QuoteOut


class AccountIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    asset: str
    kind: AccountKind
    name: str
    owner: str | None = None


class AccountOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: int
    asset: str
    kind: str
    name: str
    owner: str | None
    may_go_negative: bool
    may_go_positive: bool
    closed: bool


class AddressIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    idempotency_key: str = Field(default_factory=new_key)
    account_id: int


class AddressOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: int
    chain: str
    address: str
    derivation_index: int
    account_id: int


class AdjustmentIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    idempotency_key: str = Field(default_factory=new_key)
    reason: str
    transfers: list[AdjustmentLegIn]
    corrects_transaction_id: int | None = None


class AdjustmentLegIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    debit_account_id: int
    credit_account_id: int
    amount: Amount


class AdjustmentLegOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    debit_account_id: int
    credit_account_id: int
    amount: Money


class AdjustmentOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

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
    created_at: datetime


class AdjustmentPayloadOut(BaseModel):
    'What an approver signs. `payload` is the exact text (UTF-8), `payload_base64` its bytes,'

    model_config = ConfigDict(extra="ignore")

    adjustment_id: int
    state: str
    payload: str
    payload_base64: str
    challenge: str


class AllowlistChangeOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

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


class AllowlistEntryIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    address: str


class AllowlistOut(BaseModel):
    'The rule in force now (mode null: no allowlist) and the loosening waiting for an operator.'

    model_config = ConfigDict(extra="ignore")

    account_id: int
    mode: str | None
    cooling_off_seconds: int
    approvals: int
    version: int
    pending_change: AllowlistChangeOut | None


class AllowlistPolicyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal['enforce', 'review']
    cooling_off_seconds: int = 0
    approvals: int = 1


class AmendIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    account: str
    qty: Amount | None = None
    price: Amount | None = None
    stop_price: Amount | None = None


class ApiKeyList(BaseModel):
    model_config = ConfigDict(extra="ignore")

    keys: list[ApiKeyOut]
    next_cursor: str | None = None


class ApiKeyOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: int
    name: str
    role: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    revoked_by: str | None
    replaces: int | None
    live: bool


class ApprovalPayloadOut(BaseModel):
    'What an approver signs. `payload` is the exact text (UTF-8), `payload_base64` its bytes,'

    model_config = ConfigDict(extra="ignore")

    withdrawal_id: int
    decision_id: int
    state: str
    chain: str
    asset: str
    amount: Amount
    amount_minor: Minor
    destination: str
    policy_version: str
    expires_at: str
    payload: str
    payload_base64: str
    challenge: str


class ApprovalSignatureIn(BaseModel):
    "The approver's signature over the approval payload: Ed25519 over the payload bytes, or a"

    model_config = ConfigDict(extra="forbid")

    key_id: str
    scheme: Literal['ed25519', 'webauthn']
    signature: str
    authenticator_data: str | None = None
    client_data_json: str | None = None


class ApproveIn(BaseModel):
    "An operator's approval: the comment for the audit log and their signature (required; a"

    model_config = ConfigDict(extra="forbid")

    comment: str
    signature: ApprovalSignatureIn | None = None


class AssetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: str
    decimals: int


class AssetOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    code: str
    decimals: int


class BalanceOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    account_id: int
    asset: str
    posted: Money
    held: Money
    available: Money
    checkpoint: int


class CancelIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    account: str


class CaptureIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    idempotency_key: str = Field(default_factory=new_key)
    transfers: list[CaptureLegIn]
    final: bool = False


class CaptureLegIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    credit_account_id: int
    amount: Amount


class Check(BaseModel):
    model_config = ConfigDict(extra="ignore")

    ok: bool
    detail: str


class CheckOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    ok: bool
    detail: str


class ColdToHotIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    amount: Amount


class CommentIn(BaseModel):
    "An operator's decision with the comment recorded in the audit log (approve, reject, release,"

    model_config = ConfigDict(extra="forbid")

    comment: str


class DeliveryOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: int
    endpoint_id: int
    event_id: str
    event_type: str
    state: Literal['pending', 'delivered', 'dead']
    attempts: int
    next_attempt_at: datetime
    last_status: int | None
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None


class DepositOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: int
    chain: str
    asset: str
    txid: str
    index: int
    address: str
    amount: Amount
    amount_minor: Minor
    state: str
    confirmations: int
    block_height: int
    account_id: int
    journal_transaction_id: int | None
    amounts: dict[str, Money]


class DepositReturnOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    deposit_id: int
    withdrawal_id: int
    state: str
    decision_reasons: list[str]


class DepthOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    market: str
    seq: int
    bids: list[LevelOut]
    asks: list[LevelOut]


class DestinationAllowedOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    account_id: int
    address: str


class DestinationRemovedOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    account_id: int
    address: str
    removed: bool


class EndpointIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str
    event_types: list[str]
    description: str = ''


class EndpointOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: int
    url: str
    description: str
    event_types: list[str]
    enabled: bool
    created_by: str
    created_at: datetime
    updated_at: datetime
    previous_secret_expires_at: datetime | None


class EndpointPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    event_types: list[str] | None = None
    enabled: bool | None = None
    description: str | None = None


class EndpointSecretOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    endpoint: EndpointOut
    secret: str


class EntryOut(BaseModel):
    'One leg of a journal transaction: `amount` signed as {value, minor} (negative debits the'

    model_config = ConfigDict(extra="ignore")

    id: int
    account_id: int
    account_kind: str
    asset: str
    amount: Money
    hold_id: int | None
    transfer_index: int = 0
    counterpart_entry_id: int | None = None
    counterpart_account_id: int | None = None
    references: list[int] | None = None
    metadata: dict[str, Any] | None = None


class EthRebalanceOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: int
    chain: str = 'ethereum'
    asset: str
    source_tier: str
    destination_tier: str
    state: str
    destination: str
    amount: Amount
    amount_minor: Minor
    spendable_minor: Minor
    ceiling_minor: Minor
    target_minor: Minor
    floor_minor: Minor | None
    approvals_required: int
    approvals: int
    nonce: int | None
    gas_limit: int
    max_fee_wei: str
    txid: str | None
    fee_minor: Minor | None
    confirmations: int
    created_at: str
    updated_at: str
    amounts: dict[str, Money]


class EthRefillApprovedOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    rebalance: EthRebalanceOut
    approvals: int


class FeeTierIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    maker_ppm: int
    taker_ppm: int


class FeeTierOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    maker_ppm: int
    taker_ppm: int


class FillOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: int
    seq: int
    match_no: int
    maker_order_id: str
    taker_order_id: str
    maker_account: str
    taker_account: str
    taker_side: str
    price: Amount | None
    price_ticks: int
    qty: Amount | None
    qty_lots: int
    quote_amount: Amount
    maker_fee: Amount
    taker_fee: Amount
    journal_transaction_id: int | None
    created_at: datetime
    amounts: dict[str, Money]


class FillsOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    fills: list[FillOut]
    next_after: int | None
    next_cursor: str | None = None


class HoldIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    idempotency_key: str = Field(default_factory=new_key)
    account_id: int
    amount: Amount
    reference: str
    expires_at: datetime | None = None


class HoldOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: int
    account_id: int
    state: str
    owner: str
    reference: str
    amount: Money
    captured: Money
    released: Money
    remaining: Money
    expires_at: datetime | None


class HotFundingIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    chain: str
    txid: str


class HotFundingOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    chain: str
    txid: str
    asset: str
    source: str
    amount: Amount
    amount_minor: Minor
    journal_transaction_id: int
    created: bool


class IncidentOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: int
    kind: str
    severity: str
    detail: dict[str, Any]
    opened_at: datetime
    resolved_at: datetime | None
    resolved_by: str | None
    resolution: dict[str, Any] | None


class JournalTransactionOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: int
    idempotency_key: str
    kind: str
    metadata: dict[str, Any]
    reverses_id: int | None
    created_at: datetime
    entries: list[EntryOut]


class KillSwitchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engaged: bool
    reason: str


class KillSwitchOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    engaged: bool
    reason: str
    changed_by: str


class LevelOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    price: Amount | None
    price_ticks: int
    qty: Amount | None
    qty_lots: int


class LiquidityOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    asset: str
    account_id: int
    name: str
    posted: Money
    held: Money
    available: Money


class Live(BaseModel):
    model_config = ConfigDict(extra="ignore")

    status: str


class MarketIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    symbol: str
    base_asset: str
    quote_asset: str
    lot_size: int
    quote_per_tick_lot: int
    min_notional: int = 0
    fees: dict[str, FeeTierIn]
    default_stp: StpPolicy = 'cancel_newest'


class MarketOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    symbol: str
    base_asset: str
    quote_asset: str
    lot_size: int
    quote_per_tick_lot: int
    min_notional: int
    default_stp: str
    fees: dict[str, FeeTierOut]
    fee_account_id: int | None


class OrderIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    account: str
    client_order_id: str = Field(default_factory=new_key)
    side: Side
    type: OrderType = 'limit'
    qty: Amount | None = None
    price: Amount | None = None
    budget: Amount | None = None
    stop_price: Amount | None = None
    display_qty: Amount | None = None
    tif: TimeInForce | None = None
    post_only: bool = False
    stp_group: str | None = None
    stp_policy: StpPolicy | None = None
    fee_tier: str = 'default'


class OrderOut(BaseModel):
    'An order as the engine holds it: decimal strings beside the integer lots and ticks.'

    model_config = ConfigDict(extra="ignore")

    order_id: str
    market: str
    account: str
    client_order_id: str
    side: str
    type: str
    tif: str | None
    post_only: bool
    state: str
    price: Amount | None
    price_ticks: int | None
    qty: Amount | None
    qty_lots: int | None
    filled: Amount | None
    filled_lots: int
    remaining: Amount | None
    remaining_lots: int | None
    display_qty: Amount | None
    stop_price: Amount | None
    budget: Amount | None
    quote_traded: Amount
    fees_paid: Amount
    hold_id: int | None
    reject_code: str | None
    close_reason: str | None
    seq: int | None
    last_seq: int | None
    created_at: datetime
    updated_at: datetime
    amounts: dict[str, Money]


class PriceChangeOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: int
    state: str
    base_asset: str
    quote_asset: str
    price: Money
    proposed_by: str
    signed_by: str | None
    refusal: str | None
    expires_at: datetime
    created_at: datetime


class PriceChangePayloadOut(BaseModel):
    'What an operator signs. `payload` is the exact text (UTF-8), `payload_base64` its bytes,'

    model_config = ConfigDict(extra="ignore")

    change_id: int
    state: str
    payload: str
    payload_base64: str
    challenge: str


class PriceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    idempotency_key: str = Field(default_factory=new_key)
    base_asset: str
    quote_asset: str
    price: Amount


class ProofLeafOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    index: int
    amount: Minor
    nonce: str
    steps: list[ProofNodeOut]


class ProofNodeOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    hash: str
    sum: Minor


class PsbtIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    psbt: str


class PsbtOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    rebalance: RebalanceOut
    psbt: str | None


class QuoteIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    idempotency_key: str = Field(default_factory=new_key)
    account_id: int
    to_asset: str
    from_amount: Amount | None = None
    to_amount: Amount | None = None


class QuoteOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: int
    state: str
    account_id: int
    receive_account_id: int
    from_asset: str
    to_asset: str
    from_amount: Money
    fee: Money
    net: Money
    to_amount: Money
    cost: Money
    rounding: Money
    rate: Ratio
    price: Amount | None
    remainder: Ratio
    fee_ppm: int
    spread_ppm: int
    source: str
    liquidity_in_account_id: int
    liquidity_out_account_id: int
    fee_account_id: int
    rounding_account_id: int
    expires_at: datetime
    transaction_id: int | None
    created_at: datetime


class Ratio(BaseModel):
    model_config = ConfigDict(extra="ignore")

    numerator: str
    denominator: str


class Ready(BaseModel):
    model_config = ConfigDict(extra="ignore")

    status: str
    checks: dict[str, Check]


class ReasonIn(BaseModel):
    "A deposit decision's comment: it must say something (not only whitespace), as the audit"

    model_config = ConfigDict(extra="forbid")

    comment: str


class RebalanceOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: int
    chain: str
    asset: str
    source_tier: str
    destination_tier: str
    state: str
    destination: str
    amount: Amount
    amount_minor: Minor
    fee: Amount
    fee_minor: Minor
    spendable_minor: Minor
    ceiling_minor: Minor
    target_minor: Minor
    txid: str | None
    confirmations: int
    created_at: str
    updated_at: str
    amounts: dict[str, Money]


class ReconciliationLineOut(BaseModel):
    'One location of one asset: what the chain holds against what the books say. The bare integers'

    model_config = ConfigDict(extra="ignore")

    chain: str
    asset: str
    tier: str
    on_chain: int
    books: int
    in_transit: int
    booked_off_chain: int
    observed_late: int
    observation_mark: int
    node: int | None = None
    difference: int
    amounts: dict[str, Money]


class RefillApprovedOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    rebalance: RebalanceOut
    approvals: int


class RefillPayloadOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    rebalance_id: int
    amount_minor: Minor
    destination: str
    payload: str
    payload_base64: str


class ReplayedOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    replayed: int


class ReserveAddressOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    address: str
    amount: Minor
    message: str
    signature: str
    format: str
    amounts: dict[str, Money]


class ReserveErrorOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    code: str
    message: str


class ReserveHoldingsOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    total: Minor
    addresses: list[ReserveAddressOut]
    amounts: dict[str, Money]


class ReserveJobOut(BaseModel):
    "One requested report: `building` (the worker's progress: leaves hashed of the total, null"

    model_config = ConfigDict(extra="ignore")

    report_id: int
    asset: str
    state: Literal['building', 'published', 'failed']
    leaves_built: int
    leaves_total: int | None
    attempts: int
    error: ReserveErrorOut | None
    requested_by: str
    requested_at: datetime
    updated_at: datetime
    published_at: datetime | None
    report: ReserveReportOut | None


class ReserveLedgerOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    last_transaction_id: int
    transactions: int
    journal_digest: str
    checks_passed: list[str]


class ReserveLiabilitiesOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    root_hash: str
    total: Minor
    accounts: int
    leaves: int
    leaves_per_account: int
    amounts: dict[str, Money]


class ReserveProofOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    version: int
    report_id: int
    asset: str
    account_id: int
    balance: Minor
    leaf_count: int
    root: ProofNodeOut
    leaves: list[ProofLeafOut]
    amounts: dict[str, Money]


class ReserveReportOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

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
    model_config = ConfigDict(extra="forbid")

    idempotency_key: str = Field(default_factory=new_key)
    assets: list[str] | None = None


class ReserveRequestOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    created: bool
    reports: list[ReserveJobOut]


class ResolveIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    comment: str
    decision: Literal['release', 'capture'] | None = None


class RetriedOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    kind: str
    id: int
    state: str
    failed_step: str
    incident_id: int | None
    containment: str


class ReturnIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    comment: str
    destination: str | None = None


class ReverseIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    idempotency_key: str = Field(default_factory=new_key)


class RotatedOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    new: ApiKeyOut
    key: str
    old_key_stops_at: datetime


class SetAsideOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    kind: str
    id: int
    state: str
    failed_step: str | None
    incident_id: int | None
    times_set_aside: int


class StatementLineOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    entry_id: int
    transaction_id: int
    kind: str
    idempotency_key: str
    amount: Money
    balance_after: Money
    created_at: datetime
    counterpart_entry_id: int | None = None
    counterpart_account_id: int | None = None


class StatementOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    account_id: int
    asset: str
    lines: list[StatementLineOut]
    next_after: int | None
    next_cursor: str | None = None


class TransactionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    idempotency_key: str = Field(default_factory=new_key)
    kind: str = 'transfer'
    metadata: dict[str, Any] | None = None
    transfers: list[TransferIn]


class TransactionOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    transaction_id: int
    created: bool


class TransferIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    debit_account_id: int
    credit_account_id: int
    amount: Amount


class VerifyOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    ok: bool
    checks: list[CheckOut]


class WithdrawalIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    client_withdrawal_id: str = Field(default_factory=new_key)
    account_id: int
    amount: Amount
    destination: str
    priority: Literal['normal', 'fast'] = 'normal'


class WithdrawalOut(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: int
    client_withdrawal_id: str
    account_id: int
    asset: str
    amount: Amount
    fee_quoted: Amount
    destination: str
    priority: str
    state: str
    reject_reasons: list[str]
    decision_reasons: list[str] | None = None
    batch_id: int | None
    hold_id: int | None
    amounts: dict[str, Money]


class ApiKeyRotateIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grace_seconds: int = 0


class WebhookRotateIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grace_seconds: int | None = None


# Every model refers to others by name: resolve them all now, not at the first call.
for _model in [v for v in list(globals().values()) if isinstance(v, type) and issubclass(v, BaseModel) and v is not BaseModel]:
    _model.model_rebuild()
