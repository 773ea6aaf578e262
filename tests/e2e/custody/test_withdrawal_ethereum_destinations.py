"""withdrawal_ethereum_destinations (issue 11, observation 8): over the HTTP API, USDT to the token
contract itself, to the 0x...dEaD burn address, to the zero address and to precompiles, and ether to
the token contract, are refused at once, each with its own code; ether to a contract that rejects
ether (contracts/RejectsEther.sol, deployed on anvil) is refused while the contract is not on the
account's allowlist and, once it is, because the simulated payout reverts; nothing is held or written
and no gas is spent. USDT to that allowlisted contract is paid (a token transfer runs no code of the
destination). Ether withdrawals to plain addresses that gain reverting code after approval are
rejected when batched (one not allowlisted; one allowlisted whose payout would now revert), holds
released. The books verify and the ethereum lines reconcile to zero."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from sqlalchemy import text

from custody.client import CustodyApiError
from regtest.anvil_node import compile_contract, deploy_contract
from regtest.install import find_tools
from regtest.util import assert_equal
from tests.e2e import txbuild
from tests.e2e.custody.api_helpers import backend_client, credit, refused, withdraw
from tests.e2e.custody.conftest import ETH_FINALITY

REJECTS_ETHER = Path(__file__).resolve().parents[3] / "contracts" / "RejectsEther.sol"
ZERO = "0x0000000000000000000000000000000000000000"
DEAD = "0x000000000000000000000000000000000000dEaD"
ECRECOVER = "0x0000000000000000000000000000000000000001"
P256_VERIFY = "0x0000000000000000000000000000000000000100"
REVERT_CODE = "0x60006000fd"  # PUSH1 0 PUSH1 0 REVERT: any call reverts


@pytest.fixture
def api(custody):
    return backend_client(custody, "backend-dest")


def test_ethereum_destinations_that_swallow_value_are_refused(custody, customer, api, anvil, usdt, engine, ledger, log):
    w, p = custody.withdrawals, custody.payouts
    owner = f"eth-dest-{uuid.uuid4().hex[:8]}"
    eth_acct, usdt_acct = customer("ETH", owner), customer("USDT", owner)
    credit(custody, eth_acct, "ETH", 3 * 10**18)
    credit(custody, usdt_acct, "USDT", 5_000 * 10**6)
    hot = p.hot_address("ethereum")
    log.info("treasury funds the hot wallet %s with 1 ETH for gas and 1,000 USDT", hot)
    funding, minted = anvil.fund(hot, 10**18), usdt.mint(hot, 1_000 * 10**6)
    p.book_hot_funding("ethereum", "ETH", 10**18, f"hot-funding:ethereum:{funding}")
    p.book_hot_funding("ethereum", "USDT", 1_000 * 10**6, f"hot-funding:ethereum:{minted}")

    log.info("a contract that rejects ether is deployed at a fresh address")
    rejecter = deploy_contract(anvil.w3, compile_contract(find_tools(), REJECTS_ETHER, "RejectsEther"))
    assert len(anvil.w3.eth.get_code(rejecter)) > 0

    with engine.connect() as c:
        signed_before = c.execute(text("SELECT count(*) FROM chain_transaction")).scalar_one()
    cases = [(usdt_acct, "1", usdt.address, "destination_token_contract"),
             (eth_acct, "0.01", usdt.address, "destination_token_contract"),
             (usdt_acct, "1", DEAD, "destination_burn_address"),
             (usdt_acct, "1", ZERO, "destination_zero_address"),
             (usdt_acct, "1", ECRECOVER, "destination_precompile"),
             (usdt_acct, "1", P256_VERIFY, "destination_precompile"),
             (eth_acct, "0.01", rejecter, "destination_contract_not_allowlisted"),
             (usdt_acct, "1", rejecter, "destination_contract_not_allowlisted")]
    answers, expected = [], []
    for acct, amount, destination, code in cases:
        answers.append(refused(lambda: withdraw(api, acct, amount, destination)))
        expected.append((422, code))
        log.info("%s %s to %s -> %s", amount, "USDT" if acct == usdt_acct else "ETH", destination, answers[-1])
    assert_equal(answers, expected)

    log.info("the customer allowlists the contract: ether is still refused, the simulated payout reverts")
    for acct in (eth_acct, usdt_acct):
        assert_equal(api.allow_destination(acct, address=rejecter).account_id, acct)
    with pytest.raises(CustodyApiError) as r:
        withdraw(api, eth_acct, "0.01", rejecter)
    assert_equal((r.value.status, r.value.code), (422, "destination_would_revert"))
    log.info("refused: %s", r.value.message)
    for acct in (eth_acct, usdt_acct):
        assert_equal(ledger.balance(acct).held, 0)
        assert_equal(w.list(account_id=acct, state=None), [])  # nothing was written
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT count(*) FROM chain_transaction")).scalar_one(), signed_before)  # no gas spent

    log.info("USDT to the allowlisted contract is paid: a token transfer runs no code of the destination")
    token_amt = 12_345_678
    r = withdraw(api, usdt_acct, "12.345678", rejecter)
    assert_equal(r.state, "approved")
    paid = r.id

    log.info("ether withdrawals to two plain addresses (one allowlisted) are approved; both gain reverting code")
    plain, listed = txbuild.eth_new_address(f"grows-code-{owner}"), txbuild.eth_new_address(f"grows-code-listed-{owner}")
    assert_equal(api.allow_destination(eth_acct, address=listed).account_id, eth_acct)
    grows = []
    for destination in (plain, listed):
        r = withdraw(api, eth_acct, "0.02", destination)
        assert_equal(r.state, "approved")
        grows.append(r.id)
        anvil.call("anvil_setCode", destination, REVERT_CODE)

    log.info("batching checks again: both rejected, holds released; the USDT payout goes on")
    batches = p.batch_ethereum()
    assert_equal([(w.get(i).state, w.get(i).reject_reasons) for i in grows],
                 [("rejected", ("destination_contract_not_allowlisted",)), ("rejected", ("destination_would_revert",))])
    assert_equal(ledger.balance(eth_acct).held, 0)
    assert_equal(w.get(paid).state, "batched")
    assert w.get(paid).batch_id in batches
    txids = p.sign_open_batches()
    assert_equal(p.broadcast(), len(txids))
    for t in txids:
        anvil.wait_mined(t)
    anvil.mine(ETH_FINALITY)
    p.track()
    assert_equal(w.get(paid).state, "final")
    assert_equal(usdt.balance_of(rejecter), token_amt)
    assert_equal((anvil.w3.eth.get_balance(plain), anvil.w3.eth.get_balance(listed)), (0, 0))

    log.info("the books close: customer balances, and every ethereum line reconciles to zero")
    assert_equal(ledger.balance(usdt_acct).posted, 5_000 * 10**6 - token_amt - 10**6)
    assert_equal(ledger.balance(eth_acct).posted, 3 * 10**18)
    custody.deposits.run_once(["ethereum"])
    lines = custody.reconciliation.run(chains=["ethereum"])
    for line in lines:
        log.info("%s %s: chain %d, books %d, in transit %d", line.tier, line.asset, line.on_chain, line.books, line.in_transit)
    assert_equal({line.difference for line in lines}, {0})
