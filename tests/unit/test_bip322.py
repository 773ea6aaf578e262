"""BIP-322 simple signatures for P2WPKH (signer/bip322.py) against the BIP's published test vectors
(bip-0322/basic-test-vectors.json and generated-test-vectors.json, version 2.0.0 of the BIP) and
against an independent verifier, rust-bitcoin's `bip322` crate through its Python binding."""
from __future__ import annotations

import base64

import bip322 as rust_bip322
import pytest
from bip_utils import WifDecoder
from coincurve import PrivateKey

from regtest.util import assert_equal
from signer import bip322

ADDRESS = "bc1q9vza2e8x573nczrlzms0wvx3gsqjx7vavgkx0l"
KEY = WifDecoder.Decode("L3VFeEujGtevx9w18HD1fhRbCH67Az2dpCymeRE1SoPK6XQtaN2k")[0]
# (message, message_hash, to_spend txid, to_sign txid): the BIP's "tx_hashes"
HASHES = [
    ("", "c90c269c4f8fcbe6880f72a721ddfbf1914268a794cbb21cfafee13770ae19f1",
     "c5680aa69bb8d860bf82d4e9cd3504b55dde018de765a91bb566283c545a99a7",
     "1e9654e951a5ba44c8604c4de6c67fd78a27e81dcadcfe1edf638ba3aaebaed6"),
    ("Hello World", "f0eb03b1a75ac6d9847f55c624a99169b5dccba2a31f5b23bea77ba270de0a7a",
     "b79d196740ad5217771c1098fc4a4b51e0535c32236c71f1ea4d61a2d603352b",
     "88737ae86f2077145f93cc4b153ae9a1cb8d56afa511988c149c5c8c9d93bddf"),
    ("UTF-8 support: öäüéàè 测试文本 \U0001F604", "43936b237ea38c7794eb5d755e0d220b6db92ebfc5c8f482759d22b1286376d7",
     "c8f4f525fe8afb1bc09b44175bd2096f079c98425e8a1be676b712add1fb62f0",
     "8f488e06b89eafd019ec528109eafaf7f1d1811fd617aa1eeb9658f1c1be6586"),
]
# (message, low-R signature as Bitcoin Core makes it, plain RFC6979 signature): the BIP's "simple"
SIGNATURES = [
    ("", "smpAkcwRAIgM2gBAQqvZX15ZiysmKmQpDrG83avLIT492QBzLnQIxYCIBaTpOaD20qRlEylyxFSeEA2ba9YOixpX8z46TSDtS40ASEC"
         "x/EgAxlkQpQ9hYjgGu6EBCPMVPwVIVJqO4XCsMvViHI=",
     "smpAkgwRQIhAPkJ1Q4oYS0htvyuSFHLxRQpFAY56b70UvE7Dxazen0ZAiAtZfFz1S6T6I23MWI2lK/pcNTWncuyL8UL+oMdydVgzAEhAsfx"
     "IAMZZEKUPYWI4BruhAQjzFT8FSFSajuFwrDL1Yhy"),
    ("Hello World", "smpAkcwRAIgZRfIY3p7/DoVTty6YZbWS71bc5Vct9p9Fia83eRmw2QCICK/ENGfwLtptFluMGs2KsqoNSk89pO7F29zJLUx9a/s"
                    "ASECx/EgAxlkQpQ9hYjgGu6EBCPMVPwVIVJqO4XCsMvViHI=",
     "smpAkgwRQIhAOzyynlqt93lOKJr+wmmxIens//zPzl9tqIOua93wO6MAiBi5n5EyAcPScOjf1lAqIUIQtr3zKNeavYabHyR8eGhowEhAsfx"
     "IAMZZEKUPYWI4BruhAQjzFT8FSFSajuFwrDL1Yhy"),
]
# generated-test-vectors.json, "simple", the p2wpkh case (its one signature is plain RFC6979)
GENERATED = ("KySmn2yeCukjHXnSu3M6vX7tNok4weu1FKbNEuVvm2b3ZidKhB4L", "bc1qqthe0hz8klx90e7stf6shclhsvqd5ly96pn53v",
             "2V6TUTMSH4VQ3Z7WZWKYD7DFNH",
             "smpAkgwRQIhALC6hdfxNy1n45d7UXSskRBdfZW0Al259E1kDMpipdYkAiAJPfZqb+WurZuf1apU5xeE6Igui9dvt5tihQLDvxlY1AEhAqbn"
             "ruyo677ktQjio7XOchO3w51Dh9AbRVngha5jtNfT")
MULTISIG = "bc1qp0ahvfh83088w49k405szqgg4f3pptr7p2g06tdxfjcd40z4lh4q95lsz9"


def rust_accepts(address: str, message: str, signature: str) -> bool:
    """rust-bitcoin's bip322 crate predates the prefix: it takes the base64 witness alone."""
    try:
        rust_bip322.verify_simple_encoded(address, message, signature.removeprefix(bip322.PREFIX_SIMPLE))
    except rust_bip322.VerificationError:
        return False
    return True


@pytest.mark.parametrize("message, msg_hash, to_spend, to_sign", HASHES)
def test_message_hash_and_virtual_transactions_match_the_bip(message, msg_hash, to_spend, to_sign):
    program = bip322.p2wpkh_program(ADDRESS)
    assert_equal(bip322.message_hash(message).hex(), msg_hash)
    assert_equal(bip322.to_spend_txid(message, program)[::-1].hex(), to_spend)
    assert_equal(bip322.to_sign_txid(message, program)[::-1].hex(), to_sign)


@pytest.mark.parametrize("message, low_r, plain", SIGNATURES)
def test_signatures_are_byte_identical_to_the_bips(message, low_r, plain):
    assert_equal(bip322.sign_simple(KEY, ADDRESS, message), low_r)
    assert_equal(bip322.sign_simple(KEY, ADDRESS, message, low_r=False), plain)
    for sig in (low_r, plain):
        assert bip322.verify_simple(ADDRESS, message, sig)
        assert rust_accepts(ADDRESS, message, sig)


def test_the_generated_p2wpkh_vector():
    wif, address, message, sig = GENERATED
    assert_equal(bip322.sign_simple(WifDecoder.Decode(wif)[0], address, message, low_r=False), sig)
    assert bip322.verify_simple(address, message, sig)
    assert not bip322.verify_simple(address, "EFGJ4AZYXDV7NDUDSUDB3NCDUC", sig)  # the BIP's "wrong message" case
    assert not bip322.verify_simple(ADDRESS, message, sig)  # and its "wrong signer" case


@pytest.mark.parametrize("address, message, signature", [
    (ADDRESS, "", "not-valid-base64!!!"),
    (ADDRESS, "", ""),
    (ADDRESS, "Wrong message that was not signed", SIGNATURES[0][1]),
    (MULTISIG, "", SIGNATURES[0][1]),  # a valid signature, for another address
    (ADDRESS, "", "smpAA=="),  # empty witness stack
    (ADDRESS, "", "fooAA=="),  # unknown prefix
    (ADDRESS, "", SIGNATURES[0][1][3:]),  # unprefixed: the BIP lets a verifier assume simple; ours does not
    (ADDRESS, "", SIGNATURES[0][1].replace("=", "")),  # non-canonical base64
    (ADDRESS, "", "ful" + SIGNATURES[0][1][3:]),  # another variant
])
def test_the_bips_error_cases_and_ours_are_refused(address, message, signature):
    assert not bip322.verify_simple(address, message, signature)


def test_a_high_s_twin_or_another_sighash_type_is_refused():
    """The same signature with S replaced by n - S verifies as plain ECDSA but is malleable: refused,
    as the BIP's LOW_S rule requires; so is the signature with SIGHASH_NONE in place of ALL."""
    payload = base64.b64decode(SIGNATURES[1][1][3:])
    sig, pub = payload[2:2 + payload[1] - 1], payload[2 + payload[1]:]
    r_len = sig[3]
    r, s = sig[4:4 + r_len], int.from_bytes(sig[6 + r_len:], "big")
    n = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
    high = (n - s).to_bytes(33, "big")  # top bit set: DER needs the leading zero
    der = b"\x30" + bytes([4 + r_len + len(high)]) + b"\x02" + bytes([r_len]) + r + b"\x02" + bytes([len(high)]) + high

    def encode(sig_with_type: bytes) -> str:
        return "smp" + base64.b64encode(b"\x02" + bytes([len(sig_with_type)]) + sig_with_type + pub).decode()

    assert bip322.verify_simple(ADDRESS, "Hello World", encode(sig + b"\x01"))
    assert not bip322.verify_simple(ADDRESS, "Hello World", encode(der + b"\x01"))
    assert not bip322.verify_simple(ADDRESS, "Hello World", encode(sig + b"\x02"))


@pytest.mark.parametrize("network, index", [("regtest", 1), ("testnet", 2), ("mainnet", 3)])
def test_our_signatures_pass_the_independent_verifier(network, index):
    from bip_utils import P2WPKHAddrEncoder

    key = PrivateKey(bytes([index]) * 32)
    address = P2WPKHAddrEncoder.EncodeKey(key.public_key.format(), hrp=bip322.HRPS[network])
    message = f"custody proof of reserves: a message for {network}"
    sig = bip322.sign_simple(key.secret, address, message)
    assert bip322.verify_simple(address, message, sig)
    assert rust_accepts(address, message, sig)
    assert not rust_accepts(address, message + ".", sig)


def test_signing_for_an_address_the_key_does_not_own_is_refused():
    with pytest.raises(ValueError):
        bip322.sign_simple(bytes([7]) * 32, ADDRESS, "Hello World")
