"""Ledger throughput benchmark: prints transfers per second for the cases of issue 2.

    .venv/bin/python bench/ledger.py            # full run (about 2 minutes)
    .venv/bin/python bench/ledger.py --seconds 3

Runs against a fresh database on the configured server (DATABASE_URL, or the embedded PostgreSQL),
with the server's default durability (synchronous_commit on). Workers are separate processes (no
GIL between them), each with its own connection, posting through `Ledger.post` exactly as the
service does. Cases:
- single: one transfer per database transaction, 50 accounts, 1 / 4 / 16 workers;
- batch: linked batches of 100 and 1,000 transfers per transaction;
- hot: every posting also pays a fee leg into one shared fee account (16 workers);
- contention: only 10 accounts (16 workers).
Ratios are computed from figures measured in the same run.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from custody.database import drop_database, ensure_database, make_engine, migrate, server_url, with_database  # noqa: E402
from custody.settings import Settings  # noqa: E402
from ledger.errors import LedgerError  # noqa: E402
from ledger.model import AccountKind, Transfer  # noqa: E402
from ledger.service import Ledger  # noqa: E402

FUNDING = 10**15


def setup_accounts(ledger: Ledger, run: str, n: int) -> tuple[list[int], int]:
    ledger.create_asset("USDT", 6)
    pool = ledger.open_account("USDT", AccountKind.equity, f"{run}:equity")
    fee = ledger.open_account("USDT", AccountKind.fee_income, f"{run}:fee")
    ids = []
    for i in range(n):
        acc = ledger.open_account("USDT", AccountKind.customer, f"{run}:c{i}")
        ledger.transfer(f"{run}:fund:{i}", pool.id, acc.id, FUNDING)
        ids.append(acc.id)
    return ids, fee.id


def worker(url: str, accounts: list[int], fee: int, batch: int, hot: bool, seconds: float,
           tag: str, start, out) -> None:
    ledger = Ledger(make_engine(url, pool_size=1))
    rng = random.Random(tag)
    start.wait()
    done = 0
    n = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        legs = []
        for _ in range(batch):
            a, b = rng.sample(accounts, 2)
            legs.append(Transfer(a, b, rng.randint(1, 1000)))
            if hot:
                legs.append(Transfer(a, fee, 1))
        try:
            ledger.post(f"{tag}:{n}", legs)
            done += len(legs)
        except LedgerError:
            pass
        n += 1
    out.put(done)
    ledger.engine.dispose()


def run_case(url: str, accounts: list[int], fee: int, *, workers: int, batch: int = 1,
             hot: bool = False, seconds: float) -> float:
    ctx = mp.get_context("fork")
    start = ctx.Barrier(workers + 1)
    out = ctx.Queue()
    tag = uuid.uuid4().hex[:8]
    procs = [
        ctx.Process(target=worker, args=(url, accounts, fee, batch, hot, seconds, f"{tag}:{w}", start, out))
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    start.wait()
    t0 = time.perf_counter()
    total = sum(out.get() for _ in procs)
    elapsed = time.perf_counter() - t0
    for p in procs:
        p.join()
    return total / elapsed


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
        engine.dispose()
        s = args.seconds
        print(f"ledger benchmark: {s:g}s per case, {os.cpu_count()} cores, server {url.split('@')[-1]}")
        results = {}
        for w in (1, 4, 16):
            results[f"single_{w}"] = run_case(url, fifty, fee, workers=w, seconds=s)
            print(f"  one transfer per transaction, 50 accounts, {w:2d} workers: {results[f'single_{w}']:9,.0f} transfers/s", flush=True)
        for b, w in ((100, 4), (1000, 2)):
            results[f"batch_{b}"] = run_case(url, fifty, fee, workers=w, batch=b, seconds=s)
            print(f"  linked batches of {b:5d}, {w} workers:                  {results[f'batch_{b}']:9,.0f} transfers/s", flush=True)
        results["hot_16"] = run_case(url, fifty, fee, workers=16, hot=True, seconds=s)
        print(f"  hot fee account in every posting, 16 workers:          {results['hot_16']:9,.0f} transfers/s "
              f"({results['hot_16'] / 2:,.0f} postings/s)", flush=True)
        results["ten_16"] = run_case(url, ten, fee10, workers=16, seconds=s)
        print(f"  contention: 10 accounts, 16 workers:                   {results['ten_16']:9,.0f} transfers/s", flush=True)
        base = results["single_16"]
        print("ratios (same run):")
        print(f"  hot-account postings/s / normal postings/s (16 workers): {results['hot_16'] / 2 / base:.2f}  (target >= 0.5)")
        print(f"  10-account / 50-account (16 workers):                    {results['ten_16'] / base:.2f}  (target >= 0.5)")
        print("targets: >= 3,000 transfers/s with 16 workers one per transaction; >= 20,000 transfers/s in batches of 1,000")
        Ledger(make_engine(url)).assert_verified()
        print("ledger verified after the benchmark")
    finally:
        drop_database(url)


if __name__ == "__main__":
    main()
