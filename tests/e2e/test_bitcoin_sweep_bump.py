"""bitcoin_sweep_bump: a sweep stuck in the mempool for `stuck_blocks` blocks is signed again over the
same deposit coins at a higher fee (RBF) and sent; only the version the chain mines is booked, with
its own fee, exactly once. Twice: once the replacement is mined (the usual case), once a miner takes
the ORIGINAL after all (a block built with it, `generateblock`), which the sweep then follows and
books at the original fee. The first time the process dies between storing the replacement and
sending it: the next tracking run sends it. Reconciliation is zero at the end and the ledger verifies."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from chain_adapters.errors import ChainError
from regtest.util import assert_equal
from tests.e2e.custody.conftest import BTC_FINALITY, custody, signer_keys  # noqa: F401 - the custody suite's fixtures
from tests.e2e.treasury_helpers import reconciled

OTHER = "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080"  # empty blocks are mined to someone else


def deposit(custody, bitcoind, n: int) -> list[int]:  # noqa: F811
    accounts = [custody.wallets.customer_account(f"sweep-bump-{bitcoind.rpc('getblockcount')}-{i}", "BTC") for i in range(n)]
    for a in accounts:
        bitcoind.fund(custody.wallets.issue_address(f"addr:{a}", a).address, 2_000_000)
    bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    return accounts


def stuck_sweep(custody, bitcoind, log, *, lost: bool = False) -> tuple[int, str, str]:  # noqa: F811
    """A sweep signed, sent, then left out of `stuck_blocks` empty blocks, and bumped: (id, first txid,
    second txid). `lost`: the process dies between storing the replacement and sending it; the next
    `track()` sends the stored replacement (it never falls back to the stuck version)."""
    sweeps = custody.sweeps
    first = sweeps.sweep_bitcoin()
    assert first is not None
    assert_equal(sweeps.broadcast(), 1)
    log.info("%d empty blocks: the sweep %s is stuck", sweeps.bump.stuck_blocks, first)
    for _ in range(sweeps.bump.stuck_blocks - 1):
        bitcoind.rpc("generateblock", OTHER, [])
    assert_equal(sweeps.bump_fees(), [])  # not stuck yet
    bitcoind.rpc("generateblock", OTHER, [])
    if lost:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(sweeps.bitcoin, "broadcast", lost_send)
            [second] = sweeps.bump_fees()
        mempool = bitcoind.rpc("getrawmempool")
        assert first in mempool and second not in mempool
        assert_equal(sweeps.track(), 0)
    else:
        [second] = sweeps.bump_fees()
    assert_equal(sweeps.bump_fees(), [])  # one replacement per stuck version
    mempool = bitcoind.rpc("getrawmempool")
    assert second in mempool and first not in mempool
    with custody.engine.connect() as c:
        sweep_id = c.execute(text("SELECT id FROM sweep WHERE txid = :t"), {"t": second}).scalar_one()
    return sweep_id, first, second


def lost_send(raw: bytes):
    raise ChainError("the process died before it sent this")


def versions(engine, sweep_id: int) -> list:
    with engine.connect() as c:
        return c.execute(text("SELECT id, txid, fee, fee_rate, replaces_id FROM firm_tx_version WHERE machine = 'sweep' "
                              "AND row_id = :s ORDER BY id"), {"s": sweep_id}).all()


def booked(engine, txid: str) -> int:
    with engine.connect() as c:
        return c.execute(text("SELECT count(*) FROM journal_transaction WHERE metadata->>'txid' = :t"), {"t": txid}).scalar_one()


def test_a_stuck_sweep_is_bumped_and_only_the_mined_version_is_booked(custody, bitcoind, engine, ledger, log):  # noqa: F811
    sweeps = custody.sweeps
    deposit_loc = custody.wallets.location_account("bitcoin", "deposit", "BTC")
    hot = custody.wallets.location_account("bitcoin", "hot", "BTC")
    expense = custody.wallets.firm_account("network_fees", "BTC")
    bitcoind.mine(1)
    custody.payouts.sync_hot_wallet()
    sweeps.run_once()  # anything an earlier suite left to sweep is swept, so this test's sweep is its own
    bitcoind.mine(BTC_FINALITY)
    sweeps.track()

    log.info("the replacement is mined: booked once, at its fee; the first version never")
    deposit(custody, bitcoind, 2)
    before = {a: ledger.balance(a).posted for a in (deposit_loc, hot, expense)}
    sweep_id, first, second = stuck_sweep(custody, bitcoind, log, lost=True)
    [v1, v2] = versions(engine, sweep_id)
    assert_equal((v1.txid, v2.txid, v2.replaces_id), (first, second, v1.id))
    assert int(v2.fee) > int(v1.fee) and int(v2.fee_rate) > int(v1.fee_rate)
    log.info("fee %d -> %d sat", v1.fee, v2.fee)
    sweeps.track()  # both followed until one is mined: nothing moves
    bitcoind.mine(BTC_FINALITY)
    assert_equal(sweeps.track(), 1)
    with engine.connect() as c:
        row = c.execute(text("SELECT state, txid, amount, fee FROM sweep WHERE id = :s"), {"s": sweep_id}).one()
    assert_equal((row.state, row.txid, int(row.fee)), ("final", second, int(v2.fee)))
    amount = int(row.amount)
    assert_equal(ledger.balance(deposit_loc).posted - before[deposit_loc], amount)
    assert_equal(ledger.balance(hot).posted - before[hot], -(amount - int(v2.fee)))
    assert_equal(ledger.balance(expense).posted - before[expense], -int(v2.fee))
    assert_equal((booked(engine, second), booked(engine, first)), (1, 0))
    assert_equal(sweeps.track(), 0)
    reconciled(custody)

    log.info("a miner takes the ORIGINAL version after all: the sweep follows it and books it at the original fee")
    deposit(custody, bitcoind, 2)
    before = {a: ledger.balance(a).posted for a in (deposit_loc, hot, expense)}
    sweep_id, first, second = stuck_sweep(custody, bitcoind, log)
    [v1, v2] = versions(engine, sweep_id)
    with engine.connect() as c:
        original = bytes(c.execute(text("SELECT raw FROM firm_tx_version WHERE id = :v"), {"v": v1.id}).scalar_one()).hex()
    bitcoind.rpc("generateblock", OTHER, [original])
    assert second not in bitcoind.rpc("getrawmempool")  # its inputs are spent in the chain now
    assert_equal(sweeps.track(), 0)  # the row follows the mined version
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT txid FROM sweep WHERE id = :s"), {"s": sweep_id}).scalar_one(), first)
    bitcoind.mine(BTC_FINALITY)
    assert_equal(sweeps.track(), 1)
    with engine.connect() as c:
        row = c.execute(text("SELECT state, txid, amount, fee FROM sweep WHERE id = :s"), {"s": sweep_id}).one()
    assert_equal((row.state, row.txid, int(row.fee)), ("final", first, int(v1.fee)))
    amount = int(row.amount)
    assert_equal(ledger.balance(hot).posted - before[hot], -(amount - int(v1.fee)))
    assert_equal(ledger.balance(expense).posted - before[expense], -int(v1.fee))
    assert_equal((booked(engine, first), booked(engine, second)), (1, 0))
    custody.payouts.sync_hot_wallet()
    assert_equal(ledger.balance(hot).posted - before[hot], -(amount - int(v1.fee)))  # the swept coin is ours, not "funding"
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT count(*) FROM sweep WHERE state NOT IN ('final', 'dropped', 'abandoned')")).scalar_one(), 0)
    reconciled(custody)
    ledger.assert_verified()
