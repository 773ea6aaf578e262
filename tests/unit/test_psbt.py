"""custody.psbt: the unsigned PSBT custody builds for a cold -> hot move, and what it accepts back.

The signed transaction is checked against the signer's own signing code: a PSBT finalized with the
witnesses `signer.bitcoin_tx.sign_batch` makes for the same coins and outputs extracts to exactly
the bytes and txid sign_batch answers. Each refusal is shown with a PSBT that differs in one way."""
from __future__ import annotations

import base64

import coincurve
import pytest

from bip_utils import Bip32KeyNetVersions, Bip32Slip10Secp256k1

from custody.psbt import (HARDENED, IN_BIP32_DERIVATION, IN_FINAL_SCRIPTWITNESS, IN_PARTIAL_SIG, IN_WITNESS_UTXO,
                          OUT_BIP32_DERIVATION, KeyOrigin, PsbtError, PsbtErrorCode, PsbtInput, build, decode, encode, extract,
                          parse, serialize, unsigned_tx)
from regtest.util import assert_equal
from signer.bitcoin_tx import PayOutput, SpendInput, _sha256d, _varint, p2wpkh_script, sign_batch

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


# ---- BIP32 derivations (PSBT_IN_BIP32_DERIVATION, PSBT_OUT_BIP32_DERIVATION) ---------------------

# BIP 174's updater test vector: its master key, and the derivation fields the updater must add
# (type, then 33-byte key; 4-byte master fingerprint d90c6a4f; path m/0'/0'/n'), as the BIP writes them.
BIP174_MASTER = ("tprv8ZgxMBicQKsPd9TeAdPADNnSyH9SSUUbTVeFszDE23Ki6TBB5nCefAdHkK8Fm3qMQR6sHwA56zqRmKmxnHk37JkiFzvncDqo"
                 "KmPWubu7hDF")
BIP174_FIELDS = {  # (field type, hardened child n of m/0'/0'/n') -> the key-value pair's bytes in the BIP's PSBT
    (0x06, 0): "2206029583bf39ae0a609747ad199addd634fa6108559d6c5cd39b4c2183f1ab96e07f10d90c6a4f000000800000008000000080",
    (0x06, 1): "220602dab61ff49a14db6a7d02b0cd1fbb78fc4b18312b5b4e54dae4dba2fbfef536d710d90c6a4f000000800000008001000080",
    (0x02, 4): "220203a9a4c37f5996d3aa25dbac6b570af0650394492942460b354753ed9eeca5877110d90c6a4f000000800000008004000080",
    (0x02, 5): "2202027f6399757d2eff55a136ad02c684b1838b6556e5f1b6b34282a94b6b5005109610d90c6a4f000000800000008005000080",
}


def test_derivation_fields_match_the_bip174_updater_vector():
    master = Bip32Slip10Secp256k1.FromExtendedKey(BIP174_MASTER, Bip32KeyNetVersions(bytes.fromhex("043587cf"),
                                                                                       bytes.fromhex("04358394")))
    fingerprint = master.FingerPrint().ToBytes()
    assert_equal(fingerprint.hex(), "d90c6a4f")
    for (field_type, n), expected in BIP174_FIELDS.items():
        pubkey = master.DerivePath(f"m/0'/0'/{n}'").PublicKey().RawCompressed().ToBytes()
        key, value = KeyOrigin(pubkey, fingerprint, (HARDENED, HARDENED, HARDENED | n)).pair(field_type)
        assert_equal(_varint(len(key)) + key + _varint(len(value)) + value, bytes.fromhex(expected))


ORIGINS = [KeyOrigin(PUBS[0], b"\xf1\x1a\x05\x21", (0, 7)), KeyOrigin(PUBS[1], b"\xf1\x1a\x05\x21", (1, 2))]
DERIVED = [PsbtInput(k.txid, k.vout, k.amount, k.script_pubkey, o) for k, o in zip(COINS, ORIGINS)]
HOT_KEY = coincurve.PrivateKey(b"\x03" * 32).public_key.format(compressed=True)
HOT_OWN = p2wpkh_script(HOT_KEY)
OWN_OUTPUTS = [(HOT_OWN, 200_000), (CHANGE, 39_000)]
OUT_ORIGINS = [KeyOrigin(HOT_KEY, b"\xaa\xbb\xcc\xdd", (0, 0)), KeyOrigin(PUBS[0], b"\xf1\x1a\x05\x21", (0, 7))]


def test_the_psbt_states_each_inputs_and_our_outputs_derivation():
    tx, ins, outs = parse(build(DERIVED, OWN_OUTPUTS, OUT_ORIGINS))
    assert_equal(tx, unsigned_tx(COINS, OWN_OUTPUTS))  # the transaction is the same with or without them
    for fields, origin in zip(ins, ORIGINS):
        assert_equal(fields[bytes((IN_BIP32_DERIVATION,)) + origin.pubkey],
                     origin.fingerprint + b"".join(i.to_bytes(4, "little") for i in origin.path))
    assert_equal([list(o) for o in outs], [[bytes((OUT_BIP32_DERIVATION,)) + o.pubkey] for o in OUT_ORIGINS])
    assert_equal(parse(build(DERIVED, OWN_OUTPUTS, [OUT_ORIGINS[0], None]))[2][1], {})  # an output with no origin: none
    with pytest.raises(ValueError):  # an origin that is not the key of its script is never written
        build(DERIVED, OWN_OUTPUTS, [OUT_ORIGINS[1], OUT_ORIGINS[0]])
    with pytest.raises(ValueError):
        build([PsbtInput(COINS[1].txid, 3, 90_000, COINS[1].script_pubkey, ORIGINS[0])], OWN_OUTPUTS)
    with pytest.raises(ValueError):
        KeyOrigin(PUBS[0], b"\x00" * 3, (0, 1))


def _stacks(raw: bytes, outputs) -> list[list[bytes]]:
    stripped_len = len(unsigned_tx(COINS, outputs))
    wit, pos, stacks = raw[4 + 2 + stripped_len - 8:-4], 0, []
    for _ in COINS:
        n, pos = wit[pos], pos + 1
        items = []
        for _ in range(n):
            size, pos = wit[pos], pos + 1
            items.append(wit[pos:pos + size])
            pos += size
        stacks.append(items)
    return stacks


def test_with_derivations_the_signed_psbt_extracts_and_one_paying_another_address_is_still_refused():
    stacks = _stacks(sign_batch([SpendInput(k.txid, k.vout, k.amount, key) for k, key in zip(COINS, KEYS)],
                                [PayOutput("", 200_000, HOT_OWN)], "regtest", change=PayOutput("", 39_000, CHANGE)).raw,
                     OWN_OUTPUTS)
    tx, ins, outs = parse(build(DERIVED, OWN_OUTPUTS, OUT_ORIGINS))
    for fields, items in zip(ins, stacks):
        fields[bytes((IN_FINAL_SCRIPTWITNESS,))] = bytes((len(items),)) + b"".join(bytes((len(x),)) + x for x in items)
    assert_equal(extract(serialize(tx, ins, outs), tx, DERIVED, OWN_OUTPUTS).txid, _sha256d(tx)[::-1].hex())

    attacker = p2wpkh_script(b"\x02" + b"\x66" * 32)
    theirs = [(attacker, 200_000), (CHANGE, 39_000)]  # correctly signed, for a transaction that pays someone else
    their_stacks = _stacks(sign_batch([SpendInput(k.txid, k.vout, k.amount, key) for k, key in zip(COINS, KEYS)],
                                      [PayOutput("", 200_000, attacker)], "regtest",
                                      change=PayOutput("", 39_000, CHANGE)).raw, theirs)
    their_tx, their_ins, _ = parse(build(DERIVED, theirs))
    for fields, items in zip(their_ins, their_stacks):
        fields[bytes((IN_FINAL_SCRIPTWITNESS,))] = bytes((len(items),)) + b"".join(bytes((len(x),)) + x for x in items)
    forged = serialize(their_tx, their_ins, outs)  # our own output derivations kept: they prove nothing
    assert_equal(code_of(forged, DERIVED, OWN_OUTPUTS), PsbtErrorCode.psbt_transaction_mismatch)


def test_a_cold_keys_origin_from_its_account_xpub_with_and_without_a_master_fingerprint():
    """custody.addresses.btc_key_origin against an independent derivation from the seed: the test
    mnemonic's cold account (regtest, m/84'/1'/3'), key 0/5."""
    from bip_utils import Bip39SeedGenerator, Bip44Changes, Bip84, Bip84Coins

    from custody.addresses import btc_key_origin
    from signer.bitcoin_tx import _hash160
    from signer.keys import Secret, SignerKeys, seed_from_text

    mnemonic = "abandon " * 11 + "about"
    keys = SignerKeys(seed_from_text(Secret(mnemonic)), "regtest")
    account = Bip84.FromSeed(Bip39SeedGenerator(mnemonic).Generate(), Bip84Coins.BITCOIN_REGTEST).Purpose().Coin().Account(3)
    xpub = keys.account_xpub("bitcoin", "cold")
    assert_equal(account.PublicKey().ToExtended(), xpub)
    pubkey = account.Change(Bip44Changes.CHAIN_EXT).AddressIndex(5).PublicKey().RawCompressed().ToBytes()
    own = _hash160(account.PublicKey().RawCompressed().ToBytes())[:4]
    assert_equal(btc_key_origin(xpub, "regtest", 0, 5), (pubkey, own, (0, 5)))
    assert_equal(btc_key_origin(xpub, "regtest", 0, 5, keys.master_fingerprint),
                 (pubkey, bytes.fromhex(keys.master_fingerprint), (84 | HARDENED, 1 | HARDENED, 3 | HARDENED, 0, 5)))
    assert_equal(keys.master_fingerprint, "73c5da0a")  # the mnemonic's well-known master fingerprint
