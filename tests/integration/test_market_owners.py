"""Two real api processes on one database (issue 20): each market's sequencer is owned by one of
them (custody.api.market_owners: a session advisory lock per market), the other forwards its
orders there; SIGKILL of the owner while clients submit to both loses no acknowledged order.

Both are `python -m custody api --config FILE` subprocesses (the second with `CUSTODY_API__PORT`),
on a migrated database of this module's own whose reference data a worker root applied in-process
(no chain node runs: the api starts with its bitcoin node unreachable, which it tolerates).

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python -m pytest tests/integration/test_market_owners.py
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from custody.api.market_owners import market_lock_key
from custody.auth import create_api_key
from custody.launch import free_port
from custody.roots.worker import build_worker_root
from ledger.model import AccountKind, Transfer
from ledger.service import Ledger
from matching.settlement import customer_account_name
from regtest.process import spawn, stop_pid
from tests.integration.own_database import own_database
from tests.integration.test_roots_startup import SignerStandIn, config

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
SYMBOL = "BTC-USDT"
TRADERS = 8


class Api:
    """One `custody api` subprocess."""

    def __init__(self, name: str, cfg: Path, logs: Path, pepper: str) -> None:
        self.name, self.port = name, free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = logs / f"{name}.log"
        env = {**os.environ, "CUSTODY_API__PORT": str(self.port), "API_KEY_PEPPER": pepper,
               "PYTHONUNBUFFERED": "1", "PGAPPNAME": name}
        env.pop("CUSTODY_CONFIG", None)
        self.proc = spawn([sys.executable, "-m", "custody", "api", "--config", str(cfg)], self.log_path, env=env)
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{self.base}/health/live", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None, f"{name} exited {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"{name} not up:\n{self.log_path.read_text()[-3000:]}"
            time.sleep(0.2)

    def stop(self) -> None:
        stop_pid(self.proc.pid, timeout=15)


@pytest.fixture(scope="module")
def world(database_url, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("owners")
    pepper = "owners-" + uuid.uuid4().hex
    apis: list[Api] = []
    with own_database(database_url, "owners") as engine:
        build_worker_root(config(tmp, engine, "custody_worker"), adapters={}, signer=SignerStandIn()).close()
        cfg = config(tmp, engine, "custody_api", name="api.toml").source
        ledger = Ledger(engine)
        ledger.create_asset("USDT", 6)
        admin = create_api_key(engine, "owners-admin", "admin", pepper)
        backend = create_api_key(engine, "owners-backend", "backend", pepper)
        equity = {a: ledger.open_account(a, AccountKind.equity, f"owners:equity:{a}").id for a in ("BTC", "USDT")}
        for i in range(TRADERS):
            for asset, amount in (("BTC", 10**12), ("USDT", 10**15)):
                account = ledger.open_account(asset, AccountKind.customer, customer_account_name(f"t{i}", asset),
                                              owner=f"t{i}")
                ledger.post(f"owners:fund:{i}:{asset}", [Transfer(equity[asset], account.id, amount)])
        try:
            first = Api("custody-api", Path(cfg), tmp, pepper)
            apis.append(first)
            r = httpx.post(f"{first.base}/v1/markets", headers={"X-API-Key": admin}, timeout=30, json={
                "symbol": SYMBOL, "base_asset": "BTC", "quote_asset": "USDT", "lot_size": 10_000,
                "quote_per_tick_lot": 1, "fees": {"default": {"maker_ppm": 1_000, "taker_ppm": 2_000}}})
            assert r.status_code == 201, r.text
            r = httpx.post(f"{first.base}/v1/markets/{SYMBOL}/orders", headers={"X-API-Key": backend}, timeout=30,
                           json={"account": "t0", "client_order_id": "first", "side": "buy", "qty": "0.01",
                                 "price": "50000"})
            assert r.status_code == 201, r.text  # the first process owns the market from here on
            apis.append(Api("custody-api-2", Path(cfg), tmp, pepper))
            yield engine, ledger, backend, apis
        finally:
            for api in apis:
                api.stop()


def _owner_app(engine) -> str | None:
    namespace, key = market_lock_key(SYMBOL)
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.classid::bigint = :n AND l.objid::bigint = :k"),
            {"n": namespace, "k": key & 0xFFFFFFFF}).scalar()


def _order(client: httpx.Client, who: int, cid: str, side: str, price: int) -> httpx.Response:
    return client.post(f"/v1/markets/{SYMBOL}/orders", json={
        "account": f"t{who}", "client_order_id": cid, "side": side, "qty": "0.01", "price": str(price)})


def test_the_process_that_does_not_own_the_market_forwards_to_the_owner(world):
    engine, ledger, key, (owner, other) = world
    assert _owner_app(engine) == f"custody-api {owner.base}"
    with httpx.Client(base_url=other.base, headers={"X-API-Key": key}, timeout=30) as client:
        ask = _order(client, 1, "fwd-ask", "sell", 60_000)
        assert ask.status_code == 201, ask.text
        bid = _order(client, 2, "fwd-bid", "buy", 60_000)
        assert bid.status_code == 201, bid.text
        assert (bid.json()["state"], bid.json()["filled"]) == ("filled", "0.01000000")
        assert _order(client, 2, "fwd-bid", "buy", 60_000).status_code == 200  # a retry: the same order
        rest = _order(client, 3, "fwd-rest", "sell", 70_000)
        cancel = client.post(f"/v1/markets/{SYMBOL}/orders/{rest.json()['order_id']}/cancel", json={"account": "t3"})
        assert (cancel.status_code, cancel.json()["state"]) == (200, "cancelled"), cancel.text
        wrong = client.post(f"/v1/markets/{SYMBOL}/orders/{rest.json()['order_id']}/cancel", json={"account": "t3"})
        assert (wrong.status_code, wrong.json()["error"]["code"]) == (409, "order_not_open")
        refused = client.post(f"/v1/markets/{SYMBOL}/orders", json={
            "account": "t3", "client_order_id": "fwd-bad", "side": "sell", "qty": "0.00015", "price": "1"})
        assert (refused.status_code, refused.json()["error"]["code"]) == (422, "invalid_quantity")
        depth = client.get(f"/v1/markets/{SYMBOL}/depth")
        assert depth.status_code == 200 and depth.json()["bids"][0]["price_ticks"] > 0, depth.text
        unauthenticated = httpx.post(f"{other.base}/v1/markets/{SYMBOL}/orders", json={}, timeout=30)
        assert unauthenticated.status_code in (401, 422)
    assert "owned by this api process" not in other.log_path.read_text()
    assert _owner_app(engine) == f"custody-api {owner.base}"


def test_killing_the_owner_while_clients_submit_loses_no_acknowledged_order(world):
    engine, ledger, key, apis = world
    owner, other = apis
    acked: dict[str, dict] = {}
    acked_lock, stop = threading.Lock(), threading.Event()
    after_kill = [0]
    killed = threading.Event()
    unexpected: list[str] = []

    def client_loop(i: int) -> None:
        clients = [httpx.Client(base_url=api.base, headers={"X-API-Key": key}, timeout=30) for api in (owner, other)]
        n = 0
        try:
            while not stop.is_set():
                n += 1
                side = "buy" if (i + n) % 2 else "sell"
                price = 60_000 + (n % 5) - (2 if side == "sell" else 0)
                cid = f"k{i}-{n}"
                try:
                    r = _order(clients[n % 2], i, cid, side, price)
                except httpx.HTTPError:
                    continue  # not acknowledged (the owner died under it): nothing to find later
                if r.status_code in (200, 201):
                    with acked_lock:
                        acked[r.json()["order_id"]] = r.json()
                        after_kill[0] += killed.is_set()
                elif r.status_code != 503:  # 503: the takeover is under way (nothing was done)
                    unexpected.append(f"{r.status_code} {r.text[:300]}")
        finally:
            for c in clients:
                c.close()

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(TRADERS)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    with acked_lock:
        before = len(acked)
    log.info("SIGKILL the owner after %d acknowledged orders", before)
    os.kill(owner.proc.pid, signal.SIGKILL)
    owner.proc.wait(10)
    killed.set()
    time.sleep(6)
    stop.set()
    for t in threads:
        t.join(60)
    log.info("%d orders acknowledged, %d after the kill", len(acked), after_kill[0])
    assert not unexpected, unexpected[:5]
    assert before > 0 and after_kill[0] > 0, (before, after_kill)
    assert _owner_app(engine) == f"custody-api {other.base}"
    assert "owned by this api process" in other.log_path.read_text()
    with engine.connect() as conn:
        stored = {r.id: r for r in conn.execute(text(
            "SELECT id, state, seq FROM trade_order WHERE market = :m AND id = ANY(:ids)"),
            {"m": SYMBOL, "ids": list(acked)})}
        journaled = set(conn.execute(text(
            "SELECT record->>'order_id' FROM matching_command WHERE market = :m AND record->>'type' = 'Place'"),
            {"m": SYMBOL}).scalars())
    assert set(stored) == set(acked), f"acknowledged but lost: {sorted(set(acked) - set(stored))[:5]}"
    assert all(order_id in journaled for order_id, order in acked.items() if order["seq"] is not None)
    assert not [c for c in ledger.verify() if not c.ok]


def test_an_owner_whose_lock_session_is_lost_drops_the_book_and_takes_it_back(world):
    """The owner's lock session is terminated (as a network failure or a DBA would): within a
    second the process notices, drops the market's book (it no longer holds the lock) and, nobody
    else holding the lock, takes it again with the book rebuilt from the journal; orders go on."""
    engine, ledger, key, apis = world
    owner = next(api for api in apis if api.proc.poll() is None)
    assert _owner_app(engine) == f"custody-api {owner.base}"
    with engine.connect() as conn:
        ended = conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  "WHERE application_name = :a"), {"a": f"custody-api {owner.base}"}).scalars().all()
    assert ended == [True]
    deadline = time.monotonic() + 30
    while "its lock session failed; releasing markets" not in owner.log_path.read_text():
        assert time.monotonic() < deadline, owner.log_path.read_text()[-3000:]
        time.sleep(0.2)
    with httpx.Client(base_url=owner.base, headers={"X-API-Key": key}, timeout=30) as client:
        r = _order(client, 5, "after-session-loss", "buy", 55_000)
        assert r.status_code == 201, r.text
    assert _owner_app(engine) == f"custody-api {owner.base}"
    assert not [c for c in ledger.verify() if not c.ok]
