"""signer_signatures: the signer's own record of what it signed (`signer_signature`, migration 0021)
decides what it signs again, and its own configuration decides where a rebalance may go.

| scenario | expected |
| --- | --- |
| re-sign after a crash: the same batch, the same coins, nothing recorded by custody | signed again, the same txid, a second record |
| fee bump of the signer's own version: the same coins and outputs, a lower change | signed; its record names the version it replaces |
| fee bump spending another coin set than the version it replaces | `replacement_unknown` |
| fee bump after the decision expired (the version replaced was signed while it was live) | signed: expiry is not re-checked for a replacement |
| two requests for one withdrawal over disjoint coins, at the same moment | exactly one signed, the other `already_signed` (the advisory lock serialises them) |
| withdrawals with no approval beyond the signer's `unapproved_limits` window cap | `unapproved_limit_reached`; signed again once the window has passed |
| a rebalance to the cold key PINNED in the signer's config, while `wallet` names an attacker's | the attacker's address `destination_not_cold`; the pinned one signed |

Each scenario invents its hot coins (deleted when the module ends) and releases what it holds, so
the ledger verifies at the end.
"""
from __future__ import annotations

import datetime as dt
import logging
import threading
import uuid

import pytest
from sqlalchemy import text

import signer.service as service_module
from custody.payouts import PayoutConfig, Payouts
from custody.policy_config import default_policy
from custody.states import advance
from custody.withdrawals import HOLD_OWNER
from regtest.util import assert_equal
from signer.approvals import quorum_table_from_policy
from signer.assets import UnapprovedLimit
from signer.keys import Secret, SignerKeys, seed_from_text
from signer.protocol import BatchOutput, BtcCoin, SigningRefused
from signer.service import Signer
from tests.approvers import registry
from tests.integration.own_database import own_database
from ledger.service import Ledger
from tests.integration.withdrawal_api import WithdrawalApi

log = logging.getLogger(__name__)
KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
ATTACKER_KEYS = SignerKeys(seed_from_text(Secret("zoo " * 11 + "wrong")), "regtest")
COIN, FEE = 600_000_000, 2_000
FAKE_COINS: list[str] = []


class Clock:
    def __init__(self, offset: dt.timedelta = dt.timedelta(0)) -> None:
        self.now = dt.datetime.now(dt.timezone.utc) + offset

    def __call__(self) -> dt.datetime:
        return self.now


@pytest.fixture(scope="module")
def api(database_url) -> WithdrawalApi:
    """A database of these modules' own: they invent hot coins, sign batches nobody broadcasts and
    sign unapproved value under a cap, none of which the session database's payout jobs (the e2e
    suites share it) or other scenarios' caps may see."""
    with own_database(database_url, "signer_sigs") as eng:
        yield WithdrawalApi(eng)
        Ledger(eng).assert_verified()


def make_signer(api: WithdrawalApi, **kw) -> Signer:
    return Signer(api.custody.engine, KEYS, bitcoin_network="regtest",
                  approvers=registry(api.operator_name(1), api.operator_name(2)),
                  quorum=quorum_table_from_policy(default_policy()), **kw)


@pytest.fixture(scope="module")
def signer(api) -> Signer:
    return make_signer(api, clock=Clock())


def new_coin() -> BtcCoin:
    FAKE_COINS.append(uuid.uuid4().hex * 2)
    return BtcCoin(FAKE_COINS[-1], 0, COIN, 0, 0)


def withdrawal(api: WithdrawalApi, amount: str = "5") -> int:
    """A withdrawal of `amount` BTC; 5 BTC needs (and gets) both operators' valid signatures."""
    acct = api.open_customer(f"sig-{uuid.uuid4().hex[:8]}")
    w = api.withdraw(acct, amount)
    if w["state"] == "pending_approval":
        api.approve(1, w["id"])
        api.approve(2, w["id"])
    assert_equal(api.custody.withdrawals.get(int(w["id"])).state, "approved")
    return int(w["id"])


def batch_of(api: WithdrawalApi, signer: Signer, wids: list[int], n_coins: int = 1) -> tuple[int, list[BtcCoin]]:
    with api.custody.engine.begin() as c:
        batch = c.execute(text("INSERT INTO withdrawal_batch (chain, asset, state, fee_rate) "
                               "VALUES ('bitcoin', 'BTC', 'open', 1000) RETURNING id")).scalar_one()
        for wid in wids:
            advance(c, "withdrawal", wid, "approved", "batched", batch_id=batch)
            c.execute(text("INSERT INTO batch_output (batch_id, withdrawal_id, amount) SELECT :b, id, amount "
                           "FROM withdrawal_request WHERE id = :w"), {"b": batch, "w": wid})
        coins = [new_coin() for _ in range(n_coins)]
        for k in coins:
            c.execute(text("INSERT INTO wallet_utxo (txid, vout, address, derivation_change, derivation_index, amount, reserved_by) "
                           "VALUES (:t, 0, :a, 0, 0, :m, :b)"), {"t": k.txid, "a": signer._hot_address(0, 0), "m": COIN, "b": batch})
    return batch, coins


def outputs_of(api: WithdrawalApi, wids: list[int]) -> list[BatchOutput]:
    with api.custody.engine.connect() as c:
        rows = c.execute(text("SELECT id, destination, destination_script, amount FROM withdrawal_request WHERE id = ANY(:w) "
                              "ORDER BY id"), {"w": wids}).all()
    return [BatchOutput(r.id, r.destination, int(r.amount), bytes(r.destination_script)) for r in rows]


def outcome(call) -> tuple[str, object]:
    try:
        signed = call()
    except SigningRefused as refused:
        log.info("signer refused: %s", refused)
        return refused.code.value, None
    log.info("signer signed %s", signed.txid)
    return "signed", signed


def records(api: WithdrawalApi, wid: int) -> list:
    with api.custody.engine.connect() as c:
        return c.execute(text("SELECT batch_id, txid, replaces_txid, inputs, approvals FROM signer_signature "
                              "WHERE withdrawal_id = :w ORDER BY id"), {"w": wid}).all()


def release(api: WithdrawalApi, *wids: int) -> None:
    with api.custody.engine.begin() as c:
        for wid in wids:
            hold = c.execute(text("SELECT w.hold_id FROM withdrawal_request w JOIN hold h ON h.id = w.hold_id "
                                  "WHERE w.id = :w AND h.state = 'pending'"), {"w": wid}).scalar()
            if hold is not None:
                api.custody.ledger.release_hold(hold, owner=HOLD_OWNER, conn=c)
            c.execute(text("UPDATE withdrawal_request SET state = 'rejected', reject_reasons = '{test_cleanup}' WHERE id = :w "
                           "AND state IN ('approved', 'batched', 'pending_approval')"), {"w": wid})


def book_signed(api: WithdrawalApi, signer: Signer, batch: int, signed, coins) -> None:
    """What custody's payouts do after a signature: store it, capture the holds, mark the coins spent."""
    payouts = Payouts(api.custody.engine, api.custody.ledger, api.custody.wallets, {}, signer, PayoutConfig(bitcoin_network="regtest"))
    with api.custody.engine.begin() as c:
        tx = payouts._record_signed(c, batch, "bitcoin", signed.txid, signed.raw, signed.fee, 1000, payouts._batch_outputs(c, batch))
        for k in coins:
            c.execute(text("UPDATE wallet_utxo SET spent_by = :s WHERE txid = :t AND vout = :v"), {"s": tx, "t": k.txid, "v": k.vout})


def test_resign_after_a_crash_and_fee_bumps_of_the_signers_own_version(api, signer, ledger):
    wid = withdrawal(api)
    batch, (a, b) = batch_of(api, signer, [wid], n_coins=2)
    outs = outputs_of(api, [wid])
    change = (signer._hot_address(1, batch), 2 * COIN - outs[0].amount - FEE)
    code, first = outcome(lambda: signer.sign_bitcoin_batch(batch, [a, b], outs, change))
    assert_equal(code, "signed")
    log.info("custody dies before storing it; the next run asks again with the same coins: the same transaction")
    code, again = outcome(lambda: signer.sign_bitcoin_batch(batch, [a, b], outs, change))
    assert_equal((code, again.txid), ("signed", first.txid))
    book_signed(api, signer, batch, again, [a, b])

    log.info("a fee bump spending one coin only (another coin set than the version replaced) is refused")
    code, _ = outcome(lambda: signer.sign_bitcoin_replacement(batch, first.txid, [a], outs, (change[0], COIN - outs[0].amount - 5_000)))
    assert_equal(code, "replacement_unknown")
    log.info("the decision expires; a fee bump of the same coins and outputs is still signed")
    signer.clock.now += dt.timedelta(days=30)
    try:
        code, bumped = outcome(lambda: signer.sign_bitcoin_replacement(batch, first.txid, [a, b], outs, (change[0], change[1] - 3_000)))
        assert_equal(code, "signed")
        assert_equal(bumped.fee, FEE + 3_000)
        log.info("... and a bump of that bump")
        code, _ = outcome(lambda: signer.sign_bitcoin_replacement(batch, bumped.txid, [a, b], outs, (change[0], change[1] - 9_000)))
        assert_equal(code, "signed")
    finally:
        signer.clock.now -= dt.timedelta(days=30)
    rows = records(api, wid)
    assert_equal([(r.txid, r.replaces_txid) for r in rows[:3]], [(first.txid, None), (first.txid, None), (bumped.txid, first.txid)])
    assert_equal({frozenset(r.inputs) for r in rows}, {frozenset({f"{a.txid}:0", f"{b.txid}:0"})})
    assert_equal({r.approvals for r in rows}, {2})


def test_two_concurrent_requests_for_one_withdrawal_sign_once(api, signer, ledger, monkeypatch):
    wid = withdrawal(api)
    batch, (a, b) = batch_of(api, signer, [wid], n_coins=2)
    outs = outputs_of(api, [wid])
    change = (signer._hot_address(1, batch), COIN - outs[0].amount - FEE)
    meet = threading.Barrier(2, timeout=3)
    real = service_module.sign_batch

    def sign_after_both_checked(*args, **kw):  # without the lock both requests pass their checks and meet here
        try:
            meet.wait()
        except threading.BrokenBarrierError:
            pass
        return real(*args, **kw)

    monkeypatch.setattr(service_module, "sign_batch", sign_after_both_checked)
    results: dict[str, str] = {}
    threads = [threading.Thread(target=lambda k=k: results.__setitem__(k.txid, outcome(
        lambda: signer.sign_bitcoin_batch(batch, [k], outs, change))[0])) for k in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    release(api, wid)
    assert_equal(sorted(results.values()), ["already_signed", "signed"])
    assert_equal(len(records(api, wid)), 1)


def test_value_signed_without_approvals_is_capped_per_window(api, ledger):
    # The cap counts every unapproved BTC signature in its window, other tests' too (one session
    # database): this signer's clock runs five hours back, where no other scenario signs.
    clock = Clock(-dt.timedelta(hours=5))
    capped = make_signer(api, clock=clock, unapproved_limits={"BTC": UnapprovedLimit(25_000_000, 3_600)})
    small = [withdrawal(api, "0.1") for _ in range(3)]  # auto-approved: no approval needed below 0.5 BTC
    signed = []
    for wid in small[:2]:
        batch, coins = batch_of(api, capped, [wid])
        outs = outputs_of(api, [wid])
        code, tx = outcome(lambda: capped.sign_bitcoin_batch(batch, coins, outs, (capped._hot_address(1, batch), COIN - outs[0].amount - FEE)))
        assert_equal(code, "signed")
        signed.append((batch, coins, outs, tx))
    log.info("0.2 BTC signed without approvals within the hour; 0.1 more would pass the 0.25 cap")
    batch, coins = batch_of(api, capped, [small[2]])
    outs = outputs_of(api, [small[2]])
    change = (capped._hot_address(1, batch), COIN - outs[0].amount - FEE)
    assert_equal(outcome(lambda: capped.sign_bitcoin_batch(batch, coins, outs, change))[0], "unapproved_limit_reached")
    log.info("a re-sign of one already counted is not counted twice")
    b0, c0, o0, t0 = signed[0]
    code, again = outcome(lambda: capped.sign_bitcoin_batch(b0, c0, o0, (capped._hot_address(1, b0), COIN - o0[0].amount - FEE)))
    assert_equal((code, again.txid), ("signed", t0.txid))
    log.info("an hour later the window has room again")
    clock.now += dt.timedelta(seconds=3_601)
    assert_equal(outcome(lambda: capped.sign_bitcoin_batch(batch, coins, outs, change))[0], "signed")
    assert_equal([r.approvals for r in records(api, small[2])], [0])
    release(api, *small)


def test_a_rebalance_pays_only_the_cold_key_pinned_in_the_signers_config(api, ledger):
    pinned = KEYS.account_xpub("bitcoin", "cold")
    honest = make_signer(api, cold_xpubs={"bitcoin": pinned})
    attacker_vpub = ATTACKER_KEYS.account_xpub("bitcoin", "cold")
    index = uuid.uuid4().int % 2**31  # a fresh index: rebalance destinations are unique in the session database
    attacker_addr, cold_addr = honest._derive_address(attacker_vpub, 0, index), honest._derive_address(pinned, 0, index)
    with api.custody.engine.begin() as c:
        before = c.execute(text("SELECT xpub FROM wallet WHERE chain = 'bitcoin' AND tier = 'cold'")).scalar()
        if before is None:
            c.execute(text("INSERT INTO wallet (chain, tier, network, xpub) VALUES ('bitcoin', 'cold', 'regtest', :x)"),
                      {"x": attacker_vpub})
        else:
            c.execute(text("UPDATE wallet SET xpub = :x WHERE chain = 'bitcoin' AND tier = 'cold'"), {"x": attacker_vpub})
    rebalances = {}
    try:
        for name, destination in (("attacker", attacker_addr), ("pinned", cold_addr)):
            with api.custody.engine.begin() as c:
                rid = c.execute(text(
                    "INSERT INTO rebalance (chain, asset, source_tier, destination_tier, state, destination, destination_index, "
                    "amount, fee, fee_rate, spendable, ceiling, target) VALUES ('bitcoin', 'BTC', 'hot', 'cold', 'open', :d, :i, "
                    ":m, :f, 1000, :m, 0, 0) RETURNING id"), {"d": destination, "i": index, "m": COIN - FEE, "f": FEE}).scalar_one()
                coin = new_coin()
                c.execute(text("INSERT INTO wallet_utxo (txid, vout, address, derivation_change, derivation_index, amount, "
                               "rebalance_id) VALUES (:t, 0, :a, 0, 0, :m, :r)"),
                          {"t": coin.txid, "a": honest._hot_address(0, 0), "m": COIN, "r": rid})
            rebalances[name] = outcome(lambda: honest.sign_bitcoin_rebalance(rid, [coin], destination, COIN - FEE, None))[0]
            with api.custody.engine.begin() as c:
                c.execute(text("UPDATE rebalance SET state = 'abandoned' WHERE id = :r"), {"r": rid})
    finally:
        with api.custody.engine.begin() as c:
            if before is None:
                c.execute(text("DELETE FROM wallet WHERE chain = 'bitcoin' AND tier = 'cold'"))
            else:
                c.execute(text("UPDATE wallet SET xpub = :x WHERE chain = 'bitcoin' AND tier = 'cold'"), {"x": before})
    assert_equal(rebalances, {"attacker": "destination_not_cold", "pinned": "signed"})
