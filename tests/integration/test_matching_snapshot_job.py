"""The snapshot job bounds how much journal a rebuild replays (issue 11, observation 12: with no
snapshot job, each rebuild replayed the whole journal).

Orders are placed over HTTP; the scheduler's `matching-snapshots` job runs (called directly, as
the scheduler would); three more orders follow. A service rebuilt from the database then starts
from the job's snapshot and replays only those three commands, and its book hashes the same as
the live one. A market with nothing new since its snapshot gets no other.
"""
from __future__ import annotations

import logging

from custody.auth import Role
from custody.jobs import build_scheduler
from matching.service import Trading
from matching.snapshot import state_hash
from tests.integration.test_matching_api import api, call, market  # noqa: F401 - fixtures

log = logging.getLogger(__name__)


def test_a_rebuild_after_the_snapshot_job_replays_only_the_tail(api, market, ledger):
    symbol, run = market
    client, _ = api
    container = client.app.state.container
    url = f"/v1/markets/{symbol}/orders"

    def place(cid: str, who: str, side: str, price: str) -> None:
        r = call(api, Role.backend, "POST", url, json={
            "account": f"{run}-{who}", "client_order_id": cid, "side": side, "qty": "0.01",
            "price": price})
        assert r.status_code == 201, r.text

    log.info("Ten orders, some of them trading")
    for i in range(5):
        place(f"a{i}", "seller", "sell", str(60000 + 10 * i))
        place(f"b{i}", "buyer", "buy", str(60010 + 10 * i))
    seq = call(api, Role.auditor, "GET", f"/v1/markets/{symbol}/depth").json()["seq"]
    assert seq == 10

    log.info("The scheduler's snapshot job runs, set to snapshot every 5 commands")
    container.trading.snapshot_every_commands = 5
    job = build_scheduler(container).get_job("matching-snapshots")
    assert job is not None, "build_scheduler has a matching snapshot job"
    job.func()
    assert container.trading.rebuild_stats(symbol)[0] == 10
    assert [s.seq for s in container.trading.snapshot_markets() if s.seq <= 10] == []

    log.info("Three more orders after the snapshot")
    place("a9", "seller", "sell", "61000")
    place("b9", "buyer", "buy", "59000")
    place("b8", "buyer", "buy", "61000")

    log.info("A fresh service rebuilds from the snapshot and replays only the three")
    fresh = Trading(ledger.engine, ledger)
    fresh.load(symbol)
    assert fresh.rebuild_stats(symbol) == (10, 3)
    assert state_hash(fresh.engine(symbol)) == state_hash(container.trading.engine(symbol))

    log.info("Three commands are not yet due; after 300 s with something new, they are")
    assert fresh.snapshot_markets() == []
    fresh.snapshot_every_seconds = 0
    assert [s.seq for s in fresh.snapshot_markets()] == [13]
    assert fresh.snapshot_markets() == []
