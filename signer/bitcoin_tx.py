"""Bitcoin transaction building and signing for the signer: segwit batches, paid from P2WPKH coins.

Guarantees, stated first:
- Integer satoshis only: every amount is an `int` (a `bool` or `float` is refused), positive, at
  most 21,000,000 BTC; fee = inputs - payments - change, exactly, never negative.
- Every destination is a native segwit address of the signer's network: bech32 v0 (P2WPKH,
  P2WSH) or bech32m v1 (P2TR), with the checksum variant BIP350 requires for its version.
  Everything else is refused with a `SignerError` code. Every output script, however it
  arrived, is one of those three forms. A script handed in with its address
  (`PayOutput.script`, made by `pay_output` when the withdrawal was requested) is trusted to
  be that address's: it comes from the same approved row as the address, and re-deriving it
  would cost the ~50 us per output this layer exists to avoid.
- All inputs are signed SIGHASH_ALL per BIP143, with low-S ECDSA from libsecp256k1 (coincurve)
  and RFC6979 nonces, so signing the same transaction twice yields the same bytes. Each
  signature is verified after signing (as Bitcoin Core's CKey::Sign does) before it is used.
- The transaction is version 2; inputs signal BIP125 replaceability (nSequence 0xfffffffd)
  unless `rbf=False` (then 0xfffffffe: final for RBF, locktime still enforced).
- Output order is the caller's; the change output, when any, is last (`SignedTx.change_vout`),
  so output n maps to payment n and a fee bump keeps the same shape.

Speed (DESIGN 7, issue 6 item 8): the BIP143 parts shared by all inputs (hashPrevouts,
hashSequence, hashOutputs) are computed once per transaction, and the outputs are serialised
once and reused for both hashOutputs and the wire bytes, so a 500-output batch costs one pass
over its outputs however many inputs it has. Parsing an address costs ~50 us in pure Python,
more than everything else per output together: parse destinations when a withdrawal is
requested (`pay_output(address, amount, network)` fills `PayOutput.script`) and hand the
batch already-resolved outputs; an output without a script is parsed at signing time.

Bech32/bech32m decoding and checksums come from bip-utils (`SegwitBech32Decoder`,
`Bech32Utils.VerifyChecksum`); this module adds the policy around them: the 90-character limit,
the network's HRP, which witness versions and lengths are payable, and precise refusal codes.

Dust thresholds are Bitcoin Core's (policy.cpp GetDustThreshold at the default dustrelayfee of
3 sat/vB): (serialised output size + 67 vB to spend it) * 3, i.e.

| script | output size | dust below |
| --- | --- | --- |
| P2WPKH | 31 B | 294 sat |
| P2WSH, P2TR | 43 B | 330 sat |
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import coincurve
from bip_utils import Bech32ChecksumError, Hash160, SegwitBech32Decoder
from bip_utils.bech32.bech32 import Bech32Encodings, Bech32Utils
from bip_utils.bech32.bech32_base import Bech32BaseConst

from signer.errors import SignerError, SignerErrorCode

# Human-readable parts per network (BIP173; regtest's is Bitcoin Core's chainparams).
NETWORK_HRP: dict[str, str] = {"mainnet": "bc", "testnet": "tb", "regtest": "bcrt"}
_HRP_NETWORK = {hrp: net for net, hrp in NETWORK_HRP.items()}

MAX_MONEY = 21_000_000 * 100_000_000
MAX_STANDARD_TX_WEIGHT = 400_000
TX_VERSION = 2
SIGHASH_ALL = 1
SEQUENCE_RBF = 0xFFFFFFFD
SEQUENCE_NO_RBF = 0xFFFFFFFE
# Bitcoin Core's default -maxfeerate for sendrawtransaction (0.10 BTC/kvB): a fee above this
# is almost certainly an amount or a unit mixed up, not a fee.
DEFAULT_MAX_FEE_RATE_SAT_PER_KVB = 10_000_000

# Dust: Core's GetDustThreshold for witness programs (see the module docstring).
DUST_RELAY_FEE_SAT_PER_KVB = 3_000
_WITNESS_SPEND_VB = 67  # 32 + 4 + 1 + 107 // 4 + 4

# P2WPKH input weight, upper bound with a low-S signature:
#   non-witness: outpoint 36 + empty scriptSig 1 + nSequence 4 = 41 B  -> 164 WU
#   witness: item count 1 + push 1 + DER <= 71 + sighash 1 + push 1 + pubkey 33 = 108 WU
P2WPKH_INPUT_WEIGHT = 41 * 4 + 108  # 272 WU = 68 vB
P2WPKH_INPUT_VBYTES = 68
_SEGWIT_MARKER_WEIGHT = 2  # marker and flag bytes, witness-discounted

_MAX_BECH32_LEN = 90
# (length, first two bytes) of the scripts we pay: P2WPKH, P2WSH, P2TR
_PAYABLE_FORMS = frozenset({(22, b"\x00\x14"), (34, b"\x00\x20"), (34, b"\x51\x20")})
_BASE58_ALPHABET = frozenset("123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz")
_SECP256K1_HALF_N = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0


# --- value types ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpendInput:
    """A P2WPKH coin the signer owns. `script_pubkey`, when given, is checked against the key."""

    txid: str
    vout: int
    amount: int
    private_key: bytes
    script_pubkey: bytes | None = None

    def __repr__(self) -> str:  # the key must never reach a log line
        return f"SpendInput(txid={self.txid!r}, vout={self.vout}, amount={self.amount}, private_key=<redacted>)"


@dataclass(frozen=True, slots=True)
class PayOutput:
    """Pay `amount` satoshis to `address`. `script` is the address's scriptPubKey when already
    resolved (see `pay_output`); empty means "parse the address when signing"."""

    address: str
    amount: int
    script: bytes = b""


@dataclass(frozen=True, slots=True)
class SignedTx:
    raw: bytes            # the serialised segwit transaction, ready for sendrawtransaction
    txid: str             # display order (reversed double SHA-256 of the non-witness bytes)
    vsize: int            # virtual size, ceil(weight / 4)
    fee: int              # satoshis: inputs - outputs
    change_vout: int | None = None
    weight: int = 0


class HasAmount(Protocol):
    @property
    def amount(self) -> int: ...


C = TypeVar("C", bound=HasAmount)


# --- addresses ------------------------------------------------------------------------------


def hrp_for(network: str) -> str:
    try:
        return NETWORK_HRP[network]
    except (KeyError, TypeError):
        raise SignerError(SignerErrorCode.UNKNOWN_NETWORK, f"{network!r} is not one of {sorted(NETWORK_HRP)}") from None


def address_to_script(address: str, network: str) -> bytes:
    """The scriptPubKey of a native segwit `address` on `network`, or a `SignerError`.

    Accepted: bech32 witness v0 with a 20-byte (P2WPKH) or 32-byte (P2WSH) program, and
    bech32m witness v1 with a 32-byte program (P2TR), whose HRP is the network's.
    Refused, in order of precedence: unknown_network, invalid_address (not a string, too long,
    malformed, bad checksum), unsupported_address_type (base58 legacy or P2SH; witness v1 of
    another length; v2..v16, which are anyone-can-spend today), wrong_network,
    address_checksum_variant_mismatch (v0 with bech32m or v1+ with bech32).
    """
    hrp = hrp_for(network)
    if not isinstance(address, str) or not address:
        raise SignerError(SignerErrorCode.INVALID_ADDRESS, "the address must be a non-empty string")
    if len(address) > _MAX_BECH32_LEN:
        raise SignerError(SignerErrorCode.INVALID_ADDRESS, f"longer than {_MAX_BECH32_LEN} characters")
    sep = address.rfind("1")
    got_hrp = address[:sep].lower() if sep > 0 else ""
    if got_hrp not in _HRP_NETWORK:
        if _looks_base58(address):
            raise SignerError(SignerErrorCode.UNSUPPORTED_ADDRESS_TYPE,
                              "legacy base58 addresses (P2PKH, P2SH) are not paid; use a bech32 address")
        raise SignerError(SignerErrorCode.INVALID_ADDRESS, "not a bech32 address of a known bitcoin network")
    try:
        version, program = SegwitBech32Decoder.Decode(got_hrp, address)
    except Bech32ChecksumError:
        raise _checksum_error(got_hrp, address) from None
    except ValueError as exc:
        raise SignerError(SignerErrorCode.INVALID_ADDRESS, str(exc)) from None
    if version == 1 and len(program) != 32:
        raise SignerError(SignerErrorCode.UNSUPPORTED_ADDRESS_TYPE, f"witness v1 program of {len(program)} bytes is not taproot")
    if version > 1:
        raise SignerError(SignerErrorCode.UNSUPPORTED_ADDRESS_TYPE, f"witness version {version} is not spendable by anyone's rules yet")
    if got_hrp != hrp:
        raise SignerError(SignerErrorCode.WRONG_NETWORK, f"a {_HRP_NETWORK[got_hrp]} address, this signer is on {network}")
    return bytes((0x50 + version if version else 0, len(program))) + program


def _looks_base58(address: str) -> bool:
    return 25 <= len(address) <= 35 and address[0] in "123mn" and set(address) <= _BASE58_ALPHABET


def _checksum_error(hrp: str, address: str) -> SignerError:
    """A failed checksum: a BIP350 variant mix-up when the other variant verifies, else a typo."""
    data = [Bech32BaseConst.CHARSET.find(c) for c in address.lower()[len(hrp) + 1:]]
    if data and data[0] == 0 and Bech32Utils.VerifyChecksum(hrp, data, Bech32Encodings.BECH32M):
        return SignerError(SignerErrorCode.ADDRESS_CHECKSUM_VARIANT_MISMATCH, "witness v0 must use bech32, not bech32m")
    if data and data[0] != 0 and Bech32Utils.VerifyChecksum(hrp, data, Bech32Encodings.BECH32):
        return SignerError(SignerErrorCode.ADDRESS_CHECKSUM_VARIANT_MISMATCH,
                           f"witness v{data[0]} must use bech32m, not bech32")
    return SignerError(SignerErrorCode.INVALID_ADDRESS, "bad bech32 checksum (a mistyped character?)")


def pay_output(address: str, amount: int, network: str) -> PayOutput:
    """A `PayOutput` with its script resolved now: call this when the withdrawal is requested."""
    return PayOutput(address, amount, address_to_script(address, network))


def dust_threshold(script: bytes) -> int:
    """The smallest amount Bitcoin Core relays to `script` (witness programs; see module doc)."""
    size = 8 + _varint_len(len(script)) + len(script)
    return (size + _WITNESS_SPEND_VB) * DUST_RELAY_FEE_SAT_PER_KVB // 1000


def p2wpkh_script(public_key: bytes) -> bytes:
    return b"\x00\x14" + _hash160(public_key)


# --- size and fee ---------------------------------------------------------------------------


def estimate_vsize(n_inputs: int, output_scripts: Sequence[bytes]) -> int:
    """Virtual size of a transaction spending `n_inputs` P2WPKH coins to `output_scripts`.

    An upper bound, exact when every signature's r is 33 bytes: each signature is at most
    71 DER bytes with low-S, and about half are 70 (low r), so the real size is at most
    n_inputs / 4 vB smaller (rounded). A fee computed from this is never below the target rate.
    """
    return _vsize(n_inputs, len(output_scripts), sum(_output_len(s) for s in output_scripts))


def _vsize(n_inputs: int, n_outputs: int, outputs_len: int) -> int:
    base = 4 + _varint_len(n_inputs) + 41 * n_inputs + _varint_len(n_outputs) + outputs_len + 4
    weight = 4 * base + _SEGWIT_MARKER_WEIGHT + 108 * n_inputs
    return (weight + 3) // 4


def fee_for(vsize: int, fee_rate_sat_per_kvb: int) -> int:
    """Satoshis for `vsize` at a rate in sat per 1000 vB, rounded up (integer arithmetic)."""
    return -(-vsize * fee_rate_sat_per_kvb // 1000)


def _output_len(script: bytes) -> int:
    return 8 + _varint_len(len(script)) + len(script)


def select_coins(
    utxos: Iterable[C],
    target: int,
    fee_rate_sat_per_kvb: int,
    output_scripts: Sequence[bytes],
    change_script: bytes,
) -> tuple[list[C], int, int]:
    """Choose P2WPKH coins to pay `target` satoshis to `output_scripts` at the given fee rate.

    Returns (chosen coins, change amount, fee); change 0 means "no change output". Largest
    first: coins are taken in decreasing amount (stable, so equal amounts keep the caller's
    order) until they cover target + the fee of the transaction with a change output. That
    minimises inputs, hence today's fee, and is predictable; it does not consolidate small
    coins (sweeps and rebalances do that). Coins worth less than the fee to spend them are
    skipped. When the change would be dust (or nothing), it is dropped and the surplus, which
    is then below dust + the cost of a change output, goes to the fee; otherwise the change
    carries everything above the estimated fee. The fee uses `estimate_vsize`, an upper
    bound, so the signed transaction pays at least the requested rate.
    """
    if type(target) is not int or target <= 0:
        raise SignerError(SignerErrorCode.AMOUNT_MUST_BE_POSITIVE, "target must be a positive int of satoshis")
    if type(fee_rate_sat_per_kvb) is not int or fee_rate_sat_per_kvb < 0:
        raise SignerError(SignerErrorCode.INVALID_FEE_RATE, "fee rate must be a non-negative int (sat per 1000 vB)")
    if not output_scripts:
        raise SignerError(SignerErrorCode.OUTPUTS_MUST_NOT_BE_EMPTY)
    n_out = len(output_scripts)
    out_len = sum(_output_len(s) for s in output_scripts)
    change_len = _output_len(change_script)
    change_dust = dust_threshold(change_script)
    input_fee = fee_for(P2WPKH_INPUT_VBYTES, fee_rate_sat_per_kvb)
    coins = sorted((u for u in utxos if u.amount > input_fee), key=lambda u: u.amount, reverse=True)
    chosen: list[C] = []
    total = 0
    for coin in coins:
        chosen.append(coin)
        total += coin.amount
        n = len(chosen)
        fee_without = fee_for(_vsize(n, n_out, out_len), fee_rate_sat_per_kvb)
        if total < target + fee_without:
            continue
        fee_with = fee_for(_vsize(n, n_out + 1, out_len + change_len), fee_rate_sat_per_kvb)
        change = total - target - fee_with
        if change >= change_dust:
            return chosen, change, fee_with
        return chosen, 0, total - target
    have = sum(c.amount for c in coins)
    raise SignerError(SignerErrorCode.INSUFFICIENT_FUNDS,
                      f"{len(coins)} spendable coins hold {have} sat; {target} sat plus fee needed")


# --- BIP143 ---------------------------------------------------------------------------------


class Bip143Sighash:
    """BIP143 signature hashes for one transaction, its shared parts hashed once.

    Bitcoin Core's PrecomputedTransactionData: hashPrevouts, hashSequence and hashOutputs
    depend only on the transaction, not on the input being signed, so each input's digest is
    one SHA-256d over ~180 bytes however many outputs the transaction has.
    """

    __slots__ = ("_head", "_tail")

    def __init__(self, version: int, outpoints: Sequence[bytes], sequences: Sequence[int],
                 outputs: bytes, locktime: int) -> None:
        hash_prevouts = _sha256d(b"".join(outpoints))
        hash_sequence = _sha256d(b"".join(s.to_bytes(4, "little") for s in sequences))
        self._head = version.to_bytes(4, "little") + hash_prevouts + hash_sequence
        self._tail = _sha256d(outputs) + locktime.to_bytes(4, "little")

    def digest(self, outpoint: bytes, script_code: bytes, amount: int, sequence: int,
               sighash_type: int = SIGHASH_ALL) -> bytes:
        """The digest input `outpoint` signs; `script_code` is length-prefixed, as serialised."""
        return _sha256d(self._head + outpoint + script_code + amount.to_bytes(8, "little")
                        + sequence.to_bytes(4, "little") + self._tail + sighash_type.to_bytes(4, "little"))


def p2wpkh_script_code(public_key: bytes) -> bytes:
    """BIP143 scriptCode of a P2WPKH input: the P2PKH script of the key, length-prefixed."""
    return b"\x19\x76\xa9\x14" + _hash160(public_key) + b"\x88\xac"


def sign_digest(key: coincurve.PrivateKey, public_key: bytes, digest: bytes) -> bytes:
    """DER ECDSA signature of a 32-byte digest: RFC6979, low-S, verified before it is returned."""
    sig = key.sign(digest, hasher=None)
    # libsecp256k1 always normalises to low-S; check anyway, the node would refuse a high S.
    r_len = sig[3]
    s = int.from_bytes(sig[6 + r_len:], "big")
    if s > _SECP256K1_HALF_N or not coincurve.verify_signature(sig, digest, public_key, hasher=None):
        raise RuntimeError("secp256k1 produced an invalid signature")  # a library or hardware fault
    return sig


# --- signing a batch ------------------------------------------------------------------------


def sign_batch(
    inputs: Sequence[SpendInput],
    outputs: Sequence[PayOutput],
    network: str,
    *,
    change: PayOutput | None,
    rbf: bool = True,
    locktime: int = 0,
    max_fee_rate_sat_per_kvb: int | None = DEFAULT_MAX_FEE_RATE_SAT_PER_KVB,
) -> SignedTx:
    """Build and sign a version-2 segwit transaction paying `outputs` (then `change`) from
    P2WPKH `inputs`; fee = inputs - outputs - change.

    Refusals, in order of precedence: unknown_network; inputs_must_not_be_empty;
    outputs_must_not_be_empty; invalid_input; duplicate_input; amount_must_be_positive; an
    address refusal (see `address_to_script`; a given script of another form is
    unsupported_address_type); output_below_dust; outputs_exceed_inputs;
    key_does_not_match_input; transaction_too_large; fee_exceeds_maximum (pass None to lift).
    """
    hrp_for(network)
    if not inputs:
        raise SignerError(SignerErrorCode.INPUTS_MUST_NOT_BE_EMPTY)
    if not outputs:
        raise SignerError(SignerErrorCode.OUTPUTS_MUST_NOT_BE_EMPTY)
    if type(locktime) is not int or not 0 <= locktime <= 0xFFFFFFFF:
        raise SignerError(SignerErrorCode.INVALID_INPUT, "locktime must be an int in 0..2^32-1")
    sequence = SEQUENCE_RBF if rbf else SEQUENCE_NO_RBF
    outpoints = _outpoints(inputs)
    total_in = 0
    for i, txin in enumerate(inputs):
        total_in += _checked_amount(txin.amount, f"input {i}")

    pays = list(outputs) if change is None else [*outputs, change]
    serialised = []
    total_out = 0
    for i, out in enumerate(pays):
        what = "change" if change is not None and i == len(outputs) else f"output {i}"
        amount = _checked_amount(out.amount, what)
        script = _checked_script(out.script, what) if out.script else address_to_script(out.address, network)
        if amount < dust_threshold(script):
            raise SignerError(SignerErrorCode.OUTPUT_BELOW_DUST,
                              f"{what} pays {amount} sat; {dust_threshold(script)} is the minimum for its script type")
        total_out += amount
        serialised.append(amount.to_bytes(8, "little") + _varint(len(script)) + script)
    if total_out > total_in:
        raise SignerError(SignerErrorCode.OUTPUTS_EXCEED_INPUTS, f"outputs {total_out} sat > inputs {total_in} sat")
    outputs_bytes = b"".join(serialised)

    sighash = Bip143Sighash(TX_VERSION, outpoints, [sequence] * len(inputs), outputs_bytes, locktime)
    witnesses = []
    for i, (txin, outpoint) in enumerate(zip(inputs, outpoints)):
        key, public_key = _key(txin.private_key, i)
        if txin.script_pubkey is not None and txin.script_pubkey != p2wpkh_script(public_key):
            raise SignerError(SignerErrorCode.KEY_DOES_NOT_MATCH_INPUT, f"input {i} ({txin.txid}:{txin.vout})")
        digest = sighash.digest(outpoint, p2wpkh_script_code(public_key), txin.amount, sequence)
        sig = sign_digest(key, public_key, digest) + b"\x01"
        witnesses.append(b"\x02" + bytes((len(sig),)) + sig + b"\x21" + public_key)

    seq = sequence.to_bytes(4, "little")
    ins = b"".join(op + b"\x00" + seq for op in outpoints)
    head = TX_VERSION.to_bytes(4, "little")
    body = _varint(len(inputs)) + ins + _varint(len(pays)) + outputs_bytes
    tail = locktime.to_bytes(4, "little")
    stripped = head + body + tail
    raw = head + b"\x00\x01" + body + b"".join(witnesses) + tail
    weight = 3 * len(stripped) + len(raw)
    vsize = (weight + 3) // 4
    fee = total_in - total_out
    if weight > MAX_STANDARD_TX_WEIGHT:
        raise SignerError(SignerErrorCode.TRANSACTION_TOO_LARGE, f"{weight} WU > {MAX_STANDARD_TX_WEIGHT}")
    if max_fee_rate_sat_per_kvb is not None and fee * 1000 > max_fee_rate_sat_per_kvb * vsize:
        raise SignerError(SignerErrorCode.FEE_EXCEEDS_MAXIMUM,
                          f"fee {fee} sat for {vsize} vB is above {max_fee_rate_sat_per_kvb} sat/kvB")
    return SignedTx(raw, _sha256d(stripped)[::-1].hex(), vsize, fee,
                    len(outputs) if change is not None else None, weight)


def _outpoints(inputs: Sequence[SpendInput]) -> list[bytes]:
    outpoints = []
    for i, txin in enumerate(inputs):
        txid = txin.txid
        if not isinstance(txid, str) or len(txid) != 64:
            raise SignerError(SignerErrorCode.INVALID_INPUT, f"input {i}: txid must be 64 hex digits")
        try:
            txid_bytes = bytes.fromhex(txid)[::-1]
        except ValueError:
            raise SignerError(SignerErrorCode.INVALID_INPUT, f"input {i}: txid must be 64 hex digits") from None
        if type(txin.vout) is not int or not 0 <= txin.vout <= 0xFFFFFFFF:
            raise SignerError(SignerErrorCode.INVALID_INPUT, f"input {i}: vout must be an int in 0..2^32-1")
        outpoints.append(txid_bytes + txin.vout.to_bytes(4, "little"))
    if len(set(outpoints)) != len(outpoints):
        raise SignerError(SignerErrorCode.DUPLICATE_INPUT, "an outpoint is spent twice")
    return outpoints


def _checked_script(script: bytes, what: str) -> bytes:
    """A pre-resolved script must have the form of a payable address: P2WPKH, P2WSH or P2TR."""
    if not isinstance(script, bytes) or (len(script), script[:2]) not in _PAYABLE_FORMS:
        raise SignerError(SignerErrorCode.UNSUPPORTED_ADDRESS_TYPE, f"{what}: script is not P2WPKH, P2WSH or P2TR")
    return script


def _checked_amount(amount: int, what: str) -> int:
    if type(amount) is not int or not 0 < amount <= MAX_MONEY:
        raise SignerError(SignerErrorCode.AMOUNT_MUST_BE_POSITIVE,
                          f"{what}: amount must be an int of satoshis in 1..{MAX_MONEY}, got {amount!r}")
    return amount


def _key(private_key: bytes, i: int) -> tuple[coincurve.PrivateKey, bytes]:
    # Never echo the key or chain the library's exception (its message could carry it).
    if not isinstance(private_key, bytes) or len(private_key) != 32:
        raise SignerError(SignerErrorCode.INVALID_INPUT, f"input {i}: private key must be 32 bytes")
    try:
        key = coincurve.PrivateKey(private_key)
    except Exception:
        raise SignerError(SignerErrorCode.INVALID_INPUT, f"input {i}: private key is not a valid secp256k1 scalar") from None
    return key, key.public_key.format(compressed=True)


# --- encoding helpers -----------------------------------------------------------------------


def _sha256d(data: bytes) -> bytes:
    return hashlib.sha256(hashlib.sha256(data).digest()).digest()


def _hash160_hashlib(data: bytes) -> bytes:
    return hashlib.new("ripemd160", hashlib.sha256(data).digest()).digest()


def _hash160_bip_utils(data: bytes) -> bytes:
    return bytes(Hash160.QuickDigest(data))


try:  # OpenSSL 3 builds may leave RIPEMD-160 out of hashlib; bip-utils carries its own
    hashlib.new("ripemd160")
    _hash160 = _hash160_hashlib
except ValueError:
    _hash160 = _hash160_bip_utils


def _varint(n: int) -> bytes:
    if n < 0xFD:
        return bytes((n,))
    if n <= 0xFFFF:
        return b"\xfd" + n.to_bytes(2, "little")
    if n <= 0xFFFFFFFF:
        return b"\xfe" + n.to_bytes(4, "little")
    return b"\xff" + n.to_bytes(8, "little")


def _varint_len(n: int) -> int:
    return 1 if n < 0xFD else 3 if n <= 0xFFFF else 5 if n <= 0xFFFFFFFF else 9


# --- reading a transaction ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ParsedTx:
    """What the signer reads from a serialised transaction it did not build (a CPFP parent): its
    txid (computed here from the bytes), virtual size and outputs (amount, script) in order; the
    outpoints its inputs spend (txid in display order, vout) in order; and `p2wpkh_vsize`, the
    virtual size the same transaction has at most when every input is a P2WPKH spend with a
    low-S signature (its non-witness bytes, which the txid commits to, plus `P2WPKH_INPUT_WEIGHT`'s
    witness part per input). The witness is not covered by the txid: whoever sends the bytes can
    pad it without changing the txid, so `vsize` alone is no bound on the real transaction's size."""

    txid: str
    vsize: int
    outputs: tuple[tuple[int, bytes], ...]
    inputs: tuple[tuple[str, int], ...] = ()
    p2wpkh_vsize: int = 0


def parse_transaction(raw: bytes) -> ParsedTx:
    """Parse a serialised transaction (legacy or segwit, BIP144), strictly: every byte is read
    exactly once and nothing trails. `invalid_input` for anything else."""
    if not isinstance(raw, (bytes, bytearray)):
        raise SignerError(SignerErrorCode.INVALID_INPUT, "a transaction must be bytes")
    raw = bytes(raw)
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > len(raw):
            raise SignerError(SignerErrorCode.INVALID_INPUT, "the transaction is truncated")
        pos += n
        return raw[pos - n:pos]

    def varint() -> int:
        first = take(1)[0]
        if first < 0xFD:
            return first
        return int.from_bytes(take({0xFD: 2, 0xFE: 4, 0xFF: 8}[first]), "little")

    version = take(4)
    segwit = raw[pos:pos + 2] == b"\x00\x01"
    if segwit:
        take(2)
    body_start = pos
    n_in = varint()
    if n_in == 0 or n_in > len(raw):
        raise SignerError(SignerErrorCode.INVALID_INPUT, "the transaction has no inputs")
    inputs = []
    for _ in range(n_in):
        outpoint = take(36)
        inputs.append((outpoint[:32][::-1].hex(), int.from_bytes(outpoint[32:], "little")))
        take(varint())
        take(4)
    n_out = varint()
    if n_out == 0 or n_out > len(raw):
        raise SignerError(SignerErrorCode.INVALID_INPUT, "the transaction has no outputs")
    outputs = []
    for _ in range(n_out):
        amount = int.from_bytes(take(8), "little")
        outputs.append((amount, take(varint())))
    body_end = pos
    if segwit:
        for _ in range(n_in):
            for _ in range(varint()):
                take(varint())
    locktime = take(4)
    if pos != len(raw):
        raise SignerError(SignerErrorCode.INVALID_INPUT, "bytes trail the transaction")
    stripped = version + raw[body_start:body_end] + locktime
    weight = 3 * len(stripped) + len(raw)
    p2wpkh_weight = 4 * len(stripped) + _SEGWIT_MARKER_WEIGHT + n_in * (P2WPKH_INPUT_WEIGHT - 41 * 4)
    return ParsedTx(_sha256d(stripped)[::-1].hex(), (weight + 3) // 4, tuple(outputs), tuple(inputs),
                    (p2wpkh_weight + 3) // 4)
