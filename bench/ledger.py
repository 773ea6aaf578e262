"""Ledger throughput benchmark: prints transfers per second for the cases of issue 2.

    .venv/bin/python bench/ledger.py            # full run (about 2 minutes)
    .venv/bin/python bench/ledger.py --seconds 3

Runs against a fresh database on the configured server (DATABASE_URL, or the embedded PostgreSQL),
with the server's default durability (synchronous_commit on). A worker posts through `Ledger.post`
exactly as the service does, one command after another, each on its own pooled connection. Workers
are threads of one client process sharing one Ledger and engine, as the API's request threads
are (one uvicorn process); the one-transfer case also runs 16 workers as 16 separate processes,
which spends more client CPU per posting on this 2-core machine (32 processes taking turns).
Cases:
- single: one transfer per database transaction, 50 accounts, 1 / 4 / 16 workers;
- batch: linked batches of 100 and 1,000 transfers per transaction;
- hot: every posting also pays a fee leg into one shared fee account (16 workers); the fee
  account is fee_income, so its balance projection has 16 shards by default; the same case with a
  one-shard fee account shows what the sharding buys;
- contention: only 10 accounts (16 workers);
- holds: place a hold and release it, per order, as the matching gateway does (16 workers; pairs/s);
- baseline: a bare one-row INSERT + COMMIT per transaction from 16 client processes, raw psycopg
  and through the ledger's own Python path (`Ledger._call`), to show this machine's commit (fsync)
  ceiling beside the ledger.
Ratios are computed from figures measured in the same run; the load average is printed before and
after, since other work on a shared machine moves every figure. For one transfer per transaction
it also prints the CPU each posting cost in the client processes and in the PostgreSQL server
(read from /proc, so only for a server on this host): with 16 workers both cores are busy, and
that sum, not the commit (fsync) rate, sets the throughput.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from custody.database import drop_database, ensure_database, make_engine, migrate, server_url, with_database  # noqa: E402
from custody.settings import Settings  # noqa: E402
from ledger.errors import LedgerError  # noqa: E402
from ledger.model import AccountKind, Transfer  # noqa: E402
from ledger.service import Ledger  # noqa: E402
from sqlalchemy import text  # noqa: E402

FUNDING = 10**15


def setup_accounts(ledger: Ledger, run: str, n: int, *, fee_shards: int | None = None) -> tuple[list[int], int]:
    ledger.create_asset("USDT", 6)
    pool = ledger.open_account("USDT", AccountKind.equity, f"{run}:equity")
    fee = ledger.open_account("USDT", AccountKind.fee_income, f"{run}:fee", balance_shards=fee_shards)
    ids = []
    for i in range(n):
        acc = ledger.open_account("USDT", AccountKind.customer, f"{run}:c{i}")
        ledger.transfer(f"{run}:fund:{i}", pool.id, acc.id, FUNDING)
        ids.append(acc.id)
    return ids, fee.id


def _bare_loop(url: str, raw: bool):
    """One-row INSERT + COMMIT per transaction: the ceiling any durable posting path runs under."""
    if raw:
        import psycopg

        conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)

        def one(n: int, rng: random.Random) -> int:
            conn.execute("INSERT INTO bench_bare (v) VALUES (%s)", (n,))
            return 1
        return one
    # The ledger's own path for a one-statement command (`Ledger._call`): a pooled connection in
    # autocommit, so the statement commits as it ends.
    ledger = Ledger(make_engine(url, pool_size=1))

    def one(n: int, rng: random.Random) -> int:
        ledger._call(None, "INSERT INTO bench_bare (v) VALUES (%s) RETURNING id", (n,))
        return 1
    return one


def _hold_loop(ledger: Ledger, accounts: list[int], tag: str):
    def one(n: int, rng: random.Random) -> int:
        hold = ledger.place_hold(f"{tag}:{n}", rng.choice(accounts), 10, owner="matching:BENCH", reference=f"o{n}")
        ledger.release_hold(hold.id, owner="matching:BENCH")
        return 1
    return one


def _post_loop(ledger: Ledger, accounts: list[int], fee: int, batch: int, hot: bool, tag: str):
    def one(n: int, rng: random.Random) -> int:
        legs = []
        for _ in range(batch):
            a, b = rng.sample(accounts, 2)
            legs.append(Transfer(a, b, rng.randint(1, 1000)))
            if hot:
                legs.append(Transfer(a, fee, 1))
        try:
            ledger.post(f"{tag}:{n}", legs)
        except LedgerError:
            return 0
        return len(legs)
    return one


def client(url: str, kind: str, threads: int, accounts: list[int], fee: int, batch: int, hot: bool,
           seconds: float, tag: str, start, out, finished) -> None:
    """One client process: `threads` workers, each with its own pooled connection (one Ledger and
    engine per process, as in the service), each running its loop for `seconds`. Reports the
    items done and the CPU the whole process spent on them."""
    ledger = None if kind.startswith("bare") else Ledger(make_engine(url, pool_size=threads))
    loops = [
        _bare_loop(url, kind == "bare_raw") if ledger is None else
        _hold_loop(ledger, accounts, f"{tag}:{t}") if kind == "holds" else
        _post_loop(ledger, accounts, fee, batch, hot, f"{tag}:{t}")
        for t in range(threads)
    ]
    done = [0] * threads
    go = threading.Barrier(threads + 1)

    def work(t: int) -> None:
        rng = random.Random(f"{tag}:{t}")
        go.wait()
        deadline = time.perf_counter() + seconds
        n = items = 0
        while time.perf_counter() < deadline:
            items += loops[t](n, rng)
            n += 1
        done[t] = items

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    start.wait()
    cpu = time.process_time()
    go.wait()
    for w in workers:
        w.join()
    out.put((sum(done), time.process_time() - cpu))
    finished.wait()
    if ledger is not None:
        ledger.engine.dispose()


def run_case(url: str, accounts: list[int], fee: int, *, threads: int, procs: int = 1, batch: int = 1,
             hot: bool = False, seconds: float, kind: str = "post", cpu: dict | None = None) -> float:
    """Items per second with `procs` client processes of `threads` workers each; with `cpu`, also
    fills in the CPU microseconds per item spent by the client processes and by the local
    PostgreSQL server (None if the server is not on this host)."""
    ctx = mp.get_context("fork")
    start = ctx.Barrier(procs + 1)
    finished = ctx.Barrier(procs + 1)  # clients stay connected until the server CPU is read
    out = ctx.Queue()
    tag = uuid.uuid4().hex[:8]
    clients = [ctx.Process(target=client, args=(url, kind, threads, accounts, fee, batch, hot, seconds,
                                               f"{tag}:{p}", start, out, finished))
               for p in range(procs)]
    for p in clients:
        p.start()
    start.wait()
    server0 = _server_cpu()
    t0 = time.perf_counter()
    results = [out.get() for _ in clients]
    elapsed = time.perf_counter() - t0
    server = _server_cpu() - server0
    finished.wait()
    for p in clients:
        p.join()
    total = sum(r[0] for r in results)
    if cpu is not None and total:
        cpu["client"] = 1e6 * sum(r[1] for r in results) / total
        cpu["server"] = 1e6 * server / total if server > 0 else None
        cpu["items"], cpu["elapsed"] = total, elapsed
    return total / elapsed


def _server_cpu() -> float:
    """CPU seconds used so far by the PostgreSQL processes on this host (0 if there are none)."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            line = stat.read_text()
        except OSError:
            continue
        name = line[line.index("(") + 1:line.rindex(")")]
        if name.startswith(("postgres", "postmaster")):
            fields = line[line.rindex(")") + 2:].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="measuring time per case")
    args = parser.parse_args()

    url = with_database(server_url(Settings()), f"bench_ledger_{os.getpid()}")
    ensure_database(url)
    migrate(url)
    try:
        engine = make_engine(url)
        ledger = Ledger(engine)
        run = uuid.uuid4().hex[:8]
        fifty, fee = setup_accounts(ledger, f"{run}:50", 50)
        ten, fee10 = setup_accounts(ledger, f"{run}:10", 10)
        fee_one_shard = ledger.open_account("USDT", AccountKind.fee_income, f"{run}:fee1", balance_shards=1).id
        with engine.begin() as c:
            c.execute(text("CREATE TABLE bench_bare (id bigserial PRIMARY KEY, v bigint NOT NULL)"))
        engine.dispose()
        s = args.seconds
        print(f"ledger benchmark: {s:g}s per case, {os.cpu_count()} cores, server {url.split('@')[-1]}")
        print(f"  load average before: {_load()}", flush=True)
        r = {}

        def show(name: str, label: str, value: float, extra: str = "") -> None:
            r[name] = value
            print(f"  {label:<70}{value:9,.0f} {extra}", flush=True)

        cpu_split = {}
        for w in (1, 4, 16):
            cpu_split[f"{w:2d} workers (threads)"] = split = {}
            rate = run_case(url, fifty, fee, threads=w, seconds=s, cpu=split)
            show(f"single_{w}", f"one transfer per transaction, 50 accounts, {w:2d} workers:", rate,
                 f"transfers/s ({split['items']:,} in {split['elapsed']:.2f}s)")
        cpu_split["16 worker processes"] = split = {}
        rate = run_case(url, fifty, fee, threads=1, procs=16, seconds=s, cpu=split)
        show("single_16p", "  the same, 16 workers as 16 separate client processes:", rate,
             f"transfers/s ({split['items']:,} in {split['elapsed']:.2f}s)")
        for b, w in ((100, 4), (1000, 2)):
            show(f"batch_{b}", f"linked batches of {b:5d}, {w} workers:",
                 run_case(url, fifty, fee, threads=w, batch=b, seconds=s), "transfers/s")
        hot = run_case(url, fifty, fee, threads=16, hot=True, seconds=s)
        show("hot_16", "hot fee account in every posting, 16 workers:", hot / 2,
             f"postings/s ({hot:,.0f} transfers/s)")
        hot1 = run_case(url, fifty, fee_one_shard, threads=16, hot=True, seconds=s)
        show("hot1_16", "hot fee account with ONE balance shard, 16 workers:", hot1 / 2,
             f"postings/s ({hot1:,.0f} transfers/s)")
        show("ten_16", "contention: 10 accounts, 16 workers:", run_case(url, ten, fee10, threads=16, seconds=s),
             "transfers/s")
        show("holds_16", "holds: place + release per order, 16 workers:",
             run_case(url, fifty, fee, threads=16, seconds=s, kind="holds"), "pairs/s")
        show("bare_raw", "baseline: bare INSERT+COMMIT, raw psycopg, 16 client processes:",
             run_case(url, [], 0, threads=1, procs=16, seconds=s, kind="bare_raw"), "commits/s")
        show("bare_sa", "baseline: bare INSERT+COMMIT, the ledger's Python path, 16 client processes:",
             run_case(url, [], 0, threads=1, procs=16, seconds=s, kind="bare_ledger"), "commits/s")
        print(f"  load average after:  {_load()}")
        print("CPU per posting, one transfer per transaction (client processes / local PostgreSQL server):")
        for label, split in cpu_split.items():
            server = f"{split['server']:,.0f} us" if split.get("server") else "n/a (server not on this host)"
            print(f"  {label:<22} client {split.get('client', 0):,.0f} us, server {server}")
        base = r["single_16"]
        print("ratios (same run):")
        print(f"  hot-account postings/s / normal postings/s (16 workers): {r['hot_16'] / base:.2f}  (target >= 0.5)")
        print(f"  same with a one-shard fee account:                       {r['hot1_16'] / base:.2f}")
        print(f"  10-account / 50-account (16 workers):                    {r['ten_16'] / base:.2f}  (target >= 0.5)")
        print(f"  16-worker postings / bare INSERT+COMMIT (raw):           {base / r['bare_raw']:.2f}")
        print(f"  16-worker postings / bare INSERT+COMMIT (ledger path):   {base / r['bare_sa']:.2f}")
        print("targets: >= 3,000 transfers/s with 16 workers one per transaction "
              f"({'met' if base >= 3000 else 'NOT met'}); >= 20,000 transfers/s in batches of 1,000 "
              f"({'met' if r['batch_1000'] >= 20000 else 'NOT met'})")
        print(f"  commit ceiling here: {r['bare_raw']:,.0f} bare commits/s (raw), {r['bare_sa']:,.0f}/s through the "
              "ledger's Python path; a posting below both is bound by CPU (posting work, clients), not fsync")
        Ledger(make_engine(url)).assert_verified()
        print("ledger verified after the benchmark")
    finally:
        drop_database(url)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
