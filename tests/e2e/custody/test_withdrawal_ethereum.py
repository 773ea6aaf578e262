"""withdrawal_ethereum: an ether and an ERC-20 withdrawal are signed (one transaction each, gap-free
nonces from the hot wallet), broadcast, mined and booked: in-flight -> hot location at finality and
the actual gas paid (gas used x effective price) to the network-fee expense. Neither payout can be
booked as hot-wallet funding (`funding_own_transaction`)."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from custody.errors import CustodyError

from regtest.util import assert_equal
from tests.e2e import txbuild
from tests.e2e.custody.conftest import ETH_FINALITY

ETH_FEE, USDT_FEE = 10**15, 10**6


def test_ether_and_token_withdrawals(custody, customer, anvil, usdt, engine, ledger, log):
    w, p = custody.withdrawals, custody.payouts
    owner = f"eth-withdrawer-{id(log)}"
    eth_acct, usdt_acct = customer("ETH", owner), customer("USDT", owner)
    anvil.fund(custody.wallets.issue_address(f"addr:{eth_acct}", eth_acct).address, 5 * 10**18)
    usdt.mint(custody.wallets.issue_address(f"addr:{usdt_acct}", usdt_acct).address, 2_000 * 10**6)
    hot = p.hot_address("ethereum")
    hot_wei_before = anvil.w3.eth.get_balance(hot)  # other suites (hot funding) may have funded it already
    log.info("treasury funds the hot wallet %s with 20 ETH and 50,000 USDT", hot)
    funding = anvil.fund(hot, 20 * 10**18)
    minted = usdt.mint(hot, 50_000 * 10**6)
    p.book_hot_funding("ethereum", "ETH", 20 * 10**18, f"hot-funding:ethereum:{funding}")
    p.book_hot_funding("ethereum", "USDT", 50_000 * 10**6, f"hot-funding:ethereum:{minted}")
    anvil.mine(ETH_FINALITY)
    custody.deposits.run_once(["ethereum"])
    assert_equal((ledger.balance(eth_acct).posted, ledger.balance(usdt_acct).posted), (5 * 10**18, 2_000 * 10**6))

    ether_to, token_to = txbuild.eth_new_address("w-eth"), txbuild.eth_new_address("w-usdt")
    ether_amt, token_amt = 1_234_567_890_123_456_789, 1_234_567_891
    we = w.request(client_withdrawal_id="eth-1", account_id=eth_acct, amount=ether_amt, destination=ether_to, requested_by="backend")
    wt = w.request(client_withdrawal_id="usdt-1", account_id=usdt_acct, amount=token_amt, destination=token_to, requested_by="backend")
    assert_equal((we.state, wt.state), ("approved", "approved"))
    expense = custody.wallets.firm_account("network_fees", "ETH")
    hot_eth = custody.wallets.location_account("ethereum", "hot", "ETH")
    hot_usdt = custody.wallets.location_account("ethereum", "hot", "USDT")
    before = {a: ledger.balance(a).posted for a in (expense, hot_eth, hot_usdt)}

    log.info("batch (one per withdrawal), sign, broadcast")
    assert_equal(len(p.batch_ethereum()), 2)
    txids = p.sign_open_batches()
    assert_equal(len(txids), 2)
    with engine.connect() as c:
        nonces = sorted(c.execute(text("SELECT nonce FROM chain_transaction WHERE txid = ANY(:t)"), {"t": txids}).scalars())
    assert_equal(nonces[1], nonces[0] + 1)
    assert_equal(p.broadcast(), 2)
    for t in txids:
        anvil.wait_mined(t)

    log.info("mine to finality and book")
    anvil.mine(ETH_FINALITY)
    assert_equal(p.track(), 2)
    assert_equal((w.get(we.id).state, w.get(wt.id).state), ("final", "final"))
    assert_equal(anvil.w3.eth.get_balance(ether_to), ether_amt)
    assert_equal(usdt.balance_of(token_to), token_amt)
    gas_paid = sum(int(r["gasUsed"]) * int(r["effectiveGasPrice"]) for r in (anvil.w3.eth.get_transaction_receipt(t) for t in txids))
    log.info("gas paid for both transactions: %d wei", gas_paid)
    assert_equal(ledger.balance(expense).posted, before[expense] - gas_paid)
    assert_equal(ledger.balance(hot_eth).posted, before[hot_eth] + ether_amt + gas_paid)
    assert_equal(ledger.balance(hot_usdt).posted, before[hot_usdt] + token_amt)
    assert_equal(ledger.balance(eth_acct).posted, 5 * 10**18 - ether_amt - ETH_FEE)
    assert_equal(ledger.balance(usdt_acct).posted, 2_000 * 10**6 - token_amt - USDT_FEE)
    assert_equal(anvil.w3.eth.get_balance(hot) - hot_wei_before, 20 * 10**18 - ether_amt - gas_paid)
    for txid in txids:  # our own payouts (sent by the hot address, in chain_transaction) are never funding
        with pytest.raises(CustodyError) as err:
            p.book_ethereum_funding(txid, by="test")
        assert_equal(err.value.code.value, "funding_own_transaction")
