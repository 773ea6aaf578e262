"""Second adversarial review of issue 11: a reorg battle that the deposit pipeline loses track of.

Block X holds Alice's credited deposit (final). A competing branch wins for a while (X is
invalidated, one empty block mined on the fork point): the deposit is reorged out after finality,
the shortfall is booked to suspense, her credit is frozen, a critical incident engages the kill
switch. Then the original branch wins back (reconsiderblock X: it is longer): the very same
transaction is in the very same block X again. The scanner reports the observation in X;
`Deposits._record` takes it for "seen before in this very block" (a rescan after a crash: the
observation still names X, as `_deep_reorg` left it) and never reaches its re-mine branch. The
coins are on chain, yet the shortfall stays booked and Alice's credit stays frozen (an operator
may capture it to suspense); the deposit location's books now hold less than the chain (a
surplus). Expected: the same as a re-mine in another block: compensation reversed.
The test reverses the compensation itself afterwards, so later suites see clean books.
"""
from __future__ import annotations

from sqlalchemy import text

from custody.controls import set_kill_switch
from custody.incidents import Incidents
from regtest.util import assert_equal
from tests.e2e.custody.conftest import BTC_FINALITY

OTHER = "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080"  # not ours: the competing block pays here


def test_a_deposit_back_in_its_original_block_stays_reorged_out(custody, customer, bitcoind, engine, ledger, log):
    acct = customer("BTC")
    addr = custody.wallets.issue_address(f"addr:{acct}", acct).address
    bitcoind.fund(addr, 3_000_000)
    blocks = bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    [obs] = custody.deposits.list(account_id=acct)
    assert_equal(obs["state"], "credited")
    suspense = custody.wallets.firm_account("suspense", "BTC")
    before = ledger.balance(suspense).posted

    log.info("a competing branch wins: block %s is out, the deposit is reorged out after finality", blocks[0])
    bitcoind.rpc("invalidateblock", blocks[0])
    bitcoind.rpc("generateblock", OTHER, [])
    custody.deposits.run_once(["bitcoin"])
    assert_equal((ledger.balance(suspense).posted - before, ledger.balance(acct).held), (-3_000_000, 3_000_000))

    log.info("the original branch wins back: the same transaction, the same block %s", blocks[0])
    bitcoind.rpc("reconsiderblock", blocks[0])
    assert_equal(bitcoind.rpc("getbestblockhash"), blocks[-1])
    custody.deposits.run_once(["bitcoin"])
    short, held = ledger.balance(suspense).posted - before, ledger.balance(acct).held
    log.info("after the original block came back: suspense short by %d, %d of the credit held", -short, held)

    log.info("clean-up: reverse the shortfall booking if it still stands, release the freeze and the switch")
    with engine.connect() as c:
        incident = c.execute(text("SELECT id, detail FROM incident WHERE kind = 'deposit_reorged_after_finality' "
                                  "AND detail->>'observation_id' = :i ORDER BY id DESC LIMIT 1"), {"i": str(obs["id"])}).one()
        standing = c.execute(text("SELECT 1 FROM journal_transaction WHERE reverses_id = :t"),
                             {"t": int(incident.detail["suspense_transaction_id"])}).first() is None
    if standing:
        ledger.reverse(int(incident.detail["suspense_transaction_id"]), f"review2:reorg-back:{obs['id']}")
    with engine.connect() as c:
        resolved = c.execute(text("SELECT resolved_at IS NOT NULL FROM incident WHERE id = :i"), {"i": incident.id}).scalar_one()
    if not resolved:
        Incidents(engine, ledger).resolve(incident.id, operator="review2-cleanup", comment="re-mined in its block",
                                          decision="release")
    with engine.begin() as c:
        set_kill_switch(c, False, "review2 test cleanup", "review2-cleanup")
    assert_equal(ledger.balance(suspense).posted, before)

    assert_equal(short, 0)  # custody's freeze hold stays for the operator, as after any re-mine
