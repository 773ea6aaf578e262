"""deposit_reorg: a reorg before finality orphans the observation (no credit) and the re-mined
transaction is credited exactly once; a reorg deeper than finality after a credit opens an incident,
books the shortfall to suspense, engages the kill switch, and the ledger still verifies."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from custody.errors import CustodyError

from custody.controls import kill_switch, set_kill_switch
from custody.incidents import Incidents
from regtest import control
from regtest.util import assert_equal
from tests.e2e.custody.conftest import BTC_FINALITY, ETH_FINALITY

OTHER = "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080"  # not ours: competing blocks pay here


def only_deposit(custody, acct):
    [obs] = custody.deposits.list(account_id=acct)
    return obs


def test_bitcoin_reorg_before_finality(custody, customer, bitcoind, ledger, log):
    acct = customer("BTC")
    addr = custody.wallets.issue_address(f"addr:{acct}", acct).address
    txid = bitcoind.fund(addr, 5_000_000)
    [block] = bitcoind.mine(1)
    custody.deposits.run_once(["bitcoin"])
    assert_equal(only_deposit(custody, acct)["state"], "confirming")

    log.info("invalidateblock %s; two empty competing blocks: the deposit is orphaned", block)
    bitcoind.rpc("invalidateblock", block)
    for _ in range(2):
        bitcoind.rpc("generateblock", OTHER, [])
    custody.deposits.run_once(["bitcoin"])
    obs = only_deposit(custody, acct)
    assert_equal((obs["state"], obs["journal_transaction_id"]), ("orphaned", None))
    assert_equal(ledger.balance(acct).posted, 0)

    log.info("the transaction is re-mined from the mempool and credited once at finality")
    bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    obs = only_deposit(custody, acct)
    assert_equal((obs["txid"], obs["state"]), (txid, "credited"))
    assert obs["block_hash"] != block
    assert_equal(ledger.balance(acct).posted, 5_000_000)


def test_ethereum_reorg_before_finality(custody, customer, anvil, ledger, log):
    acct = customer("ETH")
    addr = custody.wallets.issue_address(f"addr:{acct}", acct).address
    txid = anvil.fund(addr, 10**18)
    custody.deposits.run_once(["ethereum"])
    assert_equal(only_deposit(custody, acct)["state"], "confirming")
    raw = control.raw_transaction(anvil, txid)

    log.info("anvil_reorg depth 1 with an empty replacement block: the deposit is orphaned")
    control.reorg_ethereum(anvil, 1)
    custody.deposits.run_once(["ethereum"])
    assert_equal(only_deposit(custody, acct)["state"], "orphaned")
    assert_equal(ledger.balance(acct).posted, 0)

    log.info("the same signed transaction is re-mined; credited once at finality")
    anvil.call("eth_sendRawTransaction", "0x" + raw.hex())
    anvil.mine(ETH_FINALITY)
    custody.deposits.run_once(["ethereum"])
    obs = only_deposit(custody, acct)
    assert_equal((obs["txid"], obs["state"]), (txid, "credited"))
    assert_equal(ledger.balance(acct).posted, 10**18)


def test_bitcoin_reorg_deeper_than_finality(custody, customer, bitcoind, engine, ledger, log):
    acct = customer("BTC")
    addr = custody.wallets.issue_address(f"addr:{acct}", acct).address
    amount = 7_654_321
    bitcoind.fund(addr, amount)
    blocks = bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    assert_equal(only_deposit(custody, acct)["state"], "credited")
    suspense = custody.wallets.firm_account("suspense", "BTC")
    before = ledger.balance(suspense).posted

    log.info("invalidate the deposit's block and build a longer chain without it")
    bitcoind.rpc("invalidateblock", blocks[0])
    for _ in range(BTC_FINALITY + 1):
        bitcoind.rpc("generateblock", OTHER, [])
    custody.deposits.run_once(["bitcoin"])
    with engine.connect() as c:
        incident = c.execute(text("SELECT id, kind, severity, detail FROM incident WHERE detail->>'observation_id' = :i"),
                             {"i": str(only_deposit(custody, acct)["id"])}).one()
    log.info("incident opened: %s (%s)", incident.kind, incident.severity)
    assert_equal((incident.kind, incident.severity), ("deposit_reorged_after_finality", "critical"))
    assert_equal(ledger.balance(suspense).posted, before - amount)
    assert_equal(ledger.balance(acct).posted, amount)  # the customer keeps what we owe them
    assert kill_switch(engine).engaged
    log.info("while the kill switch is on, a withdrawal request is refused with withdrawals_halted")
    with pytest.raises(CustodyError) as err:
        custody.withdrawals.request(client_withdrawal_id=f"during-incident-{acct}", account_id=acct, amount=1_000_000,
                                    destination=OTHER, requested_by="backend")
    assert_equal(err.value.code.value, "withdrawals_halted")
    assert_equal(ledger.balance(acct).held, amount)  # custody's freeze; the refused request held nothing
    ledger.assert_verified()

    log.info("the transaction is re-mined from the mempool: the suspense booking is reversed")
    bitcoind.mine(1)
    custody.deposits.run_once(["bitcoin"])
    assert_equal(ledger.balance(suspense).posted, before)
    assert_equal(ledger.balance(acct).posted, amount)
    log.info("an operator resolves the incident, releasing the freeze; an admin releases the switch")
    Incidents(engine, ledger).resolve(incident.id, operator="operator-test", comment="re-mined", decision="release")
    assert_equal(ledger.balance(acct).held, 0)
    with engine.begin() as c:
        set_kill_switch(c, False, "test: explained", "operator-test")


def test_unresolvable_reorg_opens_incident(custody, customer, anvil, engine, ledger, signer_keys, log):
    """A restarted scanner (fresh adapter memory) whose cursor block anvil has forgotten cannot
    find the fork point: a critical incident, the kill switch, and no credit."""
    from chain_adapters.ethereum import EthereumAdapter
    from custody.container import Container

    acct = customer("ETH")
    addr = custody.wallets.issue_address(f"addr:{acct}", acct).address
    anvil.fund(addr, 10**18)
    custody.deposits.run_once(["ethereum"])
    anvil.call("anvil_reorg", 1, [])
    fresh = Container(settings=custody.settings, engine=engine, ledger=custody.ledger)
    fresh.with_chains({"bitcoin": custody.adapters["bitcoin"],
                       "ethereum": EthereumAdapter(anvil.rpc_url, network="regtest", tokens=custody.adapters["ethereum"].tokens)})
    summary = fresh.deposits.scan("ethereum")
    assert_equal(summary.deep_reorg_incidents, 1)
    with engine.connect() as c:
        kind = c.execute(text("SELECT kind FROM incident ORDER BY id DESC LIMIT 1")).scalar_one()
    assert_equal(kind, "chain_reorg_unresolved")
    assert kill_switch(engine).engaged
    log.info("the original scanner still remembers the abandoned block: it resolves the reorg")
    custody.deposits.run_once(["ethereum"])
    assert_equal(only_deposit(custody, acct)["state"], "orphaned")
    assert_equal(ledger.balance(acct).posted, 0)
    with engine.begin() as c:
        set_kill_switch(c, False, "test: explained", "op-test")
