"""The worker's matching snapshot job (custody.roots.worker.JournalSnapshots) runs without a
`Trading`: the API process is the matching engine's single writer. It restores the newest snapshot,
replays the journal after it and stores the result, so a rebuild in the API replays only the tail,
and the book it rebuilds hashes the same as the live one. It writes nothing but the snapshot row.
"""
from __future__ import annotations

import logging

from sqlalchemy import text

from custody.auth import Role
from custody.roots.worker import JournalSnapshots
from matching import store
from matching.service import Trading
from matching.snapshot import state_hash
from tests.integration.test_matching_api import api, call, market  # noqa: F401 - fixtures

log = logging.getLogger(__name__)


def _counts(engine, symbol: str) -> tuple[int, int, int]:
    with engine.connect() as c:
        return tuple(c.execute(text(f"SELECT count(*) FROM {table} WHERE market = :m"), {"m": symbol}).scalar_one()
                     for table in ("matching_command", "trade_order", "fill"))  # type: ignore[return-value]


def _snapshots(engine, symbol: str) -> list[int]:
    with engine.connect() as c:
        return list(c.execute(text("SELECT seq FROM matching_snapshot WHERE market = :m ORDER BY seq"), {"m": symbol}).scalars())


def test_the_worker_snapshots_the_journal_without_a_sequencer(api, market, ledger):
    symbol, run = market
    client, _ = api
    live = client.app.state.container

    def place(cid: str, who: str, side: str, price: str) -> None:
        r = call(api, Role.backend, "POST", f"/v1/markets/{symbol}/orders", json={
            "account": f"{run}-{who}", "client_order_id": cid, "side": side, "qty": "0.01", "price": price})
        assert r.status_code == 201, r.text

    log.info("Ten orders over the API (the sequencer), some trading")
    for i in range(5):
        place(f"a{i}", "seller", "sell", str(60000 + 10 * i))
        place(f"b{i}", "buyer", "buy", str(60010 + 10 * i))

    log.info("The worker's job, every 5 commands: one snapshot at seq 10, and only that row written")
    job = JournalSnapshots(ledger.engine, every_commands=5)
    before = _counts(ledger.engine, symbol)
    job.snapshot_markets()  # other tests' markets in this database may be snapshotted too
    assert _snapshots(ledger.engine, symbol) == [10]
    with ledger.engine.connect() as c:
        assert store.latest_snapshot(c, symbol).hash == state_hash(live.trading.engine(symbol))
    assert _counts(ledger.engine, symbol) == before
    job.snapshot_markets()
    assert _snapshots(ledger.engine, symbol) == [10]  # nothing new: nothing taken

    log.info("Three more orders; the API rebuilt from the database replays only those")
    place("a9", "seller", "sell", "61000")
    place("b9", "buyer", "buy", "59000")
    place("b8", "buyer", "buy", "61000")
    job.snapshot_markets()
    assert _snapshots(ledger.engine, symbol) == [10]  # 3 < 5 commands: not due yet
    fresh = Trading(ledger.engine, ledger)
    fresh.load(symbol)
    assert fresh.rebuild_stats(symbol) == (10, 3)
    assert state_hash(fresh.engine(symbol)) == state_hash(live.trading.engine(symbol))

    log.info("Past the time bound, the tail is snapshotted too")
    job.snapshot_every_seconds = 0
    job.snapshot_markets()
    assert _snapshots(ledger.engine, symbol) == [10, 13]
