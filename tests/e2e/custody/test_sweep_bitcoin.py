"""sweep_bitcoin: booked deposit coins are swept into the hot wallet; the books move deposit location
-> hot location (+ network fee to expense) only at finality, the hot wallet spends the swept coin
only then, reconciliation stays at zero throughout, and the signer refuses any other destination."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from regtest.util import assert_equal
from signer.service import SigningRefused
from tests.e2e.custody.conftest import BTC_FINALITY


def test_sweep_moves_deposits_to_hot_wallet(custody, customer, bitcoind, engine, ledger, log):
    sweeps, recon = custody.sweeps, custody.reconciliation
    accounts = [customer("BTC") for _ in range(2)]
    for a in accounts:
        bitcoind.fund(custody.wallets.issue_address(f"addr:{a}", a).address, 3_000_000)
    bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    custody.payouts.sync_hot_wallet()
    deposit = custody.wallets.location_account("bitcoin", "deposit", "BTC")
    hot = custody.wallets.location_account("bitcoin", "hot", "BTC")
    expense = custody.wallets.firm_account("network_fees", "BTC")
    before = {a: ledger.balance(a).posted for a in (deposit, hot, expense)}
    customers_before = [ledger.balance(a).posted for a in accounts]

    log.info("the signer refuses a sweep to anything but our hot receive address")
    with pytest.raises(SigningRefused) as err:
        custody.payouts.signer.sign_bitcoin_sweep(0, [], "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080", 1_000)
    assert_equal(err.value.code.value, "output_mismatch")

    txid = sweeps.sweep_bitcoin()
    assert txid is not None
    with engine.connect() as c:
        sweep = c.execute(text("SELECT id, amount, fee, state FROM sweep WHERE txid = :t"), {"t": txid}).one()
    log.info("sweep %d: %d sat from deposit addresses, fee %d", sweep.id, sweep.amount, sweep.fee)
    assert_equal(sweeps.broadcast(), 1)
    bitcoind.mine(1)
    sweeps.track()
    custody.deposits.run_once(["bitcoin"])  # the scanner at the tip: both locations are compared
    lines = recon.run(chains=["bitcoin"])  # mined, not final: explained as in transit on both lines
    assert {"deposit", "hot"} <= {ln.tier for ln in lines}
    assert_equal({ln.difference for ln in lines}, {0})
    assert_equal(ledger.balance(deposit).posted, before[deposit])
    custody.payouts.sync_hot_wallet()
    with engine.connect() as c:
        spendable = {k.txid for k in custody.payouts._spendable_coins(c)}  # noqa: SLF001 - the rule under test
    assert txid not in spendable

    bitcoind.mine(BTC_FINALITY - 1)
    assert_equal(sweeps.track(), 1)
    amount, fee = int(sweep.amount), int(sweep.fee)
    assert_equal(ledger.balance(deposit).posted, before[deposit] + amount)
    assert_equal(ledger.balance(hot).posted, before[hot] - (amount - fee))
    assert_equal(ledger.balance(expense).posted, before[expense] - fee)
    assert_equal([ledger.balance(a).posted for a in accounts], customers_before)  # a sweep never touches customers
    custody.payouts.sync_hot_wallet()
    assert_equal(ledger.balance(hot).posted, before[hot] - (amount - fee))  # the swept coin is not "funding"
    with engine.connect() as c:
        spendable = {k.txid for k in custody.payouts._spendable_coins(c)}  # noqa: SLF001
    assert txid in spendable
    custody.deposits.run_once(["bitcoin"])
    lines = recon.run(chains=["bitcoin"])  # every line: deposit, hot (and cold once one is registered)
    assert {"deposit", "hot"} <= {ln.tier for ln in lines}
    assert_equal({ln.difference for ln in lines}, {0})
