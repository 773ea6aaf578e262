"""BIP-322 "simple" signed messages for P2WPKH addresses (sign and verify), standard library +
coincurve + bip-utils only, no key loading: the signer signs with it, custody's verifier checks.

What it implements of BIP-322 (version 2.0.0 of the BIP's text):
- `message_hash(m)` = BIP340 tagged hash "BIP0322-signed-message" of the message bytes;
- the two virtual transactions: `to_spend` (version 0, one input spending 000..000:0xFFFFFFFF with
  scriptSig OP_0 PUSH32[message_hash], one 0-value output paying the address's scriptPubKey) and
  `to_sign` (version 0, spends to_spend:0 with sequence 0, one 0-value OP_RETURN output, locktime 0);
- the signature: the P2WPKH witness [DER ECDSA || SIGHASH_ALL, compressed public key] satisfying
  to_sign's input under BIP143, consensus-encoded, base64, prefixed "smp" (`sign_simple`).
  `low_r=True` (default) grinds the nonce as Bitcoin Core does (RFC6979 with a 32-byte counter as
  extra data until R < 2^255), so our signatures are byte-identical to Core's and to the BIP's
  first published vector; `low_r=False` gives plain RFC6979 (the BIP's second vector).
- `verify_simple(address, message, signature)`: True only for a "smp"-prefixed, canonical base64
  witness of exactly two items whose key hashes to the address's program, with a strictly
  DER-encoded (BIP66), low-S signature with SIGHASH_ALL that verifies over to_sign's BIP143 digest.
  Anything else (another address type, the full/proof-of-funds variants, a legacy signature, an
  unprefixed one) answers False: we only check what we produce.

Why a signature here cannot spend coins: to_sign spends an output of to_spend, a transaction that
cannot exist on any chain (its input spends the null outpoint and it is not a coinbase), and the
only thing a caller chooses is the message. The signer still signs only reserves statements
(signer.protocol.parse_reserves_message).
"""
from __future__ import annotations

import base64
import binascii
import hashlib

from bip_utils import Hash160, P2WPKHAddrDecoder
from coincurve import PrivateKey, PublicKey
from coincurve._libsecp256k1 import ffi, lib

PREFIX_SIMPLE = "smp"
TAG = b"BIP0322-signed-message"
SIGHASH_ALL = 1
HRPS = {"mainnet": "bc", "testnet": "tb", "regtest": "bcrt"}
_SECP256K1_HALF_N = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0


def _sha256d(data: bytes) -> bytes:
    return hashlib.sha256(hashlib.sha256(data).digest()).digest()


def _varbytes(data: bytes) -> bytes:
    if len(data) >= 0xFD:  # every script and witness item here is shorter
        raise ValueError("item too long for a one-byte length")
    return bytes([len(data)]) + data


def message_hash(message: str) -> bytes:
    tag = hashlib.sha256(TAG).digest()
    return hashlib.sha256(tag + tag + message.encode()).digest()


def p2wpkh_program(address: str) -> bytes:
    """The 20-byte key hash of a P2WPKH address of any of our networks; ValueError otherwise."""
    hrp = "bcrt" if address.lower().startswith("bcrt1") else address[:2].lower()
    if hrp not in HRPS.values():
        raise ValueError(f"{address!r} is not a bech32 address of a known bitcoin network")
    try:
        return bytes(P2WPKHAddrDecoder().DecodeAddr(address, hrp=hrp))
    except Exception:  # bip-utils raises ValueError or its own errors for a bad checksum, length, version
        raise ValueError(f"{address!r} is not a P2WPKH address") from None


def _script_pubkey(program: bytes) -> bytes:
    return b"\x00\x14" + program


def to_spend_txid(message: str, program: bytes) -> bytes:
    """to_spend's txid in internal byte order (reverse it for display)."""
    script_sig = b"\x00\x20" + message_hash(message)
    tx = (b"\x00\x00\x00\x00" + b"\x01" + bytes(32) + b"\xff\xff\xff\xff" + _varbytes(script_sig) + b"\x00\x00\x00\x00"
          + b"\x01" + bytes(8) + _varbytes(_script_pubkey(program)) + b"\x00\x00\x00\x00")
    return _sha256d(tx)


def to_sign_txid(message: str, program: bytes) -> bytes:
    """to_sign's txid (witness excluded) in internal byte order."""
    tx = (b"\x00\x00\x00\x00" + b"\x01" + to_spend_txid(message, program) + b"\x00\x00\x00\x00" + b"\x00"
          + b"\x00\x00\x00\x00" + b"\x01" + bytes(8) + b"\x01\x6a" + b"\x00\x00\x00\x00")
    return _sha256d(tx)


def sighash(message: str, program: bytes) -> bytes:
    """BIP143 digest of to_sign's only input (P2WPKH script code, amount 0, SIGHASH_ALL)."""
    prevout = to_spend_txid(message, program) + b"\x00\x00\x00\x00"
    script_code = _varbytes(b"\x76\xa9\x14" + program + b"\x88\xac")
    preimage = (b"\x00\x00\x00\x00" + _sha256d(prevout) + _sha256d(b"\x00\x00\x00\x00") + prevout + script_code
                + bytes(8) + b"\x00\x00\x00\x00" + _sha256d(bytes(8) + b"\x01\x6a") + b"\x00\x00\x00\x00"
                + SIGHASH_ALL.to_bytes(4, "little"))
    return _sha256d(preimage)


def _ecdsa_sign(key: PrivateKey, digest: bytes, low_r: bool) -> bytes:
    counter = 0
    while True:
        if counter == 0:
            sig = key.sign(digest, hasher=None)
        else:
            extra = ffi.new("unsigned char[32]", counter.to_bytes(32, "little"))
            sig = key.sign(digest, hasher=None, custom_nonce=(lib.secp256k1_nonce_function_rfc6979, extra))
        if not low_r or sig[3] == 32 and sig[4] < 0x80:  # DER: 30 len 02 rlen r...; low R fits 32 bytes, top bit clear
            return sig
        counter += 1


def sign_simple(private_key: bytes, address: str, message: str, *, low_r: bool = True) -> str:
    """The "smp"-prefixed BIP-322 simple signature of `message` for the P2WPKH `address`, which must
    be `private_key`'s (ValueError otherwise: we never sign for an address the key does not own)."""
    key = PrivateKey(private_key)
    pub = key.public_key.format(compressed=True)
    program = p2wpkh_program(address)
    if bytes(Hash160.QuickDigest(pub)) != program:
        raise ValueError(f"{address} is not the P2WPKH address of this key")
    sig = _ecdsa_sign(key, sighash(message, program), low_r) + bytes([SIGHASH_ALL])
    return PREFIX_SIMPLE + base64.b64encode(b"\x02" + _varbytes(sig) + _varbytes(pub)).decode()


def _strict_der(sig: bytes) -> bool:
    """BIP66 IsValidSignatureEncoding, on the signature without its sighash byte."""
    if not 8 <= len(sig) <= 72 or sig[0] != 0x30 or sig[1] != len(sig) - 2:
        return False
    rlen = sig[3]
    if sig[2] != 0x02 or rlen == 0 or 5 + rlen >= len(sig):
        return False
    slen = sig[5 + rlen]
    if sig[4 + rlen] != 0x02 or slen == 0 or rlen + slen + 6 != len(sig):
        return False
    r, s = sig[4:4 + rlen], sig[6 + rlen:]
    return not (r[0] & 0x80 or (len(r) > 1 and r[0] == 0 and not r[1] & 0x80)
                or s[0] & 0x80 or (len(s) > 1 and s[0] == 0 and not s[1] & 0x80))


def _witness(payload: bytes) -> list[bytes] | None:
    if not payload or payload[0] != 2:
        return None
    items, at = [], 1
    for _ in range(2):
        if at >= len(payload) or payload[at] >= 0xFD:
            return None
        n = payload[at]
        items.append(payload[at + 1:at + 1 + n])
        at += 1 + n
    return items if at == len(payload) and all(items) else None


def verify_simple(address: str, message: str, signature: str) -> bool:
    """True when `signature` is a valid BIP-322 simple signature of `message` for the P2WPKH
    `address` (module docstring for exactly what is checked); False for anything else."""
    try:
        program = p2wpkh_program(address)
    except ValueError:
        return False
    if not isinstance(signature, str) or not signature.startswith(PREFIX_SIMPLE):
        return False
    body = signature[len(PREFIX_SIMPLE):]
    try:
        payload = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        return False
    if base64.b64encode(payload).decode() != body:  # one spelling per signature
        return False
    items = _witness(payload)
    if items is None:
        return False
    sig, pub = items
    if len(pub) != 33 or pub[0] not in (2, 3) or bytes(Hash160.QuickDigest(pub)) != program:
        return False
    if sig[-1] != SIGHASH_ALL or not _strict_der(sig[:-1]):
        return False
    rlen = sig[3]
    if int.from_bytes(sig[6 + rlen:-1], "big") > _SECP256K1_HALF_N:
        return False
    try:
        return PublicKey(pub).verify(sig[:-1], sighash(message, program), hasher=None)
    except ValueError:  # not a point on the curve, or a signature libsecp256k1 cannot parse
        return False
