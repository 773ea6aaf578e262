"""deposit_many: 1,000 outputs to 200 watched addresses across 20 blocks are each credited exactly
once, and every customer's balance is the sum of what was paid to their addresses."""
from __future__ import annotations

import random
import time
from collections import Counter

from sqlalchemy import text

from regtest.util import assert_equal
from regtest.workloads import pay_many_bitcoin
from tests.e2e.custody.conftest import BTC_FINALITY


def test_thousand_outputs_credited_once(custody, customer, bitcoind, engine, ledger, log):
    rng = random.Random(20261129)
    accounts = [customer("BTC") for _ in range(200)]
    address_of = {custody.wallets.issue_address(f"addr:{a}", a).address: a for a in accounts}
    log.info("paying 1,000 outputs to 200 addresses over 20 blocks")
    paid = pay_many_bitcoin(bitcoind, list(address_of), 1000, 20, rng)
    bitcoind.mine(BTC_FINALITY)
    start = time.perf_counter()
    custody.deposits.run_once(["bitcoin"])
    log.info("scan -> credit of 1,000 deposits took %.1fs", time.perf_counter() - start)
    custody.deposits.run_once(["bitcoin"])  # a second pass credits nothing new

    expected = Counter()
    for address, sat in paid:
        expected[address_of[address]] += sat
    for acct in accounts:
        assert_equal(ledger.balance(acct).posted, expected[acct])
    with engine.connect() as c:
        states = c.execute(text("SELECT state, count(*) FROM deposit_observation WHERE account_id = ANY(:a) GROUP BY state"),
                           {"a": accounts}).all()
        keys = c.execute(text("SELECT count(*), count(DISTINCT idempotency_key) FROM journal_transaction "
                              "WHERE kind = 'deposit' AND metadata->>'observation_id' IN "
                              "(SELECT id::text FROM deposit_observation WHERE account_id = ANY(:a))"), {"a": accounts}).one()
    assert_equal(dict(states), {"credited": 1000})
    assert_equal(tuple(keys), (1000, 1000))
