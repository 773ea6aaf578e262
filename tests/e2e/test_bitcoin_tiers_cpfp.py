"""bitcoin_tiers_cpfp: a cold -> hot move (a PSBT signed offline) stuck in the mempool is bumped by a CPFP
child, since RBF cannot re-sign it (its key is offline).

The market is made with `prioritisetransaction`: the parent's fee counts as zero to this node's
block assembler, so `generatetoaddress` leaves it out (below the minimum block fee rate) until a
child pays for the package. After `stuck_blocks` blocks the worker has the signer sign a child
spending the parent's output at the hot receive address back to it, at a fee that brings the
package to the bumped rate. The first ask loses the signer's reply (a crash after the signer
recorded it): asked again, by two workers at once, the signer answers the same child, and there is one child. That child is
then made stuck the same way, and the next bump replaces the CHILD by RBF (the parent is never
re-signed). The package mines; the parent is booked once as the rebalance (its own fee), the
mined child's fee once (hot -> network-fee expense); the replaced child never. Reconciliation is
zero before, while the parent and children wait, once mined but not final, and after; the child's
output is hot's to spend once final, the parent's spent output never; the ledger verifies."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import text

from chain_adapters.bitcoin import BitcoinAdapter, txid_of
from custody.cpfp import Cpfp
from custody.firm_moves import BumpConfig
from custody.rebalances import RebalanceConfig, RebalanceThreshold
from regtest.util import assert_equal
from signer.wire import SignerUnavailable
from tests.e2e.custody.conftest import BTC_FINALITY, custody, signer_keys  # noqa: F401 - fixtures
from tests.e2e.test_bitcoin_tiers_psbt import offline_signer
from tests.e2e.treasury_helpers import rebalances, reconciled, spendable  # noqa: F401 - fixture

BTC = 100_000_000
OTHER = "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080"  # a block mined to someone else
TIERS = ("deposit", "hot", "cold")


def booked(engine, key: str) -> list:
    with engine.connect() as c:
        return c.execute(text("SELECT metadata FROM journal_transaction WHERE idempotency_key = :k"), {"k": key}).scalars().all()


def booked_txid(engine, txid: str) -> int:
    with engine.connect() as c:
        return c.execute(text("SELECT count(*) FROM journal_transaction WHERE metadata->>'txid' = :t"), {"t": txid}).scalar_one()


def cold_coins(custody, bitcoind, engine, rebalances):  # noqa: F811
    """Cold gets a coin the way it does in production: a hot -> cold rebalance above the ceiling, booked final."""
    base = spendable(custody, engine)
    rebalances.config = RebalanceConfig(thresholds={"BTC": RebalanceThreshold(ceiling=base + BTC, target=base + BTC // 4)})
    bitcoind.fund(custody.payouts.hot_address("bitcoin"), 2 * BTC)
    bitcoind.mine(1)
    spendable(custody, engine)
    assert rebalances.rebalance_bitcoin() is not None
    rebalances.run_once()
    bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    assert_equal(rebalances.track(), 1)
    rebalances.config = RebalanceConfig(thresholds={"BTC": RebalanceThreshold(ceiling=base + 100 * BTC, target=base)})


class LostReply:
    """The signer's port, but the reply to the first CPFP request is lost after the signer signed and recorded it."""

    def __init__(self, real) -> None:
        self.real, self.lost = real, 0

    def __getattr__(self, name):
        return getattr(self.real, name)

    def sign_bitcoin_cpfp(self, *args, **kwargs):
        signed = self.real.sign_bitcoin_cpfp(*args, **kwargs)
        if not self.lost:
            self.lost += 1
            raise SignerUnavailable("the reply was lost")
        return signed


def test_a_stuck_cold_to_hot_move_is_bumped_by_a_child_and_only_the_mined_child_is_booked(
        custody, bitcoind, engine, ledger, signer_keys, rebalances, log):  # noqa: F811
    wallets = custody.wallets
    wallets.register_wallet("bitcoin", "cold", "regtest", signer_keys.account_xpub("bitcoin", "cold"))
    hot, cold = wallets.location_account("bitcoin", "hot", "BTC"), wallets.location_account("bitcoin", "cold", "BTC")
    expense = wallets.firm_account("network_fees", "BTC")
    cpfp = rebalances.cpfp
    stuck = cpfp.bump.stuck_blocks
    bitcoind.mine(1)
    cold_coins(custody, bitcoind, engine, rebalances)
    reconciled(custody, TIERS)
    before = {a: ledger.balance(a).posted for a in (hot, cold, expense)}
    held = spendable(custody, engine)

    log.info("a 1.5 BTC cold -> hot PSBT, signed offline, imported and sent; its fee counts as zero to the miner")
    rid = rebalances.open_cold_to_hot(3 * BTC // 2, by="op-trent")
    _name, offline = offline_signer(bitcoind, signer_keys)
    processed = offline.call("walletprocesspsbt", rebalances.export_psbt(rid))
    assert processed["complete"]
    parent = rebalances.import_psbt(rid, processed["psbt"], by="op-trent")
    assert_equal(rebalances.broadcast(), 1)
    with engine.connect() as c:
        move = c.execute(text("SELECT amount, fee FROM rebalance WHERE id = :r"), {"r": rid}).one()
    amount, parent_fee = int(move.amount), int(move.fee)
    bitcoind.rpc("prioritisetransaction", parent, 0, -parent_fee)
    assert_equal(rebalances.bump_fees(), [])  # RBF cannot re-sign a cold move
    for _ in range(stuck - 1):
        bitcoind.mine(1)
        assert_equal(cpfp.bump_fees(), [])  # not stuck yet
    assert parent in bitcoind.rpc("getrawmempool")  # a block was mined each time: the parent stays out
    reconciled(custody, TIERS)

    log.info("stuck: the first ask loses the signer's reply; asked again, the same child, and one child")
    bitcoind.mine(1)
    real = cpfp.signer
    cpfp.signer = LostReply(real)
    try:
        assert_equal(cpfp.bump_fees(), [])  # logged, retried next run: nothing stored
        assert_equal(cpfp.signer.lost, 1)
        with engine.connect() as c:
            assert_equal(c.execute(text("SELECT count(*) FROM rebalance_cpfp WHERE rebalance_id = :r"), {"r": rid}).scalar_one(), 0)
    finally:
        cpfp.signer = real
    log.info("two workers (their own node connections) ask at once: the parent row locked across the signer call")
    workers = [Cpfp(engine, ledger, wallets, BitcoinAdapter(bitcoind.rpc_url, network="regtest"), real,
                    hot_address=cpfp.hot_address, network="regtest", bump=cpfp.bump) for _ in range(2)]
    try:
        with ThreadPoolExecutor(2) as pool:
            made = [txid for new in pool.map(lambda w: w.bump_fees(), workers) for txid in new]
    finally:
        for w in workers:
            w.bitcoin.close()
    [first] = made
    assert_equal(cpfp.bump_fees(), [])  # one child per parent
    with engine.connect() as c:
        child = c.execute(text("SELECT id, txid, fee, fee_rate, state, parent_txid FROM rebalance_cpfp WHERE rebalance_id = :r"),
                          {"r": rid}).one()
        recorded = c.execute(text("SELECT txid FROM signer_cpfp WHERE parent_txid = :p"), {"p": parent}).scalars().all()
    assert_equal((child.txid, child.state, child.parent_txid, recorded), (first, "broadcast", parent, [first]))
    package = bitcoind.rpc("getmempoolentry", first)
    assert_equal(package["depends"], [parent])
    parent_vsize = bitcoind.rpc("getmempoolentry", parent)["vsize"]
    child_fee = int(child.fee)
    assert (parent_fee + child_fee) * 1000 >= int(child.fee_rate) * (parent_vsize + package["vsize"])  # the package rate
    assert int(child.fee_rate) > parent_fee * 1000 // parent_vsize
    reconciled(custody, TIERS)

    log.info("the child is made stuck too: the next bump replaces the CHILD (RBF), never the parent")
    bitcoind.rpc("prioritisetransaction", first, 0, -child_fee)
    for _ in range(stuck):
        bitcoind.mine(1)
    mempool = bitcoind.rpc("getrawmempool")
    assert parent in mempool and first in mempool
    assert_equal(rebalances.bump_fees(), [])
    [second] = cpfp.bump_fees()
    assert_equal(cpfp.bump_fees(), [])
    mempool = bitcoind.rpc("getrawmempool")
    assert parent in mempool and second in mempool and first not in mempool
    with engine.connect() as c:
        versions = c.execute(text("SELECT id, txid, fee, fee_rate, replaces_id FROM firm_tx_version WHERE machine = 'cpfp' "
                                  "AND row_id = :i ORDER BY id"), {"i": child.id}).all()
        assert_equal(c.execute(text("SELECT txid FROM rebalance WHERE id = :r"), {"r": rid}).scalar_one(), parent)
    assert_equal([(v.txid, v.replaces_id) for v in versions], [(first, None), (second, versions[0].id)])
    assert int(versions[1].fee) > int(versions[0].fee) and int(versions[1].fee_rate) > int(versions[0].fee_rate)
    reconciled(custody, TIERS)

    log.info("the package mines: in transit until final, then the parent booked once, the mined child's fee once")
    bitcoind.mine(1)
    assert_equal(bitcoind.rpc("getrawmempool"), [])
    rebalances.track()
    cpfp.track()
    reconciled(custody, TIERS)  # mined, not final: + amount - child fee on hot, - amount - fee on cold
    assert_equal(spendable(custody, engine), held)  # neither the parent's output (spent) nor the child's (not final)
    bitcoind.mine(BTC_FINALITY - 1)
    assert_equal(rebalances.track(), 1)
    assert_equal(cpfp.track(), 1)
    assert_equal((rebalances.track(), cpfp.track()), (0, 0))
    mined_fee = int(versions[1].fee)
    [rebalance_booked] = booked(engine, f"rebalance:{rid}:final")
    [child_booked] = booked(engine, f"cpfp:{child.id}:final")
    assert_equal((rebalance_booked["txid"], rebalance_booked["network_fee"]), (parent, parent_fee))
    assert_equal((child_booked["txid"], child_booked["network_fee"]), (second, mined_fee))
    assert_equal((booked_txid(engine, second), booked_txid(engine, first)), (1, 0))
    assert_equal(ledger.balance(hot).posted - before[hot], -(amount - mined_fee))
    assert_equal(ledger.balance(cold).posted - before[cold], amount + parent_fee)
    assert_equal(ledger.balance(expense).posted - before[expense], -(parent_fee + mined_fee))
    assert_equal(spendable(custody, engine), held + amount - mined_fee)  # the child's output; the parent's is spent
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT state FROM rebalance_cpfp WHERE id = :i"), {"i": child.id}).scalar_one(), "final")
        assert_equal(c.execute(text("SELECT count(*) FROM rebalance WHERE state NOT IN ('final', 'abandoned')")).scalar_one(), 0)
    reconciled(custody, TIERS)
    ledger.assert_verified()


def test_a_child_that_never_mines_is_dropped_when_its_parent_is_final_alone(
        custody, bitcoind, engine, ledger, signer_keys, rebalances, log, monkeypatch):  # noqa: F811
    """The child is stored and "sent", but the node never keeps it (a node that lost its mempool,
    simulated: every send but the parent's is swallowed); first, with the ceiling at the parent's
    own rate, no child at all but a `fee_ceiling_reached` warning. A miner takes the parent alone; while
    the child is in progress the parent's hot output is not selectable; once the parent is final
    the child is dropped, nothing is booked for it, and the parent's output is hot's to spend."""
    wallets = custody.wallets
    wallets.register_wallet("bitcoin", "cold", "regtest", signer_keys.account_xpub("bitcoin", "cold"))
    hot, expense = wallets.location_account("bitcoin", "hot", "BTC"), wallets.firm_account("network_fees", "BTC")
    cpfp = rebalances.cpfp
    bitcoind.mine(1)
    cold_coins(custody, bitcoind, engine, rebalances)
    reconciled(custody, TIERS)
    before = {a: ledger.balance(a).posted for a in (hot, expense)}
    held = spendable(custody, engine)
    rid = rebalances.open_cold_to_hot(BTC // 2, by="op-trent")
    _name, offline = offline_signer(bitcoind, signer_keys)
    parent = rebalances.import_psbt(rid, offline.call("walletprocesspsbt", rebalances.export_psbt(rid))["psbt"], by="op-trent")
    assert_equal(rebalances.broadcast(), 1)
    with engine.connect() as c:
        move = c.execute(text("SELECT amount, fee FROM rebalance WHERE id = :r"), {"r": rid}).one()
    bitcoind.rpc("prioritisetransaction", parent, 0, -int(move.fee))
    bitcoind.mine(cpfp.bump.stuck_blocks)
    log.info("with the ceiling at the parent's own rate there is no room: a fee_ceiling_reached warning, no child")
    saved = cpfp.bump
    parent_rate = int(move.fee) * 1000 // bitcoind.rpc("getmempoolentry", parent)["vsize"]
    cpfp.bump = BumpConfig(saved.stuck_blocks, saved.bump_percent, parent_rate)
    try:
        assert_equal(cpfp.bump_fees(), [])
    finally:
        cpfp.bump = saved
    with engine.connect() as c:
        incident = c.execute(text("SELECT kind, severity, detail FROM incident WHERE dedupe_key = :k"),
                             {"k": f"fee_ceiling:rebalance:{parent}"}).one()
        assert_equal(c.execute(text("SELECT count(*) FROM rebalance_cpfp WHERE rebalance_id = :r"), {"r": rid}).scalar_one(), 0)
    assert_equal((incident.kind, incident.severity, incident.detail["cpfp"]), ("fee_ceiling_reached", "warning", True))
    real_send = cpfp.bitcoin.broadcast
    monkeypatch.setattr(cpfp.bitcoin, "broadcast", lambda raw: real_send(raw) if txid_of(raw) == parent else None)
    [child] = cpfp.bump_fees()
    with engine.connect() as c:
        row = c.execute(text("SELECT id, state FROM rebalance_cpfp WHERE rebalance_id = :r"), {"r": rid}).one()
    assert_equal(row.state, "broadcast")
    assert child not in bitcoind.rpc("getrawmempool")

    log.info("a miner takes the parent alone; the child stays in progress until the parent is final")
    bitcoind.rpc("generateblock", OTHER, [parent])
    assert_equal(cpfp.track(), 0)
    reconciled(custody, TIERS)
    bitcoind.mine(BTC_FINALITY - 1)
    assert_equal(rebalances.track(), 1)
    with engine.connect() as c:
        recorded = c.execute(text("SELECT count(*) FROM wallet_utxo WHERE txid = :t"), {"t": parent}).scalar_one()
    assert_equal((spendable(custody, engine), recorded), (held, 1))  # recorded, but a child in progress spends it
    assert_equal(cpfp.track(), 0)
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT state FROM rebalance_cpfp WHERE id = :i"), {"i": row.id}).scalar_one(), "dropped")
    assert_equal((booked(engine, f"cpfp:{row.id}:final"), booked_txid(engine, child)), ([], 0))
    assert_equal(spendable(custody, engine), held + int(move.amount))
    assert_equal(ledger.balance(hot).posted - before[hot], -int(move.amount))
    assert_equal(ledger.balance(expense).posted - before[expense], -int(move.fee))
    monkeypatch.undo()
    assert_equal((cpfp.broadcast(), cpfp.track(), cpfp.bump_fees()), (0, 0, []))  # a dropped child is never sent again
    assert child not in bitcoind.rpc("getrawmempool")
    reconciled(custody, TIERS)
    ledger.assert_verified()
