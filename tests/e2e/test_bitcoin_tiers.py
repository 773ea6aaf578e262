"""bitcoin_tiers: the warm tier, thresholds both ways. Hot above its ceiling sends the excess to a fresh
warm address (signed by the signer, which derives the address from its own warm key); hot below its
floor opens a refill from warm that is signed only once a quorum of operators signed its approval
payload: the signer refuses it before (`rebalance_not_approved`), even with the row's own count
forged to zero and a forged approval row beside one real approval, since it verifies every
signature against its own approver keys. Each move is booked once at finality (destination location
<- source location, fee -> expense); reconciliation (deposit, hot, warm and cold lines) is zero mid-flight and
at the end, nothing is left in flight, and the ledger verifies. And a stuck hot -> warm rebalance is
fee-bumped out of its change; only the mined replacement is booked."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from chain_adapters.bitcoin import to_sat
from custody.addresses import derive_btc_address
from custody.errors import CustodyError
from custody.rebalances import RebalanceConfig, RebalanceThreshold
from regtest.util import assert_equal
from signer.service import SigningRefused
from tests.approvers import operator_client, sign_approval, signature_json
from tests.e2e.custody.conftest import BTC_FINALITY, custody, signer_keys  # noqa: F401 - the custody suite's fixtures
from tests.e2e.treasury_helpers import rebalances, reconciled, spendable  # noqa: F401 - fixture

BTC = 100_000_000


def row(engine, rebalance_id: int):
    with engine.connect() as c:
        return c.execute(text("SELECT id, source_tier, destination_tier, state, destination, destination_index, amount, fee, "
                              "change_amount, change_address, change_index, approvals_required, txid FROM rebalance WHERE id = :r"),
                         {"r": rebalance_id}).one()


def test_warm_tier_both_ways(custody, bitcoind, engine, ledger, signer_keys, rebalances, log):  # noqa: F811
    wallets, hot_address = custody.wallets, custody.payouts.hot_address("bitcoin")
    with engine.connect() as c:
        first_incident = c.execute(text("SELECT coalesce(max(id), 0) FROM incident")).scalar_one()
    warm_xpub = signer_keys.account_xpub("bitcoin", "warm")
    wallets.register_wallet("bitcoin", "warm", "regtest", warm_xpub)
    hot = wallets.location_account("bitcoin", "hot", "BTC")
    warm = wallets.location_account("bitcoin", "warm", "BTC")
    expense = wallets.firm_account("network_fees", "BTC")

    log.info("treasury funds hot 3 BTC above what it holds; thresholds: ceiling +2 BTC, target +0.5 BTC, excess to warm")
    bitcoind.mine(1)
    base = spendable(custody, engine)
    rebalances.config = RebalanceConfig(thresholds={"BTC": RebalanceThreshold(
        ceiling=base + 2 * BTC, target=base + BTC // 2, excess_to="warm")})
    bitcoind.fund(hot_address, 3 * BTC)
    bitcoind.mine(1)
    held = spendable(custody, engine)
    assert_equal(held, base + 3 * BTC)
    before = {a: ledger.balance(a).posted for a in (hot, warm, expense)}
    chain_before = reconciled(custody, ("deposit", "hot", "warm"))

    txid = rebalances.rebalance_bitcoin()
    assert txid is not None
    with engine.connect() as c:
        out = row(engine, c.execute(text("SELECT id FROM rebalance WHERE txid = :t"), {"t": txid}).scalar_one())
    assert_equal((out.source_tier, out.destination_tier, int(out.amount)), ("hot", "warm", held - (base + BTC // 2)))
    assert_equal(out.destination, derive_btc_address(warm_xpub, "regtest", 0, out.destination_index))
    rebalances.run_once()
    assert txid in bitcoind.rpc("getrawmempool")
    bitcoind.mine(1)
    assert_equal(rebalances.track(), 0)
    mid = reconciled(custody, ("deposit", "hot", "warm"))
    log.info("mined, not final: in transit on hot (- amount - fee) and warm (+ amount)")
    assert_equal(mid["warm"].in_transit - chain_before["warm"].in_transit, int(out.amount))
    assert_equal(mid["hot"].in_transit - chain_before["hot"].in_transit, -(int(out.amount) + int(out.fee)))
    bitcoind.mine(BTC_FINALITY - 1)
    assert_equal(rebalances.track(), 1)
    assert_equal(ledger.balance(warm).posted - before[warm], -int(out.amount))
    assert_equal(ledger.balance(hot).posted - before[hot], int(out.amount) + int(out.fee))
    assert_equal(ledger.balance(expense).posted - before[expense], -int(out.fee))
    end = reconciled(custody, ("deposit", "hot", "warm"))
    assert_equal(end["warm"].on_chain - chain_before["warm"].on_chain, int(out.amount))

    log.info("hot below its floor: a refill from warm is opened, and waits for operators")
    low = spendable(custody, engine)
    rebalances.config = RebalanceConfig(thresholds={"BTC": RebalanceThreshold(
        ceiling=low + 10 * BTC, target=low + BTC, floor=low + BTC // 2, excess_to="warm")})
    refill_id = rebalances.decide_bitcoin()
    assert refill_id is not None
    refill = row(engine, refill_id)
    assert_equal((refill.source_tier, refill.destination_tier, refill.state, int(refill.amount), refill.destination),
                 ("warm", "hot", "open", BTC, hot_address))
    assert_equal(refill.approvals_required, 2)
    if int(refill.change_amount):  # change to a fresh warm address the warm key derives
        assert_equal(refill.change_address, derive_btc_address(warm_xpub, "regtest", 0, refill.change_index))
    assert rebalances.rebalance_bitcoin() is None  # no approval: custody does not even ask
    with engine.connect() as c:
        coins = rebalances._coins(c, refill_id, "warm")  # noqa: SLF001 - what the worker would send
    change = (refill.change_address, int(refill.change_amount)) if int(refill.change_amount) else None
    with pytest.raises(SigningRefused) as refused:
        rebalances.signer.sign_bitcoin_rebalance(refill_id, coins, hot_address, BTC, change)
    assert_equal(refused.value.code.value, "rebalance_not_approved")

    log.info("a database writer forges the row's quorum to 0 and an approval row for op-carol: the signer still refuses")
    with engine.begin() as c:
        c.execute(text("UPDATE rebalance SET approvals_required = 0 WHERE id = :r"), {"r": refill_id})
        c.execute(text("INSERT INTO rebalance_approval (rebalance_id, operator, key_id, scheme, signed_payload, signature) "
                       "VALUES (:r, 'op-carol', 'test-ed25519:op-carol', 'ed25519', :p, :s)"),
                  {"r": refill_id, "p": rebalances.refill_payload(refill_id), "s": b"\x00" * 64})
    assert rebalances.rebalance_bitcoin() is None
    assert_equal(rebalances.refusals[-1], (refill_id, "rebalance_not_approved"))
    with engine.begin() as c:
        c.execute(text("UPDATE rebalance SET approvals_required = 2 WHERE id = :r"), {"r": refill_id})

    log.info("op-alice approves with her key; her approval again, or op-bob's key under her name, are refused")
    payload = rebalances.refill_payload(refill_id)
    assert_equal(rebalances.approve_refill(refill_id, operator="op-alice", signature=sign_approval(payload, "op-alice")), 2)
    for operator, signer_name, code in (("op-alice", "op-alice", "already_acted"), ("op-alice", "op-bob", "approver_not_caller")):
        with pytest.raises(CustodyError) as err:
            rebalances.approve_refill(refill_id, operator=operator, signature=sign_approval(payload, signer_name))
        assert_equal(err.value.code.value, code)
    assert rebalances.rebalance_bitcoin() is None  # custody counts 2 rows (one forged); the signer counts one valid
    assert_equal(rebalances.refusals[-1], (refill_id, "rebalance_not_approved"))
    assert_equal(row(engine, refill_id).state, "open")

    log.info("op-bob approves over the API: the quorum is there, the worker signs and sends the refill")
    bob = operator_client(custody, "op-bob")
    got = bob.get(f"/v1/rebalances/{refill_id}/approval-payload")
    assert_equal(got.status_code, 200)
    assert_equal(got.json()["payload"].encode(), payload)
    answer = bob.post(f"/v1/rebalances/{refill_id}/approve",
                      json={"comment": "refill checked", "signature": signature_json(sign_approval(payload, "op-bob"))})
    assert_equal((answer.status_code, answer.json()["approvals"]), (200, 3))
    before = {a: ledger.balance(a).posted for a in (hot, warm, expense)}
    refill_txid = rebalances.rebalance_bitcoin()
    assert refill_txid is not None
    rebalances.run_once()
    tx = bitcoind.rpc("getrawtransaction", refill_txid, True)
    paid = {o["scriptPubKey"]["address"]: to_sat(o["value"]) for o in tx["vout"]}
    assert_equal(paid[hot_address], BTC)
    assert set(paid) <= {hot_address, refill.change_address}
    bitcoind.mine(BTC_FINALITY)
    assert_equal(rebalances.track(), 1)
    refill = row(engine, refill_id)
    assert_equal((refill.state, refill.txid), ("final", refill_txid))
    assert_equal(ledger.balance(hot).posted - before[hot], -BTC)
    assert_equal(ledger.balance(warm).posted - before[warm], BTC + int(refill.fee))
    assert_equal(ledger.balance(expense).posted - before[expense], -int(refill.fee))
    assert_equal(spendable(custody, engine), low + BTC)  # final: the refilled coin is hot's to spend
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT count(*) FROM rebalance WHERE state NOT IN ('final', 'abandoned')")).scalar_one(), 0)
    reconciled(custody, ("deposit", "hot", "warm"))
    with engine.connect() as c:  # the index, the node's own view and the books agreed all along: no incident
        assert_equal(c.execute(text("SELECT kind FROM incident WHERE id > :i"), {"i": first_incident}).scalars().all(), [])
    ledger.assert_verified()


OTHER = "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080"  # empty blocks are mined to someone else


def test_a_stuck_rebalance_is_bumped_out_of_its_change(custody, bitcoind, engine, ledger, signer_keys, rebalances, log):  # noqa: F811
    """A hot -> warm rebalance left out of `stuck_blocks` blocks is signed again (the signer checks the
    version it replaces is the row's) over the same coins, the higher fee taken from the change; the
    mined replacement is booked once, at its fee."""
    wallets, hot_address = custody.wallets, custody.payouts.hot_address("bitcoin")
    wallets.register_wallet("bitcoin", "warm", "regtest", signer_keys.account_xpub("bitcoin", "warm"))
    hot = wallets.location_account("bitcoin", "hot", "BTC")
    warm = wallets.location_account("bitcoin", "warm", "BTC")
    expense = wallets.firm_account("network_fees", "BTC")
    bitcoind.mine(1)
    base = spendable(custody, engine)
    rebalances.config = RebalanceConfig(thresholds={"BTC": RebalanceThreshold(
        ceiling=base + BTC, target=base + BTC // 4, excess_to="warm")})
    bitcoind.fund(hot_address, 2 * BTC)
    bitcoind.mine(1)
    assert_equal(spendable(custody, engine), base + 2 * BTC)
    before = {a: ledger.balance(a).posted for a in (hot, warm, expense)}
    first = rebalances.rebalance_bitcoin()
    assert_equal(rebalances.broadcast(), 1)
    rid = row_of(engine, first)
    old = row(engine, rid)

    log.info("%d empty blocks: the rebalance is stuck and bumped once", rebalances.bump.stuck_blocks)
    for _ in range(rebalances.bump.stuck_blocks):
        bitcoind.rpc("generateblock", OTHER, [])
    [second] = rebalances.bump_fees()
    assert_equal(rebalances.bump_fees(), [])
    new = row(engine, rid)
    assert_equal((new.txid, int(new.amount), new.destination), (second, int(old.amount), old.destination))
    assert int(new.fee) > int(old.fee)
    assert_equal(int(new.change_amount), int(old.change_amount) - (int(new.fee) - int(old.fee)))
    mempool = bitcoind.rpc("getrawmempool")
    assert second in mempool and first not in mempool
    log.info("a replacement of a version that is not the row's is refused by the signer")
    with engine.connect() as c:
        coins = rebalances._coins(c, rid, "hot")  # noqa: SLF001 - what the worker sends
    with pytest.raises(SigningRefused) as refused:
        rebalances.signer.sign_bitcoin_rebalance(rid, coins, new.destination, int(new.amount),
                                                 (new.change_address, int(new.change_amount) - 1000), replaces_txid=first)
    assert_equal(refused.value.code.value, "rebalance_not_open")

    bitcoind.mine(BTC_FINALITY)
    assert_equal(rebalances.track(), 1)
    assert_equal(ledger.balance(warm).posted - before[warm], -int(new.amount))
    assert_equal(ledger.balance(hot).posted - before[hot], int(new.amount) + int(new.fee))
    assert_equal(ledger.balance(expense).posted - before[expense], -int(new.fee))
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT count(*) FROM journal_transaction WHERE metadata->>'txid' = :t"),
                               {"t": first}).scalar_one(), 0)
        assert_equal(c.execute(text("SELECT count(*) FROM rebalance WHERE state NOT IN ('final', 'abandoned')")).scalar_one(), 0)
    reconciled(custody, ("deposit", "hot", "warm"))
    ledger.assert_verified()


def row_of(engine, txid: str) -> int:
    with engine.connect() as c:
        return c.execute(text("SELECT id FROM rebalance WHERE txid = :t"), {"t": txid}).scalar_one()
