"""The wallet index against bitcoind (issue 13): deposits, a sweep, a payout with change and a reorg
that removes the block holding our change output and a deposit. At every step the index equals
what the node says (compared from the test itself with `scantxoutset` over every address of ours
the index knows, and `gettxout` per indexed outpoint), reconciliation is zero and the books verify.
Every RPC method the jobs call is recorded (the adapter's client is wrapped): `scantxoutset` is
never among them.
"""
from __future__ import annotations

from contextlib import contextmanager

import pytest
from sqlalchemy import text

from custody.wallet_index import unspent
from regtest.util import assert_equal
from tests.e2e.custody.conftest import BTC_FINALITY


class Recorder:
    """Wraps the adapter's JSON-RPC client and records the methods called while `on`."""

    def __init__(self, rpc) -> None:
        self.rpc, self.methods, self.on = rpc, [], True
        self._call, self._batch = rpc.call, rpc.batch
        rpc.call = self.call
        rpc.batch = self.batch

    def call(self, method, *params, **kw):
        if self.on:
            self.methods.append(method)
        return self._call(method, *params, **kw)

    def batch(self, calls, *a, **kw):
        if self.on:
            self.methods += [m for m, _ in calls]
        return self._batch(calls, *a, **kw)

    def restore(self) -> None:
        self.rpc.call, self.rpc.batch = self._call, self._batch

    @contextmanager
    def paused(self):
        self.on = False
        try:
            yield
        finally:
            self.on = True


@pytest.fixture
def recorder(custody):
    r = Recorder(custody.adapters["bitcoin"].rpc)
    yield r
    r.restore()


def index_agrees_with_node(custody, engine, recorder) -> None:
    with engine.connect() as c:
        ours = {(u.txid, u.index): u.amount for t in ("deposit", "hot", "cold") for u in unspent(c, t)}
        addresses = c.execute(text("SELECT DISTINCT address FROM btc_wallet_output")).scalars().all()
    adapter = custody.adapters["bitcoin"]
    with recorder.paused():
        node = {(u.txid, u.index): u.amount for u in adapter.unspent(addresses)}
        for txid, vout in ours:
            assert adapter.rpc.call("gettxout", txid, vout, False) is not None, (txid, vout)
    assert_equal(ours, node)


def reconciled(custody) -> None:
    lines = custody.reconciliation.run(chains=["bitcoin"])
    assert {"deposit", "hot"} <= {ln.tier for ln in lines}
    assert_equal({ln.tier: ln.difference for ln in lines}, {ln.tier: 0 for ln in lines})
    # the independent evidence: the node's own watch-only wallet, read at the same tip, agrees
    assert_equal({ln.tier: ln.node for ln in lines}, {ln.tier: ln.on_chain for ln in lines})


def test_index_follows_deposits_sweep_payout_and_a_reorg(custody, customer, bitcoind, engine, ledger, recorder, log):
    p = custody.payouts
    log.info("hot funding and two deposits")
    bitcoind.fund(p.hot_address("bitcoin"), 5 * 100_000_000)
    accounts = [customer("BTC") for _ in range(2)]
    for a in accounts:
        bitcoind.fund(custody.wallets.issue_address(f"idx:{a}", a).address, 2_000_000)
    bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    p.sync_hot_wallet()
    index_agrees_with_node(custody, engine, recorder)
    reconciled(custody)

    log.info("a sweep of the booked deposits")
    txid = custody.sweeps.sweep_bitcoin()
    assert txid is not None
    custody.sweeps.broadcast()
    bitcoind.mine(1)
    custody.sweeps.track()
    custody.deposits.run_once(["bitcoin"])
    index_agrees_with_node(custody, engine, recorder)
    reconciled(custody)

    log.info("a payout with change, then a deposit, mined in one block; that block is then reorged out")
    acct = accounts[0]
    dest = bitcoind.wallet("getnewaddress", "", "bech32")
    custody.withdrawals.request(client_withdrawal_id=f"idx-w-{acct}", account_id=acct, amount=500_000,
                                destination=dest, requested_by="backend")
    p.batch_bitcoin()
    p.sign_open_batches()
    p.broadcast()
    late = customer("BTC")
    bitcoind.fund(custody.wallets.issue_address(f"idx:{late}", late).address, 1_000_000)
    bitcoind.mine(1)
    block = bitcoind.rpc("getbestblockhash")
    custody.deposits.run_once(["bitcoin"])
    p.track()
    with engine.connect() as c:
        change = c.execute(text("SELECT count(*) FROM btc_wallet_output WHERE block_hash = :b AND tier = 'hot' "
                                "AND derivation_change = 1"), {"b": block}).scalar_one()
        deposit = c.execute(text("SELECT count(*) FROM btc_wallet_output WHERE block_hash = :b AND tier = 'deposit'"),
                            {"b": block}).scalar_one()
    assert_equal((change, deposit), (1, 1))
    index_agrees_with_node(custody, engine, recorder)
    reconciled(custody)

    bitcoind.rpc("invalidateblock", block)
    with recorder.paused():
        # a longer competing chain; its first block re-mines the undone block's transactions (back in
        # the mempool), so the index undoes the change and the deposit and applies them again there
        bitcoind.rpc("generatetoaddress", 2, bitcoind.wallet("getnewaddress"))
    custody.deposits.run_once(["bitcoin"])
    p.track()
    index_agrees_with_node(custody, engine, recorder)
    reconciled(custody)
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT count(*) FROM btc_wallet_output WHERE block_hash = :b"), {"b": block}).scalar_one(), 0)

    log.info("proof of reserves reads the index too")
    custody.reserves.publish(["BTC"])
    assert "scantxoutset" not in recorder.methods, sorted(set(recorder.methods))
    assert {"getblock", "getblockhash"} <= set(recorder.methods)  # the recorder saw the jobs' calls

    log.info("the payout and the sweep taken to finality and booked: nothing left in flight for later tests")
    bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    p.track()
    custody.sweeps.track()
    with engine.connect() as c:
        in_flight = c.execute(text("SELECT (SELECT count(*) FROM withdrawal_batch WHERE chain = 'bitcoin' AND state NOT IN "
                                   "('final', 'failed', 'abandoned')) + (SELECT count(*) FROM sweep WHERE state NOT IN "
                                   "('final', 'dropped', 'abandoned'))")).scalar_one()
    assert_equal(in_flight, 0)
    index_agrees_with_node(custody, engine, recorder)
    reconciled(custody)
    ledger.assert_verified()
