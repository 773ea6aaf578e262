"""sweep_reorged_coin: a credited deposit reorged out after finality and double-spent away (its
shortfall in suspense, the credit frozen under a `deposit_reorged_after_finality` incident, as in
test_deposit_reorg_freeze) is gone from the chain, and sweeps know it.

- A sweep made afterwards never reserves the gone coin: it takes only coins the wallet index holds
  unspent in the best chain, so it broadcasts and the other coins are swept (before the fix it
  reserved the gone coin and the node refused the sweep for good: missing inputs; the report that
  test_sweep_set_aside failed after test_deposit_reorg_freeze).
- A sweep signed (stored, not sent) or mined (not final) before the reorg can never be mined: once
  the kill switch is released, the broadcast run drops it and frees its coins, audited with the
  gone coin and its incident, and the next sweep is rebuilt from the coins still on chain.
- A sweep whose deposit was reorged out but went back to the node's mempool (not double-spent) is
  not dropped: it is sent as a child of the deposit, mined with it, and booked once.
Each ends with the books final, reconciliation at zero (a gone coin explained by the shortfall
booking), the frozen credit captured to suspense (or, re-mined, released) by an operator, and
verify() ok."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from custody.controls import kill_switch, set_kill_switch
from regtest.util import assert_equal
from tests.e2e import txbuild
from tests.e2e.custody.api_helpers import answered, role_client
from tests.e2e.custody.conftest import BTC_FINALITY

OTHER = "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080"  # not ours: the competing blocks pay here


def live_deposit(custody, customer, bitcoind, amount: int) -> int:
    """A deposit mined below any fork point of the test; returns its customer account."""
    acct = customer("BTC")
    bitcoind.fund(custody.wallets.issue_address(f"addr:{acct}", acct).address, amount)
    bitcoind.mine(BTC_FINALITY)
    return acct


def double_spendable_deposit(custody, customer, btc, bitcoind, amount: int):
    """A deposit paid from a key the test holds, so the test can double-spend it: (account, key,
    funding output, the blocks that made it final)."""
    acct = customer("BTC")
    key, utxo = btc.funded_key(amount + 1_000_000)
    address = custody.wallets.issue_address(f"addr:{acct}", acct).address
    btc.adapter.broadcast(txbuild.spend_p2wpkh(key, utxo.txid, utxo.index, utxo.amount,
                                               [(address, amount), (key.address, utxo.amount - amount - 2_000)]))
    return acct, key, utxo, bitcoind.mine(BTC_FINALITY)


def double_spend(bitcoind, key, utxo, blocks: list[str]) -> None:
    """The sender's competing chain, longer than ours: the deposit's funding output paid back to the
    sender instead, then enough blocks for the deposit to have been final."""
    bitcoind.rpc("invalidateblock", blocks[0])
    theft = txbuild.spend_p2wpkh(key, utxo.txid, utxo.index, utxo.amount, [(key.address, utxo.amount - 3_000)])
    bitcoind.rpc("generateblock", OTHER, [theft.hex()])
    for _ in range(BTC_FINALITY + 1):
        bitcoind.rpc("generateblock", OTHER, [])


def observation(custody, acct: int) -> dict:
    [obs] = custody.deposits.list(account_id=acct)
    return obs


def reorg_incident(engine, obs_id: int):
    with engine.connect() as c:
        return c.execute(text("SELECT id, detail FROM incident WHERE kind = 'deposit_reorged_after_finality' "
                              "AND detail->>'observation_id' = :i AND resolved_at IS NULL"), {"i": str(obs_id)}).one()


def sweep_row(engine, sweep_id: int):
    with engine.connect() as c:
        row = c.execute(text("SELECT id, state, txid, amount FROM sweep WHERE id = :s"), {"s": sweep_id}).one()
        coins = set(c.execute(text("SELECT id FROM deposit_observation WHERE swept_by = :s"), {"s": sweep_id}).scalars())
    return row, coins


def sweep_of(engine, txid: str) -> int:
    with engine.connect() as c:
        return c.execute(text("SELECT id FROM sweep WHERE txid = :t"), {"t": txid}).scalar_one()


def books_of(engine, sweep_id: int) -> int:
    with engine.connect() as c:
        return c.execute(text("SELECT count(*) FROM journal_transaction WHERE idempotency_key = :k"),
                         {"k": f"sweep:{sweep_id}:final"}).scalar_one()


def release_kill_switch(engine, why: str) -> None:
    with engine.begin() as c:  # an admin's decision once the incident is explained
        set_kill_switch(c, False, f"test: {why}", "op-test")


def sweep_to_final(custody, bitcoind, engine, log) -> int:
    """Sweep what is sweepable, send it and book it at finality; returns the sweep's id."""
    sweeps = custody.sweeps
    sweep_id = sweep_of(engine, sweeps.sweep_bitcoin())
    sweeps.broadcast()
    assert_equal(sweep_row(engine, sweep_id)[0].state, "broadcast")
    bitcoind.mine(BTC_FINALITY)
    sweeps.track()
    assert_equal((sweep_row(engine, sweep_id)[0].state, books_of(engine, sweep_id)), ("final", 1))
    log.info("sweep %d final and booked once", sweep_id)
    return sweep_id


def explained(custody, engine, ledger, incident_id: int, decision: str = "capture") -> None:
    """Reconciliation at zero (a gone coin's shortfall in suspense); the operator resolves the
    reorg incident (capture the frozen credit to suspense, or release it); the books verify."""
    custody.deposits.run_once(["bitcoin"])
    custody.payouts.sync_hot_wallet()
    lines = custody.reconciliation.run(chains=["bitcoin"])
    assert {"deposit", "hot"} <= {ln.tier for ln in lines}
    assert_equal({ln.difference for ln in lines}, {0})
    operator = role_client(custody, "operator", "operator")
    resolved = answered(operator, 200, operator.resolve_incident(incident_id, comment=f"reorged deposit: {decision}",
                                                                 decision=decision))
    assert_equal(resolved.resolution["decision"], decision)
    ledger.assert_verified()
    release_kill_switch(engine, "reorged deposit explained")


@pytest.fixture(autouse=True)
def no_earlier_coins(custody, bitcoind, engine, log):
    """The e2e session's database is shared: earlier suites leave booked, unswept deposit coins, and a
    sweep takes the oldest `max_inputs` of them first. Sweep them all to finality before each test,
    so that its sweeps are made of its own coins (found by the whole suite: a sweep of 200 earlier
    coins did not hold this test's deposit)."""
    sweeps = custody.sweeps
    for _ in range(50):
        custody.deposits.run_once(["bitcoin"])
        if sweeps.sweep_bitcoin() is None:
            break
        sweeps.broadcast()
        bitcoind.mine(BTC_FINALITY)
        custody.deposits.run_once(["bitcoin"])
        sweeps.track()
    with engine.connect() as c:
        unswept = c.execute(text("SELECT count(*) FROM sweep WHERE state NOT IN ('final', 'dropped', 'abandoned')")).scalar_one()
    assert_equal(unswept, 0)
    log.info("earlier suites' deposit coins swept: this test's sweeps hold only its own")


def test_sweep_never_reserves_a_coin_reorged_out_after_finality(custody, customer, btc, bitcoind, engine, ledger, log):
    sweeps = custody.sweeps
    log.info("a credited deposit is double-spent away in a longer chain after finality")
    gone_acct, key, utxo, blocks = double_spendable_deposit(custody, customer, btc, bitcoind, 7_000_000)
    custody.deposits.run_once(["bitcoin"])
    gone = observation(custody, gone_acct)
    assert_equal(gone["state"], "credited")
    double_spend(bitcoind, key, utxo, blocks)
    custody.deposits.run_once(["bitcoin"])
    incident = reorg_incident(engine, gone["id"])
    assert_equal((observation(custody, gone_acct)["state"], ledger.balance(gone_acct).held), ("credited", 7_000_000))
    assert kill_switch(engine).engaged
    release_kill_switch(engine, "double spend confirmed; sweeps go on")

    log.info("another deposit arrives; the sweep reserves it, never the gone coin")
    live_acct = live_deposit(custody, customer, bitcoind, 2_000_000)
    custody.deposits.run_once(["bitcoin"])
    live = observation(custody, live_acct)
    sweep_id = sweep_of(engine, sweeps.sweep_bitcoin())
    row, coins = sweep_row(engine, sweep_id)
    assert live["id"] in coins and gone["id"] not in coins, coins
    assert_equal(sweeps.broadcast(), 1)
    assert_equal(sweep_row(engine, sweep_id)[0].state, "broadcast")
    bitcoind.mine(BTC_FINALITY)
    assert_equal(sweeps.track(), 1)
    assert_equal(books_of(engine, sweep_id), 1)
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT swept_by FROM deposit_observation WHERE id = :i"), {"i": gone["id"]}).scalar(), None)
    explained(custody, engine, ledger, incident.id)


@pytest.mark.parametrize("reached", ["signed", "confirmed"])
def test_sweep_stranded_by_a_reorg_is_dropped_and_rebuilt(reached, custody, customer, btc, bitcoind, engine, ledger, log):
    sweeps = custody.sweeps
    live_acct = live_deposit(custody, customer, bitcoind, 2_000_000)
    gone_acct, key, utxo, blocks = double_spendable_deposit(custody, customer, btc, bitcoind, 7_000_000)
    custody.deposits.run_once(["bitcoin"])
    live, gone = observation(custody, live_acct), observation(custody, gone_acct)
    assert_equal((live["state"], gone["state"]), ("credited", "credited"))
    log.info("a sweep of both coins is %s before the reorg", reached)
    stranded = sweep_of(engine, sweeps.sweep_bitcoin())
    assert {live["id"], gone["id"]} <= sweep_row(engine, stranded)[1]
    if reached == "confirmed":
        sweeps.broadcast()
        bitcoind.mine(1)
        sweeps.track()
    assert_equal(sweep_row(engine, stranded)[0].state, reached)

    log.info("the deposit is double-spent away after finality: incident, shortfall to suspense, credit frozen")
    double_spend(bitcoind, key, utxo, blocks)
    custody.deposits.run_once(["bitcoin"])
    incident = reorg_incident(engine, gone["id"])
    assert_equal(ledger.balance(gone_acct).held, 7_000_000)
    assert kill_switch(engine).engaged
    log.info("while the kill switch is on nothing moves; the sweep cannot be mined")
    assert_equal(sweeps.broadcast(), 0)
    sweeps.track()
    assert_equal(sweep_row(engine, stranded)[0].state, reached)

    release_kill_switch(engine, "double spend confirmed; sweeps go on")
    log.info("the broadcast run drops the stranded sweep and frees its coins; nothing is booked for it")
    sweeps.broadcast()
    row, coins = sweep_row(engine, stranded)
    assert_equal((row.state, coins, books_of(engine, stranded)), ("dropped", set(), 0))
    with engine.connect() as c:
        dropped = c.execute(text("SELECT detail FROM audit_event WHERE action = 'sweep.dropped' AND subject = :s"),
                            {"s": f"sweep:{stranded}"}).scalar_one()
    assert_equal((dropped["gone"], dropped["reorg_incidents"], dropped["state"]), ([gone["id"]], [incident.id], reached))
    assert live["id"] in dropped["freed"]
    assert_equal(sweeps.drop_stranded(), [])  # once

    log.info("the sweep is rebuilt from the coins still on chain")
    rebuilt = sweep_to_final(custody, bitcoind, engine, log)
    _, coins = sweep_row(engine, rebuilt)
    assert live["id"] in coins and gone["id"] not in coins, coins
    explained(custody, engine, ledger, incident.id)


def test_sweep_of_a_deposit_back_in_the_mempool_is_not_dropped(custody, customer, bitcoind, engine, ledger, log):
    sweeps = custody.sweeps
    live_acct = live_deposit(custody, customer, bitcoind, 2_000_000)
    back_acct = customer("BTC")
    bitcoind.fund(custody.wallets.issue_address(f"addr:{back_acct}", back_acct).address, 3_000_000)
    blocks = bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    live, back = observation(custody, live_acct), observation(custody, back_acct)
    stranded = sweep_of(engine, sweeps.sweep_bitcoin())
    assert {live["id"], back["id"]} <= sweep_row(engine, stranded)[1]

    log.info("the deposit's blocks are replaced by empty ones after finality; its transaction waits in the mempool")
    bitcoind.rpc("invalidateblock", blocks[0])
    for _ in range(BTC_FINALITY + 1):
        bitcoind.rpc("generateblock", OTHER, [])
    custody.deposits.run_once(["bitcoin"])
    incident = reorg_incident(engine, back["id"])
    assert_equal(ledger.balance(back_acct).held, 3_000_000)
    release_kill_switch(engine, "deposit in the mempool; sweeps go on")

    log.info("the sweep is sent as the deposit's child, not dropped; both are mined")
    assert_equal((sweeps.broadcast(), sweeps.drop_stranded()), (1, []))
    assert_equal(sweep_row(engine, stranded)[0].state, "broadcast")
    bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])  # re-mined: the shortfall booking is reversed
    assert_equal(sweeps.track(), 1)
    row, coins = sweep_row(engine, stranded)
    assert_equal((row.state, books_of(engine, stranded)), ("final", 1))
    assert {live["id"], back["id"]} <= coins
    explained(custody, engine, ledger, incident.id, decision="release")
