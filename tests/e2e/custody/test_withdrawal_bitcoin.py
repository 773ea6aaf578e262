"""withdrawal_bitcoin: 20 withdrawals (three needing two distinct operators) paid by one batch
transaction with 20 outputs plus change, accepted and mined by bitcoind; balances, in-flight and the
hot wallet location are checked at each step, and the books close exactly at finality."""
from __future__ import annotations

from decimal import Decimal

import pytest
from custody.errors import CustodyError
from regtest.util import assert_equal
from tests.approvers import approve
from tests.e2e.custody.conftest import BTC_FINALITY

DEPOSIT = 300_000_000  # 3 BTC per customer
BIG = 250_000_000  # 2.5 BTC: above the 2-operator tier
FEE = 5_000  # quoted per withdrawal (normal priority)


def sat(value) -> int:
    return int(Decimal(str(value)) * 100_000_000)


@pytest.fixture
def funded_customers(custody, customer, bitcoind):
    """20 customers, each credited 3 BTC through the real deposit pipeline."""
    accounts = [customer("BTC") for _ in range(20)]
    addresses = [custody.wallets.issue_address(f"addr:{a}", a).address for a in accounts]
    bitcoind.wallet("sendmany", "", {a: "3" for a in addresses})
    bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    return accounts


@pytest.fixture
def hot_funded(custody, bitcoind):
    p = custody.payouts
    bitcoind.fund(p.hot_address("bitcoin"), 100 * 100_000_000)
    bitcoind.mine(1)
    p.sync_hot_wallet()
    return p


def test_batch_of_twenty_with_approvals(custody, funded_customers, hot_funded, bitcoind, ledger, log):
    w, p, L = custody.withdrawals, hot_funded, ledger
    amounts = [1_000_000 + 12_345 * i for i in range(17)] + [BIG, BIG, BIG]
    dests = [bitcoind.wallet("getnewaddress", "", "bech32") for _ in amounts]
    for acct in funded_customers:
        assert_equal(L.balance(acct).posted, DEPOSIT)

    log.info("20 requests: 17 auto-approved, 3 above the two-operator tier")
    reqs = [w.request(client_withdrawal_id=f"w-{i}", account_id=acct, amount=amt, destination=d, requested_by="backend")
            for i, (acct, amt, d) in enumerate(zip(funded_customers, amounts, dests))]
    assert_equal([r.state for r in reqs], ["approved"] * 17 + ["pending_approval"] * 3)
    big = reqs[17:]
    bal = L.balance(big[0].account_id)
    assert_equal((bal.held, bal.available), (BIG + FEE, DEPOSIT - BIG - FEE))
    replay = w.request(client_withdrawal_id="w-0", account_id=funded_customers[0], amount=amounts[0], destination=dests[0],
                       requested_by="backend")
    assert_equal((replay.id, replay.created), (reqs[0].id, False))

    log.info("the requester cannot approve; one operator counts once; two distinct operators approve")
    with pytest.raises(CustodyError) as err:
        w.approve(big[0].id, operator="backend", comment="mine")
    assert_equal(err.value.code.value, "requester_cannot_approve")
    for r in big:
        assert_equal(approve(w, r.id, "op-alice", "ok, known customer").state, "pending_approval")
    with pytest.raises(CustodyError) as err:
        approve(w, big[0].id, "op-alice", "again")
    assert_equal(err.value.code.value, "already_acted")
    for r in big:
        assert_equal(approve(w, r.id, "op-bob", "second pair of eyes").state, "approved")

    log.info("batch, sign: holds captured into in-flight and fee income")
    in_flight = custody.wallets.firm_account("in_flight", "BTC")
    fees = custody.wallets.firm_account("fees", "BTC")
    expense = custody.wallets.firm_account("network_fees", "BTC")
    hot = custody.wallets.location_account("bitcoin", "hot", "BTC")
    before = {k: L.balance(a).posted for k, a in (("in_flight", in_flight), ("fees", fees), ("expense", expense), ("hot", hot))}
    total = sum(amounts)
    assert p.batch_bitcoin() is not None
    [txid] = p.sign_open_batches()
    assert_equal(L.balance(in_flight).posted, before["in_flight"] + total)
    assert_equal(L.balance(fees).posted, before["fees"] + 20 * FEE)
    assert_equal(L.balance(hot).posted, before["hot"])  # nothing has left the wallet yet
    for acct, amt in zip(funded_customers, amounts):
        bal = L.balance(acct)
        assert_equal((bal.posted, bal.held), (DEPOSIT - amt - FEE, 0))

    log.info("broadcast: one transaction, 20 outputs plus change, in the mempool")
    assert_equal(p.broadcast(), 1)
    tx = bitcoind.rpc("getrawtransaction", txid, True)
    assert_equal(len(tx["vout"]), 21)
    paid = {o["scriptPubKey"]["address"]: sat(o["value"]) for o in tx["vout"]}
    for d, amt in zip(dests, amounts):
        assert_equal(paid[d], amt)
    network_fee = sat(bitcoind.rpc("getmempoolentry", txid)["fees"]["base"])
    log.info("network fee paid: %d sat for %d vB", network_fee, tx["vsize"])

    log.info("mine to finality: in-flight -> hot location, network fee -> expense, exactly once")
    bitcoind.mine(BTC_FINALITY - 1)
    assert_equal(p.track(), 0)
    assert_equal([w.get(r.id).state for r in reqs], ["confirmed"] * 20)
    bitcoind.mine(1)
    assert_equal(p.track(), 1)
    assert_equal(p.track(), 0)
    assert_equal(L.balance(in_flight).posted, before["in_flight"])
    assert_equal(L.balance(hot).posted, before["hot"] + total + network_fee)
    assert_equal(L.balance(expense).posted, before["expense"] - network_fee)
    assert_equal([w.get(r.id).state for r in reqs], ["final"] * 20)
    for d, amt in zip(dests, amounts):
        assert_equal(sat(bitcoind.wallet("getreceivedbyaddress", d)), amt)
