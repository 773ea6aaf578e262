"""A consumer on NATS JetStream builds balances, orders and withdrawals from events only, and ends
equal to what the API reports (issue 14, "must show" 1, on the in-process API).

The outbox dispatcher publishes to the real NATS server (NATS_URL, else the embedded
`nats-server` started under a temporary directory) through custody.broker.JetStreamSink. The
consumer is a durable pull consumer with explicit acks. Mid-run, the dispatcher is restarted (a new
sink and dispatcher, as after a worker restart) after "crashing" between the broker's ack and the
outbox update (rows set back to undelivered: republished, the server drops them as duplicates),
and the consumer is restarted after applying a batch it never acknowledged (JetStream redelivers
it after ack_wait; the projection skips event keys it has applied). Also: a broker that is down
leaves the events in the outbox with one warning and no traceback.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from pathlib import Path

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from sqlalchemy import text

from custody.broker import DEFAULT_STREAM, BrokerUnavailable, JetStreamSink, embedded_nats_url
from custody.client.projection import EventProjection
from custody.jobs import OutboxDispatcher
from matching.settlement import customer_account_name
from tests.integration.test_matching_support import fund
from tests.integration.withdrawal_api import WithdrawalApi

log = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return os.environ.get("NATS_URL") or embedded_nats_url(Path(tmp_path_factory.mktemp("state")))


class Consumer:
    """A durable pull consumer with explicit acks, on its own event loop."""

    def __init__(self, url: str, durable: str, start_seq: int) -> None:
        self.url, self.durable, self.start_seq = url, durable, start_seq
        self.loop = asyncio.new_event_loop()
        self.nc = self.sub = None

    def start(self) -> None:
        async def go():
            self.nc = await nats.connect(self.url)
            js = self.nc.jetstream()
            self.sub = await js.pull_subscribe("custody.>", durable=self.durable, stream=DEFAULT_STREAM, config=ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT, ack_wait=1, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=self.start_seq))
        self.loop.run_until_complete(go())

    def pull(self, projection: EventProjection, *, ack: bool = True, batch: int = 200) -> int:
        async def go() -> int:
            try:
                msgs = await self.sub.fetch(batch=batch, timeout=1)
            except nats.errors.TimeoutError:
                return 0
            for m in msgs:
                projection.apply(json.loads(m.data))
                if ack:
                    await m.ack()
            return len(msgs)
        return self.loop.run_until_complete(go())

    def drain(self, projection: EventProjection) -> None:
        while self.pull(projection):
            pass

    def stop(self) -> None:
        self.loop.run_until_complete(self.nc.close())
        self.loop.close()


def stream_last_seq(url: str) -> int:
    async def go() -> int:
        nc = await nats.connect(url)
        try:
            return (await nc.jetstream().stream_info(DEFAULT_STREAM)).state.last_seq
        finally:
            await nc.close()
    return asyncio.run(go())


def dispatch_all(dispatcher: OutboxDispatcher) -> None:
    while dispatcher.dispatch():
        pass


def test_projection_from_events_equals_the_api(engine, ledger, nats_url, caplog):
    run = uuid.uuid4().hex[:8]
    w = WithdrawalApi(engine)
    sink = JetStreamSink(nats_url)
    dispatcher = OutboxDispatcher(engine, sink)
    sink.ping()  # the stream exists before the consumer is made
    dispatch_all(dispatcher)  # earlier tests' events first
    consumer = Consumer(nats_url, f"projection-{run}", stream_last_seq(nats_url) + 1)
    consumer.start()
    projection = EventProjection()

    log.info("Two customers funded, a market, a trade that fills one order and leaves one resting")
    ledger.create_asset("USDT", 6)
    symbol = f"BTC-USDT-{run}"
    r = w.admin.post("/v1/markets", json={"symbol": symbol, "base_asset": "BTC", "quote_asset": "USDT", "lot_size": 10_000,
                                          "quote_per_tick_lot": 1, "min_notional": 1_000_000,
                                          "fees": {"default": {"maker_ppm": 1_000, "taker_ppm": 2_000}}})
    assert r.status_code == 201, r.text
    seller, buyer = f"{run}-seller", f"{run}-buyer"
    seller_btc = fund(ledger, run, seller, "BTC", 10 * 10**8)
    buyer_usdt = fund(ledger, run, buyer, "USDT", 100_000 * 10**6)
    base = f"/v1/markets/{symbol}/orders"
    ask = w.backend.post(base, json={"account": seller, "client_order_id": "a1", "side": "sell", "qty": "0.5", "price": "60000"})
    assert ask.status_code == 201, ask.text

    log.info("The dispatcher publishes; the consumer applies a batch but crashes before acking it")
    dispatch_all(dispatcher)
    assert consumer.pull(projection, ack=False, batch=5) > 0
    consumer.stop()

    bid = w.backend.post(base, json={"account": buyer, "client_order_id": "b1", "side": "buy", "qty": "0.2", "price": "60000"})
    assert bid.status_code == 201 and bid.json()["state"] == "filled", bid.text
    rest = w.backend.post(base, json={"account": buyer, "client_order_id": "b2", "side": "buy", "qty": "0.1", "price": "50000"})
    assert rest.status_code == 201 and rest.json()["state"] == "working", rest.text

    log.info("A withdrawal (held, pending approval) and another rejected by an operator")
    w1 = w.withdraw(seller_btc, "0.01")
    w2 = w.withdraw(seller_btc, "0.02")
    w.custody.withdrawals.reject(int(w2["id"]), operator="op-events", comment="test")

    log.info("The broker is down: events stay in the outbox, one warning, no traceback")
    down = JetStreamSink("nats://127.0.0.1:1", timeout_s=0.5)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="custody.jobs"):
        assert OutboxDispatcher(engine, down).dispatch() == 0
    down.close()
    warnings = [r for r in caplog.records if r.name == "custody.jobs"]
    assert len(warnings) == 1 and warnings[0].exc_info is None and "broker unavailable" in warnings[0].getMessage()
    with pytest.raises(BrokerUnavailable):
        JetStreamSink("nats://127.0.0.1:1", timeout_s=0.5).ping()

    log.info("The dispatcher publishes, then 'crashes' before recording delivery; a new one republishes")
    dispatch_all(dispatcher)
    with engine.begin() as c:
        republish = c.execute(text("UPDATE outbox SET delivered_at = NULL WHERE id IN "
                                   "(SELECT id FROM outbox ORDER BY id DESC LIMIT 10) RETURNING id")).rowcount
    assert republish == 10
    sink.close()
    sink = JetStreamSink(nats_url)
    before = stream_last_seq(nats_url)
    dispatch_all(OutboxDispatcher(engine, sink))
    assert stream_last_seq(nats_url) == before  # the server dropped all ten as duplicates (Nats-Msg-Id)

    log.info("The consumer restarts: the unacked batch is redelivered and skipped by event key")
    more = w.backend.post(f"{base}/{rest.json()['order_id']}/cancel", json={"account": buyer})
    assert more.status_code == 200, more.text
    dispatch_all(OutboxDispatcher(engine, sink))
    consumer = Consumer(nats_url, f"projection-{run}", consumer.start_seq)
    consumer.start()
    consumer.drain(projection)
    consumer.stop()
    sink.close()
    assert projection.duplicates >= 1

    log.info("The projection equals the API")
    accounts = [seller_btc, buyer_usdt]
    for owner, asset in ((seller, "USDT"), (buyer, "BTC")):
        accounts.append(ledger.account_by_name(customer_account_name(owner, asset)).id)
    for acct in accounts:
        api = w.backend.get(f"/v1/accounts/{acct}/balance").json()
        assert projection.balance(acct) == (int(api["posted"]["minor"]), int(api["held"]["minor"])), acct
    for order in (ask, bid, rest):
        api = w.backend.get(f"{base}/{order.json()['order_id']}").json()
        mine = projection.orders[order.json()["order_id"]]
        assert (mine["state"], mine["filled_lots"]) == (api["state"], api["filled_lots"])
    assert projection.orders[rest.json()["order_id"]]["state"] == "cancelled"
    for wd in (w1, w2):
        assert projection.withdrawals[int(wd["id"])] == w.backend.get(f"/v1/withdrawals/{wd['id']}").json()["state"]
    assert projection.withdrawals[int(w2["id"])] == "rejected"
    w.reject_all(seller_btc)
