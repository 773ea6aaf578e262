"""signer.bitcoin_tx (and the small pure parts of signer.ethereum_tx): no node, no database.

The node is the final judge (tests/e2e/test_signer_transactions.py); here: the BIP143 document's
own P2WPKH example, address policy per network, size and fee arithmetic, coin selection edges,
every refusal code, and an independent re-check of our signatures with python-bitcoinlib's
sighash implementation.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import coincurve
import pytest
from bip_utils import SegwitBech32Encoder
from bip_utils.bech32.bech32 import Bech32Encodings, Bech32Utils
from bip_utils.bech32.bech32_base import Bech32BaseConst, Bech32BaseUtils
from bitcoin.core import CTransaction, b2lx
from bitcoin.core.script import SIGHASH_ALL, SIGVERSION_WITNESS_V0, CScript, SignatureHash

import signer.bitcoin_tx as btx
from regtest.util import assert_equal, assert_raises_code
from signer.bitcoin_tx import (
    Bip143Sighash,
    PayOutput,
    SignedTx,
    SpendInput,
    address_to_script,
    dust_threshold,
    estimate_vsize,
    fee_for,
    p2wpkh_script,
    p2wpkh_script_code,
    pay_output,
    select_coins,
    sign_batch,
    sign_digest,
)
from signer.errors import SignerErrorCode as E
from signer.ethereum_tx import erc20_transfer_data, sign_eip1559, validate_eth_address


def _key(label: str) -> bytes:
    return hashlib.sha256(f"unit:{label}".encode()).digest()


def _pub(key: bytes) -> bytes:
    return coincurve.PrivateKey(key).public_key.format()


def _address(hrp: str, version: int, program: bytes) -> str:
    return SegwitBech32Encoder.Encode(hrp, version, program)


def _with_checksum(hrp: str, version: int, program: bytes, encoding: Bech32Encodings) -> str:
    """An address whose checksum uses `encoding` whatever the version (to build BIP350 mix-ups)."""
    data = [version] + Bech32BaseUtils.ConvertToBase32(program)
    checksum = Bech32Utils.ComputeChecksum(hrp, data, encoding)
    return hrp + "1" + "".join(Bech32BaseConst.CHARSET[d] for d in data + checksum)


def _regtest_p2wpkh(label: str) -> str:
    return _address("bcrt", 0, hashlib.new("ripemd160", hashlib.sha256(_pub(_key(label))).digest()).digest())


# --- BIP143 --------------------------------------------------------------------------------
# "Native P2WPKH" example of BIP143: two inputs, the second (index 1) a P2WPKH spend of 6 BTC.
BIP143_UNSIGNED = bytes.fromhex(
    "0100000002fff7f7881a8099afa6940d42d1e7f6362bec38171ea3edf433541db4e4ad969f0000000000eeffffff"
    "ef51e1b804cc89d182d279655c3aa89e815b1b309fe287d9b2b55d57b90ec68a0100000000ffffffff02202cb206"
    "000000001976a9148280b37df378db99f66f85c95a783a76ac7a6d5988ac9093510d000000001976a9143bde42db"
    "ee7e4dbe6a21b2d50ce2f0167faa815988ac11000000")
BIP143_KEY = bytes.fromhex("619c335025c7f4012e556c2a58b2506e30b8511b53ade95ea316fd8c3286feb9")
BIP143_PUBKEY = "025476c2e83188368da1ff3e292e7acafcdb3566bb0ad253f62fc70f07aeee6357"
BIP143_SIGHASH = "c37af31116d1b27caf68aae9e3ac82f1477929014d5b917657d0eb49478cb670"
BIP143_SIGNATURE = ("304402203609e17b84f6a7d30c80bfa610b5b4542f32a8a0d5447a12fb1366d7f01cc44a0220573a954c451833"
                    "1561406f90300e8f3358f51928d43c212a8caed02de67eebee")


def test_bip143_native_p2wpkh_sighash_and_signature():
    tx = BIP143_UNSIGNED
    outpoints = [tx[5:41], tx[46:82]]
    sequences = [int.from_bytes(tx[42:46], "little"), int.from_bytes(tx[83:87], "little")]
    outputs = tx[88:-4]  # after the output count, before nLockTime
    assert_equal(sequences, [0xFFFFFFEE, 0xFFFFFFFF])
    sighash = Bip143Sighash(1, outpoints, sequences, outputs, locktime=0x11)
    pub = _pub(BIP143_KEY)
    assert_equal(pub.hex(), BIP143_PUBKEY)
    assert_equal(p2wpkh_script_code(pub).hex(), "1976a9141d0f172a0ecb48aee1be1f2687d2963ae33f71a188ac")
    digest = sighash.digest(outpoints[1], p2wpkh_script_code(pub), 600_000_000, sequences[1])
    assert_equal(digest.hex(), BIP143_SIGHASH)
    # RFC6979 makes the signature deterministic: it is byte for byte the one in BIP143
    assert_equal(sign_digest(coincurve.PrivateKey(BIP143_KEY), pub, digest).hex(), BIP143_SIGNATURE)


# --- addresses -----------------------------------------------------------------------------
PROG20 = bytes(range(20))
PROG32 = bytes(range(32))


@pytest.mark.parametrize("network,hrp", [("mainnet", "bc"), ("testnet", "tb"), ("regtest", "bcrt")])
def test_each_network_accepts_its_own_p2wpkh_p2wsh_p2tr(network, hrp):
    assert_equal(address_to_script(_address(hrp, 0, PROG20), network), b"\x00\x14" + PROG20)
    assert_equal(address_to_script(_address(hrp, 0, PROG32), network), b"\x00\x20" + PROG32)
    assert_equal(address_to_script(_address(hrp, 1, PROG32), network), b"\x51\x20" + PROG32)
    # BIP173: all-uppercase is the same address
    assert_equal(address_to_script(_address(hrp, 0, PROG20).upper(), network), b"\x00\x14" + PROG20)


def test_bip173_and_bip350_vectors():
    assert_equal(address_to_script("bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t4", "mainnet").hex(),
                 "0014751e76e8199196d454941c45d1b3a323f1433bd6")
    assert_equal(address_to_script("tb1qrp33g0q5c5txsp9arysrx4k6zdkfs4nce4xj0gdcccefvpysxf3q0sl5k7", "testnet").hex(),
                 "00201863143c14c5166804bd19203356da136c985678cd4d27a1b8c6329604903262")
    assert_equal(address_to_script("bc1p0xlxvlhemja6c4dqv22uapctqupfhlxm9h8z3k2e72q4k9hcz7vqzk5jj0", "mainnet").hex(),
                 "512079be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798")
    # BIP350 "invalid": a v0 program with a bech32m checksum
    assert_raises_code(E.ADDRESS_CHECKSUM_VARIANT_MISMATCH, address_to_script,
                       "bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kemeawh", "mainnet")


@pytest.mark.parametrize("hrp,network", [("bc", "regtest"), ("tb", "regtest"), ("bcrt", "mainnet"),
                                         ("tb", "mainnet"), ("bc", "testnet"), ("bcrt", "testnet")])
def test_wrong_network_refused(hrp, network):
    assert_raises_code(E.WRONG_NETWORK, address_to_script, _address(hrp, 0, PROG20), network)


def test_checksum_variant_must_match_witness_version():
    v0_bech32m = _with_checksum("bcrt", 0, PROG20, Bech32Encodings.BECH32M)
    v1_bech32 = _with_checksum("bcrt", 1, PROG32, Bech32Encodings.BECH32)
    assert_raises_code(E.ADDRESS_CHECKSUM_VARIANT_MISMATCH, address_to_script, v0_bech32m, "regtest")
    assert_raises_code(E.ADDRESS_CHECKSUM_VARIANT_MISMATCH, address_to_script, v1_bech32, "regtest")


def test_bad_checksum_and_malformed_refused():
    good = _address("bcrt", 0, PROG20)
    typo = good[:-1] + ("q" if good[-1] != "q" else "p")
    assert_raises_code(E.INVALID_ADDRESS, address_to_script, typo, "regtest")
    assert_raises_code(E.INVALID_ADDRESS, address_to_script, good[:6] + good[6:].upper(), "regtest")  # mixed case
    assert_raises_code(E.INVALID_ADDRESS, address_to_script, good + "q" * 70, "regtest")  # > 90 chars
    assert_raises_code(E.INVALID_ADDRESS, address_to_script, "", "regtest")
    assert_raises_code(E.INVALID_ADDRESS, address_to_script, " " + good, "regtest")
    assert_raises_code(E.INVALID_ADDRESS, address_to_script, "ltc1qw508d6qejxtdg4y5r3zarvary0c5xw7kgmn4n9", "mainnet")
    assert_raises_code(E.INVALID_ADDRESS, address_to_script, _address("bcrt", 0, bytes(25)), "regtest")  # v0 length
    assert_raises_code(E.UNKNOWN_NETWORK, address_to_script, good, "signet")


@pytest.mark.parametrize("address,network", [
    ("1BvBMSEYstWetqTFn5Au4m4GFg7xJaNVN2", "mainnet"),   # P2PKH
    ("3J98t1WpEZ73CNmQviecrnyiWrnqRhWNLy", "mainnet"),   # P2SH
    ("mipcBbFg9gMiCh81Kj8tqqdgoZub1ZJRfn", "regtest"),   # testnet/regtest P2PKH
    ("2MzQwSSnBHWHqSAqtTVQ6v47XtaisrJa1Vc", "regtest"),  # testnet/regtest P2SH
])
def test_legacy_base58_refused(address, network):
    assert_raises_code(E.UNSUPPORTED_ADDRESS_TYPE, address_to_script, address, network)


def test_future_witness_versions_refused():
    assert_raises_code(E.UNSUPPORTED_ADDRESS_TYPE, address_to_script, _address("bcrt", 2, PROG32), "regtest")
    assert_raises_code(E.UNSUPPORTED_ADDRESS_TYPE, address_to_script, _address("bcrt", 16, PROG20), "regtest")
    assert_raises_code(E.UNSUPPORTED_ADDRESS_TYPE, address_to_script, _address("bcrt", 1, PROG20), "regtest")


# --- size, fee and dust arithmetic ---------------------------------------------------------
P2WPKH = b"\x00\x14" + PROG20
P2WSH = b"\x00\x20" + PROG32
P2TR = b"\x51\x20" + PROG32


def test_vsize_matches_the_well_known_figures():
    assert_equal(estimate_vsize(1, [P2WPKH]), 110)            # 109.5 rounded up
    assert_equal(estimate_vsize(1, [P2WPKH, P2WPKH]), 141)    # 140.5
    assert_equal(estimate_vsize(2, [P2WPKH, P2WPKH]), 209)    # 208.5
    assert_equal(estimate_vsize(1, [P2TR, P2WPKH]) - estimate_vsize(1, [P2WPKH, P2WPKH]), 12)
    # the output-count varint grows from 1 to 3 bytes at 253 outputs
    assert_equal(estimate_vsize(1, [P2WPKH] * 253) - estimate_vsize(1, [P2WPKH] * 252), 31 + 2)
    assert_equal(btx.P2WPKH_INPUT_VBYTES, btx.P2WPKH_INPUT_WEIGHT // 4, 68)


def test_fee_for_rounds_up_in_integers():
    assert_equal(fee_for(141, 1_000), 141)
    assert_equal(fee_for(141, 1_500), 212)  # 211.5
    assert_equal(fee_for(141, 0), 0)
    assert_equal(fee_for(1, 1), 1)


def test_dust_thresholds_are_bitcoin_cores():
    assert_equal(dust_threshold(P2WPKH), 294)
    assert_equal(dust_threshold(P2WSH), 330)
    assert_equal(dust_threshold(P2TR), 330)


# --- signing -------------------------------------------------------------------------------
FUND_TXID = "aa" * 32


def _inputs(amounts: list[int]) -> list[SpendInput]:
    return [SpendInput(hashlib.sha256(bytes([i])).hexdigest(), i, a, _key(f"in{i}")) for i, a in enumerate(amounts)]


def _outputs(n: int, amount: int = 10_000) -> list[PayOutput]:
    return [pay_output(_regtest_p2wpkh(f"out{i}"), amount + i, "regtest") for i in range(n)]


def _check_with_bitcoinlib(signed: SignedTx, inputs: list[SpendInput]) -> CTransaction:
    """Re-derive every sighash with python-bitcoinlib and verify our signature against it."""
    tx = CTransaction.deserialize(signed.raw)
    assert_equal(b2lx(tx.GetTxid()), signed.txid)
    assert_equal(tx.nVersion, 2)
    for i, txin in enumerate(inputs):
        sig, pub = tx.wit.vtxinwit[i].scriptWitness.stack
        assert_equal(sig[-1], SIGHASH_ALL)
        script_code = CScript(p2wpkh_script_code(pub)[1:])
        digest = SignatureHash(script_code, tx, i, SIGHASH_ALL, amount=txin.amount, sigversion=SIGVERSION_WITNESS_V0)
        assert coincurve.verify_signature(sig[:-1], digest, pub, hasher=None)
        assert_equal(pub, _pub(txin.private_key))
    return tx


def test_sign_batch_signatures_verify_independently():
    inputs = _inputs([300_000, 200_000, 100_000])
    outputs = _outputs(20)
    change = pay_output(_regtest_p2wpkh("change"), 350_000, "regtest")
    signed = sign_batch(inputs, outputs, "regtest", change=change)
    tx = _check_with_bitcoinlib(signed, inputs)
    assert_equal(signed.fee, 600_000 - sum(o.amount for o in outputs) - 350_000)
    assert_equal(signed.change_vout, 20)
    assert_equal([o.nValue for o in tx.vout], [o.amount for o in outputs] + [350_000])
    assert_equal([bytes(o.scriptPubKey) for o in tx.vout][:20], [o.script for o in outputs])
    assert_equal({i.nSequence for i in tx.vin}, {btx.SEQUENCE_RBF})
    assert_equal(tx.nLockTime, 0)
    # vsize: the node's rule, and our estimate is an upper bound by at most a quarter vB per input
    assert_equal(signed.vsize, (signed.weight + 3) // 4)
    stripped = CTransaction(tx.vin, tx.vout, tx.nLockTime, tx.nVersion).serialize()
    assert_equal(signed.weight, 3 * len(stripped) + len(signed.raw))
    estimate = estimate_vsize(3, [o.script for o in outputs] + [change.script])
    assert 0 <= estimate - signed.vsize <= 1, (estimate, signed.vsize)


def test_low_s_and_deterministic_signatures():
    inputs = _inputs([500_000])
    outputs = _outputs(2)
    first = sign_batch(inputs, outputs, "regtest", change=None)
    again = sign_batch(inputs, outputs, "regtest", change=None)
    assert_equal(first.raw, again.raw)
    tx = CTransaction.deserialize(first.raw)
    sig = tx.wit.vtxinwit[0].scriptWitness.stack[0][:-1]
    r_len = sig[3]
    s = int.from_bytes(sig[6 + r_len:], "big")
    assert s <= btx._SECP256K1_HALF_N


def test_addresses_without_scripts_are_parsed_at_signing():
    inputs = _inputs([500_000])
    resolved = _outputs(3)
    unresolved = [PayOutput(o.address, o.amount) for o in resolved]
    assert_equal(sign_batch(inputs, unresolved, "regtest", change=None).raw,
                 sign_batch(inputs, resolved, "regtest", change=None).raw)
    wrong = [PayOutput("bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t4", 10_000)]
    assert_raises_code(E.WRONG_NETWORK, sign_batch, inputs, wrong, "regtest", change=None)


def test_no_rbf_and_locktime():
    signed = sign_batch(_inputs([500_000]), _outputs(1), "regtest", change=None, rbf=False, locktime=150)
    tx = CTransaction.deserialize(signed.raw)
    assert_equal((tx.vin[0].nSequence, tx.nLockTime), (btx.SEQUENCE_NO_RBF, 150))


def test_shared_bip143_parts_are_hashed_once(monkeypatch):
    """500 outputs, 5 inputs: the outputs are hashed once for all signatures (plus once in the
    txid), not once per input as a naive SignatureHash loop does."""
    hashed = []
    real = btx._sha256d
    monkeypatch.setattr(btx, "_sha256d", lambda data: hashed.append(len(data)) or real(data))
    outputs = _outputs(500, 1_000)
    signed = sign_batch(_inputs([200_000] * 5), outputs, "regtest", change=None)
    outputs_len = 500 * 31
    assert sum(hashed) < 2 * outputs_len + 5 * 200 + 1_000, (sum(hashed), len(hashed))
    assert_equal(len(hashed), 3 + 5 + 1)  # prevouts, sequences, outputs; one per input; the txid
    assert_equal(signed.fee, 1_000_000 - sum(o.amount for o in outputs))


def test_repr_of_an_input_hides_the_key():
    key = _key("secret")
    assert key.hex() not in repr(SpendInput(FUND_TXID, 0, 1_000, key))
    assert repr(key) not in repr(SpendInput(FUND_TXID, 0, 1_000, key))


# --- refusals ------------------------------------------------------------------------------


def test_refusals():
    ins, outs = _inputs([100_000]), _outputs(1)
    change = pay_output(_regtest_p2wpkh("change"), 50_000, "regtest")
    r = lambda code, inputs=ins, outputs=outs, **kw: assert_raises_code(  # noqa: E731
        code, sign_batch, inputs, outputs, kw.pop("network", "regtest"), change=kw.pop("change", None), **kw)
    r(E.UNKNOWN_NETWORK, network="signet")
    r(E.INPUTS_MUST_NOT_BE_EMPTY, inputs=[])
    r(E.OUTPUTS_MUST_NOT_BE_EMPTY, outputs=[])
    for bad in (0, -1, 1.5, True, 10_000.0, btx.MAX_MONEY + 1):
        r(E.AMOUNT_MUST_BE_POSITIVE, outputs=[PayOutput(outs[0].address, bad, outs[0].script)])
        r(E.AMOUNT_MUST_BE_POSITIVE, inputs=[SpendInput(FUND_TXID, 0, bad, _key("k"))])
    r(E.AMOUNT_MUST_BE_POSITIVE, change=PayOutput(change.address, 0, change.script))
    r(E.OUTPUTS_EXCEED_INPUTS, outputs=[PayOutput(outs[0].address, 60_000, outs[0].script)], change=change)
    r(E.OUTPUTS_EXCEED_INPUTS, outputs=[PayOutput(outs[0].address, 100_001, outs[0].script)])
    r(E.DUPLICATE_INPUT, inputs=[SpendInput(FUND_TXID, 0, 1_000, _key("a")), SpendInput(FUND_TXID, 0, 1_000, _key("b"))])
    r(E.INVALID_INPUT, inputs=[SpendInput("zz" * 32, 0, 100_000, _key("a"))])
    r(E.INVALID_INPUT, inputs=[SpendInput(FUND_TXID[:-2], 0, 100_000, _key("a"))])
    r(E.INVALID_INPUT, inputs=[SpendInput(FUND_TXID, -1, 100_000, _key("a"))])
    r(E.INVALID_INPUT, inputs=[SpendInput(FUND_TXID, 2**32, 100_000, _key("a"))])
    r(E.INVALID_INPUT, inputs=[SpendInput(FUND_TXID, 0, 100_000, b"\x01" * 31)])
    r(E.INVALID_INPUT, locktime=-1)
    other = p2wpkh_script(_pub(_key("someone else")))
    r(E.KEY_DOES_NOT_MATCH_INPUT, inputs=[SpendInput(FUND_TXID, 0, 100_000, _key("a"), other)])
    # 0.0999 BTC of fee for ~110 vB (above Core's 0.1 BTC/kvB maxfeerate): an amount/fee mix-up
    big = _inputs([10_000_000])
    r(E.FEE_EXCEEDS_MAXIMUM, inputs=big, outputs=[PayOutput(outs[0].address, 10_000, outs[0].script)])
    sign_batch(big, [PayOutput(outs[0].address, 10_000, outs[0].script)], "regtest", change=None,
               max_fee_rate_sat_per_kvb=None)


def test_invalid_private_key_is_refused_without_echoing_it():
    order = bytes.fromhex("fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141")  # n: not a scalar
    for key in (bytes(32), order):
        exc = assert_raises_code(E.INVALID_INPUT, sign_batch, [SpendInput(FUND_TXID, 0, 100_000, key)],
                                 _outputs(1), "regtest", change=None)
        assert key.hex() not in str(exc) and exc.__cause__ is None


@pytest.mark.parametrize("script,threshold", [(P2WPKH, 294), (P2WSH, 330), (P2TR, 330)])
def test_dust_outputs_refused_at_the_threshold(script, threshold):
    ins = _inputs([100_000])
    below, at = PayOutput("x", threshold - 1, script), PayOutput("x", threshold, script)
    assert_raises_code(E.OUTPUT_BELOW_DUST, sign_batch, ins, [below], "regtest", change=None,
                       max_fee_rate_sat_per_kvb=None)
    sign_batch(ins, [at], "regtest", change=None, max_fee_rate_sat_per_kvb=None)
    assert_raises_code(E.OUTPUT_BELOW_DUST, sign_batch, ins, [at], "regtest", change=below,
                       max_fee_rate_sat_per_kvb=None)


def test_pre_resolved_scripts_must_be_payable_forms():
    ins = _inputs([100_000])
    for script in (b"\x76\xa9\x14" + PROG20 + b"\x88\xac",   # P2PKH
                   b"\xa9\x14" + PROG20 + b"\x87",             # P2SH
                   b"\x6a\x04abcd",                             # OP_RETURN
                   b"\x52\x20" + PROG32,                        # witness v2
                   b"\x00\x14" + PROG20 + b"\x00"):             # P2WPKH with a trailing byte
        assert_raises_code(E.UNSUPPORTED_ADDRESS_TYPE, sign_batch, ins, [PayOutput("x", 50_000, script)], "regtest",
                           change=None)
        assert_raises_code(E.UNSUPPORTED_ADDRESS_TYPE, sign_batch, ins, _outputs(1), "regtest",
                           change=PayOutput("x", 50_000, script))


def test_oversized_transaction_refused():
    outs = [PayOutput("x", 1_000, P2WPKH)] * 3_300  # 3,300 * 31 B * 4 > 400,000 WU
    assert_raises_code(E.TRANSACTION_TOO_LARGE, sign_batch, _inputs([10_000_000]), outs, "regtest", change=None,
                       max_fee_rate_sat_per_kvb=None)


# --- coin selection ------------------------------------------------------------------------


@dataclass(frozen=True)
class Coin:
    name: str
    amount: int


CHANGE = P2WPKH


def test_select_largest_first_with_change():
    coins = [Coin("small", 50_000), Coin("big", 400_000), Coin("mid", 200_000)]
    chosen, change, fee = select_coins(coins, 500_000, 2_000, [P2WPKH] * 3, CHANGE)
    assert_equal([c.name for c in chosen], ["big", "mid"])
    assert_equal(fee, fee_for(estimate_vsize(2, [P2WPKH] * 3 + [CHANGE]), 2_000))
    assert_equal(change, 600_000 - 500_000 - fee)


def test_select_drops_dust_change_into_the_fee():
    fee_without = fee_for(estimate_vsize(1, [P2WPKH]), 1_000)
    fee_with = fee_for(estimate_vsize(1, [P2WPKH, CHANGE]), 1_000)
    # leftover after a change output would be 293 sat: below dust, so no change
    amount = 100_000 + fee_with + 293
    chosen, change, fee = select_coins([Coin("a", amount)], 100_000, 1_000, [P2WPKH], CHANGE)
    assert_equal((len(chosen), change, fee), (1, 0, amount - 100_000))
    assert fee >= fee_without
    # 294 sat leftover: a change output is worth making
    chosen, change, fee = select_coins([Coin("a", amount + 1)], 100_000, 1_000, [P2WPKH], CHANGE)
    assert_equal((change, fee), (294, fee_with))


def test_select_exact_changeless_match():
    fee_without = fee_for(estimate_vsize(1, [P2WPKH]), 1_000)
    chosen, change, fee = select_coins([Coin("a", 100_000 + fee_without)], 100_000, 1_000, [P2WPKH], CHANGE)
    assert_equal((change, fee), (0, fee_without))


def test_select_skips_coins_that_cost_more_than_they_hold():
    rate = 50_000  # 50 sat/vB: spending a P2WPKH coin costs 3,400 sat
    coins = [Coin("dust", 3_400), Coin("ok", 200_000)]
    chosen, _, _ = select_coins(coins, 100_000, rate, [P2WPKH], CHANGE)
    assert_equal([c.name for c in chosen], ["ok"])
    assert_raises_code(E.INSUFFICIENT_FUNDS, select_coins, [Coin("dust", 3_400)] * 100, 1_000, rate, [P2WPKH], CHANGE)


def test_select_refusals():
    coins = [Coin("a", 10_000)]
    assert_raises_code(E.INSUFFICIENT_FUNDS, select_coins, coins, 10_000, 1_000, [P2WPKH], CHANGE)  # fee on top
    assert_raises_code(E.INSUFFICIENT_FUNDS, select_coins, [], 1_000, 1_000, [P2WPKH], CHANGE)
    assert_raises_code(E.AMOUNT_MUST_BE_POSITIVE, select_coins, coins, 0, 1_000, [P2WPKH], CHANGE)
    assert_raises_code(E.AMOUNT_MUST_BE_POSITIVE, select_coins, coins, 1_000.0, 1_000, [P2WPKH], CHANGE)
    assert_raises_code(E.INVALID_FEE_RATE, select_coins, coins, 1_000, 1.5, [P2WPKH], CHANGE)
    assert_raises_code(E.INVALID_FEE_RATE, select_coins, coins, 1_000, -1, [P2WPKH], CHANGE)
    assert_raises_code(E.OUTPUTS_MUST_NOT_BE_EMPTY, select_coins, coins, 1_000, 1_000, [], CHANGE)


def test_selection_then_signing_pays_at_least_the_rate():
    rate = 3_000
    inputs = _inputs([150_000, 90_000, 400_000, 20_000])
    outputs = _outputs(30, 15_000)
    target = sum(o.amount for o in outputs)
    chosen, change_amount, fee = select_coins(inputs, target, rate, [o.script for o in outputs], CHANGE)
    assert_equal([c.amount for c in chosen], [400_000, 150_000])
    change = PayOutput("change", change_amount, CHANGE)
    signed = sign_batch(chosen, outputs, "regtest", change=change)
    assert_equal(signed.fee, fee)
    assert signed.fee * 1000 >= rate * signed.vsize
    _check_with_bitcoinlib(signed, chosen)


# --- ethereum (pure parts; signing against anvil is in the e2e suite) ----------------------
CHECKSUMMED = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"


def test_eth_address_requires_eip55():
    assert_equal(validate_eth_address(CHECKSUMMED), CHECKSUMMED)
    assert_raises_code(E.ADDRESS_NOT_CHECKSUMMED, validate_eth_address, CHECKSUMMED.lower())
    assert_raises_code(E.ADDRESS_NOT_CHECKSUMMED, validate_eth_address, "0x" + CHECKSUMMED[2:].upper())
    typo = CHECKSUMMED.replace("Fd", "fD")
    assert_raises_code(E.ADDRESS_CHECKSUM_MISMATCH, validate_eth_address, typo)
    for bad in ("", CHECKSUMMED[2:], CHECKSUMMED + "00", "0x" + "g" * 40, "0X" + CHECKSUMMED[2:], None):
        assert_raises_code(E.INVALID_ADDRESS, validate_eth_address, bad)
    assert_raises_code(E.INVALID_ADDRESS, validate_eth_address, "0x" + "0" * 40)
    digits_only = "0x" + "1234567890" * 4  # no letters: it is its own checksum
    assert_equal(validate_eth_address(digits_only), digits_only)


def test_erc20_transfer_calldata():
    data = erc20_transfer_data(CHECKSUMMED, 12_345_678)
    assert_equal(data.hex(), "a9059cbb" + "00" * 12 + CHECKSUMMED[2:].lower() + (12_345_678).to_bytes(32, "big").hex())
    assert_raises_code(E.AMOUNT_MUST_BE_POSITIVE, erc20_transfer_data, CHECKSUMMED, 0)
    assert_raises_code(E.AMOUNT_MUST_BE_POSITIVE, erc20_transfer_data, CHECKSUMMED, 1.0)
    assert_raises_code(E.ADDRESS_NOT_CHECKSUMMED, erc20_transfer_data, CHECKSUMMED.lower(), 1)


def test_eip1559_signing_fields():
    from eth_account import Account
    from eth_account.typed_transactions import TypedTransaction
    from hexbytes import HexBytes

    key = _key("eth")
    kw = dict(chain_id=31337, nonce=7, to=CHECKSUMMED, value=10**18, gas=21_000, max_fee_wei=3 * 10**9,
              priority_fee_wei=10**9)
    signed = sign_eip1559(key, **kw)
    assert_equal(signed.raw[0], 2)
    assert_equal(Account.recover_transaction(signed.raw), signed.sender, Account.from_key(key).address)
    fields = TypedTransaction.from_bytes(HexBytes(signed.raw)).as_dict()
    assert_equal((fields["nonce"], fields["value"], fields["maxFeePerGas"], fields["chainId"]), (7, 10**18, 3 * 10**9, 31337))
    for name, bad in [("chain_id", 0), ("nonce", -1), ("value", 1.0), ("gas", 20_999), ("max_fee_wei", True)]:
        assert_raises_code(E.INVALID_TRANSACTION_FIELD, sign_eip1559, key, **{**kw, name: bad})
    assert_raises_code(E.INVALID_TRANSACTION_FIELD, sign_eip1559, key, **{**kw, "priority_fee_wei": 4 * 10**9})
    assert_raises_code(E.ADDRESS_NOT_CHECKSUMMED, sign_eip1559, key, **{**kw, "to": CHECKSUMMED.lower()})
    exc = assert_raises_code(E.INVALID_INPUT, sign_eip1559, bytes(32), **kw)
    assert exc.__cause__ is None


# --- parse_transaction (a CPFP parent the signer did not build) -------------------------------


def test_parse_transaction_reads_what_sign_batch_wrote():
    from chain_adapters.bitcoin import txid_of
    from signer.bitcoin_tx import PayOutput, SpendInput, parse_transaction, sign_batch

    key = bytes(31) + b"\x07"
    signed = sign_batch([SpendInput("ab" * 32, 1, 100_000, key), SpendInput("cd" * 32, 0, 50_000, key)],
                        [PayOutput("bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080", 60_000)], "regtest",
                        change=PayOutput("bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080", 80_000))
    parsed = parse_transaction(signed.raw)
    assert (parsed.txid, parsed.vsize) == (signed.txid, signed.vsize) and parsed.txid == txid_of(signed.raw)
    assert [amount for amount, _ in parsed.outputs] == [60_000, 80_000]
    assert all(script[:2] == b"\x00\x14" and len(script) == 22 for _, script in parsed.outputs)


def test_parse_transaction_bounds_the_size_by_the_txid_covered_bytes():
    """`p2wpkh_vsize` (the CPFP ceiling's parent size, R2-1) is at least the real size of a
    P2WPKH-spending transaction, and does not grow with a padded witness that keeps the txid."""
    from signer.bitcoin_tx import PayOutput, SpendInput, parse_transaction, sign_batch

    key = bytes(31) + b"\x07"
    for n in (1, 2, 5):
        signed = sign_batch([SpendInput(f"{i:064x}", i, 100_000, key) for i in range(n)],
                            [PayOutput("bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080", 60_000)], "regtest", change=None)
        parsed = parse_transaction(signed.raw)
        assert parsed.vsize <= parsed.p2wpkh_vsize <= parsed.vsize + n  # at most a byte per input above a real one
        assert parsed.inputs == tuple((f"{i:064x}", i) for i in range(n))
        tx = CTransaction.deserialize(signed.raw)
        body = tx.serialize({"include_witness": False})
        fat = body[:4] + b"\x00\x01" + body[4:-4] + (b"\x01\xfd\x10\x27" + bytes(10_000)) * n + body[-4:]
        padded = parse_transaction(fat)
        assert padded.txid == parsed.txid and padded.vsize > parsed.vsize + 2_000 * n
        assert padded.p2wpkh_vsize == parsed.p2wpkh_vsize


def test_parse_transaction_reads_a_legacy_transaction_and_refuses_anything_else():
    from signer.bitcoin_tx import parse_transaction
    from signer.errors import SignerError, SignerErrorCode

    script = b"\x00\x14" + bytes(20)
    legacy = (b"\x01\x00\x00\x00" + b"\x01" + bytes(32) + b"\x00\x00\x00\x00" + b"\x00" + b"\xff\xff\xff\xff"
              + b"\x01" + (1234).to_bytes(8, "little") + bytes([len(script)]) + script + b"\x00\x00\x00\x00")
    parsed = parse_transaction(legacy)
    assert parsed.outputs == ((1234, script),) and parsed.vsize == len(legacy)
    for bad in (b"", legacy[:-1], legacy + b"\x00", b"\x02\x00\x00\x00garbage", legacy[:4] + b"\x00" + legacy[5:]):
        with pytest.raises(SignerError) as err:
            parse_transaction(bad)
        assert err.value.code is SignerErrorCode.INVALID_INPUT
