"""What custody and the signer say to each other, without any key code.

Custody processes (api, worker) import this module, never `signer.service` or `signer.keys`: the
data a signing request carries (`BtcCoin`, `BatchOutput`), the refusal the signer answers
(`SigningRefused` with a `RefusalCode`), and `SignerPort`, the narrow set of calls a signer offers
whether it runs in this process (`signer.service.Signer`, in tests) or behind its socket
(`signer.client.SignerClient`, in deployment). The refusal codes are tabled in signer.service.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, Sequence

from signer.bitcoin_tx import SignedTx
from signer.ethereum_tx import SignedEthTx

RESERVES_PREFIX = "custody proof of reserves:"  # the only messages the signer signs that are not transactions


class RefusalCode(str, enum.Enum):
    kill_switch_on = "kill_switch_on"
    chain_id_mismatch = "chain_id_mismatch"
    empty_batch = "empty_batch"
    replacement_unknown = "replacement_unknown"
    output_mismatch = "output_mismatch"
    asset_unknown = "asset_unknown"
    withdrawal_not_batched = "withdrawal_not_batched"
    no_decision = "no_decision"
    payload_unprintable = "payload_unprintable"
    approval_unsigned = "approval_unsigned"
    approver_unknown = "approver_unknown"
    approval_signature_invalid = "approval_signature_invalid"
    approval_replayed = "approval_replayed"
    approval_payload_mismatch = "approval_payload_mismatch"
    decision_not_approved = "decision_not_approved"
    decision_expired = "decision_expired"
    hold_not_live = "hold_not_live"
    unknown_input = "unknown_input"
    fee_above_ceiling = "fee_above_ceiling"
    already_signed = "already_signed"
    unapproved_limit_reached = "unapproved_limit_reached"
    destination_denied = "destination_denied"
    destination_internal = "destination_internal"
    rebalance_not_open = "rebalance_not_open"
    destination_not_cold = "destination_not_cold"
    rebalance_not_approved = "rebalance_not_approved"


class SigningRefused(Exception):
    """The signer refused a request (`code`, signer.service's table). `withdrawal_id` names the ONE
    withdrawal the refusal is about when it is about one (its decision, approvals, hold, asset,
    destination: signer.service `_about`), None when it is about the request as a whole (kill switch,
    inputs, fee, change, the batch's shape). Custody takes a named withdrawal out of a batch that was
    not signed (custody.payouts `drop_refused`) so the others are signed without it."""

    def __init__(self, code: RefusalCode, message: str, withdrawal_id: int | None = None) -> None:
        self.code = code
        self.message = message
        self.withdrawal_id = withdrawal_id
        super().__init__(f"{code.value}: {message}")


@dataclass(frozen=True)
class BtcCoin:
    """A hot-wallet coin to spend: where it is and which key (BIP84 change/index) controls it."""

    txid: str
    vout: int
    amount: int
    change: int
    index: int


@dataclass(frozen=True)
class BatchOutput:
    """One payment of a batch. `script` (bitcoin) is the output script custody resolved from the
    address; the signer computes it again from the withdrawal's destination and refuses another
    (empty: the signer's own is used)."""

    withdrawal_id: int
    address: str
    amount: int
    script: bytes = b""


class SignerPort(Protocol):
    """The calls custody may make of a signer; each re-checks everything against the database
    itself and answers a signed transaction or raises SigningRefused."""

    def sign_bitcoin_batch(self, batch_id: int, coins: Sequence[BtcCoin], outputs: Sequence[BatchOutput],
                           change: tuple[str, int] | None) -> SignedTx: ...

    def sign_bitcoin_replacement(self, batch_id: int, replaces_txid: str, coins: Sequence[BtcCoin],
                                 outputs: Sequence[BatchOutput], change: tuple[str, int] | None) -> SignedTx: ...

    def sign_bitcoin_sweep(self, sweep_id: int, coins: Sequence[BtcCoin], destination: str, fee: int) -> SignedTx: ...

    def sign_bitcoin_rebalance(self, rebalance_id: int, coins: Sequence[BtcCoin], destination: str, amount: int,
                               change: tuple[str, int] | None, replaces_txid: str | None = None) -> SignedTx: ...

    def sign_reserves_message(self, tier: str, change: int, index: int, message: str) -> tuple[bytes, bytes]: ...

    def sign_ethereum_payment(self, batch_id: int, output: BatchOutput, *, hot_index: int, chain_id: int, nonce: int,
                              to: str, value: int, data: bytes, gas: int, max_fee_wei: int, priority_fee_wei: int,
                              replaces_txid: str | None = None) -> SignedEthTx: ...
