"""Deposit-address derivation against the BIP documents' own test vectors.

Vectors are quoted from BIP32 ("Test vector 1"), BIP84 ("Test vectors"), BIP380 (the checksum
example) and SLIP-132 / widely published wallet exports for the BIP84 account zpub and its
Bitcoin Core descriptor. Where a check needs a second opinion it uses a library other than
bip-utils (python-bitcoinlib's bech32, eth-keys / eth-utils).
"""
from __future__ import annotations

import pytest
from bip_utils import Base58Decoder, Base58Encoder, Bip32Secp256k1, Bip84, Bip84Coins
from bitcoin import segwit_addr
from bitcoin.core import Hash160
from eth_keys import keys as eth_keys
from eth_utils import is_checksum_address
from hypothesis import given, settings
from hypothesis import strategies as st

from custody.addresses import (
    AddressError,
    add_descriptor_checksum,
    canonical_btc_account_key,
    derive_btc_address,
    derive_btc_addresses,
    derive_eth_address,
    descriptor_for,
    descriptor_checksum,
)
from signer.keys import Secret, SignerKeys, seed_from_text

# --- BIP32 test vector 1 -------------------------------------------------------------------------

BIP32_TV1_SEED = "000102030405060708090a0b0c0d0e0f"
BIP32_TV1 = [
    (
        "m",
        "xpub661MyMwAqRbcFtXgS5sYJABqqG9YLmC4Q1Rdap9gSE8NqtwybGhePY2gZ29ESFjqJoCu1Rupje8YtGqsefD265TMg7usUDFdp6W1EGMcet8",
        "xprv9s21ZrQH143K3QTDL4LXw2F7HEK3wJUD2nW2nRk4stbPy6cq3jPPqjiChkVvvNKmPGJxWUtg6LnF5kejMRNNU3TGtRBeJgk33yuGBxrMPHi",
    ),
    (
        "m/0'",
        "xpub68Gmy5EdvgibQVfPdqkBBCHxA5htiqg55crXYuXoQRKfDBFA1WEjWgP6LHhwBZeNK1VTsfTFUHCdrfp1bgwQ9xv5ski8PX9rL2dZXvgGDnw",
        "xprv9uHRZZhk6KAJC1avXpDAp4MDc3sQKNxDiPvvkX8Br5ngLNv1TxvUxt4cV1rGL5hj6KCesnDYUhd7oWgT11eZG7XnxHrnYeSvkzY7d2bhkJ7",
    ),
    (
        "m/0'/1",
        "xpub6ASuArnXKPbfEwhqN6e3mwBcDTgzisQN1wXN9BJcM47sSikHjJf3UFHKkNAWbWMiGj7Wf5uMash7SyYq527Hqck2AxYysAA7xmALppuCkwQ",
        "xprv9wTYmMFdV23N2TdNG573QoEsfRrWKQgWeibmLntzniatZvR9BmLnvSxqu53Kw1UmYPxLgboyZQaXwTCg8MSY3H2EU4pWcQDnRnrVA1xe8fs",
    ),
    (
        "m/0'/1/2'",
        "xpub6D4BDPcP2GT577Vvch3R8wDkScZWzQzMMUm3PWbmWvVJrZwQY4VUNgqFJPMM3No2dFDFGTsxxpG5uJh7n7epu4trkrX7x7DogT5Uv6fcLW5",
        "xprv9z4pot5VBttmtdRTWfWQmoH1taj2axGVzFqSb8C9xaxKymcFzXBDptWmT7FwuEzG3ryjH4ktypQSAewRiNMjANTtpgP4mLTj34bhnZX7UiM",
    ),
    (
        "m/0'/1/2'/2",
        "xpub6FHa3pjLCk84BayeJxFW2SP4XRrFd1JYnxeLeU8EqN3vDfZmbqBqaGJAyiLjTAwm6ZLRQUMv1ZACTj37sR62cfN7fe5JnJ7dh8zL4fiyLHV",
        "xprvA2JDeKCSNNZky6uBCviVfJSKyQ1mDYahRjijr5idH2WwLsEd4Hsb2Tyh8RfQMuPh7f7RtyzTtdrbdqqsunu5Mm3wDvUAKRHSC34sJ7in334",
    ),
    (
        "m/0'/1/2'/2/1000000000",
        "xpub6H1LXWLaKsWFhvm6RVpEL9P4KfRZSW7abD2ttkWP3SSQvnyA8FSVqNTEcYFgJS2UaFcxupHiYkro49S8yGasTvXEYBVPamhGW6cFJodrTHy",
        "xprvA41z7zogVVwxVSgdKUHDy1SKmdb533PjDz7J6N6mV6uS3ze1ai8FHa8kmHScGpWmj4WggLyQjgPie1rFSruoUihUZREPSL39UNdE3BBDu76",
    ),
]


@pytest.mark.parametrize(("path", "xpub", "xprv"), BIP32_TV1, ids=[p for p, _, _ in BIP32_TV1])
def test_bip32_vector_1_private_derivation(path: str, xpub: str, xprv: str) -> None:
    # Pins the library behaviour every other derivation here rests on.
    node = Bip32Secp256k1.FromSeed(bytes.fromhex(BIP32_TV1_SEED)).DerivePath(path)
    assert node.PrivateKey().ToExtended() == xprv
    assert node.PublicKey().ToExtended() == xpub


def test_bip32_vector_1_public_derivation_matches_private() -> None:
    # Custody only ever derives non-hardened children from a public key; the vector's last two
    # steps (m/0'/1/2' -> /2 -> /1000000000) are exactly that, so they must come out the same
    # from the xpub alone.
    _, account_xpub, _ = BIP32_TV1[3]
    node = Bip32Secp256k1.FromExtendedKey(account_xpub)
    assert node.IsPublicOnly()
    node = node.ChildKey(2)
    assert node.PublicKey().ToExtended() == BIP32_TV1[4][1]
    node = node.ChildKey(1_000_000_000)
    assert node.PublicKey().ToExtended() == BIP32_TV1[5][1]


def test_signer_accepts_bip32_vector_1_hex_seed() -> None:
    # A hex seed is used as-is, so the signer's master key is the vector's m: its fingerprint
    # is the parent fingerprint recorded inside the vector's m/0' key.
    keys = SignerKeys(seed_from_text(Secret(BIP32_TV1_SEED)), "mainnet")
    parent_fingerprint = Base58Decoder.CheckDecode(BIP32_TV1[1][1])[5:9].hex()
    assert keys.master_fingerprint == parent_fingerprint == "3442193e"


# --- BIP84 test vectors --------------------------------------------------------------------------

MNEMONIC = "abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon about"
BIP84_ROOT_ZPRV = "zprvAWgYBBk7JR8Gjrh4UJQ2uJdG1r3WNRRfURiABBE3RvMXYSrRJL62XuezvGdPvG6GFBZduosCc1YP5wixPox7zhZLfiUm8aunE96BBa4Kei5"
BIP84_ACCOUNT0_ZPRV = "zprvAdG4iTXWBoARxkkzNpNh8r6Qag3irQB8PzEMkAFeTRXxHpbF9z4QgEvBRmfvqWvGp42t42nvgGpNgYSJA9iefm1yYNZKEm7z6qUWCroSQnE"
# SLIP-132's vector for the same account (the BIP itself lists only the private key).
BIP84_ACCOUNT0_ZPUB = "zpub6rFR7y4Q2AijBEqTUquhVz398htDFrtymD9xYYfG1m4wAcvPhXNfE3EfH1r1ADqtfSdVCToUG868RvUUkgDKf31mGDtKsAYz2oz2AGutZYs"
# (change, index, pubkey, address) from BIP84.
BIP84_ADDRESSES = [
    (0, 0, "0330d54fd0dd420a6e5f8d3624f5f3482cae350f79d5f0753bf5beef9c2d91af3c", "bc1qcr8te4kr609gcawutmrza0j4xv80jy8z306fyu"),
    (0, 1, "03e775fd51f0dfb8cd865d9ff1cca2a158cf651fe997fdc9fee9c1d3b5e995ea77", "bc1qnjg0jd8228aq7egyzacy8cys3knf9xvrerkf9g"),
    (1, 0, "03025324888e429ab8e3dbaf1f7802648b9cd01e9b418485c5fa4c1b9b5700e1a6", "bc1q8c6fshw2dlwun7ekn9qwf37cu2rn755upcp6el"),
]


@pytest.fixture(scope="module")
def mainnet_keys() -> SignerKeys:
    return SignerKeys(seed_from_text(Secret(MNEMONIC)), "mainnet")


def test_bip84_root_and_account_keys(mainnet_keys: SignerKeys) -> None:
    root = Bip84.FromExtendedKey(BIP84_ROOT_ZPRV, Bip84Coins.BITCOIN)
    assert root.Bip32Object().FingerPrint().ToHex() == mainnet_keys.master_fingerprint == "73c5da0a"
    account_from_vector = Bip84.FromExtendedKey(BIP84_ACCOUNT0_ZPRV, Bip84Coins.BITCOIN)
    assert account_from_vector.PublicKey().ToExtended() == BIP84_ACCOUNT0_ZPUB
    # The deposit tier is BIP84 account 0, so the signer hands custody exactly that key.
    assert mainnet_keys.account_xpub("bitcoin", "deposit") == BIP84_ACCOUNT0_ZPUB
    assert mainnet_keys.derivation_path("bitcoin", "deposit") == "m/84'/0'/0'"


@pytest.mark.parametrize(("change", "index", "pubkey", "address"), BIP84_ADDRESSES)
def test_bip84_addresses_from_account_zpub(change: int, index: int, pubkey: str, address: str) -> None:
    assert derive_btc_address(BIP84_ACCOUNT0_ZPUB, "mainnet", change, index) == address


@pytest.mark.parametrize(("change", "index", "pubkey", "address"), BIP84_ADDRESSES)
def test_bip84_address_is_hash_of_published_pubkey(change: int, index: int, pubkey: str, address: str) -> None:
    # A second opinion on the encoding: python-bitcoinlib's bech32 decoder must find
    # version 0 and HASH160(pubkey) as the witness program.
    version, program = segwit_addr.decode("bc", address)
    assert version == 0
    assert bytes(program) == Hash160(bytes.fromhex(pubkey))


def test_xpub_and_zpub_spellings_give_the_same_addresses() -> None:
    core_form = descriptor_for(BIP84_ACCOUNT0_ZPUB, "mainnet").split("(")[1].split("/")[0]
    assert core_form.startswith("xpub")
    for change, index, _, address in BIP84_ADDRESSES:
        assert derive_btc_address(core_form, "mainnet", change, index) == address


# --- networks ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def regtest_keys() -> SignerKeys:
    return SignerKeys(seed_from_text(Secret(MNEMONIC)), "regtest")


def test_regtest_and_testnet_share_the_key_but_not_the_prefix(regtest_keys: SignerKeys) -> None:
    vpub = regtest_keys.account_xpub("bitcoin", "deposit")
    assert vpub.startswith("vpub")
    assert regtest_keys.derivation_path("bitcoin", "deposit") == "m/84'/1'/0'"
    regtest = derive_btc_address(vpub, "regtest", 0, 0)
    testnet = derive_btc_address(vpub, "testnet", 0, 0)
    assert regtest.startswith("bcrt1q") and testnet.startswith("tb1q")
    assert segwit_addr.decode("bcrt", regtest) == segwit_addr.decode("tb", testnet)


def test_network_is_checked_against_the_key_version(regtest_keys: SignerKeys) -> None:
    with pytest.raises(AddressError, match="not valid for this network"):
        derive_btc_address(BIP84_ACCOUNT0_ZPUB, "regtest", 0, 0)
    with pytest.raises(AddressError, match="not valid for this network"):
        derive_btc_address(regtest_keys.account_xpub("bitcoin", "deposit"), "mainnet", 0, 0)
    with pytest.raises(AddressError, match="unknown bitcoin network"):
        derive_btc_address(BIP84_ACCOUNT0_ZPUB, "signet", 0, 0)


def test_a_wallet_key_is_stored_in_its_bip84_form_whichever_form_it_comes_in(regtest_keys: SignerKeys) -> None:
    """A cold wallet's key may arrive as a tpub (Bitcoin Core's spelling); it is stored as the vpub
    the signer parses, and both spellings name the same addresses."""
    vpub = regtest_keys.account_xpub("bitcoin", "cold")
    tpub = descriptor_for(vpub, "regtest").split("(")[1].split("/")[0]
    assert tpub.startswith("tpub")
    assert canonical_btc_account_key(tpub, "regtest") == canonical_btc_account_key(vpub, "regtest") == vpub
    parsed = Bip84.FromExtendedKey(canonical_btc_account_key(tpub, "regtest"), Bip84Coins.BITCOIN_REGTEST)
    assert parsed.IsPublicOnly()
    assert derive_btc_address(tpub, "regtest", 0, 7) == derive_btc_address(vpub, "regtest", 0, 7)
    with pytest.raises(AddressError, match="not valid for this network"):
        canonical_btc_account_key(BIP84_ACCOUNT0_ZPUB, "regtest")
    private = Base58Encoder.CheckEncode(bytes.fromhex("04358394") + Base58Decoder.CheckDecode(vpub)[4:])
    with pytest.raises(AddressError, match="private"):
        canonical_btc_account_key(private, "regtest")


# --- descriptors ---------------------------------------------------------------------------------


def test_bip380_checksum_vector() -> None:
    assert add_descriptor_checksum("raw(deadbeef)") == "raw(deadbeef)#89f8spxm"


def test_descriptor_matches_published_bip84_account_descriptor() -> None:
    # The BIP84 account 0 descriptor as wallets export it, checksum included.
    xpub = "xpub6CatWdiZiodmUeTDp8LT5or8nmbKNcuyvz7WyksVFkKB4RHwCD3XyuvPEbvqAQY3rAPshWcMLoP2fMFMKHPJ4ZeZXYVUhLv1VMrjPC7PW6V"
    assert (
        descriptor_for(BIP84_ACCOUNT0_ZPUB, "mainnet", 0, master_fingerprint="73c5da0a")
        == f"wpkh([73c5da0a/84h/0h/0h]{xpub}/0/*)#afwvtk2s"
    )
    assert (
        descriptor_for(BIP84_ACCOUNT0_ZPUB, "mainnet", 1, master_fingerprint="73c5da0a")
        == f"wpkh([73c5da0a/84h/0h/0h]{xpub}/1/*)#vatdkr6g"
    )
    assert add_descriptor_checksum(f"wpkh([73c5da0a/84'/0'/0']{xpub}/0/*)").endswith("#wc3n3van")
    assert descriptor_for(BIP84_ACCOUNT0_ZPUB, "mainnet") == add_descriptor_checksum(f"wpkh({xpub}/0/*)")


def test_regtest_descriptor_uses_tpub_for_the_same_key(regtest_keys: SignerKeys) -> None:
    vpub = regtest_keys.account_xpub("bitcoin", "deposit")
    descriptor = descriptor_for(vpub, "regtest", master_fingerprint=regtest_keys.master_fingerprint)
    body, checksum = descriptor.split("#")
    assert body.startswith("wpkh([73c5da0a/84h/1h/0h]tpub") and body.endswith("/0/*)")
    assert checksum == descriptor_checksum(body)
    tpub = body.split("]")[1].split("/")[0]
    # Same key material, only the 4 version bytes differ.
    assert Base58Decoder.CheckDecode(tpub)[4:] == Base58Decoder.CheckDecode(vpub)[4:]
    assert derive_btc_address(tpub, "regtest", 0, 5) == derive_btc_address(vpub, "regtest", 0, 5)


def test_descriptor_refuses_characters_outside_the_alphabet() -> None:
    with pytest.raises(AddressError):
        descriptor_checksum("raw(é)")


# --- ethereum ------------------------------------------------------------------------------------


def test_bip44_ethereum_vector(mainnet_keys: SignerKeys) -> None:
    account_xpub = mainnet_keys.account_xpub("ethereum", "deposit")
    assert mainnet_keys.derivation_path("ethereum", "deposit", 0, 0) == "m/44'/60'/0'/0/0"
    address = derive_eth_address(account_xpub, 0)
    assert address == "0x9858EfFD232B4033E47d90003D41EC34EcaEda94"
    assert is_checksum_address(address)


# --- custody and signer agree --------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    tier=st.sampled_from(["deposit", "hot", "warm"]),
    change=st.sampled_from([0, 1]),
    index=st.integers(min_value=0, max_value=2**31 - 1),
)
def test_signer_private_key_controls_custody_btc_address(
    regtest_keys: SignerKeys, tier: str, change: int, index: int
) -> None:
    private = regtest_keys.private_key_for("bitcoin", tier, change, index)
    pubkey = eth_keys.PrivateKey(private).public_key.to_compressed_bytes()
    address = derive_btc_address(regtest_keys.account_xpub("bitcoin", tier), "regtest", change, index)
    assert bytes(segwit_addr.decode("bcrt", address)[1]) == Hash160(pubkey)


@settings(max_examples=25, deadline=None)
@given(tier=st.sampled_from(["deposit", "hot", "warm"]), index=st.integers(min_value=0, max_value=2**31 - 1))
def test_signer_private_key_controls_custody_eth_address(mainnet_keys: SignerKeys, tier: str, index: int) -> None:
    private = mainnet_keys.private_key_for("ethereum", tier, 0, index)
    expected = eth_keys.PrivateKey(private).public_key.to_checksum_address()
    assert derive_eth_address(mainnet_keys.account_xpub("ethereum", tier), index) == expected


def test_tiers_are_distinct_accounts(mainnet_keys: SignerKeys) -> None:
    for chain in ("bitcoin", "ethereum"):
        xpubs = {mainnet_keys.account_xpub(chain, tier) for tier in ("deposit", "hot", "warm", "cold")}
        assert len(xpubs) == 4


# --- refusals ------------------------------------------------------------------------------------


def test_private_extended_keys_are_refused() -> None:
    with pytest.raises(AddressError, match="public keys only"):
        derive_btc_address(BIP84_ACCOUNT0_ZPRV, "mainnet", 0, 0)
    with pytest.raises(AddressError, match="public keys only"):
        descriptor_for(BIP84_ACCOUNT0_ZPRV, "mainnet")
    eth_xprv = Bip32Secp256k1.FromSeed(bytes.fromhex(BIP32_TV1_SEED)).DerivePath("m/44'/60'/0'")
    with pytest.raises(AddressError, match="public keys only"):
        derive_eth_address(eth_xprv.PrivateKey().ToExtended(), 0)


def test_only_account_level_keys_are_accepted() -> None:
    master_xpub = BIP32_TV1[0][1]
    with pytest.raises(AddressError, match="depth 0"):
        derive_eth_address(master_xpub, 0)
    with pytest.raises(AddressError, match="depth 4"):
        derive_eth_address(BIP32_TV1[4][1], 0)


@pytest.mark.parametrize(
    ("change", "index"), [(2, 0), (-1, 0), (0, -1), (0, 2**31), (True, 0), (0, False), (0, 1.0)]
)
def test_change_and_index_bounds(change: object, index: object) -> None:
    with pytest.raises(AddressError):
        derive_btc_address(BIP84_ACCOUNT0_ZPUB, "mainnet", change, index)  # type: ignore[arg-type]


def test_garbage_key_is_refused() -> None:
    with pytest.raises(AddressError, match="base58check"):
        derive_btc_address("zpub-not-a-key", "mainnet", 0, 0)


def test_addresses_module_depends_on_bip_utils_only() -> None:
    # It lives in custody/ but must stay liftable: stdlib and bip-utils, nothing of ours.
    import ast
    import sys
    from pathlib import Path

    source = Path(__file__).resolve().parents[2] / "custody" / "addresses.py"
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            roots = {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            roots = {(node.module or "").split(".")[0]}
        else:
            continue
        for root in roots:
            assert root == "bip_utils" or root == "__future__" or root in sys.stdlib_module_names, root


@settings(max_examples=20, deadline=None)
@given(change=st.sampled_from([0, 1]), start=st.integers(0, 2**31 - 50), n=st.integers(0, 5))
def test_a_run_of_btc_addresses_is_each_index_derived_alone(change, start, n):
    """derive_btc_addresses (the wallet index's window) equals derive_btc_address index by index."""
    xpub = SignerKeys(seed_from_text(Secret(MNEMONIC)), "regtest").account_xpub("bitcoin", "hot")
    assert derive_btc_addresses(xpub, "regtest", change, start, start + n) == \
        [derive_btc_address(xpub, "regtest", change, i) for i in range(start, start + n)]
    with pytest.raises(AddressError):
        derive_btc_addresses(xpub, "regtest", change, 2**31 - 1, 2**31 + 1)  # past the last non-hardened index
