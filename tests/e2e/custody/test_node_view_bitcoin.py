"""The node's own view (custody.node_view) equals what the UTXO set says, at every step: deposits,
a sweep in the mempool (its inputs spent only by an unconfirmed transaction: hidden by
`listunspent`, added back), the sweep mined, the block invalidated (a reorg), and a range widened
after addresses were issued and paid past it (the rescan must find the payment).
`scantxoutset` (adapter.unspent) is asked here, in the test only, as the reference."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from custody.addresses import derive_btc_address
from custody.node_view import NodeView, NodeViewNotReady
from regtest.util import assert_equal, wait_until
from tests.e2e.custody.conftest import BTC_FINALITY


def utxo_set(custody, engine) -> dict[str, int]:
    """Per tier, what scantxoutset finds at the addresses custody issued (the reference)."""
    with engine.connect() as c:
        deposit = c.execute(text("SELECT address FROM deposit_address WHERE chain = 'bitcoin'")).scalars().all()
        hot_xpub = c.execute(text("SELECT xpub FROM wallet WHERE chain = 'bitcoin' AND tier = 'hot'")).scalar_one()
        batches = c.execute(text("SELECT id FROM withdrawal_batch WHERE chain = 'bitcoin'")).scalars().all()
    hot = [derive_btc_address(hot_xpub, "regtest", 0, 0)] + [derive_btc_address(hot_xpub, "regtest", 1, b) for b in batches]
    adapter = custody.adapters["bitcoin"]
    return {"deposit": sum(u.amount for u in adapter.unspent(deposit)), "hot": sum(u.amount for u in adapter.unspent(hot))}


def view_at_tip(view: NodeView, adapter) -> dict[str, int]:
    """The view at the node's tip, once the wallet has processed it."""
    found: dict[str, int] = {}

    def ready() -> bool:
        try:
            found.update(view.holdings(adapter.tip()))
            return True
        except NodeViewNotReady:
            return False
    wait_until(ready, timeout=30)
    return {t: found.get(t, 0) for t in ("deposit", "hot")}


def test_the_node_view_equals_the_utxo_set_through_deposits_a_sweep_and_a_reorg(custody, customer, bitcoind, engine,
                                                                              ledger, log):
    adapter = custody.adapters["bitcoin"]
    # a wallet of the test's own (label): the session's container keeps another, with a wide range
    view = NodeView(engine, adapter, network="regtest", lookahead=8, label="test-node-view")
    view.ensure()
    assert_equal(view_at_tip(view, adapter), utxo_set(custody, engine))

    log.info("two deposits, mined and credited")
    accounts = [customer("BTC") for _ in range(2)]
    for a in accounts:
        bitcoind.fund(custody.wallets.issue_address(f"nv:{a}", a).address, 2_000_000)
    bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    view.ensure()
    assert_equal(view_at_tip(view, adapter), utxo_set(custody, engine))

    log.info("a sweep in the mempool: its inputs are spent only by an unconfirmed transaction")
    custody.payouts.sync_hot_wallet()
    txid = custody.sweeps.sweep_bitcoin()
    if txid is not None:
        custody.sweeps.broadcast()
        held = view.read(adapter.tip())
        assert any(c.spent_in_mempool for c in held.coins), "the sweep's inputs should be added back"
    assert_equal(view_at_tip(view, adapter), utxo_set(custody, engine))

    log.info("the sweep mined, then its block invalidated (a reorg), then reconsidered")
    bitcoind.mine(1)
    assert_equal(view_at_tip(view, adapter), utxo_set(custody, engine))
    top = adapter.tip()
    bitcoind.rpc("invalidateblock", top.hash)
    assert_equal(view_at_tip(view, adapter), utxo_set(custody, engine))
    bitcoind.rpc("reconsiderblock", top.hash)
    assert_equal(view_at_tip(view, adapter), utxo_set(custody, engine))

    log.info("addresses issued past the range and paid before the range is widened: the rescan finds them")
    # bitcoind tops a ranged descriptor up by itself to the last used index + its keypool (-keypool=20
    # on the test node): 25 more addresses put the paid one past both that and the view's own range
    late = [customer("BTC") for _ in range(25)]
    for a in late:
        custody.wallets.issue_address(f"nv-late:{a}", a)
    paid = custody.wallets.issue_address(f"nv-late:{late[-1]}", late[-1]).address
    bitcoind.fund(paid, 700_000)
    bitcoind.mine(1)
    with pytest.raises(NodeViewNotReady) as overtaken:  # a range overtaken by the issued addresses is not read
        view.holdings(adapter.tip())
    log.info("before widening: %s", overtaken.value.message)
    imports = view.ensure()
    assert imports, "the deposit range should have been widened"
    assert_equal(view_at_tip(view, adapter), utxo_set(custody, engine))

    log.info("the sweep taken to finality and booked, and the late deposit credited: nothing left open for later tests")
    bitcoind.mine(BTC_FINALITY)
    custody.sweeps.track()
    custody.deposits.run_once(["bitcoin"])
    with engine.connect() as c:
        open_sweeps = c.execute(text("SELECT count(*) FROM sweep WHERE state NOT IN ('final', 'dropped', 'abandoned')")).scalar_one()
    assert_equal(open_sweeps, 0)
    ledger.assert_verified()
