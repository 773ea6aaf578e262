"""Custody's error codes (deposits, withdrawals, batches, signing, hot-wallet funding), beside the ledger's.

| code | HTTP | meaning |
| --- | --- | --- |
| withdrawals_halted | 503 | the kill switch is on: no withdrawal is accepted, batched or signed |
| invalid_destination | 422 | the destination is not a valid address for the asset's chain and network |
| asset_not_withdrawable | 422 | the asset has no chain configuration or no hot wallet |
| withdrawal_not_found | 404 | no withdrawal with that id |
| withdrawal_rejected | 422 | the policy engine rejected the withdrawal (reasons in the detail); its hold was released |
| requester_cannot_approve | 403 | the operator who requested a withdrawal may not approve it |
| already_acted | 409 | this operator already approved or rejected this decision |
| decision_expired | 409 | the policy decision expired; approvals no longer count |
| invalid_state | 409 | the withdrawal is not in a state that allows this action |
| signer_refused | 409 | the signer refused to sign (its code in the detail) |
| funding_not_mined | 409 | a hot-wallet funding transaction is not in the main chain (yet) |
| funding_reverted | 422 | a hot-wallet funding transaction reverted: it moved no value |
| funding_not_final | 409 | a hot-wallet funding has fewer confirmations than its asset's finality depth |
| funding_not_to_hot | 422 | the transaction pays nothing to the hot address (no ether, no configured token) |
| funding_own_transaction | 422 | the transaction is the hot wallet's own (sent by it, or a payout): booked by its own flow |
| no_customer_accounts | 409 | a proof-of-reserves report needs at least one customer account of the asset to commit to |
"""
from __future__ import annotations

import enum


class CustodyErrorCode(str, enum.Enum):
    withdrawals_halted = "withdrawals_halted"
    invalid_destination = "invalid_destination"
    asset_not_withdrawable = "asset_not_withdrawable"
    withdrawal_not_found = "withdrawal_not_found"
    withdrawal_rejected = "withdrawal_rejected"
    requester_cannot_approve = "requester_cannot_approve"
    already_acted = "already_acted"
    decision_expired = "decision_expired"
    invalid_state = "invalid_state"
    signer_refused = "signer_refused"
    funding_not_mined = "funding_not_mined"
    funding_reverted = "funding_reverted"
    funding_not_final = "funding_not_final"
    funding_not_to_hot = "funding_not_to_hot"
    funding_own_transaction = "funding_own_transaction"
    no_customer_accounts = "no_customer_accounts"

    @property
    def http_status(self) -> int:
        return _STATUS[self]


_STATUS = {
    CustodyErrorCode.withdrawals_halted: 503,
    CustodyErrorCode.invalid_destination: 422,
    CustodyErrorCode.asset_not_withdrawable: 422,
    CustodyErrorCode.withdrawal_not_found: 404,
    CustodyErrorCode.withdrawal_rejected: 422,
    CustodyErrorCode.requester_cannot_approve: 403,
    CustodyErrorCode.already_acted: 409,
    CustodyErrorCode.decision_expired: 409,
    CustodyErrorCode.invalid_state: 409,
    CustodyErrorCode.signer_refused: 409,
    CustodyErrorCode.funding_not_mined: 409,
    CustodyErrorCode.funding_reverted: 422,
    CustodyErrorCode.funding_not_final: 409,
    CustodyErrorCode.funding_not_to_hot: 422,
    CustodyErrorCode.funding_own_transaction: 422,
    CustodyErrorCode.no_customer_accounts: 409,
}


class CustodyError(Exception):
    def __init__(self, code: CustodyErrorCode, message: str, **detail: object) -> None:
        self.code = CustodyErrorCode(code)
        self.message = message
        self.detail = detail
        super().__init__(f"{self.code.value}: {message}")
