"""withdrawal_future_change_address (adversarial review of issue 11, observation 3): a customer who
knows the hot wallet's xpub (every database copy holds it) withdraws to the change address of a
batch that does not exist yet, further ahead than custody.destinations refuses (`CHANGE_LOOKAHEAD`
batch ids past the next one) and further than the signer refuses on its own (`signer.own_addresses
.CHANGE_WINDOW` batch ids either side of the batch it signs; within it the signer refuses with
`destination_internal`). The request is accepted and paid: no window is infinite. Later that
batch exists, its change goes to the same address, and the hot-wallet sync finds the customer's
coin there. It is an output of our own payout transaction but not the change output we built, so
it is not taken as our change (spendable and in no book, a reconciliation difference that once
halted every withdrawal): it is booked as hot funding, with a warning incident naming it. The books
verify, the bitcoin lines reconcile to zero and the kill switch stays released."""
from __future__ import annotations

import uuid

from sqlalchemy import text

from custody.controls import kill_switch
from custody.destinations import CHANGE_LOOKAHEAD
from custody.payouts import spendable_coins
from signer.own_addresses import CHANGE_WINDOW
from ledger.model import Transfer
from regtest.util import assert_equal
from tests.e2e.custody.conftest import BTC_FINALITY

PAID = 1_000_000  # 0.01 BTC to the firm's own future change address


def next_batch_id(engine) -> int:
    with engine.connect() as c:
        return c.execute(text("SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END "
                              "FROM withdrawal_batch_id_seq")).scalar_one()


def pay(custody, bitcoind, acct: int, amount: int, destination: str) -> int:
    """Request, batch, sign, broadcast, mine to finality and track one withdrawal; its batch id."""
    w, p = custody.withdrawals, custody.payouts
    r = w.request(client_withdrawal_id=uuid.uuid4().hex, account_id=acct, amount=amount, destination=destination,
                  requested_by="backend")
    assert_equal(r.state, "approved")
    batch_id = p.batch_bitcoin()
    p.sign_open_batches()
    assert_equal(p.broadcast(), 1)
    bitcoind.mine(BTC_FINALITY)
    p.track()
    assert_equal(w.get(r.id).state, "final")
    return batch_id


def bitcoin_differences(custody) -> dict:
    custody.deposits.run_once(["bitcoin"])  # the scanner at the tip, as the deposit line needs
    return {line.tier: line.difference for line in custody.reconciliation.run(chains=["bitcoin"])}


def test_a_payout_to_our_future_change_address_is_booked_not_taken_as_change(custody, customer, bitcoind, engine,
                                                                             ledger, log):
    p = custody.payouts
    acct = customer("BTC")
    equity = custody.wallets.firm_account("equity", "BTC")
    ledger.post(f"test-credit:{uuid.uuid4().hex}", [Transfer(equity, acct, 10_000_000)], kind="treasury_credit")
    bitcoind.fund(p.hot_address("bitcoin"), 100_000_000)
    bitcoind.mine(1)
    p.sync_hot_wallet()

    first = next_batch_id(engine)
    # the first batch id neither custody's destination check nor the signer's own window looks at
    target = first + max(CHANGE_LOOKAHEAD, CHANGE_WINDOW) + 1
    future_change = p.hot_address("bitcoin", 1, target)
    log.info("a withdrawal to %s, the change address of batch %d (next batch: %d), is accepted and paid",
             future_change, target, first)
    assert_equal(pay(custody, bitcoind, acct, PAID, future_change), first)
    assert_equal(bitcoin_differences(custody)["hot"], 0)  # 1/<target> is nobody's yet

    log.info("batch ids up to %d are taken (by batching runs that rolled back, say)", target - 1)
    with engine.begin() as c:
        c.execute(text("SELECT setval('withdrawal_batch_id_seq', :v)"), {"v": target - 1})
    log.info("batch %d pays an ordinary withdrawal; its change goes to the same address", target)
    assert_equal(pay(custody, bitcoind, acct, 2_000_000, bitcoind.wallet("getnewaddress", "", "bech32")), target)

    log.info("the sync finds the customer's coin at 1/%d: booked as funding, with a warning", target)
    p.sync_hot_wallet()
    log.info("the bitcoin lines reconcile to zero; nothing halted")
    differences = bitcoin_differences(custody)
    assert_equal((differences["hot"], set(differences.values())), (0, {0}))
    assert not kill_switch(engine).engaged
    with engine.connect() as c:
        coins = c.execute(text("SELECT vout, amount FROM wallet_utxo WHERE address = :a ORDER BY vout"),
                          {"a": future_change}).all()
        incident = c.execute(text("SELECT severity, detail FROM incident WHERE kind = 'withdrawal_paid_own_address' "
                                  "AND detail->>'address' = :a"), {"a": future_change}).one()
        booked = c.execute(text("SELECT count(*) FROM journal_transaction WHERE kind = 'hot_funding' "
                                "AND idempotency_key = :k"),
                           {"k": f"hot-funding:bitcoin:{incident.detail['txid']}:{incident.detail['vout']}"}).scalar_one()
    with engine.begin() as c:
        spendable = {(coin.txid, coin.vout) for coin in spendable_coins(c)}
    log.info("coins at %s: %s; incident %s", future_change, coins, incident)
    assert (incident.detail["txid"], incident.detail["vout"]) in spendable  # booked, so spent like any other
    assert_equal(len(coins), 2)  # the customer's payout and the later batch's change, each once
    assert_equal((incident.severity, incident.detail["amount"], incident.detail["derivation"], booked),
                 ("warning", PAID, f"1/{target}", 1))
