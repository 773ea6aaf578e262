"""Custody's error codes (deposits, withdrawals, batches, signing, hot-wallet funding), beside the ledger's.

| code | HTTP | meaning |
| --- | --- | --- |
| withdrawals_halted | 503 | the kill switch is on: no withdrawal is accepted, batched or signed |
| invalid_destination | 422 | the destination is not a valid address for the asset's chain and network |
| destination_zero_address | 422 | ethereum: the zero address (what is sent there is burned) |
| destination_burn_address | 422 | ethereum: a well-known burn address (0x...dEaD and the like) |
| destination_precompile | 422 | ethereum: an address below 2**16, where precompiled contracts live (and future ones will) |
| destination_token_contract | 422 | ethereum: the contract of a configured token (tokens sent to it are lost) |
| destination_internal | 422 | an address the service controls or derived (deposit, hot receive or change, cold, either chain): paying it pays the firm |
| destination_contract_not_allowlisted | 422 | ethereum: the destination has contract code and is not on the account's allowlist |
| destination_would_revert | 422 | ethereum: the payout, simulated from the hot address with its exact value, data and gas, would revert |
| asset_not_withdrawable | 422 | the asset has no chain configuration or no hot wallet |
| withdrawal_not_found | 404 | no withdrawal with that id |
| deposit_not_found | 404 | no deposit with that id |
| withdrawal_rejected | 422 | the policy engine rejected the withdrawal (reasons in the detail); its hold was released |
| requester_cannot_approve | 403 | the operator who requested a withdrawal may not approve it |
| approval_signature_required | 422 | an approval must carry the approver's signature over the approval payload (`GET .../approval-payload` of the withdrawal, refill or treasury adjustment) |
| approval_signature_malformed | 422 | the signature, authenticator data or client data is not valid base64 |
| approver_unknown | 403 | the signature's key id is not among the approver keys custody is configured with |
| approval_scheme_mismatch | 403 | the signature names another scheme than the key's registered one (ed25519, webauthn) |
| approval_signature_invalid | 403 | the signature does not verify over this withdrawal's current approval payload (another amount, destination, decision or withdrawal; or a failed WebAuthn assertion) |
| approver_not_caller | 403 | the key belongs to another operator than the caller: an operator approves with their own key only |
| already_acted | 409 | this operator already approved or rejected this decision |
| decision_expired | 409 | the policy decision expired; approvals no longer count |
| invalid_state | 409 | the withdrawal is not in a state that allows this action |
| signer_refused | 409 | the signer refused to sign (its code in the detail) |
| funding_not_mined | 409 | a hot-wallet funding transaction is not in the main chain (yet) |
| funding_reverted | 422 | a hot-wallet funding transaction reverted: it moved no value |
| funding_not_final | 409 | a hot-wallet funding has fewer confirmations than its asset's finality depth |
| funding_not_to_hot | 422 | the transaction pays nothing to the hot address (no ether, no configured token) |
| funding_own_transaction | 422 | the transaction is the hot wallet's own (sent by it, or a payout): booked by its own flow |
| kind_not_permitted | 403 | the caller's role may not open, debit, credit or hold on an account of that kind (README: who may move money) |
| account_name_reserved | 422 | an account opened over the API must be named `customer:<owner>:<asset>[:<suffix>]`; other names are reserved |
| account_frozen | 409 | a credit of this account was reorged out after finality and custody could not hold all of it: nothing may be debited or held on the account until an operator resolves the incident |
| transaction_not_reversible | 409 | a subsystem wrote the transaction, or its reversal would move firm money: use a treasury adjustment |
| adjustment_not_found | 404 | no treasury adjustment with that id |
| proposer_cannot_approve | 403 | the operator who proposed a treasury adjustment may not approve it |
| allowlist_change_not_found | 404 | no allowlist change with that id |
| incident_not_found | 404 | no incident with that id |
| incident_decision_invalid | 422 | the resolution's decision does not fit the incident (a held amount needs release or capture; a capture needs a shortfall still booked) |
| incident_remainder_held | 409 | a capture cannot take the whole reorged-out credit yet: part of it is still behind other holds on the account (named in the detail); the account stays frozen until they are released |
| deposit_reorged_out | 409 | the deposit's transaction left the chain after finality and was not re-mined: its coins cannot be released or returned |
| retry_unknown | 404 | no withdrawal batch, sweep or rebalance with that id |
| retry_not_set_aside | 409 | the withdrawal batch, sweep or rebalance is not set aside: there is nothing to retry |
| rebalance_not_found | 404 | no rebalance with that id |
| rebalance_wallet_missing | 409 | the wallet tier a rebalance needs (warm or cold) is not registered |
| rebalance_in_progress | 409 | a rebalance from that tier is already open, signed or on its way: one at a time per source tier |
| rebalance_insufficient_funds | 409 | the source tier's coins cannot pay the amount and its fee |
| refill_expired | 409 | the warm -> hot refill waited longer than the policy's `refill_ttl` for its operator quorum: it expired (or expires at the worker's next pass) and takes no more approvals; the worker opens a fresh one if hot is still below its floor |
| psbt_malformed | 422 | the PSBT is not base64 or not a well-formed BIP 174 PSBT (custody.psbt) |
| psbt_transaction_mismatch | 422 | the PSBT's transaction is not the one custody built for this rebalance (another input, output or amount) |
| psbt_not_signed | 422 | an input of the PSBT carries no signature (neither a final witness nor one partial signature) |
| psbt_signature_invalid | 422 | an input's signature does not verify, or its key is not the spent coin's |
| psbt_fee_out_of_bounds | 422 | the fee rate is outside the configured bounds (`psbt_min_fee_rate_sat_per_kvb` .. `psbt_max_fee_rate_sat_per_kvb`) |
| no_customer_accounts | 409 | a proof-of-reserves report needs at least one customer account of the asset to commit to |
| reserves_ledger_unverified | 409 | a proof-of-reserves report commits only to a ledger that passes its own checks (`verify()`), and one failed in the report's snapshot (named in the message): nothing is published |
| reserves_index_behind | 503 | a chain scanner's block (bitcoin: the wallet index's; ethereum: the deposit scanner's cursor) is not in the node's main chain, or the scanner has not started: a reorg it has not walked yet; ask again shortly |
| reserves_report_building | 409 | the proof-of-reserves report is still being built by the worker (`GET /v1/reserves/reports/{id}` shows its progress): its proofs are served once it is published |
| reserves_request_exists_with_different_assets | 409 | the idempotency key requested reports of other assets before: nothing new was requested |
| node_view_not_ready | 503 | the node's watch-only wallet (custody.node_view) is not at the pinned tip, is rescanning, or does not yet cover every address custody issued: its holdings cannot be read now (a reconciliation pass skips the cross-check, logged) |
| webhook_url_invalid | 422 | a webhook URL must be http:// or https:// with a host, at most 2,048 characters, without user or password and without a fragment, naming no internal address (unless `WEBHOOK_ALLOW_PRIVATE_HOSTS` lists it) |
| webhook_event_types_invalid | 422 | a webhook endpoint's event types are 1 to 100 types of the event catalogue (README "Events", e.g. `deposit.credited`), or `*` for every type |
| webhook_endpoint_not_found | 404 | no webhook endpoint with that id (or it was deleted) |
| webhook_delivery_not_found | 404 | no webhook delivery with that id |
| webhook_key_unavailable | 503 | the key that encrypts webhook secrets (`WEBHOOK_SECRET_KEY`, or the state directory's key file) cannot be read or created; nothing was written |
| api_key_not_found | 404 | no API key with that id |
| api_key_not_live | 409 | the API key is revoked already (or, to rotate, revoked or rotated already) |
| api_key_name_taken | 409 | a key of that name was created before (a name is an idempotency namespace: it is never handed out again; rotate the key instead) |
| api_key_in_grace_period | 403 | the calling key is in its rotation grace period (or is not an admin key): it may not revoke or rotate keys; use the key that replaced it |
| console_sign_in_required | 401 | the console route needs a signed-in session (the `custody_console` cookie): none was sent, or it names no session |
| console_session_expired | 401 | the console session ended: idle longer than `CONSOLE_IDLE_SECONDS`, past `CONSOLE_SESSION_MAX_SECONDS`, signed out, or its credential was revoked; sign in again |
| console_csrf_invalid | 403 | a state change made with a console session did not carry the session's CSRF token in `X-CSRF-Token` |
| console_challenge_invalid | 401 | the WebAuthn response names no challenge this service handed out for this step, or one already used or expired (a replayed assertion): ask for new options |
| console_assertion_invalid | 401 | the WebAuthn registration or assertion does not verify (origin, relying party, user verification, signature, or a sign count that went backwards) |
| console_credential_unknown | 401 | the assertion's credential is not an active console credential (unknown, pending an admin's approval, or revoked) |
| console_credential_not_found | 404 | no console credential with that id |
| console_self_approval | 403 | nobody approves their own console enrolment (the credential's user, or the user whose session enrolled it) |
| console_activation_invalid | 403 | an enrolment's activation is not an assertion of a configured console admin (`CONSOLE_ADMINS`) over its activation payload, or a stored one no longer verifies: no approver entry |
| console_username_taken | 409 | another console user or API key has this name in another letter case |
| quote_not_found | 404 | no convert quote with that id for this caller (a backend sees only the quotes its own key asked for) |
| quote_expired | 409 | the quote's expiry (`CONVERT_QUOTE_TTL_SECONDS` after it was made) has passed: ask for a new quote; nothing was booked |
| price_change_not_found | 404 | no convert price change with that id |
| price_change_expired | 409 | the price change's expiry (10 minutes after it was proposed, at most 15) has passed: propose the price again; nothing counts |
| quote_already_used | 409 | the quote was accepted before under another idempotency key: a quote books once; nothing was booked now |
| insufficient_liquidity | 409 | the house's liquidity account of the asset the customer would receive cannot pay the amount (it is funded by treasury adjustments); nothing was booked |
| convert_pair_unavailable | 422 | the pair has neither a market whose book prices it nor an operator-set price (`POST /v1/convert/prices`) |
| convert_depth_insufficient | 409 | the market's order book is not deep enough to price the whole amount |
| convert_amount_too_small | 422 | the payout rounds down to nothing (or the amount is smaller than the fee) |
| convert_book_unreliable | 409 | the market's book cannot price this quote: one side of it is empty, the market has no reference price (no trade and no operator price), or the average price for the amount strays more than `CONVERT_PRICE_BAND_PPM` from the last trade or the operator's price |
"""
from __future__ import annotations

import enum


class CustodyErrorCode(str, enum.Enum):
    withdrawals_halted = "withdrawals_halted"
    invalid_destination = "invalid_destination"
    destination_zero_address = "destination_zero_address"
    destination_burn_address = "destination_burn_address"
    destination_precompile = "destination_precompile"
    destination_token_contract = "destination_token_contract"
    destination_internal = "destination_internal"
    destination_contract_not_allowlisted = "destination_contract_not_allowlisted"
    destination_would_revert = "destination_would_revert"
    asset_not_withdrawable = "asset_not_withdrawable"
    withdrawal_not_found = "withdrawal_not_found"
    deposit_not_found = "deposit_not_found"
    withdrawal_rejected = "withdrawal_rejected"
    requester_cannot_approve = "requester_cannot_approve"
    approval_signature_required = "approval_signature_required"
    approval_signature_malformed = "approval_signature_malformed"
    approver_unknown = "approver_unknown"
    approval_scheme_mismatch = "approval_scheme_mismatch"
    approval_signature_invalid = "approval_signature_invalid"
    approver_not_caller = "approver_not_caller"
    already_acted = "already_acted"
    decision_expired = "decision_expired"
    invalid_state = "invalid_state"
    signer_refused = "signer_refused"
    funding_not_mined = "funding_not_mined"
    funding_reverted = "funding_reverted"
    funding_not_final = "funding_not_final"
    funding_not_to_hot = "funding_not_to_hot"
    funding_own_transaction = "funding_own_transaction"
    kind_not_permitted = "kind_not_permitted"
    account_name_reserved = "account_name_reserved"
    account_frozen = "account_frozen"
    transaction_not_reversible = "transaction_not_reversible"
    adjustment_not_found = "adjustment_not_found"
    proposer_cannot_approve = "proposer_cannot_approve"
    allowlist_change_not_found = "allowlist_change_not_found"
    incident_not_found = "incident_not_found"
    incident_decision_invalid = "incident_decision_invalid"
    incident_remainder_held = "incident_remainder_held"
    deposit_reorged_out = "deposit_reorged_out"
    retry_unknown = "retry_unknown"
    retry_not_set_aside = "retry_not_set_aside"
    rebalance_not_found = "rebalance_not_found"
    rebalance_wallet_missing = "rebalance_wallet_missing"
    rebalance_in_progress = "rebalance_in_progress"
    rebalance_insufficient_funds = "rebalance_insufficient_funds"
    refill_expired = "refill_expired"
    psbt_malformed = "psbt_malformed"
    psbt_transaction_mismatch = "psbt_transaction_mismatch"
    psbt_not_signed = "psbt_not_signed"
    psbt_signature_invalid = "psbt_signature_invalid"
    psbt_fee_out_of_bounds = "psbt_fee_out_of_bounds"
    no_customer_accounts = "no_customer_accounts"
    reserves_ledger_unverified = "reserves_ledger_unverified"
    reserves_index_behind = "reserves_index_behind"
    reserves_report_building = "reserves_report_building"
    reserves_request_exists_with_different_assets = "reserves_request_exists_with_different_assets"
    node_view_not_ready = "node_view_not_ready"
    webhook_url_invalid = "webhook_url_invalid"
    webhook_event_types_invalid = "webhook_event_types_invalid"
    webhook_endpoint_not_found = "webhook_endpoint_not_found"
    webhook_delivery_not_found = "webhook_delivery_not_found"
    webhook_key_unavailable = "webhook_key_unavailable"
    api_key_not_found = "api_key_not_found"
    api_key_not_live = "api_key_not_live"
    api_key_name_taken = "api_key_name_taken"
    api_key_in_grace_period = "api_key_in_grace_period"
    console_sign_in_required = "console_sign_in_required"
    console_session_expired = "console_session_expired"
    console_csrf_invalid = "console_csrf_invalid"
    console_challenge_invalid = "console_challenge_invalid"
    console_assertion_invalid = "console_assertion_invalid"
    console_credential_unknown = "console_credential_unknown"
    console_credential_not_found = "console_credential_not_found"
    console_self_approval = "console_self_approval"
    console_activation_invalid = "console_activation_invalid"
    console_username_taken = "console_username_taken"
    quote_not_found = "quote_not_found"
    quote_expired = "quote_expired"
    price_change_not_found = "price_change_not_found"
    price_change_expired = "price_change_expired"
    quote_already_used = "quote_already_used"
    insufficient_liquidity = "insufficient_liquidity"
    convert_pair_unavailable = "convert_pair_unavailable"
    convert_depth_insufficient = "convert_depth_insufficient"
    convert_amount_too_small = "convert_amount_too_small"
    convert_book_unreliable = "convert_book_unreliable"

    @property
    def http_status(self) -> int:
        return _STATUS[self]


_STATUS = {
    CustodyErrorCode.withdrawals_halted: 503,
    CustodyErrorCode.invalid_destination: 422,
    CustodyErrorCode.destination_zero_address: 422,
    CustodyErrorCode.destination_burn_address: 422,
    CustodyErrorCode.destination_precompile: 422,
    CustodyErrorCode.destination_token_contract: 422,
    CustodyErrorCode.destination_internal: 422,
    CustodyErrorCode.destination_contract_not_allowlisted: 422,
    CustodyErrorCode.destination_would_revert: 422,
    CustodyErrorCode.asset_not_withdrawable: 422,
    CustodyErrorCode.withdrawal_not_found: 404,
    CustodyErrorCode.deposit_not_found: 404,
    CustodyErrorCode.withdrawal_rejected: 422,
    CustodyErrorCode.requester_cannot_approve: 403,
    CustodyErrorCode.approval_signature_required: 422,
    CustodyErrorCode.approval_signature_malformed: 422,
    CustodyErrorCode.approver_unknown: 403,
    CustodyErrorCode.approval_scheme_mismatch: 403,
    CustodyErrorCode.approval_signature_invalid: 403,
    CustodyErrorCode.approver_not_caller: 403,
    CustodyErrorCode.already_acted: 409,
    CustodyErrorCode.decision_expired: 409,
    CustodyErrorCode.invalid_state: 409,
    CustodyErrorCode.signer_refused: 409,
    CustodyErrorCode.funding_not_mined: 409,
    CustodyErrorCode.funding_reverted: 422,
    CustodyErrorCode.funding_not_final: 409,
    CustodyErrorCode.funding_not_to_hot: 422,
    CustodyErrorCode.funding_own_transaction: 422,
    CustodyErrorCode.kind_not_permitted: 403,
    CustodyErrorCode.account_name_reserved: 422,
    CustodyErrorCode.account_frozen: 409,
    CustodyErrorCode.transaction_not_reversible: 409,
    CustodyErrorCode.adjustment_not_found: 404,
    CustodyErrorCode.proposer_cannot_approve: 403,
    CustodyErrorCode.allowlist_change_not_found: 404,
    CustodyErrorCode.incident_not_found: 404,
    CustodyErrorCode.incident_decision_invalid: 422,
    CustodyErrorCode.incident_remainder_held: 409,
    CustodyErrorCode.deposit_reorged_out: 409,
    CustodyErrorCode.retry_unknown: 404,
    CustodyErrorCode.retry_not_set_aside: 409,
    CustodyErrorCode.rebalance_not_found: 404,
    CustodyErrorCode.rebalance_wallet_missing: 409,
    CustodyErrorCode.rebalance_in_progress: 409,
    CustodyErrorCode.rebalance_insufficient_funds: 409,
    CustodyErrorCode.refill_expired: 409,
    CustodyErrorCode.psbt_malformed: 422,
    CustodyErrorCode.psbt_transaction_mismatch: 422,
    CustodyErrorCode.psbt_not_signed: 422,
    CustodyErrorCode.psbt_signature_invalid: 422,
    CustodyErrorCode.psbt_fee_out_of_bounds: 422,
    CustodyErrorCode.no_customer_accounts: 409,
    CustodyErrorCode.reserves_ledger_unverified: 409,
    CustodyErrorCode.reserves_index_behind: 503,
    CustodyErrorCode.reserves_report_building: 409,
    CustodyErrorCode.reserves_request_exists_with_different_assets: 409,
    CustodyErrorCode.node_view_not_ready: 503,
    CustodyErrorCode.webhook_url_invalid: 422,
    CustodyErrorCode.webhook_event_types_invalid: 422,
    CustodyErrorCode.webhook_endpoint_not_found: 404,
    CustodyErrorCode.webhook_delivery_not_found: 404,
    CustodyErrorCode.webhook_key_unavailable: 503,
    CustodyErrorCode.api_key_not_found: 404,
    CustodyErrorCode.api_key_not_live: 409,
    CustodyErrorCode.api_key_name_taken: 409,
    CustodyErrorCode.api_key_in_grace_period: 403,
    CustodyErrorCode.console_sign_in_required: 401,
    CustodyErrorCode.console_session_expired: 401,
    CustodyErrorCode.console_csrf_invalid: 403,
    CustodyErrorCode.console_challenge_invalid: 401,
    CustodyErrorCode.console_assertion_invalid: 401,
    CustodyErrorCode.console_credential_unknown: 401,
    CustodyErrorCode.console_credential_not_found: 404,
    CustodyErrorCode.console_self_approval: 403,
    CustodyErrorCode.console_activation_invalid: 403,
    CustodyErrorCode.console_username_taken: 409,
    CustodyErrorCode.quote_not_found: 404,
    CustodyErrorCode.quote_expired: 409,
    CustodyErrorCode.price_change_not_found: 404,
    CustodyErrorCode.price_change_expired: 409,
    CustodyErrorCode.quote_already_used: 409,
    CustodyErrorCode.insufficient_liquidity: 409,
    CustodyErrorCode.convert_pair_unavailable: 422,
    CustodyErrorCode.convert_depth_insufficient: 409,
    CustodyErrorCode.convert_amount_too_small: 422,
    CustodyErrorCode.convert_book_unreliable: 409,
}


class CustodyError(Exception):
    def __init__(self, code: CustodyErrorCode, message: str, **detail: object) -> None:
        self.code = CustodyErrorCode(code)
        self.message = message
        self.detail = detail
        super().__init__(f"{self.code.value}: {message}")
