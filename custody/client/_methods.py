"""One method per route of the custody API: `SyncMethods` for `CustodyClient`, `AsyncMethods` for
`AsyncCustodyClient`.

Written by scripts/gen_client.py from the served OpenAPI document (method names: its NAMES table):
do not edit. A method takes the path parameters positionally, then either a request model (or a
mapping) as `body` or the body's fields as keywords, and the query parameters as keywords. A list
method answers one page; its `iter_*` twin walks every page by the `X-Next-Cursor` header.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, Literal

from pydantic import TypeAdapter

from custody.client._base import _body, _seg
from custody.client.models import *  # noqa: F403 (every model a signature names)
from custody.client.models import AccountKind, OrderType, Side, StpPolicy, TimeInForce  # noqa: F401
from custody.client.types import Money  # noqa: F401

# The answer types, each parsed by one TypeAdapter built at import.
_ACCEPTOUT: TypeAdapter[Any] = TypeAdapter(AcceptOut)
_ACCOUNTOUT: TypeAdapter[Any] = TypeAdapter(AccountOut)
_ADDRESSOUT: TypeAdapter[Any] = TypeAdapter(AddressOut)
_ADJUSTMENTOUT: TypeAdapter[Any] = TypeAdapter(AdjustmentOut)
_ADJUSTMENTPAYLOADOUT: TypeAdapter[Any] = TypeAdapter(AdjustmentPayloadOut)
_ALLOWLISTCHANGEOUT: TypeAdapter[Any] = TypeAdapter(AllowlistChangeOut)
_ALLOWLISTOUT: TypeAdapter[Any] = TypeAdapter(AllowlistOut)
_APIKEYLIST: TypeAdapter[Any] = TypeAdapter(ApiKeyList)
_APIKEYOUT: TypeAdapter[Any] = TypeAdapter(ApiKeyOut)
_APPROVALPAYLOADOUT: TypeAdapter[Any] = TypeAdapter(ApprovalPayloadOut)
_ASSETOUT: TypeAdapter[Any] = TypeAdapter(AssetOut)
_BALANCEOUT: TypeAdapter[Any] = TypeAdapter(BalanceOut)
_DELIVERYOUT: TypeAdapter[Any] = TypeAdapter(DeliveryOut)
_DEPOSITOUT: TypeAdapter[Any] = TypeAdapter(DepositOut)
_DEPOSITRETURNOUT: TypeAdapter[Any] = TypeAdapter(DepositReturnOut)
_DEPTHOUT: TypeAdapter[Any] = TypeAdapter(DepthOut)
_DESTINATIONALLOWEDOUT: TypeAdapter[Any] = TypeAdapter(DestinationAllowedOut)
_DESTINATIONREMOVEDOUT: TypeAdapter[Any] = TypeAdapter(DestinationRemovedOut)
_ENDPOINTOUT: TypeAdapter[Any] = TypeAdapter(EndpointOut)
_ENDPOINTSECRETOUT: TypeAdapter[Any] = TypeAdapter(EndpointSecretOut)
_ETHREFILLAPPROVEDOUT: TypeAdapter[Any] = TypeAdapter(EthRefillApprovedOut)
_FILLSOUT: TypeAdapter[Any] = TypeAdapter(FillsOut)
_HOLDOUT: TypeAdapter[Any] = TypeAdapter(HoldOut)
_INCIDENTOUT: TypeAdapter[Any] = TypeAdapter(IncidentOut)
_JOURNALTRANSACTIONOUT: TypeAdapter[Any] = TypeAdapter(JournalTransactionOut)
_KILLSWITCHOUT: TypeAdapter[Any] = TypeAdapter(KillSwitchOut)
_LIQUIDITYOUT: TypeAdapter[Any] = TypeAdapter(LiquidityOut)
_LIVE: TypeAdapter[Any] = TypeAdapter(Live)
_MARKETOUT: TypeAdapter[Any] = TypeAdapter(MarketOut)
_ORDEROUT: TypeAdapter[Any] = TypeAdapter(OrderOut)
_PRICECHANGEOUT: TypeAdapter[Any] = TypeAdapter(PriceChangeOut)
_PRICECHANGEPAYLOADOUT: TypeAdapter[Any] = TypeAdapter(PriceChangePayloadOut)
_PSBTOUT: TypeAdapter[Any] = TypeAdapter(PsbtOut)
_QUOTEOUT: TypeAdapter[Any] = TypeAdapter(QuoteOut)
_READY: TypeAdapter[Any] = TypeAdapter(Ready)
_REBALANCEOUT: TypeAdapter[Any] = TypeAdapter(RebalanceOut)
_REFILLAPPROVEDOUT: TypeAdapter[Any] = TypeAdapter(RefillApprovedOut)
_REFILLPAYLOADOUT: TypeAdapter[Any] = TypeAdapter(RefillPayloadOut)
_REPLAYEDOUT: TypeAdapter[Any] = TypeAdapter(ReplayedOut)
_RESERVEJOBOUT: TypeAdapter[Any] = TypeAdapter(ReserveJobOut)
_RESERVEPROOFOUT: TypeAdapter[Any] = TypeAdapter(ReserveProofOut)
_RESERVEREQUESTOUT: TypeAdapter[Any] = TypeAdapter(ReserveRequestOut)
_RETRIEDOUT: TypeAdapter[Any] = TypeAdapter(RetriedOut)
_ROTATEDOUT: TypeAdapter[Any] = TypeAdapter(RotatedOut)
_STATEMENTOUT: TypeAdapter[Any] = TypeAdapter(StatementOut)
_TRANSACTIONOUT: TypeAdapter[Any] = TypeAdapter(TransactionOut)
_VERIFYOUT: TypeAdapter[Any] = TypeAdapter(VerifyOut)
_WITHDRAWALOUT: TypeAdapter[Any] = TypeAdapter(WithdrawalOut)
_DICT_STR_MONEY: TypeAdapter[Any] = TypeAdapter(dict[str, Money])
_LIST_ACCOUNTOUT: TypeAdapter[Any] = TypeAdapter(list[AccountOut])
_LIST_ADJUSTMENTOUT: TypeAdapter[Any] = TypeAdapter(list[AdjustmentOut])
_LIST_ALLOWLISTCHANGEOUT: TypeAdapter[Any] = TypeAdapter(list[AllowlistChangeOut])
_LIST_ASSETOUT: TypeAdapter[Any] = TypeAdapter(list[AssetOut])
_LIST_DELIVERYOUT: TypeAdapter[Any] = TypeAdapter(list[DeliveryOut])
_LIST_DEPOSITOUT: TypeAdapter[Any] = TypeAdapter(list[DepositOut])
_LIST_ENDPOINTOUT: TypeAdapter[Any] = TypeAdapter(list[EndpointOut])
_LIST_ETHREBALANCEOUT: TypeAdapter[Any] = TypeAdapter(list[EthRebalanceOut])
_LIST_HOTFUNDINGOUT: TypeAdapter[Any] = TypeAdapter(list[HotFundingOut])
_LIST_INCIDENTOUT: TypeAdapter[Any] = TypeAdapter(list[IncidentOut])
_LIST_MARKETOUT: TypeAdapter[Any] = TypeAdapter(list[MarketOut])
_LIST_REBALANCEOUT: TypeAdapter[Any] = TypeAdapter(list[RebalanceOut])
_LIST_RECONCILIATIONLINEOUT: TypeAdapter[Any] = TypeAdapter(list[ReconciliationLineOut])
_LIST_SETASIDEOUT: TypeAdapter[Any] = TypeAdapter(list[SetAsideOut])
_LIST_WITHDRAWALOUT: TypeAdapter[Any] = TypeAdapter(list[WithdrawalOut])


class SyncMethods:
    """The routes, blocking (httpx.Client)."""

    def create_asset(self, body: AssetIn | Mapping[str, Any] | None = None, /, **fields: Any) -> AssetOut:
        'POST /v1/assets: Create Asset'
        return self._call('POST', '/v1/assets', params=None, body=_body(AssetIn, body, fields), answer=_ASSETOUT)

    def list_assets(self, *, cursor: str | None = None, limit: int = 1000) -> list[AssetOut]:
        'GET /v1/assets: List Assets'
        return self._call('GET', '/v1/assets', params={'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_ASSETOUT)

    def iter_assets(self, *, limit: int = 1000) -> Iterator[AssetOut]:
        'Every item of GET /v1/assets, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/assets', params={'cursor': cursor, 'limit': limit}, answer=_LIST_ASSETOUT), None)

    def open_account(self, body: AccountIn | Mapping[str, Any] | None = None, /, **fields: Any) -> AccountOut:
        'POST /v1/accounts: Open Account'
        return self._call('POST', '/v1/accounts', params=None, body=_body(AccountIn, body, fields), answer=_ACCOUNTOUT)

    def list_firm_accounts(self, *, asset: str | None = None, cursor: str | None = None, limit: int = 1000) -> list[AccountOut]:
        'GET /v1/firm-accounts: Firm Accounts'
        return self._call('GET', '/v1/firm-accounts', params={'asset': asset, 'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_ACCOUNTOUT)

    def iter_firm_accounts(self, *, asset: str | None = None, limit: int = 1000) -> Iterator[AccountOut]:
        'Every item of GET /v1/firm-accounts, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/firm-accounts', params={'asset': asset, 'cursor': cursor, 'limit': limit}, answer=_LIST_ACCOUNTOUT), None)

    def get_account(self, account_id: int, /) -> AccountOut:
        'GET /v1/accounts/{account_id}: Get Account'
        return self._call('GET', f'/v1/accounts/{_seg(account_id)}', params=None, body=None, answer=_ACCOUNTOUT)

    def close_account(self, account_id: int, /) -> AccountOut:
        'POST /v1/accounts/{account_id}/close: Close Account'
        return self._call('POST', f'/v1/accounts/{_seg(account_id)}/close', params=None, body=None, answer=_ACCOUNTOUT)

    def get_balance(self, account_id: int, /) -> BalanceOut:
        'GET /v1/accounts/{account_id}/balance: Balance'
        return self._call('GET', f'/v1/accounts/{_seg(account_id)}/balance', params=None, body=None, answer=_BALANCEOUT)

    def get_statement(self, account_id: int, /, *, after: int | None = None, cursor: str | None = None, limit: int = 100) -> StatementOut:
        'GET /v1/accounts/{account_id}/statement: Statement'
        return self._call('GET', f'/v1/accounts/{_seg(account_id)}/statement', params={'after': after, 'cursor': cursor, 'limit': limit}, body=None, answer=_STATEMENTOUT)

    def iter_statement(self, account_id: int, /, *, after: int | None = None, limit: int = 100) -> Iterator[StatementLineOut]:
        'Every item of GET /v1/accounts/{account_id}/statement, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', f'/v1/accounts/{_seg(account_id)}/statement', params={'after': after, 'cursor': cursor, 'limit': limit}, answer=_STATEMENTOUT), 'lines')

    def post_transaction(self, body: TransactionIn | Mapping[str, Any] | None = None, /, **fields: Any) -> TransactionOut:
        'POST /v1/transactions: Post Transaction'
        return self._call('POST', '/v1/transactions', params=None, body=_body(TransactionIn, body, fields), answer=_TRANSACTIONOUT)

    def get_transaction(self, transaction_id: int, /) -> JournalTransactionOut:
        'GET /v1/transactions/{transaction_id}: Get Transaction'
        return self._call('GET', f'/v1/transactions/{_seg(transaction_id)}', params=None, body=None, answer=_JOURNALTRANSACTIONOUT)

    def reverse_transaction(self, transaction_id: int, body: ReverseIn | Mapping[str, Any] | None = None, /, **fields: Any) -> TransactionOut:
        'POST /v1/transactions/{transaction_id}/reverse: Reverse'
        return self._call('POST', f'/v1/transactions/{_seg(transaction_id)}/reverse', params=None, body=_body(ReverseIn, body, fields), answer=_TRANSACTIONOUT)

    def place_hold(self, body: HoldIn | Mapping[str, Any] | None = None, /, **fields: Any) -> HoldOut:
        'POST /v1/holds: Place Hold'
        return self._call('POST', '/v1/holds', params=None, body=_body(HoldIn, body, fields), answer=_HOLDOUT)

    def get_hold(self, hold_id: int, /) -> HoldOut:
        'GET /v1/holds/{hold_id}: Get Hold'
        return self._call('GET', f'/v1/holds/{_seg(hold_id)}', params=None, body=None, answer=_HOLDOUT)

    def capture_hold(self, hold_id: int, body: CaptureIn | Mapping[str, Any] | None = None, /, **fields: Any) -> TransactionOut:
        'POST /v1/holds/{hold_id}/capture: Capture'
        return self._call('POST', f'/v1/holds/{_seg(hold_id)}/capture', params=None, body=_body(CaptureIn, body, fields), answer=_TRANSACTIONOUT)

    def release_hold(self, hold_id: int, /) -> HoldOut:
        'POST /v1/holds/{hold_id}/release: Release'
        return self._call('POST', f'/v1/holds/{_seg(hold_id)}/release', params=None, body=None, answer=_HOLDOUT)

    def get_totals(self) -> dict[str, Money]:
        'GET /v1/totals: Totals'
        return self._call('GET', '/v1/totals', params=None, body=None, answer=_DICT_STR_MONEY)

    def verify(self) -> VerifyOut:
        'GET /v1/verify: Verify'
        return self._call('GET', '/v1/verify', params=None, body=None, answer=_VERIFYOUT)

    def issue_deposit_address(self, body: AddressIn | Mapping[str, Any] | None = None, /, **fields: Any) -> AddressOut:
        'POST /v1/deposit-addresses: Issue Address'
        return self._call('POST', '/v1/deposit-addresses', params=None, body=_body(AddressIn, body, fields), answer=_ADDRESSOUT)

    def list_account_deposits(self, account_id: int, /, *, cursor: str | None = None, limit: int = 200) -> list[DepositOut]:
        'GET /v1/accounts/{account_id}/deposits: Account Deposits'
        return self._call('GET', f'/v1/accounts/{_seg(account_id)}/deposits', params={'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_DEPOSITOUT)

    def iter_account_deposits(self, account_id: int, /, *, limit: int = 200) -> Iterator[DepositOut]:
        'Every item of GET /v1/accounts/{account_id}/deposits, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', f'/v1/accounts/{_seg(account_id)}/deposits', params={'cursor': cursor, 'limit': limit}, answer=_LIST_DEPOSITOUT), None)

    def list_deposits(self, *, state: Literal['seen', 'confirming', 'final', 'credited', 'orphaned', 'quarantined', 'released', 'dust'] = 'quarantined', cursor: str | None = None, limit: int = 200) -> list[DepositOut]:
        'GET /v1/deposits: Deposits By State'
        return self._call('GET', '/v1/deposits', params={'state': state, 'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_DEPOSITOUT)

    def iter_deposits(self, *, state: Literal['seen', 'confirming', 'final', 'credited', 'orphaned', 'quarantined', 'released', 'dust'] = 'quarantined', limit: int = 200) -> Iterator[DepositOut]:
        'Every item of GET /v1/deposits, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/deposits', params={'state': state, 'cursor': cursor, 'limit': limit}, answer=_LIST_DEPOSITOUT), None)

    def release_deposit(self, deposit_id: int, body: ReasonIn | Mapping[str, Any] | None = None, /, **fields: Any) -> DepositOut:
        'POST /v1/deposits/{deposit_id}/release: Release'
        return self._call('POST', f'/v1/deposits/{_seg(deposit_id)}/release', params=None, body=_body(ReasonIn, body, fields), answer=_DEPOSITOUT)

    def return_deposit(self, deposit_id: int, body: ReturnIn | Mapping[str, Any] | None = None, /, **fields: Any) -> DepositReturnOut:
        'POST /v1/deposits/{deposit_id}/return: Return Deposit'
        return self._call('POST', f'/v1/deposits/{_seg(deposit_id)}/return', params=None, body=_body(ReturnIn, body, fields), answer=_DEPOSITRETURNOUT)

    def list_incidents(self, *, open_only: bool = True, cursor: str | None = None, limit: int = 500) -> list[IncidentOut]:
        'GET /v1/incidents: Incidents'
        return self._call('GET', '/v1/incidents', params={'open_only': open_only, 'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_INCIDENTOUT)

    def iter_incidents(self, *, open_only: bool = True, limit: int = 500) -> Iterator[IncidentOut]:
        'Every item of GET /v1/incidents, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/incidents', params={'open_only': open_only, 'cursor': cursor, 'limit': limit}, answer=_LIST_INCIDENTOUT), None)

    def resolve_incident(self, incident_id: int, body: ResolveIn | Mapping[str, Any] | None = None, /, **fields: Any) -> IncidentOut:
        'POST /v1/incidents/{incident_id}/resolve: Resolve Incident'
        return self._call('POST', f'/v1/incidents/{_seg(incident_id)}/resolve', params=None, body=_body(ResolveIn, body, fields), answer=_INCIDENTOUT)

    def reconcile(self) -> list[ReconciliationLineOut]:
        'POST /v1/reconciliation: Reconcile'
        return self._call('POST', '/v1/reconciliation', params=None, body=None, answer=_LIST_RECONCILIATIONLINEOUT)

    def publish_reserve_report(self, body: ReserveRequestIn | Mapping[str, Any] | None = None, /, **fields: Any) -> ReserveRequestOut:
        'POST /v1/reserves/reports: Publish Reserves'
        return self._call('POST', '/v1/reserves/reports', params=None, body=_body(ReserveRequestIn, body, fields), answer=_RESERVEREQUESTOUT)

    def get_reserve_report(self, report_id: int, /) -> ReserveJobOut:
        'GET /v1/reserves/reports/{report_id}: Reserves Report'
        return self._call('GET', f'/v1/reserves/reports/{_seg(report_id)}', params=None, body=None, answer=_RESERVEJOBOUT)

    def get_reserve_proof(self, report_id: int, /, *, account_id: int) -> ReserveProofOut:
        'GET /v1/reserves/reports/{report_id}/proof: Reserves Proof'
        return self._call('GET', f'/v1/reserves/reports/{_seg(report_id)}/proof', params={'account_id': account_id}, body=None, answer=_RESERVEPROOFOUT)

    def get_kill_switch(self) -> KillSwitchOut:
        'GET /v1/kill-switch: Get Kill Switch'
        return self._call('GET', '/v1/kill-switch', params=None, body=None, answer=_KILLSWITCHOUT)

    def set_kill_switch(self, body: KillSwitchIn | Mapping[str, Any] | None = None, /, **fields: Any) -> KillSwitchOut:
        'POST /v1/kill-switch: Change Kill Switch'
        return self._call('POST', '/v1/kill-switch', params=None, body=_body(KillSwitchIn, body, fields), answer=_KILLSWITCHOUT)

    def create_market(self, body: MarketIn | Mapping[str, Any] | None = None, /, **fields: Any) -> MarketOut:
        'POST /v1/markets: Create Market'
        return self._call('POST', '/v1/markets', params=None, body=_body(MarketIn, body, fields), answer=_MARKETOUT)

    def list_markets(self, *, cursor: str | None = None, limit: int = 1000) -> list[MarketOut]:
        'GET /v1/markets: List Markets'
        return self._call('GET', '/v1/markets', params={'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_MARKETOUT)

    def iter_markets(self, *, limit: int = 1000) -> Iterator[MarketOut]:
        'Every item of GET /v1/markets, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/markets', params={'cursor': cursor, 'limit': limit}, answer=_LIST_MARKETOUT), None)

    def place_order(self, symbol: str, body: OrderIn | Mapping[str, Any] | None = None, /, **fields: Any) -> OrderOut:
        'POST /v1/markets/{symbol}/orders: Place Order'
        return self._call('POST', f'/v1/markets/{_seg(symbol)}/orders', params=None, body=_body(OrderIn, body, fields), answer=_ORDEROUT)

    def get_order_by_client_id(self, symbol: str, /, *, account: str, client_order_id: str) -> OrderOut:
        'GET /v1/markets/{symbol}/orders: Get Order By Client Id'
        return self._call('GET', f'/v1/markets/{_seg(symbol)}/orders', params={'account': account, 'client_order_id': client_order_id}, body=None, answer=_ORDEROUT)

    def cancel_order(self, symbol: str, order_id: str, body: CancelIn | Mapping[str, Any] | None = None, /, **fields: Any) -> OrderOut:
        'POST /v1/markets/{symbol}/orders/{order_id}/cancel: Cancel Order'
        return self._call('POST', f'/v1/markets/{_seg(symbol)}/orders/{_seg(order_id)}/cancel', params=None, body=_body(CancelIn, body, fields), answer=_ORDEROUT)

    def amend_order(self, symbol: str, order_id: str, body: AmendIn | Mapping[str, Any] | None = None, /, **fields: Any) -> OrderOut:
        'POST /v1/markets/{symbol}/orders/{order_id}/amend: Amend Order'
        return self._call('POST', f'/v1/markets/{_seg(symbol)}/orders/{_seg(order_id)}/amend', params=None, body=_body(AmendIn, body, fields), answer=_ORDEROUT)

    def get_order(self, symbol: str, order_id: str, /) -> OrderOut:
        'GET /v1/markets/{symbol}/orders/{order_id}: Get Order'
        return self._call('GET', f'/v1/markets/{_seg(symbol)}/orders/{_seg(order_id)}', params=None, body=None, answer=_ORDEROUT)

    def list_fills(self, symbol: str, /, *, order_id: str | None = None, account: str | None = None, after: int | None = None, cursor: str | None = None, limit: int = 100) -> FillsOut:
        'GET /v1/markets/{symbol}/fills: List Fills'
        return self._call('GET', f'/v1/markets/{_seg(symbol)}/fills', params={'order_id': order_id, 'account': account, 'after': after, 'cursor': cursor, 'limit': limit}, body=None, answer=_FILLSOUT)

    def iter_fills(self, symbol: str, /, *, order_id: str | None = None, account: str | None = None, after: int | None = None, limit: int = 100) -> Iterator[FillOut]:
        'Every item of GET /v1/markets/{symbol}/fills, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', f'/v1/markets/{_seg(symbol)}/fills', params={'order_id': order_id, 'account': account, 'after': after, 'cursor': cursor, 'limit': limit}, answer=_FILLSOUT), 'fills')

    def get_depth(self, symbol: str, /, *, levels: int = 50) -> DepthOut:
        'GET /v1/markets/{symbol}/depth: Depth'
        return self._call('GET', f'/v1/markets/{_seg(symbol)}/depth', params={'levels': levels}, body=None, answer=_DEPTHOUT)

    def request_withdrawal(self, body: WithdrawalIn | Mapping[str, Any] | None = None, /, **fields: Any) -> WithdrawalOut:
        'POST /v1/withdrawals: Request Withdrawal'
        return self._call('POST', '/v1/withdrawals', params=None, body=_body(WithdrawalIn, body, fields), answer=_WITHDRAWALOUT)

    def list_withdrawals(self, *, state: str = 'pending_approval', cursor: str | None = None, limit: int = 200) -> list[WithdrawalOut]:
        'GET /v1/withdrawals: List Withdrawals'
        return self._call('GET', '/v1/withdrawals', params={'state': state, 'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_WITHDRAWALOUT)

    def iter_withdrawals(self, *, state: str = 'pending_approval', limit: int = 200) -> Iterator[WithdrawalOut]:
        'Every item of GET /v1/withdrawals, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/withdrawals', params={'state': state, 'cursor': cursor, 'limit': limit}, answer=_LIST_WITHDRAWALOUT), None)

    def get_withdrawal(self, withdrawal_id: int, /) -> WithdrawalOut:
        'GET /v1/withdrawals/{withdrawal_id}: Get Withdrawal'
        return self._call('GET', f'/v1/withdrawals/{_seg(withdrawal_id)}', params=None, body=None, answer=_WITHDRAWALOUT)

    def get_approval_payload(self, withdrawal_id: int, /) -> ApprovalPayloadOut:
        'GET /v1/withdrawals/{withdrawal_id}/approval-payload: Approval Payload'
        return self._call('GET', f'/v1/withdrawals/{_seg(withdrawal_id)}/approval-payload', params=None, body=None, answer=_APPROVALPAYLOADOUT)

    def approve_withdrawal(self, withdrawal_id: int, body: ApproveIn | Mapping[str, Any] | None = None, /, **fields: Any) -> WithdrawalOut:
        'POST /v1/withdrawals/{withdrawal_id}/approve: Approve'
        return self._call('POST', f'/v1/withdrawals/{_seg(withdrawal_id)}/approve', params=None, body=_body(ApproveIn, body, fields), answer=_WITHDRAWALOUT)

    def reject_withdrawal(self, withdrawal_id: int, body: CommentIn | Mapping[str, Any] | None = None, /, **fields: Any) -> WithdrawalOut:
        'POST /v1/withdrawals/{withdrawal_id}/reject: Reject'
        return self._call('POST', f'/v1/withdrawals/{_seg(withdrawal_id)}/reject', params=None, body=_body(CommentIn, body, fields), answer=_WITHDRAWALOUT)

    def set_allowlist(self, account_id: int, body: AllowlistPolicyIn | Mapping[str, Any] | None = None, /, **fields: Any) -> AllowlistOut:
        'PUT /v1/accounts/{account_id}/allowlist: Set Allowlist'
        return self._call('PUT', f'/v1/accounts/{_seg(account_id)}/allowlist', params=None, body=_body(AllowlistPolicyIn, body, fields), answer=_ALLOWLISTOUT)

    def get_allowlist(self, account_id: int, /) -> AllowlistOut:
        'GET /v1/accounts/{account_id}/allowlist: Get Allowlist'
        return self._call('GET', f'/v1/accounts/{_seg(account_id)}/allowlist', params=None, body=None, answer=_ALLOWLISTOUT)

    def allow_destination(self, account_id: int, body: AllowlistEntryIn | Mapping[str, Any] | None = None, /, **fields: Any) -> DestinationAllowedOut:
        'POST /v1/accounts/{account_id}/allowlist: Allow Destination'
        return self._call('POST', f'/v1/accounts/{_seg(account_id)}/allowlist', params=None, body=_body(AllowlistEntryIn, body, fields), answer=_DESTINATIONALLOWEDOUT)

    def remove_destination(self, account_id: int, address: str, /) -> DestinationRemovedOut:
        'DELETE /v1/accounts/{account_id}/allowlist/{address}: Remove Destination'
        return self._call('DELETE', f'/v1/accounts/{_seg(account_id)}/allowlist/{_seg(address)}', params=None, body=None, answer=_DESTINATIONREMOVEDOUT)

    def list_allowlist_changes(self, *, state: Literal['pending', 'approved', 'rejected', 'superseded'] = 'pending', cursor: str | None = None, limit: int = 200) -> list[AllowlistChangeOut]:
        'GET /v1/allowlist-changes: Allowlist Changes'
        return self._call('GET', '/v1/allowlist-changes', params={'state': state, 'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_ALLOWLISTCHANGEOUT)

    def iter_allowlist_changes(self, *, state: Literal['pending', 'approved', 'rejected', 'superseded'] = 'pending', limit: int = 200) -> Iterator[AllowlistChangeOut]:
        'Every item of GET /v1/allowlist-changes, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/allowlist-changes', params={'state': state, 'cursor': cursor, 'limit': limit}, answer=_LIST_ALLOWLISTCHANGEOUT), None)

    def approve_allowlist_change(self, change_id: int, body: CommentIn | Mapping[str, Any] | None = None, /, **fields: Any) -> AllowlistChangeOut:
        'POST /v1/allowlist-changes/{change_id}/approve: Approve Allowlist Change'
        return self._call('POST', f'/v1/allowlist-changes/{_seg(change_id)}/approve', params=None, body=_body(CommentIn, body, fields), answer=_ALLOWLISTCHANGEOUT)

    def reject_allowlist_change(self, change_id: int, body: CommentIn | Mapping[str, Any] | None = None, /, **fields: Any) -> AllowlistChangeOut:
        'POST /v1/allowlist-changes/{change_id}/reject: Reject Allowlist Change'
        return self._call('POST', f'/v1/allowlist-changes/{_seg(change_id)}/reject', params=None, body=_body(CommentIn, body, fields), answer=_ALLOWLISTCHANGEOUT)

    def list_rebalances(self, *, state: str | None = None, cursor: str | None = None, limit: int = 50) -> list[RebalanceOut]:
        'GET /v1/rebalances: List Rebalances'
        return self._call('GET', '/v1/rebalances', params={'state': state, 'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_REBALANCEOUT)

    def iter_rebalances(self, *, state: str | None = None, limit: int = 50) -> Iterator[RebalanceOut]:
        'Every item of GET /v1/rebalances, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/rebalances', params={'state': state, 'cursor': cursor, 'limit': limit}, answer=_LIST_REBALANCEOUT), None)

    def run_rebalances(self) -> list[RebalanceOut]:
        'POST /v1/rebalances/run: Run Rebalances'
        return self._call('POST', '/v1/rebalances/run', params=None, body=None, answer=_LIST_REBALANCEOUT)

    def abandon_rebalance(self, rebalance_id: int, body: CommentIn | Mapping[str, Any] | None = None, /, **fields: Any) -> RebalanceOut:
        'POST /v1/rebalances/{rebalance_id}/abandon: Abandon Rebalance'
        return self._call('POST', f'/v1/rebalances/{_seg(rebalance_id)}/abandon', params=None, body=_body(CommentIn, body, fields), answer=_REBALANCEOUT)

    def open_cold_to_hot(self, body: ColdToHotIn | Mapping[str, Any] | None = None, /, **fields: Any) -> PsbtOut:
        'POST /v1/rebalances/cold-to-hot: Open Cold To Hot'
        return self._call('POST', '/v1/rebalances/cold-to-hot', params=None, body=_body(ColdToHotIn, body, fields), answer=_PSBTOUT)

    def export_psbt(self, rebalance_id: int, /) -> PsbtOut:
        'GET /v1/rebalances/{rebalance_id}/psbt: Export Psbt'
        return self._call('GET', f'/v1/rebalances/{_seg(rebalance_id)}/psbt', params=None, body=None, answer=_PSBTOUT)

    def import_psbt(self, rebalance_id: int, body: PsbtIn | Mapping[str, Any] | None = None, /, **fields: Any) -> PsbtOut:
        'POST /v1/rebalances/{rebalance_id}/psbt: Import Psbt'
        return self._call('POST', f'/v1/rebalances/{_seg(rebalance_id)}/psbt', params=None, body=_body(PsbtIn, body, fields), answer=_PSBTOUT)

    def refill_approval_payload(self, rebalance_id: int, /) -> RefillPayloadOut:
        'GET /v1/rebalances/{rebalance_id}/approval-payload: Refill Payload'
        return self._call('GET', f'/v1/rebalances/{_seg(rebalance_id)}/approval-payload', params=None, body=None, answer=_REFILLPAYLOADOUT)

    def approve_refill(self, rebalance_id: int, body: ApproveIn | Mapping[str, Any] | None = None, /, **fields: Any) -> RefillApprovedOut:
        'POST /v1/rebalances/{rebalance_id}/approve: Approve Refill'
        return self._call('POST', f'/v1/rebalances/{_seg(rebalance_id)}/approve', params=None, body=_body(ApproveIn, body, fields), answer=_REFILLAPPROVEDOUT)

    def list_eth_rebalances(self, *, state: str | None = None, cursor: str | None = None, limit: int = 50) -> list[EthRebalanceOut]:
        'GET /v1/eth-rebalances: List Eth Rebalances'
        return self._call('GET', '/v1/eth-rebalances', params={'state': state, 'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_ETHREBALANCEOUT)

    def iter_eth_rebalances(self, *, state: str | None = None, limit: int = 50) -> Iterator[EthRebalanceOut]:
        'Every item of GET /v1/eth-rebalances, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/eth-rebalances', params={'state': state, 'cursor': cursor, 'limit': limit}, answer=_LIST_ETHREBALANCEOUT), None)

    def eth_refill_approval_payload(self, rebalance_id: int, /) -> RefillPayloadOut:
        'GET /v1/eth-rebalances/{rebalance_id}/approval-payload: Eth Refill Payload'
        return self._call('GET', f'/v1/eth-rebalances/{_seg(rebalance_id)}/approval-payload', params=None, body=None, answer=_REFILLPAYLOADOUT)

    def approve_eth_refill(self, rebalance_id: int, body: ApproveIn | Mapping[str, Any] | None = None, /, **fields: Any) -> EthRefillApprovedOut:
        'POST /v1/eth-rebalances/{rebalance_id}/approve: Approve Eth Refill'
        return self._call('POST', f'/v1/eth-rebalances/{_seg(rebalance_id)}/approve', params=None, body=_body(ApproveIn, body, fields), answer=_ETHREFILLAPPROVEDOUT)

    def book_hot_funding(self, body: HotFundingIn | Mapping[str, Any] | None = None, /, **fields: Any) -> list[HotFundingOut]:
        'POST /v1/treasury/hot-funding: Book Hot Funding'
        return self._call('POST', '/v1/treasury/hot-funding', params=None, body=_body(HotFundingIn, body, fields), answer=_LIST_HOTFUNDINGOUT)

    def propose_adjustment(self, body: AdjustmentIn | Mapping[str, Any] | None = None, /, **fields: Any) -> AdjustmentOut:
        'POST /v1/treasury/adjustments: Propose'
        return self._call('POST', '/v1/treasury/adjustments', params=None, body=_body(AdjustmentIn, body, fields), answer=_ADJUSTMENTOUT)

    def list_adjustments(self, *, state: Literal['proposed', 'approved', 'posted', 'rejected'] | None = None, cursor: str | None = None, limit: int = 200) -> list[AdjustmentOut]:
        'GET /v1/treasury/adjustments: List Adjustments'
        return self._call('GET', '/v1/treasury/adjustments', params={'state': state, 'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_ADJUSTMENTOUT)

    def iter_adjustments(self, *, state: Literal['proposed', 'approved', 'posted', 'rejected'] | None = None, limit: int = 200) -> Iterator[AdjustmentOut]:
        'Every item of GET /v1/treasury/adjustments, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/treasury/adjustments', params={'state': state, 'cursor': cursor, 'limit': limit}, answer=_LIST_ADJUSTMENTOUT), None)

    def adjustment_approval_payload(self, adjustment_id: int, /) -> AdjustmentPayloadOut:
        'GET /v1/treasury/adjustments/{adjustment_id}/approval-payload: Get Approval Payload'
        return self._call('GET', f'/v1/treasury/adjustments/{_seg(adjustment_id)}/approval-payload', params=None, body=None, answer=_ADJUSTMENTPAYLOADOUT)

    def approve_adjustment(self, adjustment_id: int, body: ApproveIn | Mapping[str, Any] | None = None, /, **fields: Any) -> AdjustmentOut:
        'POST /v1/treasury/adjustments/{adjustment_id}/approve: Approve'
        return self._call('POST', f'/v1/treasury/adjustments/{_seg(adjustment_id)}/approve', params=None, body=_body(ApproveIn, body, fields), answer=_ADJUSTMENTOUT)

    def reject_adjustment(self, adjustment_id: int, body: CommentIn | Mapping[str, Any] | None = None, /, **fields: Any) -> AdjustmentOut:
        'POST /v1/treasury/adjustments/{adjustment_id}/reject: Reject'
        return self._call('POST', f'/v1/treasury/adjustments/{_seg(adjustment_id)}/reject', params=None, body=_body(CommentIn, body, fields), answer=_ADJUSTMENTOUT)

    def get_adjustment(self, adjustment_id: int, /) -> AdjustmentOut:
        'GET /v1/treasury/adjustments/{adjustment_id}: Get Adjustment'
        return self._call('GET', f'/v1/treasury/adjustments/{_seg(adjustment_id)}', params=None, body=None, answer=_ADJUSTMENTOUT)

    def list_set_aside(self, *, cursor: str | None = None, limit: int = 1000) -> list[SetAsideOut]:
        'GET /v1/set-aside: List Set Aside'
        return self._call('GET', '/v1/set-aside', params={'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_SETASIDEOUT)

    def iter_set_aside(self, *, limit: int = 1000) -> Iterator[SetAsideOut]:
        'Every item of GET /v1/set-aside, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/set-aside', params={'cursor': cursor, 'limit': limit}, answer=_LIST_SETASIDEOUT), None)

    def retry_batch(self, batch_id: int, body: CommentIn | Mapping[str, Any] | None = None, /, **fields: Any) -> RetriedOut:
        'POST /v1/withdrawal-batches/{batch_id}/retry: Retry Batch'
        return self._call('POST', f'/v1/withdrawal-batches/{_seg(batch_id)}/retry', params=None, body=_body(CommentIn, body, fields), answer=_RETRIEDOUT)

    def retry_sweep(self, sweep_id: int, body: CommentIn | Mapping[str, Any] | None = None, /, **fields: Any) -> RetriedOut:
        'POST /v1/sweeps/{sweep_id}/retry: Retry Sweep'
        return self._call('POST', f'/v1/sweeps/{_seg(sweep_id)}/retry', params=None, body=_body(CommentIn, body, fields), answer=_RETRIEDOUT)

    def retry_rebalance(self, rebalance_id: int, body: CommentIn | Mapping[str, Any] | None = None, /, **fields: Any) -> RetriedOut:
        'POST /v1/rebalances/{rebalance_id}/retry: Retry Rebalance'
        return self._call('POST', f'/v1/rebalances/{_seg(rebalance_id)}/retry', params=None, body=_body(CommentIn, body, fields), answer=_RETRIEDOUT)

    def create_webhook_endpoint(self, body: EndpointIn | Mapping[str, Any] | None = None, /, **fields: Any) -> EndpointSecretOut:
        'POST /v1/webhook-endpoints: Create Endpoint'
        return self._call('POST', '/v1/webhook-endpoints', params=None, body=_body(EndpointIn, body, fields), answer=_ENDPOINTSECRETOUT)

    def list_webhook_endpoints(self, *, cursor: str | None = None, limit: int = 1000) -> list[EndpointOut]:
        'GET /v1/webhook-endpoints: List Endpoints'
        return self._call('GET', '/v1/webhook-endpoints', params={'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_ENDPOINTOUT)

    def iter_webhook_endpoints(self, *, limit: int = 1000) -> Iterator[EndpointOut]:
        'Every item of GET /v1/webhook-endpoints, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/webhook-endpoints', params={'cursor': cursor, 'limit': limit}, answer=_LIST_ENDPOINTOUT), None)

    def get_webhook_endpoint(self, endpoint_id: int, /) -> EndpointOut:
        'GET /v1/webhook-endpoints/{endpoint_id}: Get Endpoint'
        return self._call('GET', f'/v1/webhook-endpoints/{_seg(endpoint_id)}', params=None, body=None, answer=_ENDPOINTOUT)

    def update_webhook_endpoint(self, endpoint_id: int, body: EndpointPatch | Mapping[str, Any] | None = None, /, **fields: Any) -> EndpointOut:
        'PATCH /v1/webhook-endpoints/{endpoint_id}: Update Endpoint'
        return self._call('PATCH', f'/v1/webhook-endpoints/{_seg(endpoint_id)}', params=None, body=_body(EndpointPatch, body, fields), answer=_ENDPOINTOUT)

    def delete_webhook_endpoint(self, endpoint_id: int, /) -> EndpointOut:
        'DELETE /v1/webhook-endpoints/{endpoint_id}: Delete Endpoint'
        return self._call('DELETE', f'/v1/webhook-endpoints/{_seg(endpoint_id)}', params=None, body=None, answer=_ENDPOINTOUT)

    def rotate_webhook_secret(self, endpoint_id: int, body: WebhookRotateIn | Mapping[str, Any] | None = None, /, **fields: Any) -> EndpointSecretOut:
        'POST /v1/webhook-endpoints/{endpoint_id}/rotate-secret: Rotate Secret'
        return self._call('POST', f'/v1/webhook-endpoints/{_seg(endpoint_id)}/rotate-secret', params=None, body=_body(WebhookRotateIn, body, fields), answer=_ENDPOINTSECRETOUT)

    def list_webhook_deliveries(self, endpoint_id: int, /, *, state: Literal['pending', 'delivered', 'dead'] | None = None, cursor: str | None = None, limit: int = 100) -> list[DeliveryOut]:
        'GET /v1/webhook-endpoints/{endpoint_id}/deliveries: List Deliveries'
        return self._call('GET', f'/v1/webhook-endpoints/{_seg(endpoint_id)}/deliveries', params={'state': state, 'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_DELIVERYOUT)

    def iter_webhook_deliveries(self, endpoint_id: int, /, *, state: Literal['pending', 'delivered', 'dead'] | None = None, limit: int = 100) -> Iterator[DeliveryOut]:
        'Every item of GET /v1/webhook-endpoints/{endpoint_id}/deliveries, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', f'/v1/webhook-endpoints/{_seg(endpoint_id)}/deliveries', params={'state': state, 'cursor': cursor, 'limit': limit}, answer=_LIST_DELIVERYOUT), None)

    def replay_webhook_delivery(self, delivery_id: int, /) -> DeliveryOut:
        'POST /v1/webhook-deliveries/{delivery_id}/replay: Replay Delivery'
        return self._call('POST', f'/v1/webhook-deliveries/{_seg(delivery_id)}/replay', params=None, body=None, answer=_DELIVERYOUT)

    def replay_dead_webhook_deliveries(self, endpoint_id: int, /) -> ReplayedOut:
        'POST /v1/webhook-endpoints/{endpoint_id}/replay-dead: Replay Dead'
        return self._call('POST', f'/v1/webhook-endpoints/{_seg(endpoint_id)}/replay-dead', params=None, body=None, answer=_REPLAYEDOUT)

    def list_api_keys(self, *, live: bool = False, cursor: str | None = None, limit: int = 1000) -> ApiKeyList:
        'GET /v1/api-keys: Api Keys'
        return self._call('GET', '/v1/api-keys', params={'live': live, 'cursor': cursor, 'limit': limit}, body=None, answer=_APIKEYLIST)

    def iter_api_keys(self, *, live: bool = False, limit: int = 1000) -> Iterator[ApiKeyOut]:
        'Every item of GET /v1/api-keys, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/api-keys', params={'live': live, 'cursor': cursor, 'limit': limit}, answer=_APIKEYLIST), 'keys')

    def revoke_api_key(self, key_id: int, /) -> ApiKeyOut:
        'POST /v1/api-keys/{key_id}/revoke: Revoke'
        return self._call('POST', f'/v1/api-keys/{_seg(key_id)}/revoke', params=None, body=None, answer=_APIKEYOUT)

    def rotate_api_key(self, key_id: int, body: ApiKeyRotateIn | Mapping[str, Any] | None = None, /, **fields: Any) -> RotatedOut:
        'POST /v1/api-keys/{key_id}/rotate: Rotate'
        return self._call('POST', f'/v1/api-keys/{_seg(key_id)}/rotate', params=None, body=_body(ApiKeyRotateIn, body, fields), answer=_ROTATEDOUT)

    def health_live(self) -> Live:
        'GET /health/live: Live'
        return self._call('GET', '/health/live', params=None, body=None, answer=_LIVE)

    def health(self) -> Live:
        'GET /health: Health'
        return self._call('GET', '/health', params=None, body=None, answer=_LIVE)

    def health_ready(self) -> Ready:
        'GET /health/ready: Ready'
        return self._call('GET', '/health/ready', params=None, body=None, answer=_READY)

    def metrics(self) -> str:
        'GET /metrics: Metrics'
        return self._call('GET', '/metrics', params=None, body=None, answer=None)

    def create_quote(self, body: QuoteIn | Mapping[str, Any] | None = None, /, **fields: Any) -> QuoteOut:
        'POST /v1/quotes: Create Quote'
        return self._call('POST', '/v1/quotes', params=None, body=_body(QuoteIn, body, fields), answer=_QUOTEOUT)

    def get_quote(self, quote_id: int, /) -> QuoteOut:
        'GET /v1/quotes/{quote_id}: Get Quote'
        return self._call('GET', f'/v1/quotes/{_seg(quote_id)}', params=None, body=None, answer=_QUOTEOUT)

    def accept_quote(self, quote_id: int, body: AcceptIn | Mapping[str, Any] | None = None, /, **fields: Any) -> AcceptOut:
        'POST /v1/quotes/{quote_id}/accept: Accept Quote'
        return self._call('POST', f'/v1/quotes/{_seg(quote_id)}/accept', params=None, body=_body(AcceptIn, body, fields), answer=_ACCEPTOUT)

    def propose_convert_price(self, body: PriceIn | Mapping[str, Any] | None = None, /, **fields: Any) -> PriceChangeOut:
        'POST /v1/convert/prices: Propose Price'
        return self._call('POST', '/v1/convert/prices', params=None, body=_body(PriceIn, body, fields), answer=_PRICECHANGEOUT)

    def get_convert_price_change(self, change_id: int, /) -> PriceChangeOut:
        'GET /v1/convert/prices/changes/{change_id}: Get Price Change'
        return self._call('GET', f'/v1/convert/prices/changes/{_seg(change_id)}', params=None, body=None, answer=_PRICECHANGEOUT)

    def convert_price_approval_payload(self, change_id: int, /) -> PriceChangePayloadOut:
        'GET /v1/convert/prices/changes/{change_id}/approval-payload: Get Price Payload'
        return self._call('GET', f'/v1/convert/prices/changes/{_seg(change_id)}/approval-payload', params=None, body=None, answer=_PRICECHANGEPAYLOADOUT)

    def approve_convert_price(self, change_id: int, body: ApproveIn | Mapping[str, Any] | None = None, /, **fields: Any) -> PriceChangeOut:
        'POST /v1/convert/prices/changes/{change_id}/approve: Sign Price'
        return self._call('POST', f'/v1/convert/prices/changes/{_seg(change_id)}/approve', params=None, body=_body(ApproveIn, body, fields), answer=_PRICECHANGEOUT)

    def get_convert_liquidity(self, asset: str, /) -> LiquidityOut:
        'GET /v1/convert/liquidity/{asset}: Liquidity'
        return self._call('GET', f'/v1/convert/liquidity/{_seg(asset)}', params=None, body=None, answer=_LIQUIDITYOUT)


class AsyncMethods:
    """The routes, awaitable (httpx.AsyncClient)."""

    async def create_asset(self, body: AssetIn | Mapping[str, Any] | None = None, /, **fields: Any) -> AssetOut:
        'POST /v1/assets: Create Asset'
        return await self._call('POST', '/v1/assets', params=None, body=_body(AssetIn, body, fields), answer=_ASSETOUT)

    async def list_assets(self, *, cursor: str | None = None, limit: int = 1000) -> list[AssetOut]:
        'GET /v1/assets: List Assets'
        return await self._call('GET', '/v1/assets', params={'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_ASSETOUT)

    def iter_assets(self, *, limit: int = 1000) -> AsyncIterator[AssetOut]:
        'Every item of GET /v1/assets, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/assets', params={'cursor': cursor, 'limit': limit}, answer=_LIST_ASSETOUT), None)

    async def open_account(self, body: AccountIn | Mapping[str, Any] | None = None, /, **fields: Any) -> AccountOut:
        'POST /v1/accounts: Open Account'
        return await self._call('POST', '/v1/accounts', params=None, body=_body(AccountIn, body, fields), answer=_ACCOUNTOUT)

    async def list_firm_accounts(self, *, asset: str | None = None, cursor: str | None = None, limit: int = 1000) -> list[AccountOut]:
        'GET /v1/firm-accounts: Firm Accounts'
        return await self._call('GET', '/v1/firm-accounts', params={'asset': asset, 'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_ACCOUNTOUT)

    def iter_firm_accounts(self, *, asset: str | None = None, limit: int = 1000) -> AsyncIterator[AccountOut]:
        'Every item of GET /v1/firm-accounts, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/firm-accounts', params={'asset': asset, 'cursor': cursor, 'limit': limit}, answer=_LIST_ACCOUNTOUT), None)

    async def get_account(self, account_id: int, /) -> AccountOut:
        'GET /v1/accounts/{account_id}: Get Account'
        return await self._call('GET', f'/v1/accounts/{_seg(account_id)}', params=None, body=None, answer=_ACCOUNTOUT)

    async def close_account(self, account_id: int, /) -> AccountOut:
        'POST /v1/accounts/{account_id}/close: Close Account'
        return await self._call('POST', f'/v1/accounts/{_seg(account_id)}/close', params=None, body=None, answer=_ACCOUNTOUT)

    async def get_balance(self, account_id: int, /) -> BalanceOut:
        'GET /v1/accounts/{account_id}/balance: Balance'
        return await self._call('GET', f'/v1/accounts/{_seg(account_id)}/balance', params=None, body=None, answer=_BALANCEOUT)

    async def get_statement(self, account_id: int, /, *, after: int | None = None, cursor: str | None = None, limit: int = 100) -> StatementOut:
        'GET /v1/accounts/{account_id}/statement: Statement'
        return await self._call('GET', f'/v1/accounts/{_seg(account_id)}/statement', params={'after': after, 'cursor': cursor, 'limit': limit}, body=None, answer=_STATEMENTOUT)

    def iter_statement(self, account_id: int, /, *, after: int | None = None, limit: int = 100) -> AsyncIterator[StatementLineOut]:
        'Every item of GET /v1/accounts/{account_id}/statement, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', f'/v1/accounts/{_seg(account_id)}/statement', params={'after': after, 'cursor': cursor, 'limit': limit}, answer=_STATEMENTOUT), 'lines')

    async def post_transaction(self, body: TransactionIn | Mapping[str, Any] | None = None, /, **fields: Any) -> TransactionOut:
        'POST /v1/transactions: Post Transaction'
        return await self._call('POST', '/v1/transactions', params=None, body=_body(TransactionIn, body, fields), answer=_TRANSACTIONOUT)

    async def get_transaction(self, transaction_id: int, /) -> JournalTransactionOut:
        'GET /v1/transactions/{transaction_id}: Get Transaction'
        return await self._call('GET', f'/v1/transactions/{_seg(transaction_id)}', params=None, body=None, answer=_JOURNALTRANSACTIONOUT)

    async def reverse_transaction(self, transaction_id: int, body: ReverseIn | Mapping[str, Any] | None = None, /, **fields: Any) -> TransactionOut:
        'POST /v1/transactions/{transaction_id}/reverse: Reverse'
        return await self._call('POST', f'/v1/transactions/{_seg(transaction_id)}/reverse', params=None, body=_body(ReverseIn, body, fields), answer=_TRANSACTIONOUT)

    async def place_hold(self, body: HoldIn | Mapping[str, Any] | None = None, /, **fields: Any) -> HoldOut:
        'POST /v1/holds: Place Hold'
        return await self._call('POST', '/v1/holds', params=None, body=_body(HoldIn, body, fields), answer=_HOLDOUT)

    async def get_hold(self, hold_id: int, /) -> HoldOut:
        'GET /v1/holds/{hold_id}: Get Hold'
        return await self._call('GET', f'/v1/holds/{_seg(hold_id)}', params=None, body=None, answer=_HOLDOUT)

    async def capture_hold(self, hold_id: int, body: CaptureIn | Mapping[str, Any] | None = None, /, **fields: Any) -> TransactionOut:
        'POST /v1/holds/{hold_id}/capture: Capture'
        return await self._call('POST', f'/v1/holds/{_seg(hold_id)}/capture', params=None, body=_body(CaptureIn, body, fields), answer=_TRANSACTIONOUT)

    async def release_hold(self, hold_id: int, /) -> HoldOut:
        'POST /v1/holds/{hold_id}/release: Release'
        return await self._call('POST', f'/v1/holds/{_seg(hold_id)}/release', params=None, body=None, answer=_HOLDOUT)

    async def get_totals(self) -> dict[str, Money]:
        'GET /v1/totals: Totals'
        return await self._call('GET', '/v1/totals', params=None, body=None, answer=_DICT_STR_MONEY)

    async def verify(self) -> VerifyOut:
        'GET /v1/verify: Verify'
        return await self._call('GET', '/v1/verify', params=None, body=None, answer=_VERIFYOUT)

    async def issue_deposit_address(self, body: AddressIn | Mapping[str, Any] | None = None, /, **fields: Any) -> AddressOut:
        'POST /v1/deposit-addresses: Issue Address'
        return await self._call('POST', '/v1/deposit-addresses', params=None, body=_body(AddressIn, body, fields), answer=_ADDRESSOUT)

    async def list_account_deposits(self, account_id: int, /, *, cursor: str | None = None, limit: int = 200) -> list[DepositOut]:
        'GET /v1/accounts/{account_id}/deposits: Account Deposits'
        return await self._call('GET', f'/v1/accounts/{_seg(account_id)}/deposits', params={'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_DEPOSITOUT)

    def iter_account_deposits(self, account_id: int, /, *, limit: int = 200) -> AsyncIterator[DepositOut]:
        'Every item of GET /v1/accounts/{account_id}/deposits, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', f'/v1/accounts/{_seg(account_id)}/deposits', params={'cursor': cursor, 'limit': limit}, answer=_LIST_DEPOSITOUT), None)

    async def list_deposits(self, *, state: Literal['seen', 'confirming', 'final', 'credited', 'orphaned', 'quarantined', 'released', 'dust'] = 'quarantined', cursor: str | None = None, limit: int = 200) -> list[DepositOut]:
        'GET /v1/deposits: Deposits By State'
        return await self._call('GET', '/v1/deposits', params={'state': state, 'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_DEPOSITOUT)

    def iter_deposits(self, *, state: Literal['seen', 'confirming', 'final', 'credited', 'orphaned', 'quarantined', 'released', 'dust'] = 'quarantined', limit: int = 200) -> AsyncIterator[DepositOut]:
        'Every item of GET /v1/deposits, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/deposits', params={'state': state, 'cursor': cursor, 'limit': limit}, answer=_LIST_DEPOSITOUT), None)

    async def release_deposit(self, deposit_id: int, body: ReasonIn | Mapping[str, Any] | None = None, /, **fields: Any) -> DepositOut:
        'POST /v1/deposits/{deposit_id}/release: Release'
        return await self._call('POST', f'/v1/deposits/{_seg(deposit_id)}/release', params=None, body=_body(ReasonIn, body, fields), answer=_DEPOSITOUT)

    async def return_deposit(self, deposit_id: int, body: ReturnIn | Mapping[str, Any] | None = None, /, **fields: Any) -> DepositReturnOut:
        'POST /v1/deposits/{deposit_id}/return: Return Deposit'
        return await self._call('POST', f'/v1/deposits/{_seg(deposit_id)}/return', params=None, body=_body(ReturnIn, body, fields), answer=_DEPOSITRETURNOUT)

    async def list_incidents(self, *, open_only: bool = True, cursor: str | None = None, limit: int = 500) -> list[IncidentOut]:
        'GET /v1/incidents: Incidents'
        return await self._call('GET', '/v1/incidents', params={'open_only': open_only, 'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_INCIDENTOUT)

    def iter_incidents(self, *, open_only: bool = True, limit: int = 500) -> AsyncIterator[IncidentOut]:
        'Every item of GET /v1/incidents, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/incidents', params={'open_only': open_only, 'cursor': cursor, 'limit': limit}, answer=_LIST_INCIDENTOUT), None)

    async def resolve_incident(self, incident_id: int, body: ResolveIn | Mapping[str, Any] | None = None, /, **fields: Any) -> IncidentOut:
        'POST /v1/incidents/{incident_id}/resolve: Resolve Incident'
        return await self._call('POST', f'/v1/incidents/{_seg(incident_id)}/resolve', params=None, body=_body(ResolveIn, body, fields), answer=_INCIDENTOUT)

    async def reconcile(self) -> list[ReconciliationLineOut]:
        'POST /v1/reconciliation: Reconcile'
        return await self._call('POST', '/v1/reconciliation', params=None, body=None, answer=_LIST_RECONCILIATIONLINEOUT)

    async def publish_reserve_report(self, body: ReserveRequestIn | Mapping[str, Any] | None = None, /, **fields: Any) -> ReserveRequestOut:
        'POST /v1/reserves/reports: Publish Reserves'
        return await self._call('POST', '/v1/reserves/reports', params=None, body=_body(ReserveRequestIn, body, fields), answer=_RESERVEREQUESTOUT)

    async def get_reserve_report(self, report_id: int, /) -> ReserveJobOut:
        'GET /v1/reserves/reports/{report_id}: Reserves Report'
        return await self._call('GET', f'/v1/reserves/reports/{_seg(report_id)}', params=None, body=None, answer=_RESERVEJOBOUT)

    async def get_reserve_proof(self, report_id: int, /, *, account_id: int) -> ReserveProofOut:
        'GET /v1/reserves/reports/{report_id}/proof: Reserves Proof'
        return await self._call('GET', f'/v1/reserves/reports/{_seg(report_id)}/proof', params={'account_id': account_id}, body=None, answer=_RESERVEPROOFOUT)

    async def get_kill_switch(self) -> KillSwitchOut:
        'GET /v1/kill-switch: Get Kill Switch'
        return await self._call('GET', '/v1/kill-switch', params=None, body=None, answer=_KILLSWITCHOUT)

    async def set_kill_switch(self, body: KillSwitchIn | Mapping[str, Any] | None = None, /, **fields: Any) -> KillSwitchOut:
        'POST /v1/kill-switch: Change Kill Switch'
        return await self._call('POST', '/v1/kill-switch', params=None, body=_body(KillSwitchIn, body, fields), answer=_KILLSWITCHOUT)

    async def create_market(self, body: MarketIn | Mapping[str, Any] | None = None, /, **fields: Any) -> MarketOut:
        'POST /v1/markets: Create Market'
        return await self._call('POST', '/v1/markets', params=None, body=_body(MarketIn, body, fields), answer=_MARKETOUT)

    async def list_markets(self, *, cursor: str | None = None, limit: int = 1000) -> list[MarketOut]:
        'GET /v1/markets: List Markets'
        return await self._call('GET', '/v1/markets', params={'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_MARKETOUT)

    def iter_markets(self, *, limit: int = 1000) -> AsyncIterator[MarketOut]:
        'Every item of GET /v1/markets, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/markets', params={'cursor': cursor, 'limit': limit}, answer=_LIST_MARKETOUT), None)

    async def place_order(self, symbol: str, body: OrderIn | Mapping[str, Any] | None = None, /, **fields: Any) -> OrderOut:
        'POST /v1/markets/{symbol}/orders: Place Order'
        return await self._call('POST', f'/v1/markets/{_seg(symbol)}/orders', params=None, body=_body(OrderIn, body, fields), answer=_ORDEROUT)

    async def get_order_by_client_id(self, symbol: str, /, *, account: str, client_order_id: str) -> OrderOut:
        'GET /v1/markets/{symbol}/orders: Get Order By Client Id'
        return await self._call('GET', f'/v1/markets/{_seg(symbol)}/orders', params={'account': account, 'client_order_id': client_order_id}, body=None, answer=_ORDEROUT)

    async def cancel_order(self, symbol: str, order_id: str, body: CancelIn | Mapping[str, Any] | None = None, /, **fields: Any) -> OrderOut:
        'POST /v1/markets/{symbol}/orders/{order_id}/cancel: Cancel Order'
        return await self._call('POST', f'/v1/markets/{_seg(symbol)}/orders/{_seg(order_id)}/cancel', params=None, body=_body(CancelIn, body, fields), answer=_ORDEROUT)

    async def amend_order(self, symbol: str, order_id: str, body: AmendIn | Mapping[str, Any] | None = None, /, **fields: Any) -> OrderOut:
        'POST /v1/markets/{symbol}/orders/{order_id}/amend: Amend Order'
        return await self._call('POST', f'/v1/markets/{_seg(symbol)}/orders/{_seg(order_id)}/amend', params=None, body=_body(AmendIn, body, fields), answer=_ORDEROUT)

    async def get_order(self, symbol: str, order_id: str, /) -> OrderOut:
        'GET /v1/markets/{symbol}/orders/{order_id}: Get Order'
        return await self._call('GET', f'/v1/markets/{_seg(symbol)}/orders/{_seg(order_id)}', params=None, body=None, answer=_ORDEROUT)

    async def list_fills(self, symbol: str, /, *, order_id: str | None = None, account: str | None = None, after: int | None = None, cursor: str | None = None, limit: int = 100) -> FillsOut:
        'GET /v1/markets/{symbol}/fills: List Fills'
        return await self._call('GET', f'/v1/markets/{_seg(symbol)}/fills', params={'order_id': order_id, 'account': account, 'after': after, 'cursor': cursor, 'limit': limit}, body=None, answer=_FILLSOUT)

    def iter_fills(self, symbol: str, /, *, order_id: str | None = None, account: str | None = None, after: int | None = None, limit: int = 100) -> AsyncIterator[FillOut]:
        'Every item of GET /v1/markets/{symbol}/fills, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', f'/v1/markets/{_seg(symbol)}/fills', params={'order_id': order_id, 'account': account, 'after': after, 'cursor': cursor, 'limit': limit}, answer=_FILLSOUT), 'fills')

    async def get_depth(self, symbol: str, /, *, levels: int = 50) -> DepthOut:
        'GET /v1/markets/{symbol}/depth: Depth'
        return await self._call('GET', f'/v1/markets/{_seg(symbol)}/depth', params={'levels': levels}, body=None, answer=_DEPTHOUT)

    async def request_withdrawal(self, body: WithdrawalIn | Mapping[str, Any] | None = None, /, **fields: Any) -> WithdrawalOut:
        'POST /v1/withdrawals: Request Withdrawal'
        return await self._call('POST', '/v1/withdrawals', params=None, body=_body(WithdrawalIn, body, fields), answer=_WITHDRAWALOUT)

    async def list_withdrawals(self, *, state: str = 'pending_approval', cursor: str | None = None, limit: int = 200) -> list[WithdrawalOut]:
        'GET /v1/withdrawals: List Withdrawals'
        return await self._call('GET', '/v1/withdrawals', params={'state': state, 'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_WITHDRAWALOUT)

    def iter_withdrawals(self, *, state: str = 'pending_approval', limit: int = 200) -> AsyncIterator[WithdrawalOut]:
        'Every item of GET /v1/withdrawals, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/withdrawals', params={'state': state, 'cursor': cursor, 'limit': limit}, answer=_LIST_WITHDRAWALOUT), None)

    async def get_withdrawal(self, withdrawal_id: int, /) -> WithdrawalOut:
        'GET /v1/withdrawals/{withdrawal_id}: Get Withdrawal'
        return await self._call('GET', f'/v1/withdrawals/{_seg(withdrawal_id)}', params=None, body=None, answer=_WITHDRAWALOUT)

    async def get_approval_payload(self, withdrawal_id: int, /) -> ApprovalPayloadOut:
        'GET /v1/withdrawals/{withdrawal_id}/approval-payload: Approval Payload'
        return await self._call('GET', f'/v1/withdrawals/{_seg(withdrawal_id)}/approval-payload', params=None, body=None, answer=_APPROVALPAYLOADOUT)

    async def approve_withdrawal(self, withdrawal_id: int, body: ApproveIn | Mapping[str, Any] | None = None, /, **fields: Any) -> WithdrawalOut:
        'POST /v1/withdrawals/{withdrawal_id}/approve: Approve'
        return await self._call('POST', f'/v1/withdrawals/{_seg(withdrawal_id)}/approve', params=None, body=_body(ApproveIn, body, fields), answer=_WITHDRAWALOUT)

    async def reject_withdrawal(self, withdrawal_id: int, body: CommentIn | Mapping[str, Any] | None = None, /, **fields: Any) -> WithdrawalOut:
        'POST /v1/withdrawals/{withdrawal_id}/reject: Reject'
        return await self._call('POST', f'/v1/withdrawals/{_seg(withdrawal_id)}/reject', params=None, body=_body(CommentIn, body, fields), answer=_WITHDRAWALOUT)

    async def set_allowlist(self, account_id: int, body: AllowlistPolicyIn | Mapping[str, Any] | None = None, /, **fields: Any) -> AllowlistOut:
        'PUT /v1/accounts/{account_id}/allowlist: Set Allowlist'
        return await self._call('PUT', f'/v1/accounts/{_seg(account_id)}/allowlist', params=None, body=_body(AllowlistPolicyIn, body, fields), answer=_ALLOWLISTOUT)

    async def get_allowlist(self, account_id: int, /) -> AllowlistOut:
        'GET /v1/accounts/{account_id}/allowlist: Get Allowlist'
        return await self._call('GET', f'/v1/accounts/{_seg(account_id)}/allowlist', params=None, body=None, answer=_ALLOWLISTOUT)

    async def allow_destination(self, account_id: int, body: AllowlistEntryIn | Mapping[str, Any] | None = None, /, **fields: Any) -> DestinationAllowedOut:
        'POST /v1/accounts/{account_id}/allowlist: Allow Destination'
        return await self._call('POST', f'/v1/accounts/{_seg(account_id)}/allowlist', params=None, body=_body(AllowlistEntryIn, body, fields), answer=_DESTINATIONALLOWEDOUT)

    async def remove_destination(self, account_id: int, address: str, /) -> DestinationRemovedOut:
        'DELETE /v1/accounts/{account_id}/allowlist/{address}: Remove Destination'
        return await self._call('DELETE', f'/v1/accounts/{_seg(account_id)}/allowlist/{_seg(address)}', params=None, body=None, answer=_DESTINATIONREMOVEDOUT)

    async def list_allowlist_changes(self, *, state: Literal['pending', 'approved', 'rejected', 'superseded'] = 'pending', cursor: str | None = None, limit: int = 200) -> list[AllowlistChangeOut]:
        'GET /v1/allowlist-changes: Allowlist Changes'
        return await self._call('GET', '/v1/allowlist-changes', params={'state': state, 'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_ALLOWLISTCHANGEOUT)

    def iter_allowlist_changes(self, *, state: Literal['pending', 'approved', 'rejected', 'superseded'] = 'pending', limit: int = 200) -> AsyncIterator[AllowlistChangeOut]:
        'Every item of GET /v1/allowlist-changes, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/allowlist-changes', params={'state': state, 'cursor': cursor, 'limit': limit}, answer=_LIST_ALLOWLISTCHANGEOUT), None)

    async def approve_allowlist_change(self, change_id: int, body: CommentIn | Mapping[str, Any] | None = None, /, **fields: Any) -> AllowlistChangeOut:
        'POST /v1/allowlist-changes/{change_id}/approve: Approve Allowlist Change'
        return await self._call('POST', f'/v1/allowlist-changes/{_seg(change_id)}/approve', params=None, body=_body(CommentIn, body, fields), answer=_ALLOWLISTCHANGEOUT)

    async def reject_allowlist_change(self, change_id: int, body: CommentIn | Mapping[str, Any] | None = None, /, **fields: Any) -> AllowlistChangeOut:
        'POST /v1/allowlist-changes/{change_id}/reject: Reject Allowlist Change'
        return await self._call('POST', f'/v1/allowlist-changes/{_seg(change_id)}/reject', params=None, body=_body(CommentIn, body, fields), answer=_ALLOWLISTCHANGEOUT)

    async def list_rebalances(self, *, state: str | None = None, cursor: str | None = None, limit: int = 50) -> list[RebalanceOut]:
        'GET /v1/rebalances: List Rebalances'
        return await self._call('GET', '/v1/rebalances', params={'state': state, 'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_REBALANCEOUT)

    def iter_rebalances(self, *, state: str | None = None, limit: int = 50) -> AsyncIterator[RebalanceOut]:
        'Every item of GET /v1/rebalances, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/rebalances', params={'state': state, 'cursor': cursor, 'limit': limit}, answer=_LIST_REBALANCEOUT), None)

    async def run_rebalances(self) -> list[RebalanceOut]:
        'POST /v1/rebalances/run: Run Rebalances'
        return await self._call('POST', '/v1/rebalances/run', params=None, body=None, answer=_LIST_REBALANCEOUT)

    async def abandon_rebalance(self, rebalance_id: int, body: CommentIn | Mapping[str, Any] | None = None, /, **fields: Any) -> RebalanceOut:
        'POST /v1/rebalances/{rebalance_id}/abandon: Abandon Rebalance'
        return await self._call('POST', f'/v1/rebalances/{_seg(rebalance_id)}/abandon', params=None, body=_body(CommentIn, body, fields), answer=_REBALANCEOUT)

    async def open_cold_to_hot(self, body: ColdToHotIn | Mapping[str, Any] | None = None, /, **fields: Any) -> PsbtOut:
        'POST /v1/rebalances/cold-to-hot: Open Cold To Hot'
        return await self._call('POST', '/v1/rebalances/cold-to-hot', params=None, body=_body(ColdToHotIn, body, fields), answer=_PSBTOUT)

    async def export_psbt(self, rebalance_id: int, /) -> PsbtOut:
        'GET /v1/rebalances/{rebalance_id}/psbt: Export Psbt'
        return await self._call('GET', f'/v1/rebalances/{_seg(rebalance_id)}/psbt', params=None, body=None, answer=_PSBTOUT)

    async def import_psbt(self, rebalance_id: int, body: PsbtIn | Mapping[str, Any] | None = None, /, **fields: Any) -> PsbtOut:
        'POST /v1/rebalances/{rebalance_id}/psbt: Import Psbt'
        return await self._call('POST', f'/v1/rebalances/{_seg(rebalance_id)}/psbt', params=None, body=_body(PsbtIn, body, fields), answer=_PSBTOUT)

    async def refill_approval_payload(self, rebalance_id: int, /) -> RefillPayloadOut:
        'GET /v1/rebalances/{rebalance_id}/approval-payload: Refill Payload'
        return await self._call('GET', f'/v1/rebalances/{_seg(rebalance_id)}/approval-payload', params=None, body=None, answer=_REFILLPAYLOADOUT)

    async def approve_refill(self, rebalance_id: int, body: ApproveIn | Mapping[str, Any] | None = None, /, **fields: Any) -> RefillApprovedOut:
        'POST /v1/rebalances/{rebalance_id}/approve: Approve Refill'
        return await self._call('POST', f'/v1/rebalances/{_seg(rebalance_id)}/approve', params=None, body=_body(ApproveIn, body, fields), answer=_REFILLAPPROVEDOUT)

    async def list_eth_rebalances(self, *, state: str | None = None, cursor: str | None = None, limit: int = 50) -> list[EthRebalanceOut]:
        'GET /v1/eth-rebalances: List Eth Rebalances'
        return await self._call('GET', '/v1/eth-rebalances', params={'state': state, 'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_ETHREBALANCEOUT)

    def iter_eth_rebalances(self, *, state: str | None = None, limit: int = 50) -> AsyncIterator[EthRebalanceOut]:
        'Every item of GET /v1/eth-rebalances, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/eth-rebalances', params={'state': state, 'cursor': cursor, 'limit': limit}, answer=_LIST_ETHREBALANCEOUT), None)

    async def eth_refill_approval_payload(self, rebalance_id: int, /) -> RefillPayloadOut:
        'GET /v1/eth-rebalances/{rebalance_id}/approval-payload: Eth Refill Payload'
        return await self._call('GET', f'/v1/eth-rebalances/{_seg(rebalance_id)}/approval-payload', params=None, body=None, answer=_REFILLPAYLOADOUT)

    async def approve_eth_refill(self, rebalance_id: int, body: ApproveIn | Mapping[str, Any] | None = None, /, **fields: Any) -> EthRefillApprovedOut:
        'POST /v1/eth-rebalances/{rebalance_id}/approve: Approve Eth Refill'
        return await self._call('POST', f'/v1/eth-rebalances/{_seg(rebalance_id)}/approve', params=None, body=_body(ApproveIn, body, fields), answer=_ETHREFILLAPPROVEDOUT)

    async def book_hot_funding(self, body: HotFundingIn | Mapping[str, Any] | None = None, /, **fields: Any) -> list[HotFundingOut]:
        'POST /v1/treasury/hot-funding: Book Hot Funding'
        return await self._call('POST', '/v1/treasury/hot-funding', params=None, body=_body(HotFundingIn, body, fields), answer=_LIST_HOTFUNDINGOUT)

    async def propose_adjustment(self, body: AdjustmentIn | Mapping[str, Any] | None = None, /, **fields: Any) -> AdjustmentOut:
        'POST /v1/treasury/adjustments: Propose'
        return await self._call('POST', '/v1/treasury/adjustments', params=None, body=_body(AdjustmentIn, body, fields), answer=_ADJUSTMENTOUT)

    async def list_adjustments(self, *, state: Literal['proposed', 'approved', 'posted', 'rejected'] | None = None, cursor: str | None = None, limit: int = 200) -> list[AdjustmentOut]:
        'GET /v1/treasury/adjustments: List Adjustments'
        return await self._call('GET', '/v1/treasury/adjustments', params={'state': state, 'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_ADJUSTMENTOUT)

    def iter_adjustments(self, *, state: Literal['proposed', 'approved', 'posted', 'rejected'] | None = None, limit: int = 200) -> AsyncIterator[AdjustmentOut]:
        'Every item of GET /v1/treasury/adjustments, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/treasury/adjustments', params={'state': state, 'cursor': cursor, 'limit': limit}, answer=_LIST_ADJUSTMENTOUT), None)

    async def adjustment_approval_payload(self, adjustment_id: int, /) -> AdjustmentPayloadOut:
        'GET /v1/treasury/adjustments/{adjustment_id}/approval-payload: Get Approval Payload'
        return await self._call('GET', f'/v1/treasury/adjustments/{_seg(adjustment_id)}/approval-payload', params=None, body=None, answer=_ADJUSTMENTPAYLOADOUT)

    async def approve_adjustment(self, adjustment_id: int, body: ApproveIn | Mapping[str, Any] | None = None, /, **fields: Any) -> AdjustmentOut:
        'POST /v1/treasury/adjustments/{adjustment_id}/approve: Approve'
        return await self._call('POST', f'/v1/treasury/adjustments/{_seg(adjustment_id)}/approve', params=None, body=_body(ApproveIn, body, fields), answer=_ADJUSTMENTOUT)

    async def reject_adjustment(self, adjustment_id: int, body: CommentIn | Mapping[str, Any] | None = None, /, **fields: Any) -> AdjustmentOut:
        'POST /v1/treasury/adjustments/{adjustment_id}/reject: Reject'
        return await self._call('POST', f'/v1/treasury/adjustments/{_seg(adjustment_id)}/reject', params=None, body=_body(CommentIn, body, fields), answer=_ADJUSTMENTOUT)

    async def get_adjustment(self, adjustment_id: int, /) -> AdjustmentOut:
        'GET /v1/treasury/adjustments/{adjustment_id}: Get Adjustment'
        return await self._call('GET', f'/v1/treasury/adjustments/{_seg(adjustment_id)}', params=None, body=None, answer=_ADJUSTMENTOUT)

    async def list_set_aside(self, *, cursor: str | None = None, limit: int = 1000) -> list[SetAsideOut]:
        'GET /v1/set-aside: List Set Aside'
        return await self._call('GET', '/v1/set-aside', params={'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_SETASIDEOUT)

    def iter_set_aside(self, *, limit: int = 1000) -> AsyncIterator[SetAsideOut]:
        'Every item of GET /v1/set-aside, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/set-aside', params={'cursor': cursor, 'limit': limit}, answer=_LIST_SETASIDEOUT), None)

    async def retry_batch(self, batch_id: int, body: CommentIn | Mapping[str, Any] | None = None, /, **fields: Any) -> RetriedOut:
        'POST /v1/withdrawal-batches/{batch_id}/retry: Retry Batch'
        return await self._call('POST', f'/v1/withdrawal-batches/{_seg(batch_id)}/retry', params=None, body=_body(CommentIn, body, fields), answer=_RETRIEDOUT)

    async def retry_sweep(self, sweep_id: int, body: CommentIn | Mapping[str, Any] | None = None, /, **fields: Any) -> RetriedOut:
        'POST /v1/sweeps/{sweep_id}/retry: Retry Sweep'
        return await self._call('POST', f'/v1/sweeps/{_seg(sweep_id)}/retry', params=None, body=_body(CommentIn, body, fields), answer=_RETRIEDOUT)

    async def retry_rebalance(self, rebalance_id: int, body: CommentIn | Mapping[str, Any] | None = None, /, **fields: Any) -> RetriedOut:
        'POST /v1/rebalances/{rebalance_id}/retry: Retry Rebalance'
        return await self._call('POST', f'/v1/rebalances/{_seg(rebalance_id)}/retry', params=None, body=_body(CommentIn, body, fields), answer=_RETRIEDOUT)

    async def create_webhook_endpoint(self, body: EndpointIn | Mapping[str, Any] | None = None, /, **fields: Any) -> EndpointSecretOut:
        'POST /v1/webhook-endpoints: Create Endpoint'
        return await self._call('POST', '/v1/webhook-endpoints', params=None, body=_body(EndpointIn, body, fields), answer=_ENDPOINTSECRETOUT)

    async def list_webhook_endpoints(self, *, cursor: str | None = None, limit: int = 1000) -> list[EndpointOut]:
        'GET /v1/webhook-endpoints: List Endpoints'
        return await self._call('GET', '/v1/webhook-endpoints', params={'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_ENDPOINTOUT)

    def iter_webhook_endpoints(self, *, limit: int = 1000) -> AsyncIterator[EndpointOut]:
        'Every item of GET /v1/webhook-endpoints, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/webhook-endpoints', params={'cursor': cursor, 'limit': limit}, answer=_LIST_ENDPOINTOUT), None)

    async def get_webhook_endpoint(self, endpoint_id: int, /) -> EndpointOut:
        'GET /v1/webhook-endpoints/{endpoint_id}: Get Endpoint'
        return await self._call('GET', f'/v1/webhook-endpoints/{_seg(endpoint_id)}', params=None, body=None, answer=_ENDPOINTOUT)

    async def update_webhook_endpoint(self, endpoint_id: int, body: EndpointPatch | Mapping[str, Any] | None = None, /, **fields: Any) -> EndpointOut:
        'PATCH /v1/webhook-endpoints/{endpoint_id}: Update Endpoint'
        return await self._call('PATCH', f'/v1/webhook-endpoints/{_seg(endpoint_id)}', params=None, body=_body(EndpointPatch, body, fields), answer=_ENDPOINTOUT)

    async def delete_webhook_endpoint(self, endpoint_id: int, /) -> EndpointOut:
        'DELETE /v1/webhook-endpoints/{endpoint_id}: Delete Endpoint'
        return await self._call('DELETE', f'/v1/webhook-endpoints/{_seg(endpoint_id)}', params=None, body=None, answer=_ENDPOINTOUT)

    async def rotate_webhook_secret(self, endpoint_id: int, body: WebhookRotateIn | Mapping[str, Any] | None = None, /, **fields: Any) -> EndpointSecretOut:
        'POST /v1/webhook-endpoints/{endpoint_id}/rotate-secret: Rotate Secret'
        return await self._call('POST', f'/v1/webhook-endpoints/{_seg(endpoint_id)}/rotate-secret', params=None, body=_body(WebhookRotateIn, body, fields), answer=_ENDPOINTSECRETOUT)

    async def list_webhook_deliveries(self, endpoint_id: int, /, *, state: Literal['pending', 'delivered', 'dead'] | None = None, cursor: str | None = None, limit: int = 100) -> list[DeliveryOut]:
        'GET /v1/webhook-endpoints/{endpoint_id}/deliveries: List Deliveries'
        return await self._call('GET', f'/v1/webhook-endpoints/{_seg(endpoint_id)}/deliveries', params={'state': state, 'cursor': cursor, 'limit': limit}, body=None, answer=_LIST_DELIVERYOUT)

    def iter_webhook_deliveries(self, endpoint_id: int, /, *, state: Literal['pending', 'delivered', 'dead'] | None = None, limit: int = 100) -> AsyncIterator[DeliveryOut]:
        'Every item of GET /v1/webhook-endpoints/{endpoint_id}/deliveries, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', f'/v1/webhook-endpoints/{_seg(endpoint_id)}/deliveries', params={'state': state, 'cursor': cursor, 'limit': limit}, answer=_LIST_DELIVERYOUT), None)

    async def replay_webhook_delivery(self, delivery_id: int, /) -> DeliveryOut:
        'POST /v1/webhook-deliveries/{delivery_id}/replay: Replay Delivery'
        return await self._call('POST', f'/v1/webhook-deliveries/{_seg(delivery_id)}/replay', params=None, body=None, answer=_DELIVERYOUT)

    async def replay_dead_webhook_deliveries(self, endpoint_id: int, /) -> ReplayedOut:
        'POST /v1/webhook-endpoints/{endpoint_id}/replay-dead: Replay Dead'
        return await self._call('POST', f'/v1/webhook-endpoints/{_seg(endpoint_id)}/replay-dead', params=None, body=None, answer=_REPLAYEDOUT)

    async def list_api_keys(self, *, live: bool = False, cursor: str | None = None, limit: int = 1000) -> ApiKeyList:
        'GET /v1/api-keys: Api Keys'
        return await self._call('GET', '/v1/api-keys', params={'live': live, 'cursor': cursor, 'limit': limit}, body=None, answer=_APIKEYLIST)

    def iter_api_keys(self, *, live: bool = False, limit: int = 1000) -> AsyncIterator[ApiKeyOut]:
        'Every item of GET /v1/api-keys, page after page (follows X-Next-Cursor).'
        return self._walk(lambda cursor: self._page('GET', '/v1/api-keys', params={'live': live, 'cursor': cursor, 'limit': limit}, answer=_APIKEYLIST), 'keys')

    async def revoke_api_key(self, key_id: int, /) -> ApiKeyOut:
        'POST /v1/api-keys/{key_id}/revoke: Revoke'
        return await self._call('POST', f'/v1/api-keys/{_seg(key_id)}/revoke', params=None, body=None, answer=_APIKEYOUT)

    async def rotate_api_key(self, key_id: int, body: ApiKeyRotateIn | Mapping[str, Any] | None = None, /, **fields: Any) -> RotatedOut:
        'POST /v1/api-keys/{key_id}/rotate: Rotate'
        return await self._call('POST', f'/v1/api-keys/{_seg(key_id)}/rotate', params=None, body=_body(ApiKeyRotateIn, body, fields), answer=_ROTATEDOUT)

    async def health_live(self) -> Live:
        'GET /health/live: Live'
        return await self._call('GET', '/health/live', params=None, body=None, answer=_LIVE)

    async def health(self) -> Live:
        'GET /health: Health'
        return await self._call('GET', '/health', params=None, body=None, answer=_LIVE)

    async def health_ready(self) -> Ready:
        'GET /health/ready: Ready'
        return await self._call('GET', '/health/ready', params=None, body=None, answer=_READY)

    async def metrics(self) -> str:
        'GET /metrics: Metrics'
        return await self._call('GET', '/metrics', params=None, body=None, answer=None)

    async def create_quote(self, body: QuoteIn | Mapping[str, Any] | None = None, /, **fields: Any) -> QuoteOut:
        'POST /v1/quotes: Create Quote'
        return await self._call('POST', '/v1/quotes', params=None, body=_body(QuoteIn, body, fields), answer=_QUOTEOUT)

    async def get_quote(self, quote_id: int, /) -> QuoteOut:
        'GET /v1/quotes/{quote_id}: Get Quote'
        return await self._call('GET', f'/v1/quotes/{_seg(quote_id)}', params=None, body=None, answer=_QUOTEOUT)

    async def accept_quote(self, quote_id: int, body: AcceptIn | Mapping[str, Any] | None = None, /, **fields: Any) -> AcceptOut:
        'POST /v1/quotes/{quote_id}/accept: Accept Quote'
        return await self._call('POST', f'/v1/quotes/{_seg(quote_id)}/accept', params=None, body=_body(AcceptIn, body, fields), answer=_ACCEPTOUT)

    async def propose_convert_price(self, body: PriceIn | Mapping[str, Any] | None = None, /, **fields: Any) -> PriceChangeOut:
        'POST /v1/convert/prices: Propose Price'
        return await self._call('POST', '/v1/convert/prices', params=None, body=_body(PriceIn, body, fields), answer=_PRICECHANGEOUT)

    async def get_convert_price_change(self, change_id: int, /) -> PriceChangeOut:
        'GET /v1/convert/prices/changes/{change_id}: Get Price Change'
        return await self._call('GET', f'/v1/convert/prices/changes/{_seg(change_id)}', params=None, body=None, answer=_PRICECHANGEOUT)

    async def convert_price_approval_payload(self, change_id: int, /) -> PriceChangePayloadOut:
        'GET /v1/convert/prices/changes/{change_id}/approval-payload: Get Price Payload'
        return await self._call('GET', f'/v1/convert/prices/changes/{_seg(change_id)}/approval-payload', params=None, body=None, answer=_PRICECHANGEPAYLOADOUT)

    async def approve_convert_price(self, change_id: int, body: ApproveIn | Mapping[str, Any] | None = None, /, **fields: Any) -> PriceChangeOut:
        'POST /v1/convert/prices/changes/{change_id}/approve: Sign Price'
        return await self._call('POST', f'/v1/convert/prices/changes/{_seg(change_id)}/approve', params=None, body=_body(ApproveIn, body, fields), answer=_PRICECHANGEOUT)

    async def get_convert_liquidity(self, asset: str, /) -> LiquidityOut:
        'GET /v1/convert/liquidity/{asset}: Liquidity'
        return await self._call('GET', f'/v1/convert/liquidity/{_seg(asset)}', params=None, body=None, answer=_LIQUIDITYOUT)
