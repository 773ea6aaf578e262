"""Adversarial review of the signer's ethereum sweep checks (signer.service, "Ethereum sweeps"):
findings (strict xfails until fixed; all three fixed on branch fix-ethsweep), rows written directly
as a database writer with the worker's role could.

- R15-S1: the signer funds gas once per `sweep_id` only, and a sweep row costs a writer nothing: it
  funds a token "sweep" that has no booked deposit reserved for it, and funds one deposit address
  again and again under fresh sweep rows (each up to the fee cap, 0.1 ETH by default), each at a
  new hot nonce. The docstring's bound ("a forged row can at worst ... fund a little gas") does not
  hold; and a funding custody never recorded in `eth_gas_funding` is recorded by the deposit
  scanner as the address owner's deposit (custody.deposits `_our_gas_funding` looks the txid up
  there), so hot-wallet ether becomes a customer credit.
- R15-S2: a gas funding refuses a hot nonce the signer signed a withdrawal at, but a withdrawal is
  signed at a hot nonce the signer already gave a gas funding: two transactions of ours at one
  nonce, one of which can never be mined.
- R15-S6: a gas funding is signed at any hot nonce, even far past every nonce the signer signed
  (a gap the hot address can never fill); custody's funding allocator takes its next nonce from the
  signer's record (`_HOT_NONCE_RECORDED_SQL`), so every later funding lands behind the gap.
"""
from __future__ import annotations

import logging
import uuid
from types import SimpleNamespace

import pytest
from sqlalchemy import text

from custody.controls import kill_switch, set_kill_switch
from custody.eth_sweeps import _OPEN_FUNDINGS_SQL, EthSweeps
from custody.payouts import Payouts
from ledger.service import Ledger
from regtest.util import assert_equal
from signer.assets import SignerAsset
from signer.ethereum_tx import erc20_transfer_data
from signer.protocol import BatchOutput, SigningRefused
from signer.service import _eth_address
from tests.integration.test_review12_ethereum_signer import (AMOUNT, DEST, USDT_CONTRACT, api,  # noqa: F401 (fixture)
                                                            approved_usdt_withdrawal, release)
from tests.integration.test_signer_eth_sweeps import (CHAIN_ID, KEYS, decoded, env, finish, new_address,  # noqa: F401
                                                      sweep_row)
from tests.integration.test_signer_ethereum_record import signer_for

log = logging.getLogger(__name__)

GAS = {"gas": 21_000, "max_fee_wei": 2 * 10**9, "priority_fee_wei": 10**9}
NEED = 60_000 * 2 * 10**9  # what sweep_row's gas limit x max fee allows a funding


def test_a_deposit_address_is_funded_once_and_only_for_reserved_deposits(env):  # noqa: F811
    engine, _wallets, signer = env
    address, index = new_address(env)
    signed = []
    for n in range(3):
        sweep = sweep_row(env, address, index, nonce=n, booked=())  # a token sweep row with nothing reserved for it
        try:
            tx = signer.sign_ethereum_gas_funding(sweep, deposit_index=index, chain_id=CHAIN_ID, nonce=500 + n, value=NEED,
                                                  **GAS)
        except SigningRefused as refused:
            log.info("funding %d refused: %s", n, refused)
        else:
            assert_equal((decoded(tx.raw)["to"], decoded(tx.raw)["value"]), (address, NEED))
            signed.append(tx)
            log.info("funding %d signed: %s at hot nonce %d", n, tx.txid, tx.nonce)
        finish(engine, sweep, f"0x{10**9 + 1000 * index + n:064x}")  # the writer closes it: the address may have another
    assert len(signed) == 0, f"{len(signed)} gas fundings of {NEED} wei each signed to {address}, no deposit reserved for any"


def test_a_deposit_address_is_funded_once_per_sweep_nonce_even_with_deposits_reserved(env):  # noqa: F811
    """R15-S1, its second half: fresh rows that each reserve booked deposits (a writer can mark
    real deposits `eth_swept_by`) get one funding of the address between two sweeps the signer
    signed, not one per row."""
    engine, _wallets, signer = env
    address, index = new_address(env)
    hot = _eth_address(KEYS.private_key_for("ethereum", "hot", 0, 0))
    signed = []
    for n in range(3):
        sweep = sweep_row(env, address, index, nonce=n)  # 500 booked and reserved; (address, nonce) is UNIQUE
        with engine.connect() as c:
            nonce = int(c.execute(text("SELECT coalesce(max(nonce) + 1, 0) FROM (SELECT nonce FROM signer_signature WHERE "
                                       "chain = 'ethereum' AND lower(sender) = lower(:a) UNION ALL SELECT nonce FROM "
                                       "signer_eth_sweep WHERE kind = 'gas' AND lower(sender) = lower(:a)) n"),
                                  {"a": hot}).scalar_one())
        try:
            tx = signer.sign_ethereum_gas_funding(sweep, deposit_index=index, chain_id=CHAIN_ID, nonce=nonce, value=NEED, **GAS)
        except SigningRefused as refused:
            assert refused.code.value in ("already_signed", "nonce_gap"), refused
        else:
            signed.append(tx)
        finish(engine, sweep, f"0x{2 * 10**9 + 1000 * index + n:064x}")  # the writer closes it, never swept
    assert_equal(len(signed), 1)


@pytest.fixture(scope="module")
def usdt_signer(api):  # noqa: F811
    return signer_for(api, assets={"USDT": SignerAsset("ethereum", USDT_CONTRACT, 6)}, ethereum_chain_id=31337)


def test_a_withdrawal_is_not_signed_at_a_hot_nonce_a_gas_funding_took(api, usdt_signer):  # noqa: F811
    hot = _eth_address(KEYS.private_key_for("ethereum", "hot", 0, 0))
    nonce = 777
    with api.custody.engine.begin() as c:  # the signer's own record of a gas funding it signed at hot nonce 777
        c.execute(text("INSERT INTO signer_eth_sweep (signed_at, kind, sweep_id, chain_id, sender, nonce, destination, asset, "
                       "amount, txid) VALUES (now(), 'gas', 1, 31337, :s, :n, '0xdeposit', 'ETH', 1, '0xfunding')"),
                  {"s": hot, "n": nonce})
    wid, batch = approved_usdt_withdrawal(api)
    try:
        try:
            signed = usdt_signer.sign_ethereum_payment(
                batch, BatchOutput(wid, DEST, AMOUNT), hot_index=0, chain_id=31337, nonce=nonce, to=USDT_CONTRACT, value=0,
                data=erc20_transfer_data(DEST, AMOUNT), gas=100_000, max_fee_wei=10**9, priority_fee_wei=1)
        except SigningRefused as refused:
            assert_equal(refused.code.value, "already_signed")
            return  # fixed
        assert_equal((signed.sender, signed.nonce), (hot, nonce))
        raise AssertionError(f"withdrawal {wid} signed at hot nonce {nonce}, which gas funding 0xfunding already holds")
    finally:
        release(api, wid)


def test_the_withdrawal_allocator_skips_a_hot_nonce_a_gas_funding_took(api):  # noqa: F811
    """The allocator side of R15-S2: custody's withdrawal nonce allocator (custody.payouts) never
    hands out a hot nonce the signer recorded a gas funding at (the signer would refuse it, and the
    refusal gives the nonce back, so the batch would ask for the same one again and again)."""
    sender = "0x" + uuid.uuid4().hex + uuid.uuid4().hex[:8]
    payouts = SimpleNamespace(adapters={"ethereum": _Node()})  # the one attribute the allocator uses (no chains here)
    with api.custody.engine.begin() as c:
        c.execute(text("INSERT INTO signer_eth_sweep (signed_at, kind, sweep_id, chain_id, sender, nonce, destination, asset, "
                       "amount, txid) VALUES (now(), 'gas', 2, 31337, :s, 900, '0xdeposit', 'ETH', 1, :t)"),
                  {"s": sender, "t": f"0x{uuid.uuid4().hex * 2}"})
    with api.custody.engine.connect() as c:
        nonce = Payouts._allocate_nonce(payouts, c, sender, 31337)  # type: ignore[arg-type]
        c.rollback()
    assert_equal(nonce, 901)


class _Node:
    """The one call `EthSweeps._reserve_hot_nonce` makes of the node: the hot address's count (0, a fresh chain)."""

    def nonce(self, address: str, pending: bool = True) -> int:
        return 0


def test_a_gas_funding_is_signed_only_at_a_hot_nonce_without_a_gap(env):  # noqa: F811
    engine, wallets, signer = env
    address, index = new_address(env)
    sweep = sweep_row(env, address, index)
    far = 10**9
    try:
        tx = signer.sign_ethereum_gas_funding(sweep, deposit_index=index, chain_id=CHAIN_ID, nonce=far, value=NEED, **GAS)
    except SigningRefused as refused:
        assert_equal(refused.code.value, "nonce_gap")
        return  # fixed
    hot = _eth_address(KEYS.private_key_for("ethereum", "hot", 0, 0))
    sweeps = EthSweeps(engine, Ledger(engine), wallets, _Node(), signer, hot_address=hot, thresholds={})  # type: ignore[arg-type]
    with engine.connect() as c:
        following = sweeps._reserve_hot_nonce(c)
        c.rollback()
    log.info("funding %s signed at hot nonce %d; custody's next funding would take %d", tx.txid, tx.nonce, following)
    raise AssertionError(f"gas funding signed at hot nonce {tx.nonce} (nothing signed between); custody's next funding nonce "
                         f"is {following}, so every later funding waits behind a gap on chain")


def _open_funding(engine, sweep: int, address: str, nonce: int) -> object:
    """An open gas funding row of `sweep` at hot nonce `nonce`, as `EthSweeps.plan` writes it; read back as `sign` reads it."""
    with engine.begin() as c:
        fid = c.execute(text("INSERT INTO eth_gas_funding (sweep_id, address, nonce, amount, gas_limit, max_fee_wei, "
                             "priority_fee_wei, state) VALUES (:s, :a, :n, :v, 21000, 2000000000, 1000000000, 'open') RETURNING id"),
                        {"s": sweep, "a": address, "n": nonce, "v": NEED}).scalar_one()
        return next(r for r in c.execute(_OPEN_FUNDINGS_SQL) if r.id == fid)


def test_a_refused_funding_gives_its_hot_nonce_back_or_opens_a_critical_incident(env):  # noqa: F811
    """R15-S3 (the e2e test shows the withdrawal mined; this one both branches, row by row): the
    signer refuses a funding for good (here: another chain id than its own). Its hot nonce goes back
    to the counter when nothing was handed out after it; otherwise the hole stays and the incident
    is critical (the kill switch is released again afterwards)."""
    engine, wallets, signer = env
    hot = _eth_address(KEYS.private_key_for("ethereum", "hot", 0, 0))
    sweeps = EthSweeps(engine, Ledger(engine), wallets, _Node(), signer, hot_address=hot, thresholds={})  # type: ignore[arg-type]

    def counter() -> int:
        with engine.connect() as c:
            return int(c.execute(text("SELECT next_nonce FROM eth_nonce WHERE address = :a"), {"a": hot}).scalar_one())

    def incident(fid: int) -> str:
        with engine.connect() as c:
            return c.execute(text("SELECT severity FROM incident WHERE kind = 'eth_sweep_refused' AND detail->>'id' = :i"),
                             {"i": str(fid)}).scalar_one()

    with engine.begin() as c:
        c.execute(text("INSERT INTO eth_nonce (address, next_nonce) VALUES (:a, 0) ON CONFLICT DO NOTHING"), {"a": hot})
        n = sweeps._reserve_hot_nonce(c)  # the funding's, committed as plan commits it
    address, index = new_address(env)
    f = _open_funding(engine, sweep_row(env, address, index), address, n)
    assert_equal(sweeps._sign_funding(f, CHAIN_ID + 1), None)
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT state, nonce FROM eth_gas_funding WHERE id = :i"), {"i": f.id}).one(), ("open", None))
    assert_equal((counter(), incident(f.id)), (n, "warning"))  # the next hot transaction takes n: no gap
    assert_equal(kill_switch(engine).engaged, False)

    with engine.begin() as c:
        m = sweeps._reserve_hot_nonce(c)
        sweeps._reserve_hot_nonce(c)  # a withdrawal took the nonce after it before the signer answered
    other, other_index = new_address(env)
    g = _open_funding(engine, sweep_row(env, other, other_index), other, m)
    try:
        assert_equal(sweeps._sign_funding(g, CHAIN_ID + 1), None)
        with engine.connect() as c:
            assert_equal(int(c.execute(text("SELECT nonce FROM eth_gas_funding WHERE id = :i"), {"i": g.id}).scalar_one()), m)
        assert_equal((counter(), incident(g.id)), (m + 2, "critical"))
        assert_equal(kill_switch(engine).engaged, True)
    finally:
        with engine.begin() as c:
            set_kill_switch(c, False, "test_review15: the refused fundings' test is over", "test")
