"""Review 16 (R2): the signer's CPFP fee ceiling is computed from the parent's vsize as read from
the bytes custody sends. The txid excludes the witness, so the real parent with a padded witness
has the same txid and a much larger vsize: the ceiling grows with the padding (bounded only by
sign_batch's absolute 10,000 sat/vB sanity limit on the child itself)."""
from __future__ import annotations

import pytest

from signer.bitcoin_tx import address_to_script, estimate_vsize, fee_for, parse_transaction
from signer.errors import SignerError, SignerErrorCode
from signer.protocol import SigningRefused
from signer.service import Signer
from tests.integration.test_signer_cpfp import AMOUNT, KEYS, PARENT_FEE, db, hot, parent_move  # noqa: F401 - fixtures

RATE = 100_000  # sat/kvB: 100 sat/vB ceiling


def _varint(n: int) -> bytes:
    if n < 0xFD:
        return bytes([n])
    if n <= 0xFFFF:
        return b"\xfd" + n.to_bytes(2, "little")
    return b"\xfe" + n.to_bytes(4, "little")


def padded(raw: bytes, pad: int) -> bytes:
    """The same transaction (same txid) with its one input's witness replaced by one item of `pad` bytes."""
    tx = parse_transaction(raw)
    assert raw[4:6] == b"\x00\x01"
    body_and_witness = raw[6:-4]
    # the body's end: the shortest prefix that parses with an empty witness to the same txid
    for body_len in range(len(body_and_witness)):
        cand = raw[:4] + b"\x00\x01" + body_and_witness[:body_len] + _varint(1) + _varint(0) + raw[-4:]
        try:
            if parse_transaction(cand).txid == tx.txid:
                break
        except Exception:  # noqa: BLE001
            continue
    else:
        raise AssertionError("no body found")
    out = raw[:4] + b"\x00\x01" + body_and_witness[:body_len] + _varint(1) + _varint(pad) + b"\x00" * pad + raw[-4:]
    assert parse_transaction(out).txid == tx.txid
    return out


def test_cpfp_fee_ceiling_is_not_raised_by_a_padded_parent_witness(db, hot):  # noqa: F811
    eng, ledger = db
    signer = Signer(eng, KEYS, bitcoin_network="regtest", max_fee_rate_sat_per_kvb=RATE)
    rid, raw, vout = parent_move(eng, hot)
    parent = parse_transaction(raw)
    cap = fee_for(parent.vsize + estimate_vsize(1, [address_to_script(hot, "regtest")]), RATE)
    fat = padded(raw, 8_000_000)  # +2,000,000 vB of witness nobody checks
    assert parse_transaction(fat).txid == parent.txid
    # sign_batch's own sanity limit (10,000 sat/vB over the child alone, ~110 vB) still bounds it
    burn = 1_000_000  # 0.01 BTC of fee per parent output, ~38x the ceiling the real parent allows
    assert burn > 30 * cap
    try:
        child = signer.sign_bitcoin_cpfp(rid, fat, vout, hot, burn)
    except SigningRefused as exc:
        assert exc.code.value == "fee_above_ceiling"
    else:
        pytest.fail(f"signed a child paying {child.fee} sat of fee; the ceiling for the real parent is {cap}")
    ledger.assert_verified()


class _StuckChain:
    """The node as the CPFP job asks it: the tip far past the parent's broadcast, the parent in the
    mempool, as the node holds it: `parent` (its real bytes) paying `fee` sat."""

    def __init__(self, parent: bytes, fee: int = PARENT_FEE) -> None:
        self.parent, self.fee = parent, fee

    def mempool_entry(self, txid):
        parsed = parse_transaction(self.parent)
        return type("Entry", (), {"txid": txid, "vsize": parsed.vsize, "fee": self.fee})() if parsed.txid == txid else None

    def raw_transaction(self, txid):
        return self.parent if parse_transaction(self.parent).txid == txid else None

    def tip(self):
        return type("Tip", (), {"height": 1_000})()

    def tx_status(self, txid, raw=None):
        from chain_adapters.base import TxState, TxStatus
        return TxStatus(txid, TxState.MEMPOOL)


def ours(eng, rid: int, raw: bytes, tier: str = "cold") -> None:
    """What the worker holds for a real move of ours from `tier` into hot: the coins the parent
    spends in the wallet index (`tier`), and the parent as a version of the row it recorded before
    sending it (firm_tx_version). Without them the CPFP job asks for no child at all (R2-4)."""
    from bitcoin.core import CTransaction, b2lx
    from sqlalchemy import text
    parent = parse_transaction(raw)
    with eng.begin() as c:
        for txid, vout in [(b2lx(i.prevout.hash), i.prevout.n) for i in CTransaction.deserialize(raw).vin]:
            c.execute(text("INSERT INTO btc_wallet_output (txid, vout, address, tier, derivation_change, derivation_index, "
                           "amount, block_height, block_hash) VALUES (:t, :v, 'a-coin-of-ours', :tier, 0, 0, :a, 1, :b)"),
                      {"t": txid, "v": vout, "tier": tier, "a": AMOUNT + 50_000 + PARENT_FEE, "b": "00" * 32})
        c.execute(text("INSERT INTO firm_tx_version (machine, row_id, txid, raw, fee, fee_rate) "
                       "VALUES ('rebalance', :r, :t, :raw, :f, 1000)"), {"r": rid, "t": parent.txid, "raw": raw, "f": PARENT_FEE})


def test_api_rewrite_of_a_stuck_parent_makes_the_worker_burn_hot_coins_in_fees(db, hot):  # noqa: F811
    from custody.cpfp import _PARENTS_SQL, Cpfp
    from custody.firm_moves import BumpConfig
    from custody.wallets import Wallets
    from sqlalchemy import text

    eng, ledger = db
    signer = Signer(eng, KEYS, bitcoin_network="regtest")  # default ceiling 500 sat/vB
    rid, raw, vout = parent_move(eng, hot)  # a legitimately stuck cold -> hot move
    ours(eng, rid, raw)
    hot_script = address_to_script(hot, "regtest")
    real_cap = fee_for(parse_transaction(raw).vsize + estimate_vsize(1, [hot_script]), signer.max_fee_rate_sat_per_kvb)
    # custody_api's grant: rebalance UPDATE (state, containment, updated_at, txid, raw, fee); same txid, padded witness
    with eng.begin() as c:
        c.execute(text("SET LOCAL ROLE custody_api"))
        c.execute(text("UPDATE rebalance SET raw = :raw, fee = 1800000 WHERE id = :r"),
                  {"raw": padded(raw, 400_000), "r": rid})
    cpfp = Cpfp(eng, ledger, Wallets(eng, ledger), _StuckChain(raw), signer, hot_address=hot, network="regtest",
                bump=BumpConfig())
    with eng.connect() as c:
        [r] = [p for p in c.execute(_PARENTS_SQL).all() if p.id == rid]
    try:
        cpfp._first_child(r)
    except SigningRefused:
        pass
    with eng.connect() as c:
        fees = [int(f) for f in c.execute(text("SELECT fee FROM rebalance_cpfp WHERE rebalance_id = :r"), {"r": rid}).scalars()]
    assert all(f <= real_cap for f in fees), f"child fee {fees} sat; the real parent allows at most {real_cap}"
    assert len(fees) == 1, "the real stuck parent (the node's bytes and fee) gets its child"
    ledger.assert_verified()


class _FailingSigner:
    """A signer whose CPFP signing raises SignerError (as sign_batch's own absolute rate limit,
    `fee_exceeds_maximum`, does instead of a refusal)."""

    def __init__(self, signer: Signer) -> None:
        self.signer = signer

    def sign_bitcoin_cpfp(self, *args, **kwargs):
        raise SignerError(SignerErrorCode.FEE_EXCEEDS_MAXIMUM, "fee above the absolute sanity limit")


def test_a_signer_error_is_contained_to_its_parent_not_a_crash_of_the_cpfp_job(db, hot):  # noqa: F811
    """R2-3: a SignerError from the signer (not a SigningRefused) escaped Cpfp.bump_fees and stopped
    every later parent, on every run. Now it is recorded for its parent, with a warning incident."""
    from custody.controls import kill_switch
    from custody.cpfp import Cpfp
    from custody.firm_moves import BumpConfig
    from custody.wallets import Wallets
    from sqlalchemy import text

    eng, ledger = db
    signer = _FailingSigner(Signer(eng, KEYS, bitcoin_network="regtest"))
    rid, raw, vout = parent_move(eng, hot)
    ours(eng, rid, raw)
    cpfp = Cpfp(eng, ledger, Wallets(eng, ledger), _StuckChain(raw), signer, hot_address=hot, network="regtest",
                bump=BumpConfig())
    assert cpfp.bump_fees() == []  # contained: the job goes on
    assert (rid, "fee_exceeds_maximum") in cpfp.refusals
    with eng.connect() as c:
        kinds = c.execute(text("SELECT kind, severity FROM incident WHERE detail->>'rebalance_id' = :r"),
                          {"r": str(rid)}).all()
        assert c.execute(text("SELECT count(*) FROM rebalance_cpfp WHERE rebalance_id = :r"), {"r": rid}).scalar_one() == 0
    assert [(k.kind, k.severity) for k in kinds] == [("cpfp_signer_error", "warning")]
    assert not kill_switch(eng).engaged
    ledger.assert_verified()


def test_a_rebalance_row_inserted_by_the_api_role_gets_no_child(db, hot):  # noqa: F811
    from custody.cpfp import _PARENTS_SQL, Cpfp
    from custody.firm_moves import BumpConfig
    from custody.wallets import Wallets
    from sqlalchemy import text

    from tests.integration.test_signer_cpfp import parent_tx

    eng, ledger = db
    signer = Signer(eng, KEYS, bitcoin_network="regtest")
    sweep = parent_tx(hot)  # stands for a deposit sweep in the mempool: output 1 pays the hot receive address
    with eng.begin() as c:
        c.execute(text("UPDATE rebalance SET state = 'final' WHERE source_tier = 'cold'"))
        c.execute(text("SET LOCAL ROLE custody_api"))  # its grant: rebalance INSERT (any column), no trigger
        rid = c.execute(text(
            "INSERT INTO rebalance (chain, asset, source_tier, destination_tier, state, destination, destination_index, "
            "amount, fee, change_amount, fee_rate, spendable, ceiling, target, txid, raw, broadcast_height) "
            "VALUES ('bitcoin', 'BTC', 'cold', 'hot', 'broadcast', :d, 0, :a, 300, 0, 1000, 0, 1, 0, :t, :raw, 1) RETURNING id"),
            {"d": hot, "a": AMOUNT, "t": sweep.txid, "raw": sweep.raw}).scalar_one()
    cpfp = Cpfp(eng, ledger, Wallets(eng, ledger), _StuckChain(sweep.raw), signer, hot_address=hot, network="regtest",
                bump=BumpConfig())
    with eng.connect() as c:
        [r] = [p for p in c.execute(_PARENTS_SQL).all() if p.id == rid]
    try:
        cpfp._first_child(r)
    except SigningRefused:
        pass
    with eng.connect() as c:
        children = c.execute(text("SELECT txid, fee FROM rebalance_cpfp WHERE rebalance_id = :r"), {"r": rid}).all()
    assert children == [], f"a child of a transaction no rebalance made was signed: {children}"
    assert (rid, "unknown_input") in cpfp.refusals
    ledger.assert_verified()
