"""PSBT (BIP 174, version 0) for cold -> hot moves: build the unsigned PSBT, read back the signed one.

The cold wallet is watch-only: custody holds its account PUBLIC key, the signer holds no key for it.
Value leaves cold only through a transaction an operator signs offline. Custody builds that
transaction as an unsigned PSBT (`build`): version 2, the cold coins it chose as inputs (each with
its `witness_utxo`: amount and P2WPKH script, all a P2WPKH signer needs; nSequence 0xfffffffd, so it
can be fee-bumped), our outputs only, locktime 0. Each input carries `PSBT_IN_BIP32_DERIVATION` and
each output of ours (the hot receive address, the cold change) `PSBT_OUT_BIP32_DERIVATION`
(`KeyOrigin`: public key, fingerprint, path), so an offline signer finds its key without scanning
(a hardware wallet needs it; Bitcoin Core's `walletprocesspsbt` uses it too) and recognises our
outputs as its own or the hot wallet's. The fingerprint and path: with the cold key's master
fingerprint known (`[wallets.bitcoin] cold_fingerprint`, the origin `[fp/84h/<coin>h/<account>h]`
of a BIP84 account; likewise `hot_fingerprint`), the full path from that master; when none is
recorded (the `wallet` table holds the account xpub only, and an xpub names its parent's
fingerprint, not its master's), the account xpub's OWN fingerprint (HASH160 of its public key,
first 4 bytes) with the path relative to it, `<change>/<index>`: what Bitcoin Core assumes for a
descriptor `wpkh(tpub.../0/*)` without an origin, and what a hardware wallet holding the seed will
NOT recognise (record the fingerprint for one). The operator exports it (base64), signs it with
the cold key (an offline wallet: Bitcoin Core's `walletprocesspsbt`, a hardware wallet...) and
imports it back; `extract` then:

- parses the PSBT strictly (magic, one global unsigned transaction, one map per input and per
  output, no duplicate keys, nothing after the last map); unknown fields are allowed (BIP 174 says
  they must be kept or ignored), and are ignored;
- requires the unsigned transaction to be byte for byte the one custody built (`expected_unsigned`):
  the same inputs, outputs, amounts, version, sequences and locktime, so nothing can be added,
  removed or redirected by whoever signed it;
- takes each input's final witness (`PSBT_IN_FINAL_SCRIPTWITNESS`) or, when the signer did not
  finalize, builds it from the one partial signature (`PSBT_IN_PARTIAL_SIG`: [signature, key]);
- verifies every input's signature itself (P2WPKH: the key hashes to the spent script's program;
  ECDSA over the BIP 143 digest, SIGHASH_ALL only), so a wrongly signed PSBT is refused here with
  a code, never sent to the node;
- and answers the network transaction (segwit serialisation) and its txid.

Errors (`PsbtError.code`), in the order they are checked:
| code | meaning |
| --- | --- |
| psbt_malformed | not base64, not a PSBT (magic), a truncated or duplicate field, a global transaction missing or with scriptSigs/witnesses, or map counts that differ from the transaction's inputs and outputs |
| psbt_transaction_mismatch | the PSBT's unsigned transaction is not the one custody built (another input, output, amount, sequence, version or locktime) |
| psbt_not_signed | an input carries neither a final witness nor exactly one partial signature |
| psbt_signature_invalid | an input's witness is not [DER signature + SIGHASH_ALL, 33-byte key], the key is not the spent script's, or the signature does not verify |

What the signer put in the maps besides signatures (derivations it copied, its own proprietary
fields) is ignored: the transaction alone says where the value goes, and it must be custody's own,
byte for byte, so a PSBT that pays anything but our hot address (and our cold change) is refused
(`psbt_transaction_mismatch`) whatever its output maps claim.

No library: python-bitcoinlib (already used by the chain adapter) has no PSBT support, and the
version-0 format is a few key-value maps; the serialisation and BIP 143 digest are the signer's
own (signer.bitcoin_tx).
"""
from __future__ import annotations

import base64
import binascii
import enum
from dataclasses import dataclass
from typing import Sequence

import coincurve

from signer.bitcoin_tx import SEQUENCE_RBF, SIGHASH_ALL, TX_VERSION, Bip143Sighash, p2wpkh_script_code
from signer.bitcoin_tx import _hash160, _sha256d, _varint  # the signer's serialisation helpers

MAGIC = b"psbt\xff"
GLOBAL_UNSIGNED_TX = 0x00
IN_WITNESS_UTXO = 0x01
IN_PARTIAL_SIG = 0x02
IN_FINAL_SCRIPTSIG = 0x07
IN_FINAL_SCRIPTWITNESS = 0x08
IN_BIP32_DERIVATION = 0x06  # PSBT_IN_BIP32_DERIVATION: key 0x06 || pubkey, value fingerprint || path
OUT_BIP32_DERIVATION = 0x02  # PSBT_OUT_BIP32_DERIVATION: the same for an output's key
HARDENED = 0x80000000


class PsbtErrorCode(str, enum.Enum):
    psbt_malformed = "psbt_malformed"
    psbt_transaction_mismatch = "psbt_transaction_mismatch"
    psbt_not_signed = "psbt_not_signed"
    psbt_signature_invalid = "psbt_signature_invalid"


class PsbtError(Exception):
    """A PSBT refused on import (codes in the module table)."""

    def __init__(self, code: PsbtErrorCode, message: str) -> None:
        self.code = code
        super().__init__(f"{code.value}: {message}")


@dataclass(frozen=True)
class KeyOrigin:
    """Where a key comes from (BIP 174 `PSBT_IN_BIP32_DERIVATION` / `PSBT_OUT_BIP32_DERIVATION`): the
    33-byte compressed public key, the 4-byte fingerprint of the extended key the path starts from
    (a master key's, or, when no origin is recorded, the account xpub's own) and the child numbers
    from it (a hardened one with bit 31 set)."""

    pubkey: bytes
    fingerprint: bytes
    path: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.pubkey) != 33 or self.pubkey[0] not in (2, 3):
            raise ValueError("a key origin's public key is 33 bytes, compressed")
        if len(self.fingerprint) != 4:
            raise ValueError("a key origin's fingerprint is 4 bytes")
        if any(type(i) is not int or not 0 <= i <= 0xFFFFFFFF for i in self.path):
            raise ValueError("a key origin's path is child numbers of 32 bits")

    def pair(self, field_type: int) -> tuple[bytes, bytes]:
        """The (key, value) of this origin as a PSBT field of `field_type` (0x06 input, 0x02 output)."""
        return bytes((field_type,)) + self.pubkey, self.fingerprint + b"".join(i.to_bytes(4, "little") for i in self.path)


@dataclass(frozen=True)
class PsbtInput:
    """A coin to spend: outpoint, amount (sat) and its P2WPKH scriptPubKey; `origin`: its key's, when known."""

    txid: str
    vout: int
    amount: int
    script_pubkey: bytes
    origin: KeyOrigin | None = None


@dataclass(frozen=True)
class Extracted:
    raw: bytes
    txid: str
    vsize: int


def _outpoint(k: PsbtInput) -> bytes:
    return bytes.fromhex(k.txid)[::-1] + k.vout.to_bytes(4, "little")


def _outputs_bytes(outputs: Sequence[tuple[bytes, int]]) -> bytes:
    return b"".join(amount.to_bytes(8, "little") + _varint(len(script)) + script for script, amount in outputs)


def unsigned_tx(inputs: Sequence[PsbtInput], outputs: Sequence[tuple[bytes, int]]) -> bytes:
    """The unsigned transaction (no witness) custody builds for these inputs and (script, amount) outputs."""
    for name, value in [("input amount", k.amount) for k in inputs] + [("output amount", a) for _, a in outputs]:
        if type(value) is not int or value <= 0:
            raise ValueError(f"{name} must be a positive int of satoshis, got {value!r}")
    ins = b"".join(_outpoint(k) + b"\x00" + SEQUENCE_RBF.to_bytes(4, "little") for k in inputs)
    return (TX_VERSION.to_bytes(4, "little") + _varint(len(inputs)) + ins + _varint(len(outputs))
            + _outputs_bytes(outputs) + (0).to_bytes(4, "little"))


def _pair(key: bytes, value: bytes) -> bytes:
    return _varint(len(key)) + key + _varint(len(value)) + value


def serialize(tx: bytes, input_maps: Sequence[dict[bytes, bytes]], output_maps: Sequence[dict[bytes, bytes]]) -> bytes:
    """A PSBT from its global unsigned transaction and its input and output maps (key -> value)."""
    def one(fields: dict[bytes, bytes]) -> bytes:
        return b"".join(_pair(k, v) for k, v in fields.items()) + b"\x00"
    return MAGIC + one({bytes((GLOBAL_UNSIGNED_TX,)): tx}) + b"".join(map(one, input_maps)) + b"".join(map(one, output_maps))


def build(inputs: Sequence[PsbtInput], outputs: Sequence[tuple[bytes, int]],
          output_origins: Sequence[KeyOrigin | None] | None = None) -> bytes:
    """The unsigned PSBT: the global transaction; each input's witness_utxo and, when its origin is
    known, its BIP32 derivation; each output's BIP32 derivation where `output_origins` names one
    (our own outputs: hot, change), else an empty map. An origin must be the key of the script it
    describes (a P2WPKH of that key), or ValueError: a wrong derivation would make an offline
    signer sign with the wrong key, or take our output for someone else's."""
    if not inputs or not outputs:
        raise ValueError("a PSBT spends at least one coin to at least one output")
    origins = list(output_origins) if output_origins is not None else [None] * len(outputs)
    if len(origins) != len(outputs):
        raise ValueError("one output origin (or None) per output")
    in_maps = []
    for k in inputs:
        fields = {bytes((IN_WITNESS_UTXO,)): k.amount.to_bytes(8, "little") + _varint(len(k.script_pubkey)) + k.script_pubkey}
        if k.origin is not None:
            _check_origin(k.origin, k.script_pubkey)
            key, value = k.origin.pair(IN_BIP32_DERIVATION)
            fields[key] = value
        in_maps.append(fields)
    out_maps = []
    for (script, _), origin in zip(outputs, origins):
        fields = {}
        if origin is not None:
            _check_origin(origin, script)
            key, value = origin.pair(OUT_BIP32_DERIVATION)
            fields[key] = value
        out_maps.append(fields)
    return serialize(unsigned_tx(inputs, outputs), in_maps, out_maps)


def _check_origin(origin: KeyOrigin, script_pubkey: bytes) -> None:
    if script_pubkey != b"\x00\x14" + _hash160(origin.pubkey):
        raise ValueError("a key origin's public key is not the key of the script it is given for")


# ---- reading ----------------------------------------------------------------------------------

class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise PsbtError(PsbtErrorCode.psbt_malformed, "truncated")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def varint(self) -> int:
        first = self.take(1)[0]
        if first < 0xFD:
            return first
        return int.from_bytes(self.take({0xFD: 2, 0xFE: 4, 0xFF: 8}[first]), "little")

    def map(self) -> dict[bytes, bytes]:
        fields: dict[bytes, bytes] = {}
        while True:
            n = self.varint()
            if n == 0:
                return fields
            key = self.take(n)
            value = self.take(self.varint())
            if key in fields:
                raise PsbtError(PsbtErrorCode.psbt_malformed, f"duplicate key of type {key[0]:#04x}")
            fields[key] = value


def _counts(tx: bytes) -> tuple[int, int]:
    """(inputs, outputs) of an unsigned transaction without witness or scriptSig, or psbt_malformed."""
    r = _Reader(tx)
    r.take(4)
    n_in = r.varint()
    if n_in == 0:
        raise PsbtError(PsbtErrorCode.psbt_malformed, "the global transaction has no inputs (or a witness marker)")
    for _ in range(n_in):
        r.take(36)
        if r.varint() != 0:
            raise PsbtError(PsbtErrorCode.psbt_malformed, "the global transaction carries a scriptSig")
        r.take(4)
    n_out = r.varint()
    for _ in range(n_out):
        r.take(8)
        r.take(r.varint())
    r.take(4)
    if r.pos != len(tx):
        raise PsbtError(PsbtErrorCode.psbt_malformed, "bytes after the global transaction's locktime")
    return n_in, n_out


def decode(text_or_bytes: str | bytes) -> bytes:
    """The PSBT bytes from base64 text (what operators move around) or raw bytes."""
    if isinstance(text_or_bytes, bytes) and text_or_bytes.startswith(MAGIC):
        return text_or_bytes
    try:
        return base64.b64decode(text_or_bytes.strip() if isinstance(text_or_bytes, str) else text_or_bytes, validate=True)
    except (binascii.Error, ValueError):
        raise PsbtError(PsbtErrorCode.psbt_malformed, "not base64") from None


def parse(data: bytes) -> tuple[bytes, list[dict[bytes, bytes]], list[dict[bytes, bytes]]]:
    """(global unsigned transaction, input maps, output maps), or PsbtError psbt_malformed."""
    r = _Reader(data)
    if r.take(5) != MAGIC:
        raise PsbtError(PsbtErrorCode.psbt_malformed, "not a PSBT (magic bytes)")
    globals_ = r.map()
    tx = globals_.get(bytes((GLOBAL_UNSIGNED_TX,)))
    if tx is None:
        raise PsbtError(PsbtErrorCode.psbt_malformed, "no global unsigned transaction")
    n_in, n_out = _counts(tx)
    inputs = [r.map() for _ in range(n_in)]
    outputs = [r.map() for _ in range(n_out)]
    if r.pos != len(data):
        raise PsbtError(PsbtErrorCode.psbt_malformed, "bytes after the last output map")
    return tx, inputs, outputs


def _witness_items(raw: bytes) -> list[bytes]:
    r = _Reader(raw)
    items = [r.take(r.varint()) for _ in range(r.varint())]
    if r.pos != len(raw):
        raise PsbtError(PsbtErrorCode.psbt_signature_invalid, "bytes after the final witness")
    return items


def _witness(i: int, fields: dict[bytes, bytes]) -> list[bytes]:
    final = fields.get(bytes((IN_FINAL_SCRIPTWITNESS,)))
    if final is not None:
        return _witness_items(final)
    partial = [(k[1:], v) for k, v in fields.items() if k[:1] == bytes((IN_PARTIAL_SIG,))]
    if len(partial) != 1:
        raise PsbtError(PsbtErrorCode.psbt_not_signed, f"input {i} carries no final witness and {len(partial)} partial signatures")
    key, sig = partial[0]
    return [sig, key]


def extract(data: bytes, expected_unsigned: bytes, inputs: Sequence[PsbtInput],
            outputs: Sequence[tuple[bytes, int]]) -> Extracted:
    """The signed network transaction of a PSBT whose unsigned transaction is `expected_unsigned`
    (custody's, for `inputs` and `outputs`), every signature verified (module docstring)."""
    tx, in_maps, _ = parse(data)
    if tx != expected_unsigned:
        raise PsbtError(PsbtErrorCode.psbt_transaction_mismatch, "the PSBT's transaction is not the one custody built")
    witnesses = [_witness(i, fields) for i, fields in enumerate(in_maps)]
    outpoints = [_outpoint(k) for k in inputs]
    sighash = Bip143Sighash(TX_VERSION, outpoints, [SEQUENCE_RBF] * len(inputs), _outputs_bytes(outputs), 0)
    for i, (k, items) in enumerate(zip(inputs, witnesses)):
        if len(items) != 2 or len(items[1]) != 33 or not items[0] or items[0][-1] != SIGHASH_ALL:
            raise PsbtError(PsbtErrorCode.psbt_signature_invalid, f"input {i}: not a P2WPKH SIGHASH_ALL witness")
        sig, key = items
        if k.script_pubkey != b"\x00\x14" + _hash160(key):
            raise PsbtError(PsbtErrorCode.psbt_signature_invalid, f"input {i}: the key is not the spent coin's")
        digest = sighash.digest(outpoints[i], p2wpkh_script_code(key), k.amount, SEQUENCE_RBF)
        try:
            valid = coincurve.verify_signature(sig[:-1], digest, key, hasher=None)
        except (ValueError, TypeError):
            valid = False
        if not valid:
            raise PsbtError(PsbtErrorCode.psbt_signature_invalid, f"input {i}: the signature does not verify")
    # segwit serialisation: version, marker + flag, the inputs and outputs as built, witnesses, locktime
    body = tx[4:-4]
    wit = b"".join(_varint(len(items)) + b"".join(_varint(len(x)) + x for x in items) for items in witnesses)
    raw = tx[:4] + b"\x00\x01" + body + wit + tx[-4:]
    weight = 3 * len(tx) + len(raw)
    return Extracted(raw, _sha256d(tx)[::-1].hex(), (weight + 3) // 4)


def encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
