"""Two writers of one market (a process that still believes it owns a market after another took it
over, custody.api.market_owners): the journal's key (market, seq) fences them. The stale writer's
unit fails whole on the sequence number the new owner used (nothing of it is committed, its caller
gets the error, nothing is acknowledged), and its next unit runs on a book rebuilt from the journal."""
from __future__ import annotations

import uuid

import pytest
from sqlalchemy.exc import IntegrityError

from matching.model import Side
from matching.service import MarketNotHere, Trading
from tests.integration.test_matching_support import BTC, USDT, fund, new_market


def test_a_stale_writer_fails_its_unit_and_then_rebuilds(ledger):
    run = uuid.uuid4().hex[:8]
    stale = Trading(ledger.engine, ledger)
    symbol = new_market(ledger, stale, run)
    fund(ledger, run, f"{run}-a", "USDT", 1_000_000 * USDT)
    fund(ledger, run, f"{run}-b", "BTC", 10 * BTC)
    assert stale.place(symbol, f"{run}-a", "one", Side.buy, qty=100, price=50_000).code is None

    owner = Trading(ledger.engine, ledger, autoload=False)
    with pytest.raises(MarketNotHere):
        owner.place(symbol, f"{run}-a", "x", Side.buy, qty=100, price=50_000)
    owner.load(symbol)  # takes over: the book rebuilt from the journal
    assert owner.place(symbol, f"{run}-b", "two", Side.sell, qty=100, price=60_000).seq == 2

    usdt = ledger.account_by_name(f"customer:{run}-a:USDT").id
    held = ledger.balance(usdt).held
    with pytest.raises(IntegrityError):  # seq 2 is the new owner's
        stale.place(symbol, f"{run}-a", "three", Side.buy, qty=100, price=40_000)
    assert stale.order_by_client_id(symbol, f"{run}-a", "three") is None
    assert ledger.balance(usdt).held == held  # its hold rolled back with the unit
    outcome = stale.place(symbol, f"{run}-a", "three", Side.buy, qty=100, price=40_000)
    assert (outcome.code, outcome.seq) == (None, 3)  # rebuilt: it numbers after the owner's command
    assert stale.rebuilds == 1
