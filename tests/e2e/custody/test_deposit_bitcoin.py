"""deposit_bitcoin: a payment to a derived address is credited exactly once, only at finality, and
a restart mid-way (new service objects, fresh adapter) changes nothing.

Also: the derived addresses are the ones bitcoind derives from the same descriptor.
"""
from __future__ import annotations

from sqlalchemy import text

from chain_adapters.bitcoin import BitcoinAdapter
from custody.addresses import descriptor_for
from custody.container import Container
from regtest.util import assert_equal
from tests.e2e.custody.conftest import BTC_FINALITY


def deposits_of(custody, account_id):
    return custody.deposits.list(account_id=account_id)


def test_addresses_match_bitcoind_descriptor(custody, customer, bitcoind, signer_keys, ledger, log):
    acct = customer("BTC")
    first = custody.wallets.issue_address(f"addr:{acct}:1", acct)
    again = custody.wallets.issue_address(f"addr:{acct}:1", acct)
    second = custody.wallets.issue_address(f"addr:{acct}:2", acct)
    log.info("the same request key returns the same address; a new key the next index")
    assert_equal((again.address, again.created), (first.address, False))
    assert_equal(second.derivation_index, first.derivation_index + 1)
    desc = descriptor_for(signer_keys.account_xpub("bitcoin", "deposit"), "regtest")
    derived = bitcoind.rpc("deriveaddresses", desc, [first.derivation_index, second.derivation_index])
    log.info("bitcoind deriveaddresses agrees: %s", derived)
    assert_equal(derived, [first.address, second.address])


def test_bitcoin_deposit_credited_once_at_finality(custody, customer, bitcoind, btc_adapter, engine, ledger, log):
    acct = customer("BTC")
    addr = custody.wallets.issue_address(f"addr:{acct}", acct).address
    amount = 12_345_678
    log.info("pay %d sat to %s and mine one block", amount, addr)
    txid = bitcoind.fund(addr, amount)
    bitcoind.mine(1)
    custody.deposits.run_once(["bitcoin"])
    [obs] = deposits_of(custody, acct)
    assert_equal((obs["txid"], int(obs["amount"]), obs["state"], obs["confirmations"]), (txid, amount, "confirming", 1))
    assert_equal(ledger.balance(acct).posted, 0)

    log.info("restart: new service objects and a fresh adapter, then mine to finality")
    fresh = Container(settings=custody.settings, engine=engine, ledger=custody.ledger)
    fresh.with_chains({"bitcoin": BitcoinAdapter(bitcoind.rpc_url, network="regtest"), "ethereum": custody.adapters["ethereum"]})
    bitcoind.mine(BTC_FINALITY - 1)
    fresh.deposits.run_once(["bitcoin"])
    [obs] = deposits_of(fresh, acct)
    assert_equal((obs["state"], obs["confirmations"]), ("credited", BTC_FINALITY))
    bal = ledger.balance(acct)
    assert_equal((bal.posted, bal.available), (amount, amount))

    log.info("running every job again (both service instances) credits nothing more")
    bitcoind.mine(2)
    custody.deposits.run_once(["bitcoin"])
    fresh.deposits.run_once(["bitcoin"])
    assert_equal(ledger.balance(acct).posted, amount)
    with engine.connect() as c:
        events = c.execute(text("SELECT payload FROM outbox WHERE topic = 'deposit.credited' AND payload->>'account_id' = :a"),
                           {"a": str(acct)}).scalars().all()
        credits = c.execute(text("SELECT count(*) FROM journal_transaction WHERE idempotency_key = :k"),
                            {"k": f"deposit:bitcoin:BTC:{txid}:{obs['output_index']}"}).scalar_one()
    assert_equal((len(events), credits), (1, 1))
    assert_equal(events[0]["amount"], amount)


def test_dust_is_recorded_not_credited(custody, customer, bitcoind, ledger, log):
    acct = customer("BTC")
    addr = custody.wallets.issue_address(f"addr:{acct}", acct).address
    log.info("a 600 sat output is below the 1,000 sat dust minimum")
    bitcoind.fund(addr, 600)
    bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    [obs] = deposits_of(custody, acct)
    assert_equal(obs["state"], "dust")
    assert_equal(ledger.balance(acct).posted, 0)
    dust = custody.wallets.firm_account("dust", "BTC")
    assert ledger.balance(dust).posted >= 600
