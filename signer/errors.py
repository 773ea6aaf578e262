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
| invalid_address | not a well-formed address for the chain (bad characters, length or checksum) |
| wrong_network | a valid address, but for another network (e.g. a testnet address on mainnet) |
| address_checksum_variant_mismatch | a segwit address whose checksum is bech32 where bech32m is required, or the reverse (BIP350) |
| unsupported_address_type | a valid address of a kind the signer does not pay (legacy base58, unknown witness version) |
| address_not_checksummed | an ethereum address without an EIP-55 mixed-case checksum |
| address_checksum_mismatch | an ethereum address whose mixed case is not its EIP-55 checksum (a typo) |
| inputs_must_not_be_empty | a transaction needs at least one input |
| outputs_must_not_be_empty | a transaction needs at least one payment output |
| invalid_input | an input's txid, vout, amount or private key is malformed |
| duplicate_input | the same outpoint appears twice among the inputs |
| key_does_not_match_input | the input's private key does not control the scriptPubKey it claims to spend |
| amount_must_be_positive | an amount is not a positive integer (minor units, never float) or exceeds the supply |
| output_below_dust | an output pays less than the node's dust threshold for its script type |
| outputs_exceed_inputs | payments plus change are more than the inputs hold |
| fee_exceeds_maximum | the fee rate is above the configured ceiling (guards against amount/fee mix-ups) |
| transaction_too_large | the transaction exceeds the standard weight limit (400,000 WU) |
| insufficient_funds | coin selection cannot cover the payments plus fee from the given coins |
| invalid_fee_rate | a fee rate is not a non-negative integer (sat per 1000 vB; wei) |
| invalid_transaction_field | an ethereum transaction field is missing, negative or inconsistent |
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
    INVALID_ADDRESS = "invalid_address"
    WRONG_NETWORK = "wrong_network"
    ADDRESS_CHECKSUM_VARIANT_MISMATCH = "address_checksum_variant_mismatch"
    UNSUPPORTED_ADDRESS_TYPE = "unsupported_address_type"
    ADDRESS_NOT_CHECKSUMMED = "address_not_checksummed"
    ADDRESS_CHECKSUM_MISMATCH = "address_checksum_mismatch"
    INPUTS_MUST_NOT_BE_EMPTY = "inputs_must_not_be_empty"
    OUTPUTS_MUST_NOT_BE_EMPTY = "outputs_must_not_be_empty"
    INVALID_INPUT = "invalid_input"
    DUPLICATE_INPUT = "duplicate_input"
    KEY_DOES_NOT_MATCH_INPUT = "key_does_not_match_input"
    AMOUNT_MUST_BE_POSITIVE = "amount_must_be_positive"
    OUTPUT_BELOW_DUST = "output_below_dust"
    OUTPUTS_EXCEED_INPUTS = "outputs_exceed_inputs"
    FEE_EXCEEDS_MAXIMUM = "fee_exceeds_maximum"
    TRANSACTION_TOO_LARGE = "transaction_too_large"
    INSUFFICIENT_FUNDS = "insufficient_funds"
    INVALID_FEE_RATE = "invalid_fee_rate"
    INVALID_TRANSACTION_FIELD = "invalid_transaction_field"

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
    SignerErrorCode.INVALID_ADDRESS: "not a well-formed address for the chain (bad characters, length or checksum)",
    SignerErrorCode.WRONG_NETWORK: "a valid address, but for another network (e.g. a testnet address on mainnet)",
    SignerErrorCode.ADDRESS_CHECKSUM_VARIANT_MISMATCH: "a segwit address whose checksum is bech32 where bech32m is required, or the reverse (BIP350)",
    SignerErrorCode.UNSUPPORTED_ADDRESS_TYPE: "a valid address of a kind the signer does not pay (legacy base58, unknown witness version)",
    SignerErrorCode.ADDRESS_NOT_CHECKSUMMED: "an ethereum address without an EIP-55 mixed-case checksum",
    SignerErrorCode.ADDRESS_CHECKSUM_MISMATCH: "an ethereum address whose mixed case is not its EIP-55 checksum (a typo)",
    SignerErrorCode.INPUTS_MUST_NOT_BE_EMPTY: "a transaction needs at least one input",
    SignerErrorCode.OUTPUTS_MUST_NOT_BE_EMPTY: "a transaction needs at least one payment output",
    SignerErrorCode.INVALID_INPUT: "an input's txid, vout, amount or private key is malformed",
    SignerErrorCode.DUPLICATE_INPUT: "the same outpoint appears twice among the inputs",
    SignerErrorCode.KEY_DOES_NOT_MATCH_INPUT: "the input's private key does not control the scriptPubKey it claims to spend",
    SignerErrorCode.AMOUNT_MUST_BE_POSITIVE: "an amount is not a positive integer (minor units, never float) or exceeds the supply",
    SignerErrorCode.OUTPUT_BELOW_DUST: "an output pays less than the node's dust threshold for its script type",
    SignerErrorCode.OUTPUTS_EXCEED_INPUTS: "payments plus change are more than the inputs hold",
    SignerErrorCode.FEE_EXCEEDS_MAXIMUM: "the fee rate is above the configured ceiling (guards against amount/fee mix-ups)",
    SignerErrorCode.TRANSACTION_TOO_LARGE: "the transaction exceeds the standard weight limit (400,000 WU)",
    SignerErrorCode.INSUFFICIENT_FUNDS: "coin selection cannot cover the payments plus fee from the given coins",
    SignerErrorCode.INVALID_FEE_RATE: "a fee rate is not a non-negative integer (sat per 1000 vB; wei)",
    SignerErrorCode.INVALID_TRANSACTION_FIELD: "an ethereum transaction field is missing, negative or inconsistent",
}


class SignerError(Exception):
    """A refusal by the signer, carrying a `SignerErrorCode`."""

    def __init__(self, code: SignerErrorCode, detail: str | None = None) -> None:
        self.code = code
        self.detail = detail
        super().__init__(f"{code.value}: {detail or code.meaning}")
