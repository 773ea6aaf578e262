"""reconciliation (named to run last in this folder): after every suite before it, bitcoin holdings at deposit addresses and in the hot
wallet equal the books plus what is legitimately in transit, to the satoshi; a planted difference
(a funding booked that never reached the chain) is caught, opens an incident and engages the kill
switch; the compensating entry closes it."""
from __future__ import annotations

from sqlalchemy import text

from custody.controls import kill_switch, set_kill_switch
from ledger.model import Transfer
from regtest.util import assert_equal
from tests.e2e.custody.conftest import BTC_FINALITY


def lines_by_tier(custody):
    return {line.tier: line for line in custody.reconciliation.run(chains=["bitcoin"])}


def test_books_reconcile_and_a_planted_difference_is_caught(custody, customer, bitcoind, engine, ledger, log):
    acct = customer("BTC")
    bitcoind.fund(custody.wallets.issue_address(f"addr:{acct}", acct).address, 4_200_000)
    bitcoind.fund(custody.payouts.hot_address("bitcoin"), 50_000_000)
    bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    custody.payouts.sync_hot_wallet()
    lines = lines_by_tier(custody)
    for line in lines.values():
        log.info("%s: chain %d = books %d + in transit %d (difference %d)", line.tier, line.on_chain, line.books,
                 line.in_transit, line.difference)
    registered = [t for t in ("warm", "cold") if t in lines]  # a line each once its wallet is registered
    assert_equal(sorted(lines), sorted(["deposit", "hot", *registered]))
    assert_equal({line.difference for line in lines.values()}, {0})
    assert lines["hot"].on_chain > 0 and lines["deposit"].on_chain > 0

    log.info("plant: a hot-wallet funding of 0.0123 BTC is booked that never happened on chain")
    hot = custody.wallets.location_account("bitcoin", "hot", "BTC")
    equity = custody.wallets.firm_account("equity", "BTC")
    forged = ledger.post("test:forged-funding", [Transfer(hot, equity, 1_230_000)], kind="hot_funding")
    lines = lines_by_tier(custody)
    assert_equal(lines["hot"].difference, -1_230_000)
    with engine.connect() as c:
        kind = c.execute(text("SELECT kind FROM incident ORDER BY id DESC LIMIT 1")).scalar_one()
    assert_equal(kind, "reconciliation_difference")
    assert kill_switch(engine).engaged

    log.info("explained: the forged entry is reversed; the difference is zero again")
    ledger.reverse(forged.transaction_id, "test:forged-funding:reversal")
    assert_equal(lines_by_tier(custody)["hot"].difference, 0)
    with engine.begin() as c:
        set_kill_switch(c, False, "test: reconciliation explained", "op-test")
