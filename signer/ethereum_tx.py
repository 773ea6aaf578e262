"""Ethereum transaction signing for the signer: EIP-1559 (type 2) ether and ERC-20 transfers.

Guarantees, stated first:
- Amounts, gas and fees are `int` (wei, token minor units); a `bool` or `float` is refused.
- Every address the signer pays or calls must carry its EIP-55 checksum. An all-lowercase or
  all-uppercase address is refused (`address_not_checksummed`), not silently accepted: the
  checksum is the only typo protection an ethereum address has, and a withdrawal destination
  is where a typo costs the most. Custody validates destinations with the same function
  when the request arrives, so a refusal here means something changed underneath.
- The zero address is refused: value sent there is burned.
- `max_fee_wei >= priority_fee_wei`, `gas >= 21,000`, `chain_id > 0`: what a node would refuse
  anyway, refused here first with `invalid_transaction_field`.

Signing is eth-account's (`Account.sign_transaction`, RFC6979, low-S); its exceptions are never
chained into ours, so a key can never ride along in a message.
"""
from __future__ import annotations

from dataclasses import dataclass

from eth_account import Account
from eth_utils import keccak, to_checksum_address

from signer.errors import SignerError, SignerErrorCode

ERC20_TRANSFER_SELECTOR = bytes.fromhex("a9059cbb")  # keccak("transfer(address,uint256)")[:4]
MIN_GAS = 21_000
_UINT256_MAX = 2**256 - 1
_ZERO_ADDRESS = "0x" + "0" * 40
_HEX = frozenset("0123456789abcdefABCDEF")


@dataclass(frozen=True, slots=True)
class SignedEthTx:
    raw: bytes    # the signed type-2 envelope, ready for eth_sendRawTransaction
    txid: str     # 0x-prefixed keccak256 of `raw`
    sender: str   # checksummed address of the signing key
    nonce: int


def validate_eth_address(address: str) -> str:
    """`address` if it is a 0x-prefixed, 20-byte address with a valid EIP-55 checksum.

    Refused: invalid_address (not 0x + 40 hex digits, or the zero address);
    address_not_checksummed (single-case hex letters); address_checksum_mismatch (mixed case
    that is not the checksum). Addresses whose hex has no letters at all are their own checksum.
    """
    if not isinstance(address, str) or len(address) != 42 or address[:2] != "0x" or not set(address[2:]) <= _HEX:
        raise SignerError(SignerErrorCode.INVALID_ADDRESS, "an ethereum address is 0x and 40 hex digits")
    if address.lower() == _ZERO_ADDRESS:
        raise SignerError(SignerErrorCode.INVALID_ADDRESS, "the zero address burns what it is sent")
    expected = to_checksum_address(address)
    if address == expected:
        return address
    body = address[2:]
    if body == body.lower() or body == body.upper():
        raise SignerError(SignerErrorCode.ADDRESS_NOT_CHECKSUMMED, "give the EIP-55 mixed-case form of the address")
    raise SignerError(SignerErrorCode.ADDRESS_CHECKSUM_MISMATCH, "the EIP-55 checksum does not match (a typo?)")


def erc20_transfer_data(to: str, amount: int) -> bytes:
    """Calldata for ERC-20 `transfer(to, amount)`; amount in the token's minor units."""
    to = validate_eth_address(to)
    if type(amount) is not int or not 0 < amount <= _UINT256_MAX:
        raise SignerError(SignerErrorCode.AMOUNT_MUST_BE_POSITIVE, "token amount must be a positive int below 2^256")
    return ERC20_TRANSFER_SELECTOR + bytes(12) + bytes.fromhex(to[2:]) + amount.to_bytes(32, "big")


def sign_eip1559(
    private_key: bytes,
    *,
    chain_id: int,
    nonce: int,
    to: str,
    value: int,
    data: bytes = b"",
    gas: int,
    max_fee_wei: int,
    priority_fee_wei: int,
) -> SignedEthTx:
    """Sign a type-2 transaction. `value` is wei (0 for a token transfer, whose amount is in
    `data`); `gas` is the gas limit; fees are per gas, in wei.

    Refused: invalid_address / address_not_checksummed / address_checksum_mismatch for `to`;
    invalid_transaction_field for a non-int or out-of-range chain id, nonce, value, gas or fee,
    or a priority fee above the max fee; invalid_input for a malformed key.
    """
    to = validate_eth_address(to)
    _field("chain_id", chain_id, minimum=1)
    _field("nonce", nonce, minimum=0, maximum=2**64 - 2)  # EIP-2681
    _field("value", value, minimum=0)
    _field("gas", gas, minimum=MIN_GAS, maximum=2**64 - 1)
    _field("max_fee_wei", max_fee_wei, minimum=0)
    _field("priority_fee_wei", priority_fee_wei, minimum=0)
    if priority_fee_wei > max_fee_wei:
        raise SignerError(SignerErrorCode.INVALID_TRANSACTION_FIELD, "priority_fee_wei is above max_fee_wei")
    if not isinstance(data, bytes):
        raise SignerError(SignerErrorCode.INVALID_TRANSACTION_FIELD, "data must be bytes")
    if not isinstance(private_key, bytes) or len(private_key) != 32:
        raise SignerError(SignerErrorCode.INVALID_INPUT, "the private key must be 32 bytes")
    tx = {"type": 2, "chainId": chain_id, "nonce": nonce, "to": to, "value": value, "data": data,
          "gas": gas, "maxFeePerGas": max_fee_wei, "maxPriorityFeePerGas": priority_fee_wei}
    try:
        signed = Account.sign_transaction(tx, private_key)
        sender = Account.from_key(private_key).address
    except Exception:
        raise SignerError(SignerErrorCode.INVALID_INPUT, "the transaction could not be signed with this key") from None
    raw = bytes(signed.raw_transaction)
    return SignedEthTx(raw, "0x" + keccak(raw).hex(), sender, nonce)


def _field(name: str, value: int, *, minimum: int, maximum: int = _UINT256_MAX) -> None:
    if type(value) is not int or not minimum <= value <= maximum:
        raise SignerError(SignerErrorCode.INVALID_TRANSACTION_FIELD,
                          f"{name} must be an int in {minimum}..{maximum}, got {value!r}")
