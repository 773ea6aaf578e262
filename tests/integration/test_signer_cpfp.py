"""The signer's CPFP request (`Signer.sign_bitcoin_cpfp`, custody.cpfp): it signs a child of a stuck
rebalance into hot only after checking on its own that the parent's bytes are the row's transaction,
that the output spent pays the hot receive address of its own key, that the child pays only that
address, at a fee within its ceiling, and (its own record, `signer_cpfp`) one child per parent
output, replaced only at a higher fee. Each refusal is tested, and the signed child is read back.

A database of the module's own: a cold -> hot rebalance row `broadcast` with a parent transaction
(built here, signed by a key of no matter: the signer never signs the parent), as an imported PSBT
leaves it. No money moves; the books are verified at the end all the same."""
from __future__ import annotations

import os
import threading

import pytest
from bitcoin.core import CTransaction, b2lx
from sqlalchemy import text

from custody.addresses import derive_btc_address
from custody.controls import set_kill_switch
from custody.wallets import Wallets
from ledger.service import Ledger
from regtest.util import assert_equal
from signer.bitcoin_tx import (PayOutput, SpendInput, address_to_script, estimate_vsize, fee_for, parse_transaction,
                               sign_batch)
from signer.keys import Secret, SignerKeys, seed_from_text
from signer.protocol import RefusalCode, SigningRefused
from signer.service import Signer
from tests.integration.own_database import own_database

KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
STRANGER = "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080"
AMOUNT = 150_000_000
PARENT_FEE = 300  # a stuck parent: about 1 sat/vB


@pytest.fixture(scope="module")
def db(database_url):
    with own_database(database_url, "signer_cpfp") as eng:
        ledger = Ledger(eng)
        wallets = Wallets(eng, ledger)
        wallets.configure_asset("BTC", 8, "bitcoin", finality=3)
        wallets.register_wallet("bitcoin", "hot", "regtest", KEYS.account_xpub("bitcoin", "hot"))
        yield eng, ledger


@pytest.fixture(scope="module")
def hot():
    return derive_btc_address(KEYS.account_xpub("bitcoin", "hot"), "regtest", 0, 0)


def parent_tx(hot: str):
    spend = SpendInput(os.urandom(32).hex(), 0, AMOUNT + 50_000 + PARENT_FEE, os.urandom(31) + b"\x01")
    return sign_batch([spend], [PayOutput(STRANGER, 50_000), PayOutput(hot, AMOUNT)], "regtest", change=None)


def parent_move(eng, hot: str, *, destination_tier: str = "hot") -> tuple[int, bytes, int]:
    """A rebalance row `broadcast` with its parent transaction: output 0 to a stranger (as change
    elsewhere would be), output 1 paying `AMOUNT` to the hot receive address. (id, raw, vout)."""
    parent = parent_tx(hot)
    source = "cold" if destination_tier == "hot" else "hot"
    with eng.begin() as c:  # one in progress per source tier: the earlier test's is done
        c.execute(text("UPDATE rebalance SET state = 'final' WHERE source_tier = :s"), {"s": source})
        rid = c.execute(text(
            "INSERT INTO rebalance (chain, asset, source_tier, destination_tier, state, destination, destination_index, "
            "amount, fee, change_amount, fee_rate, spendable, ceiling, target, txid, raw, broadcast_height) "
            "VALUES ('bitcoin', 'BTC', :s, :d, 'broadcast', :dest, 0, :a, :f, 0, 1000, 0, 1, 0, :t, :raw, 1) RETURNING id"),
            {"s": source, "d": destination_tier, "dest": hot if destination_tier == "hot" else STRANGER, "a": AMOUNT,
             "f": PARENT_FEE, "t": parent.txid, "raw": parent.raw}).scalar_one()
    return rid, parent.raw, 1


def refused(call, *args, **kwargs) -> str:
    with pytest.raises(SigningRefused) as err:
        call(*args, **kwargs)
    return err.value.code.value


def records(eng, parent_txid: str) -> list:
    with eng.connect() as c:
        return c.execute(text("SELECT txid, fee, replaces_txid FROM signer_cpfp WHERE parent_txid = :t ORDER BY id"),
                         {"t": parent_txid}).all()


def test_a_child_spends_the_hot_output_pays_hot_once_and_is_replaced_only_higher(db, hot):
    eng, ledger = db
    signer = Signer(eng, KEYS, bitcoin_network="regtest")
    rid, raw, vout = parent_move(eng, hot)
    parent = parse_transaction(raw)
    child = signer.sign_bitcoin_cpfp(rid, raw, vout, hot, 20_000)
    tx = CTransaction.deserialize(child.raw)
    assert_equal([(b2lx(i.prevout.hash), i.prevout.n) for i in tx.vin], [(parent.txid, vout)])
    assert_equal([(o.nValue, bytes(o.scriptPubKey)) for o in tx.vout], [(AMOUNT - 20_000, address_to_script(hot, "regtest"))])
    assert_equal(child.fee, 20_000)

    again = signer.sign_bitcoin_cpfp(rid, raw, vout, hot, 20_000)  # a lost reply: the same child, recorded once
    assert_equal(again.txid, child.txid)
    assert_equal([(r.txid, int(r.fee), r.replaces_txid) for r in records(eng, parent.txid)], [(child.txid, 20_000, None)])
    assert_equal(refused(signer.sign_bitcoin_cpfp, rid, raw, vout, hot, 30_000), "already_signed")  # one child per parent

    assert_equal(refused(signer.sign_bitcoin_cpfp, rid, raw, vout, hot, 20_000, replaces_txid="ab" * 32),
                 "replacement_unknown")
    assert_equal(refused(signer.sign_bitcoin_cpfp, rid, raw, vout, hot, 20_000, replaces_txid=child.txid),
                 "replacement_unknown")  # not higher
    second = signer.sign_bitcoin_cpfp(rid, raw, vout, hot, 40_000, replaces_txid=child.txid)
    assert_equal(CTransaction.deserialize(second.raw).vin[0].prevout.n, vout)  # the same parent output: one can be mined
    assert_equal(refused(signer.sign_bitcoin_cpfp, rid, raw, vout, hot, 60_000, replaces_txid=child.txid),
                 "already_signed")  # that child was replaced already
    third = signer.sign_bitcoin_cpfp(rid, raw, vout, hot, 60_000, replaces_txid=second.txid)
    assert_equal([(r.txid, r.replaces_txid) for r in records(eng, parent.txid)],
                 [(child.txid, None), (second.txid, child.txid), (third.txid, second.txid)])
    ledger.assert_verified()


def test_refusals(db, hot):
    eng, ledger = db
    signer = Signer(eng, KEYS, bitcoin_network="regtest", max_fee_rate_sat_per_kvb=100_000)
    rid, raw, vout = parent_move(eng, hot)
    parent = parse_transaction(raw)

    assert_equal(refused(signer.sign_bitcoin_cpfp, rid, raw, vout, STRANGER, 20_000), "output_mismatch")  # pays elsewhere
    assert_equal(refused(signer.sign_bitcoin_cpfp, rid, raw, 0, hot, 20_000), "unknown_input")  # a non-hot output
    assert_equal(refused(signer.sign_bitcoin_cpfp, rid, raw, 7, hot, 20_000), "unknown_input")  # no such output
    assert_equal(refused(signer.sign_bitcoin_cpfp, rid, parent_tx(hot).raw, vout, hot, 20_000), "unknown_input")  # not the row's
    assert_equal(refused(signer.sign_bitcoin_cpfp, rid, b"\x02\x00\x00\x00garbage", vout, hot, 20_000), "unknown_input")
    cap = fee_for(parent.vsize + estimate_vsize(1, [address_to_script(hot, "regtest")]), 100_000)
    assert_equal(refused(signer.sign_bitcoin_cpfp, rid, raw, vout, hot, cap + 1), "fee_above_ceiling")
    assert_equal(refused(signer.sign_bitcoin_cpfp, rid, raw, vout, hot, 0), "fee_above_ceiling")
    assert_equal(refused(signer.sign_bitcoin_cpfp, 10**9, raw, vout, hot, 20_000), "rebalance_not_open")
    out_rid, out_raw, out_vout = parent_move(eng, hot, destination_tier="cold")
    assert_equal(refused(signer.sign_bitcoin_cpfp, out_rid, out_raw, out_vout, hot, 20_000), "rebalance_not_open")
    with eng.begin() as c:
        set_kill_switch(c, True, "test", "test")
    try:
        assert_equal(refused(signer.sign_bitcoin_cpfp, rid, raw, vout, hot, 20_000), "kill_switch_on")
    finally:
        with eng.begin() as c:
            set_kill_switch(c, False, "test", "test")
    assert_equal(records(eng, parent.txid), [])  # nothing signed, nothing recorded
    assert signer.sign_bitcoin_cpfp(rid, raw, vout, hot, cap).fee == cap  # at the ceiling itself: signed
    with eng.connect() as c:
        codes = c.execute(text("SELECT code FROM signer_audit WHERE outcome = 'refused' AND (detail->>'rebalance_id')::bigint = "
                               "ANY(:r) ORDER BY id"), {"r": [rid, 10**9, out_rid]}).scalars().all()
    assert_equal(codes, ["output_mismatch", "unknown_input", "unknown_input", "unknown_input", "unknown_input",
                         "fee_above_ceiling", "fee_above_ceiling", "rebalance_not_open", "rebalance_not_open",
                         "kill_switch_on"])
    ledger.assert_verified()


def test_two_requests_at_once_make_one_child(db, hot):
    """Two workers asking for a first child of the same parent at once (a crash and a retry, or a
    lost job lock): the signer's advisory lock orders them; the second sees the first's record."""

    eng, _ = db
    signer = Signer(eng, KEYS, bitcoin_network="regtest")
    rid, raw, vout = parent_move(eng, hot)
    out: list = []
    def ask(fee: int) -> None:
        try:
            out.append(signer.sign_bitcoin_cpfp(rid, raw, vout, hot, fee).txid)
        except SigningRefused as exc:
            out.append(exc.code.value)
    threads = [threading.Thread(target=ask, args=(fee,)) for fee in (20_000, 25_000)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert_equal(sorted(o == "already_signed" for o in out), [False, True])
    assert_equal(len(records(eng, parse_transaction(raw).txid)), 1)
