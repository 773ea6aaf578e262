"""Events on the deployed topology (issue 14, "must show" 1): a consumer on NATS JetStream builds
balances, orders and withdrawals from events only, survives a SIGKILL of the worker and a crash of
itself mid-run, and ends equal to what the API reports; the ledger verifies.

The topology is custody.launch.deploy(): `signer serve`, `custody worker` and `custody api` as
separate OS processes on a database of their own, against the session's bitcoind and anvil. The
broker is the real NATS server (NATS_URL, else the embedded `nats-server` this test starts), with a
stream and subject prefix of this run's own ([events] stream / subject_prefix), so runs on a shared
server never see each other's events; the stream is deleted at the end.

The consumer is a durable pull consumer with explicit acks on a thread of its own. Its projection
keeps what a backend would: the event keys it applied (a redelivery is skipped), the last
`aggregate_seq` per aggregate (a late state never rolls one back), posted per account (the legs of
`ledger.transaction_posted`), held per hold (`ledger.hold_changed`), each order's and withdrawal's
latest state.

The story, over the HTTP API (through the typed custody.client, one client per role): the hot wallet funded, a BTC deposit credited, a market, the buyer's
USDT from a treasury adjustment, an ask resting; the worker SIGKILLed (the api keeps serving: a
trade and a resting bid go to the outbox, nothing reaches the stream) and started again (they are
published, and the consumer crashes after applying the batch with the fill's posting without
acknowledging it (JetStream redelivers it to the restarted consumer, which skips it by event key:
applied twice, the balances would be off); a withdrawal paid to final
and the resting bid cancelled. At the end, with the outbox empty and the consumer caught up: every
account the events touched has the API's posted and held, every order and withdrawal the API's
state, and `GET /v1/verify` is ok.

Run: `python -m pytest tests/e2e/test_events_topology.py -q` (needs the regtest build; about a
minute).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
import time
import uuid
from decimal import Decimal
from pathlib import Path

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from sqlalchemy import create_engine, text

from custody.approve_cli import approve_adjustment_with_client, load_private_key
from custody.broker import JetStreamSink, embedded_nats_url
from custody.client import CustodyClient
from custody.client.projection import EventProjection
from custody.launch import Deployment, Nodes, deploy
from regtest.util import assert_equal
from tests.e2e.custody.api_helpers import answered

log = logging.getLogger(__name__)
BTC = 100_000_000
ACK_WAIT_S = 2.0


def _until(what: str, probe, timeout: float = 60.0, every: float = 0.25):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


class Consumer:
    """A durable pull consumer with explicit acks, fetching on a thread (and event loop) of its own
    until stopped. `arm_crash()` makes it apply its next batch that holds a journal posting, not
    acknowledge any of that batch, and drop its connection, as a process that dies between its
    effect and its ack (a posting: applied twice, it would double a balance)."""

    def __init__(self, url: str, stream: str, prefix: str, durable: str, projection: EventProjection) -> None:
        self.url, self.stream, self.prefix, self.durable, self.projection = url, stream, prefix, durable, projection
        self.stop_event = threading.Event()
        self.crash_event = threading.Event()
        self.crashed = threading.Event()
        self.redelivered = 0  # messages JetStream delivered more than once
        self.seen_armed: list[str] = []  # event types fetched since arm_crash() (for a failure's message)
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.stop_event.clear()
        self.crash_event.clear()
        self.crashed.clear()
        ready = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run(ready)), name=f"consumer-{self.durable}",
                                       daemon=True)
        self.thread.start()
        assert ready.wait(15), f"consumer did not subscribe: {self.error!r}"

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(15)
        assert not self.thread.is_alive() and self.error is None, self.error

    def arm_crash(self) -> None:
        """Crash on the next batch with a posting (see the class docstring)."""
        self.crash_event.set()

    def wait_crashed(self, timeout: float = 30.0) -> None:
        """Wait until the armed crash happened (a batch applied and left unacknowledged)."""
        assert self.crashed.wait(timeout), f"no batch with a posting arrived to crash on (error: {self.error!r}, " \
                                           f"alive: {self.thread.is_alive()}, seen since armed: {self.seen_armed})"
        self.thread.join(15)
        assert self.error is None, self.error

    async def _run(self, ready: threading.Event) -> None:
        nc = None
        try:
            nc = await nats.connect(self.url, name=f"projection-{self.durable}")
            sub = await nc.jetstream().pull_subscribe(
                f"{self.prefix}.>", durable=self.durable, stream=self.stream,
                config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=ACK_WAIT_S, deliver_policy=DeliverPolicy.ALL))
            ready.set()
            while not self.stop_event.is_set():
                try:
                    msgs = await sub.fetch(batch=50, timeout=0.5)
                except TimeoutError:  # nothing new within the wait (nats.errors.TimeoutError is one too)
                    continue
                events = [json.loads(m.data) for m in msgs]
                if self.crash_event.is_set():
                    self.seen_armed += [e["type"] for e in events]
                crash = self.crash_event.is_set() and any(e["type"] == "ledger.transaction_posted" for e in events)
                for m, event in zip(msgs, events):
                    self.projection.apply(event)
                    self.redelivered += m.metadata.num_delivered > 1
                    if not crash:
                        await m.ack()
                if crash:
                    log.info("consumer %s: applied %d event(s), crashing before it acknowledges them", self.durable, len(msgs))
                    self.crashed.set()
                    return
        except BaseException as exc:  # noqa: BLE001 - reported to the test's thread
            self.error = exc
            ready.set()
        finally:
            if nc is not None:
                await nc.close()


async def _js_call(url: str, fn):
    nc = await nats.connect(url)
    try:
        return await fn(nc.jetstream())
    finally:
        await nc.close()


def js(url: str, fn):
    """Run `fn(jetstream_context)` on a connection of its own (from the test's thread)."""
    return asyncio.run(_js_call(url, fn))


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return os.environ.get("NATS_URL") or embedded_nats_url(Path(tmp_path_factory.mktemp("state")))


@pytest.fixture(scope="module")
def events(nats_url):
    """This run's stream and subject prefix, created before any process starts (with the worker's
    own configuration: custody.broker), deleted at the end."""
    run = uuid.uuid4().hex[:8]
    stream, prefix = f"EVENTS_E2E_{run}", f"events-e2e-{run}"
    sink = JetStreamSink(nats_url, stream=stream, subject_prefix=prefix)
    sink.ping()
    sink.close()
    yield {"stream": stream, "subject_prefix": prefix}
    js(nats_url, lambda j: j.delete_stream(stream))


@pytest.fixture(scope="module")
def owner_url(database_url):
    from custody.database import drop_database, ensure_database, with_database

    url = with_database(database_url, f"custody_events_{uuid.uuid4().hex[:8]}")
    ensure_database(url)
    yield url
    drop_database(url)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, cluster, owner_url, nats_url, events) -> Deployment:
    nodes = Nodes(cluster.bitcoin.rpc_url, cluster.anvil.rpc_url, cluster.token.address)
    dep = deploy(tmp_path_factory.mktemp("events-topology"), owner_url=owner_url, nodes=nodes, job_scale=0.2,
                 nats_url=nats_url, events=events)
    yield dep
    dep.stop()


@pytest.fixture(scope="module")
def clients(deployment, owner_url):
    from custody.auth import create_api_key
    from custody.settings import get_settings

    engine = create_engine(owner_url)
    try:
        pepper = get_settings().api_key_pepper
        keys = {"backend": create_api_key(engine, "events-backend", "backend", pepper),
                "admin": create_api_key(engine, "events-admin", "admin", pepper),
                "op1": create_api_key(engine, "events-op-1", "operator", pepper),
                "op2": create_api_key(engine, "approver-2", "operator", pepper)}  # a scripted approver (deploy)
    finally:
        engine.dispose()
    with CustodyClient(deployment.api_base, None, timeout=30, retries=0) as base:  # one pool, a key per role; first answers
        yield {name: base.with_key(k) for name, k in keys.items()}


@pytest.fixture(scope="module")
def owner(owner_url):
    engine = create_engine(owner_url)
    yield engine
    engine.dispose()


def _undelivered(owner) -> tuple[int, int]:
    """(outbox rows not yet published, the newest outbox id)."""
    with owner.connect() as c:
        row = c.execute(text("SELECT count(*) FILTER (WHERE delivered_at IS NULL), coalesce(max(id), 0) FROM outbox")).one()
    return int(row[0]), int(row[1])


def _stream_last_seq(url: str, stream: str) -> int:
    async def go(j):
        return (await j.stream_info(stream)).state.last_seq
    return js(url, go)


def _caught_up(url: str, stream: str, durable: str) -> bool:
    async def go(j):
        info = await j.consumer_info(stream, durable)
        last = (await j.stream_info(stream)).state.last_seq
        return info.num_pending == 0 and info.num_ack_pending == 0 and info.ack_floor.stream_seq == last
    return js(url, go)


def _firm_account(api: CustodyClient, name: str, asset: str) -> int:
    return next(a.id for a in api.list_firm_accounts(asset=asset) if a.name == name)


def _customer(api: CustodyClient, owner_name: str, asset: str) -> int:
    return answered(api, 201, api.open_account(asset=asset, kind="customer", name=f"customer:{owner_name}:{asset}",
                                               owner=owner_name)).id


def _differences(projection: EventProjection, clients, orders: dict[str, str], withdrawals: list[int]) -> list[str]:
    """Where the projection and the API disagree (empty when they are equal)."""
    out = []
    for acct in sorted(projection.accounts()):
        api = clients["admin"].get_balance(acct)
        theirs = (api.posted.minor, api.held.minor)
        if projection.balance(acct) != theirs:
            out.append(f"account {acct}: events {projection.balance(acct)}, api {theirs}")
    for order_id, symbol in orders.items():
        api = clients["backend"].get_order(symbol, order_id)
        mine = projection.orders.get(order_id, {})
        if (mine.get("state"), mine.get("filled_lots")) != (api.state, api.filled_lots):
            out.append(f"order {order_id}: events {mine.get('state')}/{mine.get('filled_lots')}, "
                       f"api {api.state}/{api.filled_lots}")
    for wid in withdrawals:
        api = clients["admin"].get_withdrawal(wid).state
        if projection.withdrawals.get(wid) != api:
            out.append(f"withdrawal {wid}: events {projection.withdrawals.get(wid)}, api {api}")
    return out


def test_projection_from_jetstream_survives_restarts_and_equals_the_api(deployment, cluster, clients, owner, nats_url,
                                                                        events):
    from custody.addresses import derive_btc_address

    stream, prefix = events["stream"], events["subject_prefix"]
    backend, admin, op1, op2 = clients["backend"], clients["admin"], clients["op1"], clients["op2"]
    procs = deployment.processes
    run = uuid.uuid4().hex[:6]

    log.info("The api process reports the broker ready (it connects to the worker's NATS URL itself)")
    ready = answered(admin, 200, admin.health_ready())
    assert ready.checks["broker"].ok, ready

    projection = EventProjection()
    durable = f"projection-{run}"
    consumer = Consumer(nats_url, stream, prefix, durable, projection)
    consumer.start()

    log.info("The hot wallet funded; a BTC deposit credited to the seller")
    hot = derive_btc_address(deployment.xpubs["bitcoin"]["hot"], "regtest", 0, 0)
    cluster.bitcoin.fund(hot, 2 * BTC)
    seller, buyer = f"seller-{run}", f"buyer-{run}"
    seller_btc = _customer(backend, seller, "BTC")
    addr = answered(backend, 201, backend.issue_deposit_address(idempotency_key=f"addr-{run}", account_id=seller_btc))
    cluster.bitcoin.fund(addr.address, 1 * BTC)

    def credited():
        cluster.bitcoin.mine(1)
        return any(d.state == "credited" for d in backend.list_account_deposits(seller_btc))
    _until("the deposit credited", credited, every=0.5)

    log.info("A market; the buyer's USDT from a treasury adjustment (two operators); an ask rests")
    symbol = f"BTC-USDT-{run}"
    answered(admin, 201, admin.create_market(symbol=symbol, base_asset="BTC", quote_asset="USDT", lot_size=10_000,
                                             quote_per_tick_lot=1,
                                             fees={"default": {"maker_ppm": 1_000, "taker_ppm": 2_000}}))
    answered(admin, 201, admin.create_asset(code="USDT", decimals=6))  # idempotent; opens its firm accounts
    buyer_usdt = _customer(backend, buyer, "USDT")
    proposal = answered(op1, 201, op1.propose_adjustment(
        idempotency_key=f"usdt-{run}", reason="events e2e: the buyer's opening balance",
        transfers=[{"debit_account_id": _firm_account(admin, "equity:USDT", "USDT"), "credit_account_id": buyer_usdt,
                    "amount": Decimal("40000")}]))
    approved = approve_adjustment_with_client(op2, proposal.id, load_private_key(deployment.approver_keys["approver-2"]),
                                              comment="checked", show=log.info)
    assert_equal(approved.state, "approved")
    _until("the worker posted the adjustment", lambda: op2.get_adjustment(proposal.id).state == "posted")

    def order(account: str, client_order_id: str, side: str, qty: str, price: str):
        return answered(backend, 201, backend.place_order(symbol, account=account, client_order_id=client_order_id,
                                                          side=side, qty=Decimal(qty), price=Decimal(price)))
    ask = order(seller, "ask-1", "sell", "0.3", "59900")
    assert_equal(ask.state, "working")
    _until("the events so far published", lambda: _undelivered(owner)[0] == 0)

    log.info("The worker is SIGKILLed; the api keeps serving: a trade and a resting bid wait in the outbox")
    procs.kill("custody-worker", signal.SIGKILL)
    published = _stream_last_seq(nats_url, stream)
    bid = order(buyer, "bid-1", "buy", "0.2", "60000")
    assert_equal(bid.state, "filled")
    rest = order(buyer, "bid-2", "buy", "0.1", "50000")
    assert_equal(rest.state, "working")
    waiting, _ = _undelivered(owner)
    assert waiting > 0
    time.sleep(1.0)  # the api never publishes: with the worker dead the stream does not grow
    assert_equal(_stream_last_seq(nats_url, stream), published)

    log.info("The worker starts again and publishes what waited; the consumer applies the fill's posting but "
             "crashes before it acknowledges it, and starts again")
    _until("the consumer caught up", lambda: _caught_up(nats_url, stream, durable))
    consumer.arm_crash()
    procs.start("custody-worker")
    _until("the outbox drained by the new worker", lambda: _undelivered(owner)[0] == 0, timeout=60)
    assert _stream_last_seq(nats_url, stream) > published  # (a republished duplicate is stored once)
    consumer.wait_crashed()
    consumer = Consumer(nats_url, stream, prefix, durable, projection)
    consumer.start()

    log.info("A withdrawal is paid to final; the resting bid is cancelled")
    dest = cluster.bitcoin.wallet("getnewaddress", "", "bech32")
    withdrawal = answered(backend, 201, backend.request_withdrawal(client_withdrawal_id=f"w-{run}", account_id=seller_btc,
                                                                   amount=Decimal("0.1"), destination=dest))

    def final():
        state = admin.get_withdrawal(withdrawal.id).state
        if state in ("broadcast", "confirmed"):
            cluster.bitcoin.mine(1)
        return state == "final"
    _until(f"withdrawal {withdrawal.id} final", final, timeout=90, every=0.5)
    cancelled = backend.cancel_order(symbol, rest.order_id, account=buyer)
    assert_equal(cancelled.state, "cancelled")

    log.info("With the outbox empty and the consumer caught up, the projection equals the API")
    orders = {o.order_id: symbol for o in (ask, bid, rest)}
    differences: list[str] = ["not compared yet"]
    deadline = time.monotonic() + 45
    while differences and time.monotonic() < deadline:
        _until("the outbox drained", lambda: _undelivered(owner)[0] == 0)
        _until("the consumer caught up", lambda: _caught_up(nats_url, stream, durable))
        mark = _undelivered(owner)[1]
        differences = _differences(projection, clients, orders, [withdrawal.id])
        if _undelivered(owner)[1] != mark:
            differences = differences or ["events were emitted while comparing"]  # a job moved something: again
    consumer.stop()
    assert_equal(differences, [])

    log.info("The projection saw every kind of change, redeliveries included; the ledger verifies")
    assert {"deposit.credited", "fill.executed", "order.filled", "order.cancelled", "withdrawal.final",
            "withdrawal.state_changed", "ledger.transaction_posted", "ledger.hold_changed"} <= projection.types
    assert consumer.redelivered >= 1 and projection.duplicates >= 1, (consumer.redelivered, projection.duplicates)
    assert "ledger.transaction_posted" in projection.duplicate_types, projection.duplicate_types
    assert {seller_btc, buyer_usdt} <= projection.accounts()
    assert_equal(projection.orders[bid.order_id]["state"], "filled")
    assert_equal(projection.orders[rest.order_id]["state"], "cancelled")
    assert_equal(projection.withdrawals[withdrawal.id], "final")
    posted, held = projection.balance(buyer_usdt)
    assert held == 0 and 0 < posted < 40_000 * 10**6, (posted, held)
    assert admin.verify().ok
