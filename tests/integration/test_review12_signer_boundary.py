"""Review of issue 12 (R1): payouts the signer signs although no quorum approved exactly them.

Each test is a REPORT of a hole: it plays one attacker of the threat model against the real
`Signer` (in-process, its own approver registry and quorum table, as test_signed_approvals wires
it) and asserts the refusal a correct signer gives. They fail on the code as reviewed.

| test | attacker | what is signed today |
| --- | --- | --- |
| destination_script_rewritten | a database writer (custody_api/custody_worker may UPDATE withdrawal_request) | two valid approvals of destination D; the row's destination_script is changed to the attacker's; the signed transaction pays the script (the signer compares the output's script only with the column, never with the approved address) |
| replacement_after_destination_rewrite | the same | an RBF replacement of a signed batch paying a destination rewritten after signing: `_check_replacement` never looks at approvals |
| replacement_of_a_rejected_withdrawal | the same | a "replacement" for a rejected withdrawal (no approvals, hold released) whose rows are forged to look broadcast: any hot coin, any destination |
| second_signature_with_other_coins | a compromised worker | the same approved withdrawal signed twice over disjoint coins: two transactions that can both confirm |
| rebalance_to_a_rewritten_cold_xpub | a database writer (`wallet` is writable by custody roles) | a hot -> cold rebalance paying an address derived from an xpub the attacker wrote into `wallet` |

Every scenario releases what it holds (or books the capture) so the ledger verifies at the end.
"""
from __future__ import annotations

import logging
import uuid

import pytest
from sqlalchemy import text

from custody.payouts import PayoutConfig, Payouts
from custody.policy_config import default_policy
from custody.states import advance
from custody.withdrawals import HOLD_OWNER
from regtest.util import assert_equal
from signer.approvals import quorum_table_from_policy
from signer.bitcoin_tx import address_to_script
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
ATTACKER = "bcrt1que968zjtjkx890qdggg4pwjxgcmyyfy9r64a89"  # P2WPKH of sha256("attacker")[:20]: nobody of ours
COIN, FEE = 600_000_000, 2_000
FAKE_COINS: list[str] = []  # txids of the hot coins the scenarios invent (on the module's own database)


@pytest.fixture(scope="module")
def api(database_url) -> WithdrawalApi:
    """A database of this module's own: its forged batches (a fake broadcast transaction among them)
    must never reach the payout jobs of the session database, which the e2e suites share."""
    with own_database(database_url, "review12_signer") as eng:
        yield WithdrawalApi(eng)
        Ledger(eng).assert_verified()


@pytest.fixture(scope="module")
def signer(api) -> Signer:
    own = registry(api.operator_name(1), api.operator_name(2))
    return Signer(api.custody.engine, KEYS, bitcoin_network="regtest", approvers=own,
                  quorum=quorum_table_from_policy(default_policy()))


def new_coin() -> BtcCoin:
    FAKE_COINS.append(uuid.uuid4().hex * 2)
    return BtcCoin(FAKE_COINS[-1], 0, COIN, 0, 0)


def approved_withdrawal(api: WithdrawalApi, amount: str = "5") -> int:
    """A 5 BTC withdrawal approved by both operators with valid signatures over its payload."""
    acct = api.open_customer(f"r12-{uuid.uuid4().hex[:8]}")
    w = api.withdraw(acct, amount)
    assert_equal(w["state"], "pending_approval")
    assert_equal(api.approve(1, w["id"]).json()["state"], "pending_approval")
    assert_equal(api.approve(2, w["id"]).json()["state"], "approved")
    return int(w["id"])


def batch_of(api: WithdrawalApi, signer: Signer, wid: int, n_coins: int = 1) -> tuple[int, list[BtcCoin]]:
    """Batch `wid` as the batcher does: a batch, its output, `n_coins` hot coins reserved for it."""
    with api.custody.engine.begin() as c:
        batch = c.execute(text("INSERT INTO withdrawal_batch (chain, asset, state, fee_rate) "
                               "VALUES ('bitcoin', 'BTC', 'open', 1000) RETURNING id")).scalar_one()
        advance(c, "withdrawal", wid, "approved", "batched", batch_id=batch)
        c.execute(text("INSERT INTO batch_output (batch_id, withdrawal_id, amount) SELECT :b, id, amount "
                       "FROM withdrawal_request WHERE id = :w"), {"b": batch, "w": wid})
        coins = [new_coin() for _ in range(n_coins)]
        for k in coins:
            c.execute(text("INSERT INTO wallet_utxo (txid, vout, address, derivation_change, derivation_index, amount, reserved_by) "
                           "VALUES (:t, 0, :a, 0, 0, :m, :b)"), {"t": k.txid, "a": signer._hot_address(0, 0), "m": COIN, "b": batch})
    return batch, coins


def row_of(api: WithdrawalApi, wid: int):
    with api.custody.engine.connect() as c:
        return c.execute(text("SELECT destination, destination_script, amount, hold_id, state FROM withdrawal_request "
                              "WHERE id = :w"), {"w": wid}).one()


def outcome(call) -> tuple[str, object]:
    try:
        signed = call()
    except SigningRefused as refused:
        log.info("signer refused: %s", refused)
        return refused.code.value, None
    log.info("signer signed %s", signed.txid)
    return "signed", signed


def release(api: WithdrawalApi, wid: int) -> None:
    """Cleanup: give the held money back (if still held) and take the withdrawal out of the way."""
    with api.custody.engine.begin() as c:
        hold = c.execute(text("SELECT w.hold_id FROM withdrawal_request w JOIN hold h ON h.id = w.hold_id "
                              "WHERE w.id = :w AND h.state = 'pending'"), {"w": wid}).scalar()
        if hold is not None:
            api.custody.ledger.release_hold(hold, owner=HOLD_OWNER, conn=c)
        c.execute(text("UPDATE withdrawal_request SET state = 'rejected', reject_reasons = '{test_cleanup}' WHERE id = :w "
                       "AND state IN ('approved', 'batched', 'pending_approval')"), {"w": wid})


def test_destination_script_rewritten_after_approval_is_refused(api, signer, ledger):
    wid = approved_withdrawal(api)
    batch, [coin] = batch_of(api, signer, wid)
    attacker_script = address_to_script(ATTACKER, "regtest")
    log.info("after two valid approvals only destination_script is rewritten; destination (what was signed) stays")
    with api.custody.engine.begin() as c:
        c.execute(text("UPDATE withdrawal_request SET destination_script = :s WHERE id = :w"), {"s": attacker_script, "w": wid})
    row = row_of(api, wid)
    amount = int(row.amount)
    code, signed = outcome(lambda: signer.sign_bitcoin_batch(
        batch, [coin], [BatchOutput(wid, row.destination, amount, bytes(row.destination_script))],
        (signer._hot_address(1, batch), COIN - amount - FEE)))
    release(api, wid)
    if signed is not None:
        assert attacker_script in signed.raw  # the transaction pays the attacker, not the approved address
    # the script must be the approved destination's own script (either code says so)
    assert code in ("output_mismatch", "approval_payload_mismatch"), code


def record_signed(api: WithdrawalApi, signer: Signer, batch: int, wid: int, signed, coins) -> int:
    """What custody's payouts do after a signature: the chain_transaction row, the captured hold,
    the coins spent by it (Payouts._record_signed itself)."""
    payouts = Payouts(api.custody.engine, api.custody.ledger, api.custody.wallets, {}, signer, PayoutConfig(bitcoin_network="regtest"))
    with api.custody.engine.begin() as c:
        rows = payouts._batch_outputs(c, batch)
        tx = payouts._record_signed(c, batch, "bitcoin", signed.txid, signed.raw, signed.fee, 1000, rows)
        for k in coins:
            c.execute(text("UPDATE wallet_utxo SET spent_by = :s WHERE txid = :t AND vout = :v"), {"s": tx, "t": k.txid, "v": k.vout})
    return tx


def test_replacement_after_destination_rewrite_is_refused(api, signer, ledger):
    wid = approved_withdrawal(api)
    batch, [coin] = batch_of(api, signer, wid)
    row = row_of(api, wid)
    amount = int(row.amount)
    change = (signer._hot_address(1, batch), COIN - amount - FEE)
    code, first = outcome(lambda: signer.sign_bitcoin_batch(
        batch, [coin], [BatchOutput(wid, row.destination, amount, bytes(row.destination_script))], change))
    assert_equal(code, "signed")
    record_signed(api, signer, batch, wid, first, [coin])  # the hold is captured: the ledger is booked
    attacker_script = address_to_script(ATTACKER, "regtest")
    log.info("batch %d is signed; the withdrawal's destination is rewritten, then a fee bump is asked for", batch)
    with api.custody.engine.begin() as c:
        c.execute(text("UPDATE withdrawal_request SET destination = :d, destination_script = :s WHERE id = :w"),
                  {"d": ATTACKER, "s": attacker_script, "w": wid})
    code, bumped = outcome(lambda: signer.sign_bitcoin_replacement(
        batch, first.txid, [coin], [BatchOutput(wid, ATTACKER, amount, attacker_script)], (change[0], change[1] - 1000)))
    if bumped is not None:
        assert attacker_script in bumped.raw
    assert code != "signed", "an RBF replacement paying a destination no approver signed was signed"


def test_replacement_of_a_rejected_withdrawal_is_refused(api, signer, ledger):
    acct = api.open_customer(f"r12-{uuid.uuid4().hex[:8]}")
    w = api.withdraw(acct, "5", ATTACKER)
    wid = int(w["id"])
    assert_equal(w["state"], "pending_approval")  # needs two operators; nobody approves
    api.custody.withdrawals.reject(wid, operator="op-cleanup", comment="review12: rejected, hold released")
    hot = signer._hot_address(0, 0)
    log.info("rows forged so rejected withdrawal %d looks broadcast in batch X, spending a fresh hot coin", wid)
    with api.custody.engine.begin() as c:
        batch = c.execute(text("INSERT INTO withdrawal_batch (chain, asset, state, fee_rate) "
                               "VALUES ('bitcoin', 'BTC', 'broadcast', 1000) RETURNING id")).scalar_one()
        c.execute(text("UPDATE withdrawal_request SET state = 'broadcast', batch_id = :b WHERE id = :w"), {"b": batch, "w": wid})
        c.execute(text("INSERT INTO batch_output (batch_id, withdrawal_id, amount) VALUES (:b, :w, 500000000)"), {"b": batch, "w": wid})
        fake = "ab" * 32
        tx = c.execute(text("INSERT INTO chain_transaction (batch_id, chain, txid, raw, fee, state) "
                            "VALUES (:b, 'bitcoin', :t, '\\x00', 0, 'broadcast') RETURNING id"), {"b": batch, "t": fake}).scalar_one()
        coin = new_coin()
        c.execute(text("INSERT INTO wallet_utxo (txid, vout, address, derivation_change, derivation_index, amount, reserved_by, spent_by) "
                       "VALUES (:t, 0, :a, 0, 0, :m, :b, :s)"), {"t": coin.txid, "a": hot, "m": COIN, "b": batch, "s": tx})
    code, signed = outcome(lambda: signer.sign_bitcoin_replacement(
        batch, fake, [coin], [BatchOutput(wid, ATTACKER, 500_000_000, address_to_script(ATTACKER, "regtest"))],
        (signer._hot_address(1, batch), COIN - 500_000_000 - FEE)))
    with api.custody.engine.begin() as c:
        c.execute(text("UPDATE withdrawal_request SET state = 'rejected' WHERE id = :w"), {"w": wid})
    if signed is not None:
        assert address_to_script(ATTACKER, "regtest") in signed.raw
    assert code != "signed", "5 BTC to a destination nobody approved, for a rejected withdrawal, was signed"


def test_second_signature_with_other_coins_is_refused(api, signer, ledger):
    wid = approved_withdrawal(api)
    batch, (a, b) = batch_of(api, signer, wid, n_coins=2)
    row = row_of(api, wid)
    amount = int(row.amount)
    outputs = [BatchOutput(wid, row.destination, amount, bytes(row.destination_script))]
    change = (signer._hot_address(1, batch), COIN - amount - FEE)
    code, first = outcome(lambda: signer.sign_bitcoin_batch(batch, [a], outputs, change))
    assert_equal(code, "signed")
    log.info("a compromised worker does not record %s and asks again with the batch's other coin", first.txid)
    code, second = outcome(lambda: signer.sign_bitcoin_batch(batch, [b], outputs, change))
    release(api, wid)
    if second is not None:
        assert second.txid != first.txid  # two transactions with disjoint inputs: both can confirm, 10 BTC paid
    assert code != "signed", "one approved 5 BTC withdrawal was signed twice over different coins"


def test_rebalance_to_a_rewritten_cold_xpub_is_refused(api, signer, ledger):
    attacker_vpub = ATTACKER_KEYS.account_xpub("bitcoin", "cold")
    attacker_addr = signer._derive_address(attacker_vpub, 0, 0)
    with api.custody.engine.begin() as c:
        before = c.execute(text("SELECT xpub FROM wallet WHERE chain = 'bitcoin' AND tier = 'cold'")).scalar()
        log.info("the cold wallet's xpub in `wallet` is rewritten to the attacker's (was %s)", before)
        if before is None:
            c.execute(text("INSERT INTO wallet (chain, tier, network, xpub) VALUES ('bitcoin', 'cold', 'regtest', :x)"),
                      {"x": attacker_vpub})
        else:
            c.execute(text("UPDATE wallet SET xpub = :x WHERE chain = 'bitcoin' AND tier = 'cold'"), {"x": attacker_vpub})
        rebalance = c.execute(text(
            "INSERT INTO rebalance (chain, asset, source_tier, destination_tier, state, destination, destination_index, amount, "
            "fee, fee_rate, spendable, ceiling, target) VALUES ('bitcoin', 'BTC', 'hot', 'cold', 'open', :d, 0, :m, :f, 1000, "
            ":m, 0, 0) RETURNING id"), {"d": attacker_addr, "m": COIN - FEE, "f": FEE}).scalar_one()
        coin = new_coin()
        c.execute(text("INSERT INTO wallet_utxo (txid, vout, address, derivation_change, derivation_index, amount, rebalance_id) "
                       "VALUES (:t, 0, :a, 0, 0, :m, :r)"), {"t": coin.txid, "a": signer._hot_address(0, 0), "m": COIN, "r": rebalance})
    try:
        code, signed = outcome(lambda: signer.sign_bitcoin_rebalance(rebalance, [coin], attacker_addr, COIN - FEE, None))
    finally:
        with api.custody.engine.begin() as c:
            if before is None:
                c.execute(text("DELETE FROM wallet WHERE chain = 'bitcoin' AND tier = 'cold'"))
            else:
                c.execute(text("UPDATE wallet SET xpub = :x WHERE chain = 'bitcoin' AND tier = 'cold'"), {"x": before})
            c.execute(text("UPDATE rebalance SET state = 'failed' WHERE id = :r"), {"r": rebalance})
    if signed is not None:
        assert address_to_script(attacker_addr, "regtest") in signed.raw  # the whole coin to the attacker
    assert_equal(code, "destination_not_cold")
