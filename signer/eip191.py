"""EIP-191 (version 0x45, "personal_sign") signatures of text messages with an ethereum key, and
their check: the 65-byte r || s || v signature (v 27/28) as 0x-prefixed hex, over
keccak256("\\x19Ethereum Signed Message:\\n" + decimal byte length + message), through eth-account.
It is what wallets' "sign message" and `cast wallet verify` / eth-account's `recover_message`
produce and check. The prefix makes the digest differ from every transaction's, so such a
signature can never authorise a transfer.
"""
from __future__ import annotations

from eth_account import Account
from eth_account.messages import encode_defunct


def sign_personal(private_key: bytes, message: str) -> str:
    return "0x" + bytes(Account.sign_message(encode_defunct(text=message), private_key=private_key).signature).hex()


def signer_of(message: str, signature: str) -> str | None:
    """The checksummed address whose key made `signature` over `message`, None when it is not a
    well-formed signature (eth-account refuses a high-s or malformed one)."""
    if not isinstance(signature, str) or len(signature) != 132 or not signature.startswith("0x"):
        return None
    try:
        return Account.recover_message(encode_defunct(text=message), signature=bytes.fromhex(signature[2:]))
    except Exception:  # eth-account/eth-keys raise several types for a bad v, r or s
        return None


def verify_personal(address: str, message: str, signature: str) -> bool:
    signer = signer_of(message, signature)
    return signer is not None and signer.lower() == address.lower()
