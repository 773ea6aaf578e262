"""Signer error codes: stable names, one-line meanings, one exception type that carries them.

Messages never contain key material: a bad mnemonic is reported as "invalid", never echoed back,
because an error message ends up in logs.

| code | meaning |
| --- | --- |
| seed_not_configured | neither a seed file nor a seed environment variable was given or set |
| seed_file_unreadable | the seed file does not exist or cannot be read |
| seed_file_permissions_too_open | the seed file is readable or writable by group or others |
| seed_invalid | the seed is neither a valid BIP39 mnemonic nor a 16-64 byte hex seed |
| unknown_network | the bitcoin network is not mainnet, testnet or regtest |
| unknown_chain | the chain is not bitcoin or ethereum |
| unknown_tier | the wallet tier is not deposit, hot, warm or cold |
| tier_watch_only | this signer does not release private keys for the tier (cold is watch-only) |
| invalid_derivation_index | change or address index outside what the chain's scheme allows |
"""
from __future__ import annotations

from enum import StrEnum


class SignerErrorCode(StrEnum):
    """Why the signer refused; the value is the stable wire name."""

    SEED_NOT_CONFIGURED = "seed_not_configured"
    SEED_FILE_UNREADABLE = "seed_file_unreadable"
    SEED_FILE_PERMISSIONS_TOO_OPEN = "seed_file_permissions_too_open"
    SEED_INVALID = "seed_invalid"
    UNKNOWN_NETWORK = "unknown_network"
    UNKNOWN_CHAIN = "unknown_chain"
    UNKNOWN_TIER = "unknown_tier"
    TIER_WATCH_ONLY = "tier_watch_only"
    INVALID_DERIVATION_INDEX = "invalid_derivation_index"

    @property
    def meaning(self) -> str:
        return _MEANINGS[self]


_MEANINGS: dict[SignerErrorCode, str] = {
    SignerErrorCode.SEED_NOT_CONFIGURED: "neither a seed file nor a seed environment variable was given or set",
    SignerErrorCode.SEED_FILE_UNREADABLE: "the seed file does not exist or cannot be read",
    SignerErrorCode.SEED_FILE_PERMISSIONS_TOO_OPEN: "the seed file is readable or writable by group or others",
    SignerErrorCode.SEED_INVALID: "the seed is neither a valid BIP39 mnemonic nor a 16-64 byte hex seed",
    SignerErrorCode.UNKNOWN_NETWORK: "the bitcoin network is not mainnet, testnet or regtest",
    SignerErrorCode.UNKNOWN_CHAIN: "the chain is not bitcoin or ethereum",
    SignerErrorCode.UNKNOWN_TIER: "the wallet tier is not deposit, hot, warm or cold",
    SignerErrorCode.TIER_WATCH_ONLY: "this signer does not release private keys for the tier (cold is watch-only)",
    SignerErrorCode.INVALID_DERIVATION_INDEX: "change or address index outside what the chain's scheme allows",
}


class SignerError(Exception):
    """A refusal by the signer, carrying a `SignerErrorCode`."""

    def __init__(self, code: SignerErrorCode, detail: str | None = None) -> None:
        self.code = code
        self.detail = detail
        super().__init__(f"{code.value}: {detail or code.meaning}")
