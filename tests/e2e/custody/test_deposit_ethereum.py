"""deposit_ethereum: an ether and an ERC-20 (6 decimals) deposit to derived addresses are credited
with exact amounts in minor units at finality; a token sent to an address issued for ether lands on
the same customer's token account."""
from __future__ import annotations

from regtest.util import assert_equal
from tests.e2e.custody.conftest import ETH_FINALITY


def test_ether_and_token_deposits_credited_exactly(custody, customer, anvil, usdt, ledger, log):
    owner = "eth-customer-" + str(id(log))
    eth_acct = customer("ETH", owner)
    usdt_acct = customer("USDT", owner)
    eth_addr = custody.wallets.issue_address(f"addr:{eth_acct}", eth_acct).address
    usdt_addr = custody.wallets.issue_address(f"addr:{usdt_acct}", usdt_acct).address
    ether, tokens, stray = 1_234_567_890_123_456_789, 1_000_000_123_456, 2_500_001
    log.info("ether %d wei to %s, %d USDT units to %s, %d USDT units to the ether address", ether, eth_addr, tokens, usdt_addr, stray)
    anvil.fund(eth_addr, ether)
    usdt.mint(usdt_addr, tokens)
    usdt.mint(eth_addr, stray)
    custody.deposits.run_once(["ethereum"])
    assert_equal(sorted(d["state"] for d in custody.deposits.list(account_id=eth_acct)), ["confirming"])
    assert_equal(ledger.balance(eth_acct).posted, 0)

    log.info("mine to finality (%d confirmations) and run the jobs", ETH_FINALITY)
    anvil.mine(ETH_FINALITY)
    custody.deposits.run_once(["ethereum"])
    assert_equal(ledger.balance(eth_acct).posted, ether)
    assert_equal(ledger.balance(usdt_acct).posted, tokens + stray)
    states = sorted((d["asset"], d["state"], int(d["amount"])) for d in custody.deposits.list(account_id=usdt_acct))
    assert_equal(states, [("USDT", "credited", stray), ("USDT", "credited", tokens)])
    custody.deposits.run_once(["ethereum"])
    assert_equal(ledger.balance(usdt_acct).posted, tokens + stray)
