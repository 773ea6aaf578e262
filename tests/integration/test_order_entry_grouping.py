"""Order entry grouped across requests (issue 20): concurrent `POST /v1/markets/{s}/orders` (and
cancels) on one market share group commits (`Trading.submit_grouped`), every acknowledged order is
in the journal once its answer arrives, and a command that fails its group fails alone.

The requests go through the ASGI app concurrently (one event loop, `asyncio.gather`). The first
group commit is held until the other requests are queued behind it, so the grouping is
deterministic: N requests make exactly two group commits."""
from __future__ import annotations

import asyncio
import threading
import time

import httpx
from sqlalchemy import text

from custody.auth import Role
from matching.service import Trading
from tests.integration.test_matching_api import api, code_of, market  # noqa: F401 - fixtures

N = 12


def _hold_first_group(monkeypatch, trading: Trading, symbol: str, queued: int) -> threading.Event:
    """Make the market's first group commit wait (up to 20 s) until `queued` more commands are
    queued behind it. Returns an event set when the first group has started."""
    original, started = trading.submit_batch, threading.Event()

    def held(sym, commands):
        if sym == symbol and not started.is_set():
            started.set()
            deadline = time.monotonic() + 20
            while len(trading._committers[symbol]._pending) < queued and time.monotonic() < deadline:
                time.sleep(0.005)
        return original(sym, commands)

    monkeypatch.setattr(trading, "submit_batch", held)  # the committer looks it up per group
    return started


def _post_all(app, key: str, requests: list[tuple[str, dict]]) -> list[httpx.Response]:
    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", headers={"X-API-Key": key}) as c:
            return list(await asyncio.gather(*(c.post(path, json=body) for path, body in requests)))
    return asyncio.run(go())


def _journaled(engine, symbol: str) -> dict[str, list[int]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT seq, record FROM matching_command WHERE market = :m ORDER BY seq"),
                            {"m": symbol}).all()
    seqs: dict[str, list[int]] = {}
    for row in rows:
        seqs.setdefault(row.record["order_id"], []).append(row.seq)
    return seqs


def test_concurrent_orders_share_group_commits_and_every_ack_is_journaled(api, market, ledger, monkeypatch):
    symbol, run = market
    client, keys = api
    trading: Trading = client.app.state.container.trading
    _hold_first_group(monkeypatch, trading, symbol, queued=N - 1)
    groups_before = trading.group_stats(symbol)
    orders = [(f"/v1/markets/{symbol}/orders",
               {"account": f"{run}-{'seller' if i % 2 else 'buyer'}", "client_order_id": f"g{i}",
                "side": "sell" if i % 2 else "buy", "qty": "0.01", "price": str(59_998 + i % 4 + (0 if i % 2 else 2))})
              for i in range(N)]
    answers = _post_all(client.app, keys[Role.backend], orders)
    assert [a.status_code for a in answers] == [201] * N, [a.text for a in answers]
    groups, commands = (a - b for a, b in zip(trading.group_stats(symbol), groups_before))
    assert (groups, commands) == (2, N)  # the first alone, the N-1 queued behind it together
    journal = _journaled(ledger.engine, symbol)
    for answer in answers:
        order = answer.json()
        assert len(journal.get(order["order_id"], [])) == 1, order
        assert order["seq"] in journal[order["order_id"]]
        stored = trading.order(order["order_id"])  # as committed; a later group may have filled it since
        assert stored.last_seq >= order["last_seq"]
        if stored.last_seq == order["last_seq"]:
            assert (stored.state, int(stored.filled)) == (order["state"], order["filled_lots"])
    assert sum(a.json()["filled_lots"] for a in answers) > 0  # some of them crossed inside the group


def test_a_bad_command_in_a_group_fails_alone(api, market, ledger, monkeypatch):
    symbol, run = market
    client, keys = api
    trading: Trading = client.app.state.container.trading
    _hold_first_group(monkeypatch, trading, symbol, queued=4)
    base = f"/v1/markets/{symbol}/orders"
    good = {"account": f"{run}-buyer", "side": "buy", "qty": "0.01", "price": "50000"}
    requests = [(base, {**good, "client_order_id": "first"}),
                (base, {**good, "client_order_id": "ok-1"}),
                (base, {**good, "client_order_id": "poor", "qty": "1000"}),      # refused for funds: rejected row
                (base, {**good, "client_order_id": "tier", "fee_tier": "vip"}),  # unknown fee tier: 422
                (base, {**good, "client_order_id": "ok-2"})]
    answers = _post_all(client.app, keys[Role.backend], requests)
    by_id = {body["client_order_id"]: a for (_, body), a in zip(requests, answers)}
    assert {k: a.status_code for k, a in by_id.items()} == {"first": 201, "ok-1": 201, "poor": 201, "tier": 422,
                                                            "ok-2": 201}
    assert by_id["poor"].json()["state"] == "rejected" and by_id["poor"].json()["reject_code"] == "insufficient_funds"
    assert code_of(by_id["tier"]) == "unknown_fee_tier"
    assert all(by_id[k].json()["state"] == "working" for k in ("first", "ok-1", "ok-2"))
    journal = _journaled(ledger.engine, symbol)
    assert all(by_id[k].json()["order_id"] in journal for k in ("first", "ok-1", "ok-2"))


def test_a_command_that_fails_its_unit_fails_alone_and_the_others_commit(api, market, ledger, monkeypatch):
    """A failure of the unit of work itself (here injected for one order: no client input may cause
    one) fails the whole group's transaction; each command is then run again alone, so only that
    request fails (500) and the others are committed and acknowledged."""
    symbol, run = market
    client, keys = api
    trading: Trading = client.app.state.container.trading
    _hold_first_group(monkeypatch, trading, symbol, queued=3)
    original = Trading._gateway_place

    def failing(self, rt, conn, uow, cmd, touched):
        if cmd.client_order_id == "boom":
            raise RuntimeError("injected failure of the unit")
        return original(self, rt, conn, uow, cmd, touched)

    monkeypatch.setattr(Trading, "_gateway_place", failing)
    base = f"/v1/markets/{symbol}/orders"
    good = {"account": f"{run}-seller", "side": "sell", "qty": "0.01", "price": "70000"}
    requests = [(base, {**good, "client_order_id": c}) for c in ("first", "a", "boom", "b")]
    answers = _post_all(client.app, keys[Role.backend], requests)
    assert [a.status_code for a in answers] == [201, 201, 500, 201], [a.text for a in answers]
    assert code_of(answers[2]) == "internal_error"
    journal = _journaled(ledger.engine, symbol)
    assert all(a.json()["order_id"] in journal for a in (answers[0], answers[1], answers[3]))
    assert trading.order_by_client_id(symbol, f"{run}-seller", "boom") is None
