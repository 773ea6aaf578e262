"""custody.psbt: the unsigned PSBT custody builds for a cold -> hot move, and what it accepts back.

The signed transaction is checked against the signer's own signing code: a PSBT finalized with the
witnesses `signer.bitcoin_tx.sign_batch` makes for the same coins and outputs extracts to exactly
the bytes and txid sign_batch answers. Each refusal is shown with a PSBT that differs in one way."""
from __future__ import annotations

import base64

import coincurve
import pytest

from custody.psbt import (IN_FINAL_SCRIPTWITNESS, IN_PARTIAL_SIG, IN_WITNESS_UTXO, PsbtError, PsbtErrorCode, PsbtInput,
                          build, decode, encode, extract, parse, serialize, unsigned_tx)
from regtest.util import assert_equal
from signer.bitcoin_tx import PayOutput, SpendInput, p2wpkh_script, sign_batch

KEYS = [bytes([i]) * 32 for i in (1, 2)]
PUBS = [coincurve.PrivateKey(k).public_key.format(compressed=True) for k in KEYS]
COINS = [PsbtInput("11" * 32, 0, 150_000, p2wpkh_script(PUBS[0])), PsbtInput("22" * 32, 3, 90_000, p2wpkh_script(PUBS[1]))]
HOT = p2wpkh_script(b"\x02" + b"\x07" * 32)
CHANGE = p2wpkh_script(PUBS[0])
OUTPUTS = [(HOT, 200_000), (CHANGE, 39_000)]


def signed_by_signer() -> tuple[bytes, str, list[list[bytes]]]:
    """sign_batch's transaction for COINS -> OUTPUTS, and its witness stacks."""
    tx = sign_batch([SpendInput(k.txid, k.vout, k.amount, key) for k, key in zip(COINS, KEYS)],
                    [PayOutput("", OUTPUTS[0][1], OUTPUTS[0][0])], "regtest",
                    change=PayOutput("", OUTPUTS[1][1], OUTPUTS[1][0]))
    raw = tx.raw
    stripped_len = len(unsigned_tx(COINS, OUTPUTS))
    wit, pos = raw[4 + 2 + stripped_len - 8:-4], 0  # the witnesses sit between the outputs and the locktime
    stacks = []
    for _ in COINS:
        n, pos = wit[pos], pos + 1
        items = []
        for _ in range(n):
            size, pos = wit[pos], pos + 1
            items.append(wit[pos:pos + size])
            pos += size
        stacks.append(items)
    return raw, tx.txid, stacks


def finalized(stacks: list[list[bytes]], tx: bytes | None = None) -> bytes:
    tx_, ins, outs = parse(build(COINS, OUTPUTS))
    for fields, items in zip(ins, stacks):
        fields[bytes((IN_FINAL_SCRIPTWITNESS,))] = bytes((len(items),)) + b"".join(bytes((len(x),)) + x for x in items)
    return serialize(tx or tx_, ins, outs)


def test_the_unsigned_psbt_carries_the_transaction_and_each_coin():
    tx, ins, outs = parse(build(COINS, OUTPUTS))
    assert_equal(tx, unsigned_tx(COINS, OUTPUTS))
    assert_equal([f[bytes((IN_WITNESS_UTXO,))][:8] for f in ins], [k.amount.to_bytes(8, "little") for k in COINS])
    assert_equal(outs, [{}, {}])
    assert_equal(decode(encode(build(COINS, OUTPUTS))), build(COINS, OUTPUTS))


def test_a_finalized_psbt_extracts_to_the_signers_own_transaction():
    raw, txid, stacks = signed_by_signer()
    got = extract(decode(encode(finalized(stacks))), unsigned_tx(COINS, OUTPUTS), COINS, OUTPUTS)
    assert_equal((got.raw, got.txid), (raw, txid))


def test_a_partial_signature_is_finalized_here():
    raw, txid, stacks = signed_by_signer()
    tx, ins, outs = parse(build(COINS, OUTPUTS))
    for fields, (sig, pub) in zip(ins, stacks):
        fields[bytes((IN_PARTIAL_SIG,)) + pub] = sig
    assert_equal(extract(serialize(tx, ins, outs), tx, COINS, OUTPUTS).raw, raw)


def code_of(data: bytes, inputs=COINS, outputs=OUTPUTS) -> PsbtErrorCode:
    with pytest.raises(PsbtError) as caught:
        extract(data, unsigned_tx(inputs, outputs), inputs, outputs)
    return caught.value.code


def test_refusals_each_for_one_difference():
    _, _, stacks = signed_by_signer()
    assert_equal(code_of(b"psbt\xff\x00"), PsbtErrorCode.psbt_malformed)
    assert_equal(code_of(finalized(stacks)[:-1]), PsbtErrorCode.psbt_malformed)  # truncated
    with pytest.raises(PsbtError) as caught:
        decode("not base64!")
    assert_equal(caught.value.code, PsbtErrorCode.psbt_malformed)
    redirected = unsigned_tx(COINS, [(CHANGE, 200_000), (CHANGE, 39_000)])  # the hot output sent elsewhere
    assert_equal(code_of(finalized(stacks, tx=redirected)), PsbtErrorCode.psbt_transaction_mismatch)
    assert_equal(code_of(build(COINS, OUTPUTS)), PsbtErrorCode.psbt_not_signed)
    swapped = [stacks[1], stacks[0]]  # valid signatures, on the wrong inputs
    assert_equal(code_of(finalized(swapped)), PsbtErrorCode.psbt_signature_invalid)
    sig, pub = stacks[0]
    forged = [[sig[:-2] + bytes([sig[-2] ^ 1]) + sig[-1:], pub], stacks[1]]
    assert_equal(code_of(finalized(forged)), PsbtErrorCode.psbt_signature_invalid)


def test_a_duplicate_key_is_malformed():
    data = build(COINS, OUTPUTS)
    dup = data[:5] + data[5:5 + 3 + len(unsigned_tx(COINS, OUTPUTS))] * 2 + data[5 + 3 + len(unsigned_tx(COINS, OUTPUTS)):]
    with pytest.raises(PsbtError) as caught:
        parse(dup)
    assert_equal(caught.value.code, PsbtErrorCode.psbt_malformed)
    assert base64.b64decode(encode(data)) == data
