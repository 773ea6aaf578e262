"""The ledger's error codes: a stable vocabulary shared by the ledger, its callers and the HTTP edge.

Every failure the ledger reports carries one `ErrorCode`. Codes are listed roughly in the order the
ledger checks them; each has a one-line meaning and the HTTP status the API maps it to (only the HTTP
layer uses the status). Codes never change meaning; new ones are appended.

| code | HTTP | meaning |
| --- | --- | --- |
| invalid_request | 422 | the request is malformed (missing or ill-typed field, empty batch, bad page size) |
| invalid_amount | 422 | an amount is not a positive integer of minor units |
| excess_precision | 422 | a decimal amount has more decimals than the asset allows (no silent rounding) |
| asset_not_found | 404 | no asset with that code |
| asset_exists_with_different_decimals | 409 | an asset with that code exists with other decimals |
| account_not_found | 404 | no account with that id |
| account_closed | 409 | the account is closed and refuses postings and holds |
| account_not_empty | 409 | an account with a non-zero balance cannot be closed |
| account_has_open_holds | 409 | an account with pending holds cannot be closed |
| accounts_must_be_different | 422 | a transfer's debit and credit account are the same |
| asset_mismatch | 422 | the accounts of one transfer (or a hold and its asset) are in different assets |
| idempotency_conflict | 409 | the idempotency key was used before with different content |
| insufficient_funds | 409 | the debit would take available (posted - held) below zero on an account that may not go negative |
| limit_exceeded | 409 | the credit would take the balance above zero on an account that may not go positive, or any balance beyond 10^78-1 |
| hold_not_found | 404 | no hold with that id |
| hold_already_resolved | 409 | the hold is already captured, released or expired |
| hold_expired | 409 | the hold's timeout has passed; it can only be expired |
| hold_owner_mismatch | 403 | only the subsystem that placed a hold may capture or release it |
| hold_account_mismatch | 422 | a capture must debit the account the hold is on |
| hold_exceeded | 409 | the capture is larger than what remains held |
| transaction_not_found | 404 | no journal transaction with that id |
| already_reversed | 409 | the transaction was already reversed (by another key) |
| verification_failed | 500 | `verify()` found a broken invariant; the kill switch must trip |
"""
from __future__ import annotations

import enum


class ErrorCode(str, enum.Enum):
    """Stable ledger result codes. `.http_status` and `.meaning` document each one."""

    invalid_request = "invalid_request"
    invalid_amount = "invalid_amount"
    excess_precision = "excess_precision"
    asset_not_found = "asset_not_found"
    asset_exists_with_different_decimals = "asset_exists_with_different_decimals"
    account_not_found = "account_not_found"
    account_closed = "account_closed"
    account_not_empty = "account_not_empty"
    account_has_open_holds = "account_has_open_holds"
    accounts_must_be_different = "accounts_must_be_different"
    asset_mismatch = "asset_mismatch"
    idempotency_conflict = "idempotency_conflict"
    insufficient_funds = "insufficient_funds"
    limit_exceeded = "limit_exceeded"
    hold_not_found = "hold_not_found"
    hold_already_resolved = "hold_already_resolved"
    hold_expired = "hold_expired"
    hold_owner_mismatch = "hold_owner_mismatch"
    hold_account_mismatch = "hold_account_mismatch"
    hold_exceeded = "hold_exceeded"
    transaction_not_found = "transaction_not_found"
    already_reversed = "already_reversed"
    verification_failed = "verification_failed"

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS[self]

    @property
    def meaning(self) -> str:
        return _MEANING[self]


_TABLE: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.invalid_request: (422, "the request is malformed"),
    ErrorCode.invalid_amount: (422, "an amount is not a positive integer of minor units"),
    ErrorCode.excess_precision: (422, "more decimals than the asset allows"),
    ErrorCode.asset_not_found: (404, "no asset with that code"),
    ErrorCode.asset_exists_with_different_decimals: (409, "the asset exists with other decimals"),
    ErrorCode.account_not_found: (404, "no account with that id"),
    ErrorCode.account_closed: (409, "the account is closed"),
    ErrorCode.account_not_empty: (409, "an account with a non-zero balance cannot be closed"),
    ErrorCode.account_has_open_holds: (409, "an account with pending holds cannot be closed"),
    ErrorCode.accounts_must_be_different: (422, "debit and credit account are the same"),
    ErrorCode.asset_mismatch: (422, "the accounts are in different assets"),
    ErrorCode.idempotency_conflict: (409, "the key was used before with different content"),
    ErrorCode.insufficient_funds: (409, "available balance would go below zero"),
    ErrorCode.limit_exceeded: (409, "balance would go above zero on an account that may not"),
    ErrorCode.hold_not_found: (404, "no hold with that id"),
    ErrorCode.hold_already_resolved: (409, "the hold is already captured, released or expired"),
    ErrorCode.hold_expired: (409, "the hold's timeout has passed"),
    ErrorCode.hold_owner_mismatch: (403, "only the subsystem that placed a hold may resolve it"),
    ErrorCode.hold_account_mismatch: (422, "a capture must debit the held account"),
    ErrorCode.hold_exceeded: (409, "the capture exceeds what remains held"),
    ErrorCode.transaction_not_found: (404, "no journal transaction with that id"),
    ErrorCode.already_reversed: (409, "the transaction was already reversed"),
    ErrorCode.verification_failed: (500, "a ledger invariant is broken"),
}
_HTTP_STATUS = {code: status for code, (status, _) in _TABLE.items()}
_MEANING = {code: meaning for code, (_, meaning) in _TABLE.items()}


class LedgerError(Exception):
    """Any refusal by the ledger. `code` says which; `detail` says where (e.g. the transfer index)."""

    def __init__(self, code: ErrorCode, message: str | None = None, **detail: object) -> None:
        self.code = ErrorCode(code)
        self.message = message or self.code.meaning
        self.detail = detail
        super().__init__(f"{self.code.value}: {self.message}")
