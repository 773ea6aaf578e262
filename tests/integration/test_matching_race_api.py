"""Requests racing on one market over HTTP never answer 5xx, and every command is journaled once
(issue 11, observation 12: three racing self-trade requests answered 500, duplicate
`matching_command` key).

Threads place crossing orders on one market at the same moment: two traders trading with each
other, and one trader bidding against its own asks under caller-chosen STP groups. Each unit of
work is made to fail once in a while as a deadlock victim would (PostgreSQL aborts it; the service
rolls back, rebuilds the market if a command had been sequenced, and runs the unit again), so
rebuilds happen while other requests wait for the market's lock. Before the fix a request that had looked up the market before a rebuild ran
on the stale engine it found: its sequence numbers were already taken (500, duplicate key).
Afterwards: every answer is 2xx, the journal has each order's command exactly once with
consecutive numbers, the books rebuilt from the journal equal the live ones, and the ledger verifies.
"""
from __future__ import annotations

import logging
import threading

import psycopg
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from custody.auth import Role
from matching.settlement import Settlement
from matching.snapshot import state_hash
from matching.service import Trading
from tests.integration.test_matching_api import api, call, market  # noqa: F401 - fixtures
from tests.integration.test_matching_support import USDT, fund

log = logging.getLogger(__name__)
THREADS, ORDERS = 6, 5


def test_racing_requests_on_one_market_never_answer_5xx(api, market, ledger, monkeypatch):
    symbol, run = market
    client, _ = api
    url = f"/v1/markets/{symbol}/orders"
    fund(ledger, run, f"{run}-seller", "USDT", 100_000 * USDT)

    log.info("Every fifth ledger flush of a client's unit of work that sends commands (so after a command "
             "was sequenced) fails as a deadlock victim would")
    original, flushes, count_lock = Settlement.flush, [0], threading.Lock()

    def flaky(self, conn, *then):
        with count_lock:
            sends = not self.immediate and bool(self._pending or then)
            flushes[0] += sends
            fail = sends and flushes[0] % 5 == 0
        if fail:
            raise DBAPIError.instance("SELECT ledger_apply(...)", None,
                                      psycopg.errors.DeadlockDetected("injected"), psycopg.Error)
        return original(self, conn, *then)

    monkeypatch.setattr(Settlement, "flush", flaky)

    def body(i: int, j: int) -> dict:
        who, side, group = [("seller", "sell", f"s{i}"), ("buyer", "buy", None),
                            ("seller", "buy", f"x{i}")][(i + j) % 3]
        return {"account": f"{run}-{who}", "client_order_id": f"t{i}-{j}", "side": side,
                "qty": "0.01", "price": "60000", **({"stp_group": group} if group else {})}

    trading = client.app.state.container.trading
    rebuilds = trading.rebuilds
    answers: list[tuple[int, str]] = []
    start = threading.Barrier(THREADS)

    def trader(i: int) -> None:
        start.wait()
        for j in range(ORDERS):
            r = call(api, Role.backend, "POST", url, json=body(i, j))
            answers.append((r.status_code, r.text[:200]))

    log.info("%d threads place %d orders each on the same market at once", THREADS, ORDERS)
    threads = [threading.Thread(target=trader, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    monkeypatch.setattr(Settlement, "flush", original)

    assert [a for a in answers if a[0] >= 500] == []
    assert len(answers) == THREADS * ORDERS and all(a[0] in (200, 201) for a in answers), answers
    assert trading.rebuilds > rebuilds, "the injected failures made the market rebuild meanwhile"

    log.info("The journal holds each order's command once, numbered without gaps")
    with ledger.engine.connect() as conn:
        seqs = conn.execute(text("SELECT seq FROM matching_command WHERE market = :m ORDER BY seq"),
                            {"m": symbol}).scalars().all()
        placed = conn.execute(text("SELECT record->>'client_order_id' FROM matching_command "
                                   "WHERE market = :m AND record->>'type' = 'Place'"),
                              {"m": symbol}).scalars().all()
    assert seqs == list(range(1, len(seqs) + 1))
    assert sorted(placed) == sorted(f"t{i}-{j}" for i in range(THREADS) for j in range(ORDERS))

    log.info("A fresh service rebuilt from the journal has the same book as the live one")
    live = trading.engine(symbol)
    fresh = Trading(ledger.engine, ledger)
    fresh.load(symbol)
    assert state_hash(fresh.engine(symbol)) == state_hash(live)
