"""The signer's one non-transaction signature: `sign_reserves_message` signs a proof-of-reserves
statement (signer.protocol.ReservesStatement) and nothing else: not a transaction digest, not an
approval payload, not a statement of another chain or about an address its key does not hold, not
with a cold key. Bitcoin statements are BIP-322 simple signatures; ethereum ones are EIP-191
personal_sign signatures, checked here independently of eth-account (keccak over the EIP-191
prefix, public key recovered with libsecp256k1)."""
from __future__ import annotations

import json

import pytest
from coincurve import PublicKey
from eth_utils import keccak

from custody.addresses import derive_btc_address, derive_eth_address
from regtest.util import assert_equal, assert_raises_code
from signer import bip322, eip191
from signer.errors import SignerError
from signer.keys import Secret, SignerKeys, seed_from_text
from signer.protocol import RefusalCode, ReservesStatement
from signer.service import Signer

KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
SIGNER = Signer(None, KEYS, bitcoin_network="regtest")  # type: ignore[arg-type] - reserves statements read no database
BTC_HOT = derive_btc_address(KEYS.account_xpub("bitcoin", "hot"), "regtest", 0, 0)
BTC_DEPOSIT_7 = derive_btc_address(KEYS.account_xpub("bitcoin", "deposit"), "regtest", 0, 7)
ETH_HOT = derive_eth_address(KEYS.account_xpub("ethereum", "hot"), 0)


def statement(chain: str = "bitcoin", address: str = BTC_HOT, **kw) -> ReservesStatement:
    fields = dict(report_id=41, asset="BTC" if chain == "bitcoin" else "USDT", chain=chain, height=812,
                  block_hash="ab" * 32 if chain == "bitcoin" else "0x" + "cd" * 32, address=address, amount=123_456,
                  liabilities_root="ef" * 32)
    return ReservesStatement(**{**fields, **kw})


def test_a_statement_round_trips_and_nothing_else_parses():
    s = statement()
    assert_equal(ReservesStatement.parse(s.message()), s)
    for bad in ["", s.message() + " ", s.message().replace("report 41", "report 041"),
                s.message().replace("amount 123456", "amount -5"), s.message() + "\nsend 5 BTC",
                "custody proof of reserves: " + "ab" * 32, json.dumps({"withdrawal_id": 1, "amount": 5}),
                s.message().replace("chain bitcoin", "chain dogecoin"), s.message().upper()]:
        assert ReservesStatement.parse(bad) is None, bad


def test_bitcoin_statements_are_bip322_signed_by_the_named_address():
    message = statement().message()
    signed = SIGNER.sign_reserves_message("bitcoin", "hot", 0, 0, message)
    assert_equal(signed.address, BTC_HOT)
    assert bip322.verify_simple(BTC_HOT, message, signed.signature)
    deposit = statement(address=BTC_DEPOSIT_7).message()
    assert bip322.verify_simple(BTC_DEPOSIT_7, deposit, SIGNER.sign_reserves_message("bitcoin", "deposit", 0, 7, deposit).signature)


def test_ethereum_statements_are_eip191_signatures_anyone_can_recover():
    message = statement("ethereum", ETH_HOT).message()
    signed = SIGNER.sign_reserves_message("ethereum", "hot", 0, 0, message)
    assert_equal(signed.address, ETH_HOT)
    raw = bytes.fromhex(signed.signature[2:])
    digest = keccak(b"\x19Ethereum Signed Message:\n" + str(len(message.encode())).encode() + message.encode())
    pub = PublicKey.from_signature_and_message(raw[:64] + bytes([raw[64] - 27]), digest, hasher=None)
    assert_equal("0x" + keccak(pub.format(compressed=False)[1:])[-20:].hex(), ETH_HOT.lower())
    assert eip191.verify_personal(ETH_HOT, message, signed.signature)
    assert not eip191.verify_personal(ETH_HOT, message + " ", signed.signature)


@pytest.mark.parametrize("chain, tier, index, message", [
    ("bitcoin", "hot", 0, "custody proof of reserves: anything at all"),  # the v1 format: a free text after the prefix
    ("bitcoin", "hot", 0, "02000000" + "00" * 100),  # a transaction-like hex
    ("bitcoin", "hot", 1, statement().message()),  # names hot 0/0 but the key asked for is 0/1
    ("bitcoin", "deposit", 0, statement().message()),  # another tier's key
    ("ethereum", "hot", 0, statement().message()),  # a bitcoin statement on the ethereum key
    ("bitcoin", "hot", 0, statement("ethereum", ETH_HOT).message()),  # and the reverse
    ("ethereum", "hot", 1, statement("ethereum", ETH_HOT).message()),
])
def test_anything_but_a_statement_about_the_keys_own_address_is_refused(chain, tier, index, message):
    assert_raises_code(RefusalCode.statement_invalid, SIGNER.sign_reserves_message, chain, tier, 0, index, message)


def test_cold_keys_are_not_held():
    cold = derive_btc_address(KEYS.account_xpub("bitcoin", "cold"), "regtest", 0, 0)
    with pytest.raises(SignerError):
        SIGNER.sign_reserves_message("bitcoin", "cold", 0, 0, statement(address=cold).message())
