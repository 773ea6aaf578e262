"""Matching throughput benchmark: prints commands per second for the two cases of issue 4.

    .venv/bin/python bench/matching.py                  # both cases
    .venv/bin/python bench/matching.py --pure-only --commands 300000 --repeat 7
    .venv/bin/python bench/matching.py --e2e-commands 20000 --batch 200

Mix (issue 4): about 10% new limit orders, 3% IOC, 6% cancels and 81% amends (moves and size
changes) over about 1,000 resting orders. The command stream is generated once by driving a
scratch engine (so every cancel and amend names a live order), then replayed:
(a) pure engine: a fresh `Engine` behind a `Sequencer` with an in-memory journal (and, for
    reference, `Engine.apply` alone); --repeat runs, reported as medians of wall-clock rates with
    min and max, plus the median rate per CPU second of this process; the load average is printed
    before and after because other sessions share the machine. The garbage collector stays on;
    only the pre-built input stream is frozen out of its way (gc.freeze);
(b) end to end: `matching.service.Trading` on a fresh database (DATABASE_URL or the embedded
    PostgreSQL, synchronous_commit on): durable journal rows, holds, one ledger transaction per
    fill, exact releases, order and fill rows. Figures for one command per database transaction
    and for group commits of --batch commands (an outcome is returned only after its commit; the
    ledger commands of a unit go in one `Ledger.apply` statement, see README "Matching").
"""
from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from matching import Amend, Cancel, Engine, MemoryJournal, Place, Sequencer, Side, TimeInForce  # noqa: E402
from matching.events import OrderClosed, OrderRejected  # noqa: E402
from matching.fees import FeeSchedule, FeeTier  # noqa: E402
from matching.model import Market  # noqa: E402
from matching.service import order_id_for  # noqa: E402

MID = 6_000_000          # 60,000.00 USDT in ticks
BAND = 500               # resting prices within MID +- BAND ticks
TARGET_RESTING = 1_000
ACCOUNTS = 32
FEES = FeeSchedule({"default": FeeTier(1_000, 2_000)})


def market(symbol: str) -> Market:
    return Market(symbol, "BTC", "USDT", lot_size=10_000, quote_per_tick_lot=1, min_notional=0)


def generate(symbol: str, n: int, seed: int) -> tuple[list, list]:
    """(seed commands that build ~1,000 resting orders, n mixed commands)."""
    rng = random.Random(seed)
    engine = Engine(market(symbol), FEES)
    seq = Sequencer(engine, MemoryJournal())
    live: list[str] = []
    where: dict[str, int] = {}
    counter = [0]

    def drop(order_id: str) -> None:
        i = where.pop(order_id, None)
        if i is None:
            return
        last = live.pop()
        if last != order_id:
            live[i] = last
            where[last] = i

    def run(cmd) -> None:
        for e in seq.submit(cmd).events:
            if isinstance(e, (OrderClosed, OrderRejected)):
                drop(e.order_id)
        if isinstance(cmd, Place) and cmd.tif is None and engine.orders[cmd.order_id].state.value in (
                "working", "partially_filled"):
            where[cmd.order_id] = len(live)
            live.append(cmd.order_id)

    def new_limit(tif=None) -> Place:
        counter[0] += 1
        account = f"acct{rng.randrange(ACCOUNTS)}"
        cid = f"c{counter[0]}"
        side = rng.choice((Side.buy, Side.sell))
        if tif is TimeInForce.ioc:  # takes liquidity near the touch
            price = MID + BAND if side is Side.buy else MID - BAND
            qty = rng.randint(1, 8)
        else:
            off = rng.randint(1, BAND)
            price = MID - off if side is Side.buy else MID + off
            qty = rng.randint(1, 20)
        return Place(order_id_for(symbol, account, cid), account, cid, side, qty=qty, price=price, tif=tif)

    seeds = []
    while len(live) < TARGET_RESTING:
        cmd = new_limit()
        seeds.append(cmd)
        run(cmd)
    mixed = []
    for _ in range(n):
        r = rng.random()
        if r < 0.10 or not live:
            cmd = new_limit()
        elif r < 0.13:
            cmd = new_limit(TimeInForce.ioc)
        elif r < 0.19:
            order = engine.orders[live[rng.randrange(len(live))]]
            cmd = Cancel(order.order_id, order.account)
        else:  # a move: new price on the same side (occasionally through the touch), or a new size
            order = engine.orders[live[rng.randrange(len(live))]]
            if rng.random() < 0.8:
                off = rng.randint(-5, BAND)
                price = MID - off if order.side is Side.buy else MID + off
                cmd = Amend(order.order_id, order.account, price=price)
            else:
                cmd = Amend(order.order_id, order.account,
                            qty=order.filled + order.decremented + rng.randint(1, 20))
        mixed.append(cmd)
        run(cmd)
    return seeds, mixed


def load() -> str:
    """The 1/5/15-minute load averages: this machine is shared, so figures move with them."""
    return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def _timed(run, commands: list) -> tuple[float, float]:
    """(wall, cpu) commands/s of `run(commands)`; cpu counts this process only, so it is the
    steadier figure when other sessions load the machine. Each run starts after a collection."""
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    run(commands)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return len(commands) / wall, len(commands) / max(cpu, 1e-9)


def _through_sequencer(symbol: str, seeds: list):
    sequencer = Sequencer(Engine(market(symbol), FEES), MemoryJournal())
    for cmd in seeds:
        sequencer.submit(cmd)

    def run(commands: list) -> None:
        submit = sequencer.submit
        for cmd in commands:
            submit(cmd)
    return run


def _engine_alone(symbol: str, seeds: list):
    engine = Engine(market(symbol), FEES)
    for i, cmd in enumerate(seeds, 1):
        engine.apply(i, cmd)

    def run(commands: list) -> None:
        apply = engine.apply
        for i, cmd in enumerate(commands, len(seeds) + 1):
            apply(i, cmd)
    return run


def _report(label: str, rates: list[tuple[float, float]]) -> None:
    wall = sorted(r[0] for r in rates)
    cpu = sorted(r[1] for r in rates)
    print(f"{label}: median {statistics.median(wall):,.0f} commands/s wall "
          f"(min {wall[0]:,.0f}, max {wall[-1]:,.0f}; {len(rates)} runs), "
          f"median {statistics.median(cpu):,.0f}/s per CPU second")


def bench_pure(n: int, seed: int, repeat: int) -> None:
    symbol = "BTC-USDT"
    seeds, mixed = generate(symbol, n, seed)
    kinds = {k: sum(type(c).__name__ == k for c in mixed) / len(mixed) for k in ("Place", "Cancel", "Amend")}
    ioc = sum(isinstance(c, Place) and c.tif is TimeInForce.ioc for c in mixed) / len(mixed)
    print(f"mix over {len(mixed):,} commands: new limit {kinds['Place'] - ioc:.1%}, IOC {ioc:.1%}, "
          f"cancel {kinds['Cancel']:.1%}, amend {kinds['Amend']:.1%}; {TARGET_RESTING:,} resting at start")
    check = Sequencer(Engine(market(symbol), FEES), MemoryJournal())
    for cmd in seeds:
        check.submit(cmd)
    events = sum(len(check.submit(cmd).events) for cmd in mixed)
    print(f"    every command returns its events: {events:,} events for {len(mixed):,} commands "
          f"(untimed check run)")
    del check
    # The pre-built command stream is bench input, not engine state: freeze it so the cyclic
    # garbage collector (on throughout) does not walk it; the engines' own objects stay in play.
    gc.collect()
    gc.freeze()
    print(f"    before: {load()}")
    seq_rates, raw_rates = [], []
    for _ in range(repeat):  # fresh engines each round; the two cases interleave to share the load
        seq_rates.append(_timed(_through_sequencer(symbol, seeds), mixed))
        raw_rates.append(_timed(_engine_alone(symbol, seeds), mixed))
    _report("(a) pure engine, sequencer + in-memory journal", seq_rates)
    _report("    Engine.apply alone (reference)            ", raw_rates)
    print(f"    after:  {load()}")


def bench_e2e(n: int, batch: int, seed: int) -> None:
    from custody.database import drop_database, ensure_database, make_engine, migrate, server_url, with_database
    from custody.settings import Settings
    from ledger.model import AccountKind
    from ledger.service import Ledger
    from matching.service import Trading
    from matching.settlement import customer_account_name

    url = with_database(server_url(Settings()), f"bench_matching_{uuid.uuid4().hex[:8]}")
    ensure_database(url)
    migrate(url)
    db = make_engine(url)
    try:
        ledger = Ledger(db)
        ledger.create_asset("BTC", 8)
        ledger.create_asset("USDT", 6)
        for asset in ("BTC", "USDT"):
            equity = ledger.open_account(asset, AccountKind.equity, f"bench:equity:{asset}")
            for i in range(ACCOUNTS):
                owner = f"acct{i}"
                acc = ledger.open_account(asset, AccountKind.customer, customer_account_name(owner, asset), owner=owner)
                ledger.transfer(f"bench:fund:{owner}:{asset}", equity.id, acc.id, 10**18)
        for label, size, count in (("one command per transaction", 1, max(n // 10, 500)),
                                   (f"group commit of {batch}", batch, n)):
            symbol = f"BTC-USDT-{size}"
            trading = Trading(db, ledger)
            trading.create_market(market(symbol), FEES)
            seeds, mixed = generate(symbol, count, seed)
            for i in range(0, len(seeds), 200):
                trading.submit_batch(symbol, seeds[i:i + 200])
            t0 = time.perf_counter()
            for i in range(0, len(mixed), size):
                trading.submit_batch(symbol, mixed[i:i + size])
            rate = len(mixed) / (time.perf_counter() - t0)
            fills = len(trading.fills(symbol, limit=10**9))
            print(f"    {load()}")
            print(f"(b) end to end, {label}: {rate:,.0f} commands/s ({len(mixed):,} commands, "
                  f"{fills:,} fills settled in the ledger in the whole run)")
        t0 = time.perf_counter()
        failed = [c.name for c in ledger.verify() if not c.ok]
        print(f"    ledger verify: {'ok' if not failed else failed} ({time.perf_counter() - t0:.1f}s)")
    finally:
        db.dispose()
        drop_database(url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commands", type=int, default=200_000, help="mixed commands for (a)")
    parser.add_argument("--e2e-commands", type=int, default=20_000, help="mixed commands for (b)")
    parser.add_argument("--batch", type=int, default=100, help="commands per group commit in (b)")
    parser.add_argument("--pure-only", action="store_true")
    parser.add_argument("--seed", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5, help="runs of (a); medians are reported")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, shared with other sessions; figures vary run to run; "
          f"Python {sys.version.split()[0]}; {load()}")
    bench_pure(args.commands, args.seed, args.repeat)
    if not args.pure_only:
        bench_e2e(args.e2e_commands, args.batch, args.seed)


if __name__ == "__main__":
    main()
