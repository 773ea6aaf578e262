"""What custody and the signer say to each other, without any key code.

Custody processes (api, worker) import this module, never `signer.service` or `signer.keys`: the
data a signing request carries (`BtcCoin`, `BatchOutput`), the refusal the signer answers
(`SigningRefused` with a `RefusalCode`), and `SignerPort`, the narrow set of calls a signer offers
whether it runs in this process (`signer.service.Signer`, in tests) or behind its socket
(`signer.client.SignerClient`, in deployment). The refusal codes are tabled in signer.service.
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Protocol, Sequence

from signer.bitcoin_tx import SignedTx
from signer.ethereum_tx import SignedEthTx

RESERVES_PREFIX = "custody proof of reserves:"  # the only messages the signer signs that are not transactions
_STATEMENT = re.compile(
    r"custody proof of reserves: report (?P<report_id>[1-9][0-9]{0,17}) asset (?P<asset>[A-Z][A-Z0-9]{0,15}) "
    r"chain (?P<chain>bitcoin|ethereum) block (?P<height>0|[1-9][0-9]{0,17}) (?P<block_hash>(?:0x)?[0-9a-f]{64}) "
    r"address (?P<address>(?:bc|tb|bcrt)1q[02-9ac-hj-np-z]{38}|0x[0-9a-fA-F]{40}) amount (?P<amount>0|[1-9][0-9]{0,77}) "
    r"liabilities (?P<liabilities_root>[0-9a-f]{64})")


@dataclass(frozen=True)
class ReservesStatement:
    """What one proof-of-reserves signature says: in report `report_id` of `asset`, at block
    `height`/`block_hash` of `chain`, `address` (ours) holds `amount` minor units, against the
    liabilities tree whose root hash is `liabilities_root`. `message()` is the exact text signed
    (BIP-322 for bitcoin, EIP-191 personal_sign for ethereum); `parse()` accepts exactly that text
    and nothing else (None), which is all the signer will sign besides transactions."""

    report_id: int
    asset: str
    chain: str
    height: int
    block_hash: str
    address: str
    amount: int
    liabilities_root: str

    def message(self) -> str:
        return (f"{RESERVES_PREFIX} report {self.report_id} asset {self.asset} chain {self.chain} "
                f"block {self.height} {self.block_hash} address {self.address} amount {self.amount} "
                f"liabilities {self.liabilities_root}")

    @classmethod
    def parse(cls, message: str) -> ReservesStatement | None:
        m = _STATEMENT.fullmatch(message) if isinstance(message, str) else None
        if m is None:
            return None
        f = m.groupdict()
        statement = cls(int(f["report_id"]), f["asset"], f["chain"], int(f["height"]), f["block_hash"], f["address"],
                        int(f["amount"]), f["liabilities_root"])
        return statement if statement.message() == message else None


@dataclass(frozen=True)
class ReservesSignature:
    """The signer's answer: the address it signed for (derived from its own key) and the signature:
    BIP-322 simple ("smp" + base64) for bitcoin, EIP-191 personal_sign (0x + 65 bytes hex) for ethereum."""

    address: str
    signature: str


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
    sweep_not_open = "sweep_not_open"
    nonce_gap = "nonce_gap"
    statement_invalid = "statement_invalid"
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

    def sign_bitcoin_cpfp(self, rebalance_id: int, parent_raw: bytes, parent_vout: int, destination: str, fee: int,
                          replaces_txid: str | None = None) -> SignedTx: ...

    def sign_reserves_message(self, chain: str, tier: str, change: int, index: int, message: str) -> ReservesSignature: ...

    def sign_ethereum_gas_funding(self, sweep_id: int, *, deposit_index: int, chain_id: int, nonce: int, value: int,
                                  gas: int, max_fee_wei: int, priority_fee_wei: int,
                                  replaces_txid: str | None = None) -> SignedEthTx: ...

    def sign_ethereum_sweep(self, sweep_id: int, *, deposit_index: int, asset: str, amount: int, chain_id: int,
                            nonce: int, gas: int, max_fee_wei: int, priority_fee_wei: int,
                            replaces_txid: str | None = None) -> SignedEthTx: ...

    def sign_ethereum_rebalance(self, rebalance_id: int, *, asset: str, amount: int, destination_tier: str, chain_id: int,
                                nonce: int, gas: int, max_fee_wei: int, priority_fee_wei: int,
                                replaces_txid: str | None = None) -> SignedEthTx: ...

    def sign_ethereum_payment(self, batch_id: int, output: BatchOutput, *, hot_index: int, chain_id: int, nonce: int,
                              to: str, value: int, data: bytes, gas: int, max_fee_wei: int, priority_fee_wei: int,
                              replaces_txid: str | None = None) -> SignedEthTx: ...
