"""Deposit addresses from extended PUBLIC keys: bitcoin BIP84 P2WPKH and ethereum BIP44.

Custody hands out deposit addresses but must never hold a private key (DESIGN.md 7), so every
function here takes an account-level extended public key (depth 3, e.g. m/84'/0'/0' or
m/44'/60'/0') and derives only the non-hardened tail `<change>/<index>` below it. A private
extended key passed by mistake is refused, not silently neutered.

`descriptor_for` renders the same account as a Bitcoin Core output descriptor, so anyone can
check our addresses against `bitcoind deriveaddresses`.

This module depends on `bip-utils` only (no ledger, matching or custody internals) so it can be
tested without a database or a node, and so the signer's own derivation can be cross-checked
against it.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

from bip_utils import (
    Base58Decoder,
    Base58Encoder,
    Bip44,
    Bip44Changes,
    Bip44Coins,
    Bip84,
    Bip84Coins,
)

# Non-hardened child indices are 0 .. 2^31 - 1; anything above is a hardened index, which a
# public key cannot derive.
MAX_INDEX = 2**31 - 1

# The depth of an account-level key: m / purpose' / coin' / account'.
ACCOUNT_DEPTH = 3


class AddressError(ValueError):
    """An extended key, network, change or index that cannot yield a deposit address."""


class Network(StrEnum):
    """Bitcoin networks; passed explicitly, never read from a global."""

    MAINNET = "mainnet"
    TESTNET = "testnet"
    REGTEST = "regtest"


@dataclass(frozen=True)
class _BtcNetwork:
    coin: Bip84Coins
    hrp: str
    # SLIP-132 version bytes bip-utils uses for BIP84 account keys (zpub / vpub) ...
    bip84_pub: bytes
    # ... and the plain BIP32 version bytes Bitcoin Core wants in a descriptor (xpub / tpub).
    bip32_pub: bytes
    # Private versions of both families, only so a leaked private key can be recognised.
    private_versions: frozenset[bytes]


_BTC_NETWORKS: dict[Network, _BtcNetwork] = {
    Network.MAINNET: _BtcNetwork(
        coin=Bip84Coins.BITCOIN,
        hrp="bc",
        bip84_pub=bytes.fromhex("04b24746"),  # zpub
        bip32_pub=bytes.fromhex("0488b21e"),  # xpub
        private_versions=frozenset({bytes.fromhex("04b2430c"), bytes.fromhex("0488ade4")}),
    ),
    Network.TESTNET: _BtcNetwork(
        coin=Bip84Coins.BITCOIN_TESTNET,
        hrp="tb",
        bip84_pub=bytes.fromhex("045f1cf6"),  # vpub
        bip32_pub=bytes.fromhex("043587cf"),  # tpub
        private_versions=frozenset({bytes.fromhex("045f18bc"), bytes.fromhex("04358394")}),
    ),
    Network.REGTEST: _BtcNetwork(
        coin=Bip84Coins.BITCOIN_REGTEST,
        hrp="bcrt",
        bip84_pub=bytes.fromhex("045f1cf6"),  # vpub: regtest shares testnet's key versions
        bip32_pub=bytes.fromhex("043587cf"),  # tpub
        private_versions=frozenset({bytes.fromhex("045f18bc"), bytes.fromhex("04358394")}),
    ),
}

_ETH_PUB = bytes.fromhex("0488b21e")  # ethereum BIP44 keys serialise with plain xpub versions
_ETH_PRIVATE = frozenset({bytes.fromhex("0488ade4")})


def _network(network: str) -> _BtcNetwork:
    try:
        return _BTC_NETWORKS[Network(network)]
    except ValueError:
        raise AddressError(
            f"unknown bitcoin network {network!r}; expected one of {[n.value for n in Network]}"
        ) from None


def _check_child(change: int, index: int) -> None:
    # bool is an int subclass; True as an index is a bug, not index 1.
    if type(change) is not int or change not in (0, 1):
        raise AddressError(f"change must be 0 (receive) or 1 (change), got {change!r}")
    if type(index) is not int or not 0 <= index <= MAX_INDEX:
        raise AddressError(f"index must be an int in 0..{MAX_INDEX}, got {index!r}")


def _decode(extended_key: str) -> bytes:
    """Base58check-decode an extended key to its 78-byte payload."""
    try:
        payload = Base58Decoder.CheckDecode(extended_key.strip())
    except Exception:
        raise AddressError("not a base58check extended key") from None
    if len(payload) != 78:
        raise AddressError(f"extended key payload is {len(payload)} bytes, expected 78")
    return payload


def _reversion(
    extended_key: str,
    accepted: frozenset[bytes],
    private: frozenset[bytes],
    target: bytes,
) -> str:
    """Return `extended_key` re-serialised with version bytes `target`.

    The version bytes are only a label (xpub / zpub / tpub / vpub) over the same key material;
    refusing private versions here is what keeps a private key out of custody's derivation.
    """
    payload = _decode(extended_key)
    version, depth = payload[:4], payload[4]
    if version in private:
        raise AddressError("a private extended key was given; custody accepts public keys only")
    if version not in accepted:
        raise AddressError(f"extended key version {version.hex()} is not valid for this network")
    if depth != ACCOUNT_DEPTH:
        raise AddressError(f"expected an account-level key (depth {ACCOUNT_DEPTH}), got depth {depth}")
    return Base58Encoder.CheckEncode(target + payload[4:])


@lru_cache(maxsize=64)
def _btc_account(account_xpub: str, network: str) -> Bip84:
    # Parsing an extended key costs a point decompression; an address issuer derives many
    # addresses from the same few account keys, so keep the parsed accounts.
    net = _network(network)
    as_bip84 = _reversion(
        account_xpub,
        accepted=frozenset({net.bip84_pub, net.bip32_pub}),
        private=net.private_versions,
        target=net.bip84_pub,
    )
    return Bip84.FromExtendedKey(as_bip84, net.coin)


@lru_cache(maxsize=64)
def _eth_account(account_xpub: str) -> Bip44:
    normalised = _reversion(
        account_xpub, accepted=frozenset({_ETH_PUB}), private=_ETH_PRIVATE, target=_ETH_PUB
    )
    return Bip44.FromExtendedKey(normalised, Bip44Coins.ETHEREUM)


def canonical_btc_account_key(account_xpub: str, network: str) -> str:
    """The BIP84 serialisation (zpub on mainnet, vpub on testnet and regtest) of a bitcoin account
    key given in either form (xpub/zpub, tpub/vpub): the one form stored in `wallet`, which the
    signer reads too. Refuses private keys, keys of another network and non-account depths."""
    net = _network(network)
    return _reversion(account_xpub, accepted=frozenset({net.bip84_pub, net.bip32_pub}),
                      private=net.private_versions, target=net.bip84_pub)


def derive_btc_address(account_xpub: str, network: str, change: int, index: int) -> str:
    """The BIP84 P2WPKH (bech32) address at `<account>/<change>/<index>`.

    `account_xpub` is the account key in either serialisation (zpub/xpub on mainnet,
    vpub/tpub on testnet and regtest); `network` is "mainnet", "testnet" or "regtest" and
    picks the address prefix (bc, tb, bcrt).
    """
    _check_child(change, index)
    account = _btc_account(account_xpub, network)
    chain = Bip44Changes.CHAIN_EXT if change == 0 else Bip44Changes.CHAIN_INT
    return account.Change(chain).AddressIndex(index).PublicKey().ToAddress()


def derive_btc_addresses(account_xpub: str, network: str, change: int, start: int, stop: int) -> list[str]:
    """The addresses at `<account>/<change>/<start .. stop-1>`, in order: `derive_btc_address` for
    a run of indices, with the branch key derived once rather than per address."""
    if start < 0 or stop < start:
        raise AddressError(f"invalid index range {start}..{stop}")
    _check_child(change, start)
    if stop > start:
        _check_child(change, stop - 1)
    branch = _btc_account(account_xpub, network).Change(Bip44Changes.CHAIN_EXT if change == 0 else Bip44Changes.CHAIN_INT)
    return [branch.AddressIndex(i).PublicKey().ToAddress() for i in range(start, stop)]


def btc_key_origin(account_xpub: str, network: str, change: int, index: int,
                   master_fingerprint: str | None = None) -> tuple[bytes, bytes, tuple[int, ...]]:
    """(compressed public key, fingerprint, path) of the key at `<account>/<change>/<index>`, as a
    PSBT's BIP32 derivation states it (custody.psbt `KeyOrigin`). With `master_fingerprint` (8 hex
    digits): that fingerprint and the full BIP84 path `84h/<coin>h/<account>h/<change>/<index>`
    (the account's child number read from the xpub, which must be an account key, depth 3). Without
    one: the account xpub's OWN fingerprint (HASH160 of its public key, first 4 bytes) and the path
    relative to it, `<change>/<index>`, which is how Bitcoin Core reads a descriptor key without an
    origin (`wpkh(tpub.../0/*)`)."""
    _check_child(change, index)
    account = _btc_account(account_xpub, network)
    chain = Bip44Changes.CHAIN_EXT if change == 0 else Bip44Changes.CHAIN_INT
    pubkey = account.Change(chain).AddressIndex(index).PublicKey().RawCompressed().ToBytes()
    bip32 = account.Bip32Object()
    if master_fingerprint is None:
        return pubkey, bip32.FingerPrint().ToBytes(), (change, index)
    fingerprint = master_fingerprint.lower()
    if len(fingerprint) != 8 or any(c not in "0123456789abcdef" for c in fingerprint):
        raise AddressError("master_fingerprint must be 8 hex digits")
    if bip32.Depth().ToInt() != 3 or not bip32.Index().IsHardened():
        raise AddressError("a master fingerprint is given for an account key (depth 3, hardened) only")
    coin = 0 if _network(network).coin is Bip84Coins.BITCOIN else 1
    hardened = 0x80000000
    return pubkey, bytes.fromhex(fingerprint), (84 | hardened, coin | hardened, bip32.Index().ToInt(), change, index)


def derive_eth_address(account_xpub: str, index: int) -> str:
    """The EIP-55 checksummed ethereum address at `<account>/0/<index>` (BIP44, coin 60).

    Ethereum wallets use the external chain (change 0) only, so there is no change argument.
    """
    _check_child(0, index)
    account = _eth_account(account_xpub)
    return account.Change(Bip44Changes.CHAIN_EXT).AddressIndex(index).PublicKey().ToAddress()


def descriptor_for(
    account_xpub: str, network: str, change: int = 0, master_fingerprint: str | None = None
) -> str:
    """A Bitcoin Core descriptor `wpkh(<xpub|tpub>/<change>/*)#<checksum>` for this account.

    Bitcoin Core only understands BIP32 version bytes, so a zpub becomes an xpub and a vpub a
    tpub (same key, different label). The BIP380 checksum is appended because
    `deriveaddresses` refuses a descriptor without one. Feeding the result to
    `bitcoin-cli deriveaddresses "<descriptor>" "[0,n]"` must reproduce
    `derive_btc_address(account_xpub, network, change, 0..n)`.

    With `master_fingerprint` (8 hex digits; the signer knows it, an xpub alone does not) the
    key origin `[fingerprint/84h/<coin>h/<account>h]` is included, which a watch-only wallet
    needs to hand PSBTs back to the signer with their derivation paths.
    """
    _check_child(change, 0)
    net = _network(network)
    as_bip32 = _reversion(
        account_xpub,
        accepted=frozenset({net.bip84_pub, net.bip32_pub}),
        private=net.private_versions,
        target=net.bip32_pub,
    )
    key = f"{as_bip32}/{change}/*"
    if master_fingerprint is not None:
        key = _origin(master_fingerprint, net, _decode(as_bip32)) + key
    return add_descriptor_checksum(f"wpkh({key})")


def _origin(master_fingerprint: str, net: _BtcNetwork, payload: bytes) -> str:
    fingerprint = master_fingerprint.lower()
    if len(fingerprint) != 8 or any(c not in "0123456789abcdef" for c in fingerprint):
        raise AddressError("master_fingerprint must be 8 hex digits")
    # Bytes 9..12 of the payload are the account key's own child number (hardened).
    account = int.from_bytes(payload[9:13], "big") & MAX_INDEX
    coin = 0 if net.coin is Bip84Coins.BITCOIN else 1
    return f"[{fingerprint}/84h/{coin}h/{account}h]"


# --- BIP380 descriptor checksum ---------------------------------------------------------------
#
# Implemented from the BIP380 specification: every character of the descriptor maps to a
# position in a 95-character alphabet laid out as three rows of 32; the column (position & 31)
# is fed to a BCH code over GF(32) for every character, and the rows of each run of three
# characters are packed into one extra symbol. The result is eight bech32-alphabet characters.

_DESC_ALPHABET = (
    "0123456789()[],'/*abcdefgh@:$%{}"
    "IJKLMNOPQRSTUVWXYZ&+-.;<=>?!^_|~"
    "ijklmnopqrstuvwxyzABCDEFGH`#\"\\ "
)
_CHECKSUM_ALPHABET = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
_DESC_GENERATORS = (0xF5DEE51989, 0xA9FDCA3312, 0x1BAB10E32D, 0x3706B1677A, 0x644D626FFD)


def _desc_polymod_step(state: int, symbol: int) -> int:
    high = state >> 35
    state = ((state & 0x7FFFFFFFF) << 5) ^ symbol
    for bit, generator in enumerate(_DESC_GENERATORS):
        if (high >> bit) & 1:
            state ^= generator
    return state


def descriptor_checksum(descriptor: str) -> str:
    """The 8-character BIP380 checksum of `descriptor` (which must not already carry one)."""
    state = 1
    pending_rows: list[int] = []
    for char in descriptor:
        position = _DESC_ALPHABET.find(char)
        if position < 0:
            raise AddressError(f"character {char!r} is not allowed in a descriptor")
        state = _desc_polymod_step(state, position & 31)
        pending_rows.append(position >> 5)
        if len(pending_rows) == 3:
            state = _desc_polymod_step(state, pending_rows[0] * 9 + pending_rows[1] * 3 + pending_rows[2])
            pending_rows.clear()
    if pending_rows:
        packed = 0
        for row in pending_rows:
            packed = packed * 3 + row
        state = _desc_polymod_step(state, packed)
    for _ in range(8):  # room for the checksum itself
        state = _desc_polymod_step(state, 0)
    state ^= 1
    return "".join(_CHECKSUM_ALPHABET[(state >> (5 * (7 - i))) & 31] for i in range(8))


def add_descriptor_checksum(descriptor: str) -> str:
    """`descriptor#checksum`, the form `deriveaddresses` and `importdescriptors` accept."""
    return f"{descriptor}#{descriptor_checksum(descriptor)}"
