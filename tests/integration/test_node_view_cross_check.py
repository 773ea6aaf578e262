"""Reconciliation's cross-check of the wallet index against the node's own view (issue 13).

The books are compared with custody's wallet index; the index is compared with bitcoind's own
watch-only wallet (custody.node_view) read at the same pinned tip. A tier where the two disagree
opens a critical `wallet_index_divergence` incident (the kill switch), whatever the books say; a
node view that cannot be read at that tip leaves the line compared with the index only (logged).
The node view here is a stand-in that answers fixed figures: a real bitcoind cannot be made to
disagree with a correct index (tests/e2e/custody/test_wallet_index_bitcoin.py checks they agree).
"""
from __future__ import annotations

import pytest
from sqlalchemy import text

from chain_adapters.base import BlockRef
from custody import reconciliation as rec
from custody.controls import kill_switch
from custody.node_view import NodeHoldings, NodeViewNotReady
from custody.reconciliation import Line, Reconciliation
from ledger.service import Ledger
from custody.wallets import Wallets
from tests.integration.own_database import own_database

TIP = BlockRef(120, "ab" * 32)


class StandInView:
    def __init__(self, answer):
        self.answer, self.calls = answer, 0

    def read(self, tip: BlockRef) -> NodeHoldings:
        self.calls += 1
        assert tip == TIP  # read at the pass's pinned tip, never another
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer if isinstance(self.answer, NodeHoldings) else NodeHoldings(tip, self.answer)


@pytest.fixture
def engine(database_url):
    with own_database(database_url, "nodeview") as e:
        yield e


def reconciliation(engine, view) -> Reconciliation:
    ledger = Ledger(engine)
    return Reconciliation(engine, ledger, Wallets(engine, ledger), {}, network="regtest", node_view=view)


LINES = [Line("bitcoin", "BTC", "deposit", 7_000, 7_000, 0), Line("bitcoin", "BTC", "hot", 3_000, 3_000, 0)]


def incidents(engine) -> list:
    with engine.connect() as c:
        return c.execute(text("SELECT kind, severity, detail FROM incident ORDER BY id")).all()


def test_agreeing_figures_are_put_beside_the_lines_and_open_nothing(engine):
    checked = reconciliation(engine, StandInView({"deposit": 7_000, "hot": 3_000, "cold": 0}))._cross_check(LINES, TIP)
    assert [(ln.tier, ln.node) for ln in checked] == [("deposit", 7_000), ("hot", 3_000)]
    assert incidents(engine) == []
    assert not kill_switch(engine).engaged


def test_a_node_figure_that_differs_from_the_index_is_critical_even_when_the_books_agree_with_the_index(engine):
    # books == index on both lines (difference 0), but the node holds 1 sat less on the hot tier:
    # the index is wrong or forged, and the books were compared with it
    checked = reconciliation(engine, StandInView({"deposit": 7_000, "hot": 2_999}))._cross_check(LINES, TIP)
    assert [ln.difference for ln in checked] == [0, 0]
    [(kind, severity, detail)] = incidents(engine)
    assert (kind, severity) == ("wallet_index_divergence", "critical")
    assert (detail["tier"], detail["index"], detail["node"], detail["height"]) == ("hot", 3_000, 2_999, 120)
    assert kill_switch(engine).engaged


def test_a_view_not_at_the_tip_is_waited_for_then_the_lines_stay_index_only(engine, monkeypatch):
    monkeypatch.setattr(rec, "NODE_VIEW_WAIT", 0)
    view = StandInView(NodeViewNotReady("wallet at block 119"))
    checked = reconciliation(engine, view)._cross_check(LINES, TIP)
    assert view.calls == rec.NODE_VIEW_ATTEMPTS
    assert [ln.node for ln in checked] == [None, None]
    assert incidents(engine) == []


def test_coins_the_index_does_not_hold_are_a_warning_beside_agreeing_figures(engine):
    # the node's import rescan found a coin paid to an address before the index watched it: the
    # node counts it apart (unindexed), the tier figures agree, and a warning names it once
    held = NodeHoldings(TIP, {"deposit": 7_000, "hot": 1_003_000}, unindexed={"hot": 1_000_000})
    for _ in range(2):
        checked = reconciliation(engine, StandInView(held))._cross_check(LINES, TIP)
    assert [(ln.tier, ln.node) for ln in checked] == [("deposit", 7_000), ("hot", 3_000)]
    [(kind, severity, detail)] = incidents(engine)
    assert (kind, severity, detail["tier"], detail["amount"]) == ("wallet_index_unindexed", "warning", "hot", 1_000_000)
    assert not kill_switch(engine).engaged
