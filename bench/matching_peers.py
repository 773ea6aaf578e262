"""Our matching engine (pure and compiled) against two published Python engines, one seeded stream.

    .venv/bin/python bench/matching_peers.py                       # 300,000 commands, 3 runs each
    .venv/bin/python bench/matching_peers.py --commands 1000000 --repeat 5
    .venv/bin/python bench/matching_peers.py --commands 2000 --repeat 1 --resting 200   # smoke

The peers, `cython-orderbook` (Cython) and `lightmatchingengine` (pure Python), are installed into a
benchmark-only virtualenv under ~/.cache/custody-service/bench-peers-venv (never the project's
.venv) on first use, and run there in a child process; ours run in this process, the compiled
engine as `matching.compiled` finds it (run `scripts/bootstrap.sh` first to build it).

The stream (issue 20): about 10% new limit orders, 3% IOC, 6% cancels and 81% moves (a resting
order to a new price on its side, sometimes through the touch) over about 2,000 resting orders,
generated once by driving a scratch pure engine so every cancel and move names a live order, then
replayed by each engine. Every engine's fills, as (maker, taker, price, lots), must be identical,
in order; the run stops with an error otherwise. What differs between the engines, and how the
stream is made comparable:
- the peers have no accounts, so no self-trade prevention: every order of the stream has an
  account of its own, so ours never prevents a trade either;
- the peers have no fees: ours charges them (maker 0.1%, taker 0.2%, integers); fills are
  compared without them;
- the peers have no IOC: an IOC is a limit order whose remainder the driver cancels at once;
- the peers have no amend: a move is a cancel and a new order for the open quantity at the new
  price, under a new peer id mapped to ours. Ours re-queues a moved order at the back of its new
  level (a price change loses priority), which is what cancel + new order does;
- `lightmatchingengine` reports one aggressor trade per price level and one passive trade per
  maker: its passive trades are the fills compared (the aggressor is the order being added);
- ours emits events for every state change, hold and fee, the peers a trade log only.
Timing: commands/s over the mixed commands per engine, after the book is built (median of
--repeat rounds, each round running every engine once, so the load of this shared machine falls on
all; wall clock and per CPU second of the engine's own process), the ratios, and the load average
before and after. The peers' child processes and ours all freeze the pre-built stream out of the
garbage collector's way (gc.freeze) and keep the collector on.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEERS = ("cython-orderbook", "lightmatchingengine")
PEER_VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "custody-service" / "bench-peers-venv"
MID = 6_000_000
BAND = 1_000      # resting prices within MID +- BAND ticks
NEW, IOC, CANCEL, MOVE = 0, 1, 2, 3


def load() -> str:
    return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def _timed(run) -> tuple[float, float]:
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    n = run()
    return n / (time.perf_counter() - t0), n / max(time.process_time() - c0, 1e-9)


# -- the peers (run in the benchmark virtualenv: no import of ours below this line's functions) --

def _drive_cython_orderbook(ops: list, record: bool):
    from cython_orderbook import Order, OrderBook, OrderSide
    sides = (OrderSide.BID, OrderSide.ASK)
    book, handles, ours = OrderBook(), {}, {}

    def run() -> int:
        add, cancel = book.add_limit_order, book.cancel_order
        for op in ops:
            kind = op[0]
            if kind == MOVE:
                old = handles[op[1]]
                cancel(old.order_id)
                order = Order(old.side, old.remaining_quantity, op[2])
                if record:
                    ours[order.order_id] = op[1]
                add(order)
                handles[op[1]] = order
            elif kind == CANCEL:
                cancel(handles.pop(op[1]).order_id)
            else:
                order = Order(sides[op[2]], op[4], op[3])
                if record:
                    ours[order.order_id] = op[1]
                add(order)
                if kind == IOC:
                    if order.remaining_quantity:
                        cancel(order.order_id)
                else:
                    handles[op[1]] = order
        return len(ops)

    def fills() -> list:
        return [(ours[t.filler_id], ours[t.aggressor_id], t.price, t.quantity_filled)
                for t in book.trade_log]
    return run, fills


def _drive_lightmatchingengine(ops: list, record: bool):
    from lightmatchingengine.lightmatchingengine import LightMatchingEngine, Side
    sides = (Side.BUY, Side.SELL)
    lme, handles, ours, log = LightMatchingEngine(), {}, {}, []

    def run() -> int:
        add, cancel = lme.add_order, lme.cancel_order
        for op in ops:
            kind = op[0]
            if kind == MOVE:
                old = handles[op[1]]
                qty = old.leaves_qty  # read first: its cancel zeroes it
                cancel(old.order_id, "X")
                order, trades = add("X", op[2], qty, old.side)
                handles[op[1]] = order
            elif kind == CANCEL:
                cancel(handles.pop(op[1]).order_id, "X")
                continue
            else:
                order, trades = add("X", op[3], op[4], sides[op[2]])
                if kind == IOC:
                    if order.leaves_qty:
                        cancel(order.order_id, "X")
                else:
                    handles[op[1]] = order
            if record:
                ours[order.order_id] = op[1]
                if trades:
                    log.append((order.order_id, trades))
        return len(ops)

    def fills() -> list:
        return [(ours[t.order_id], ours[taker], t.trade_price, t.trade_qty)
                for taker, trades in log for t in trades if t.order_id != taker]
    return run, fills


def peer_main(peer: str, ops_file: str, repeat: int, out_file: str, record: bool) -> None:
    """In the benchmark virtualenv: a recorded run for the fills if `record`, then `repeat` timed
    runs."""
    with open(ops_file, "rb") as f:
        seed_ops, ops = pickle.load(f)
    drive = _drive_cython_orderbook if peer == "cython-orderbook" else _drive_lightmatchingengine
    recorded = None
    if record:
        run, fills = drive(seed_ops + ops, record=True)
        run()
        recorded = fills()
    rates = []
    gc.collect()
    gc.freeze()
    for _ in range(repeat):
        timed, _fills = _continue(drive, seed_ops, ops)
        rates.append(_timed(timed))
    with open(out_file, "wb") as f:
        pickle.dump({"fills": recorded, "rates": rates}, f)


def _continue(drive, seed_ops: list, ops: list):
    """A driver whose book holds `seed_ops` already and whose timed run applies `ops` only."""
    stream = list(seed_ops)
    run, fills = drive(stream, record=False)
    run()
    stream[:] = ops  # the driver iterates the same list object: now the measured part
    return run, fills


def _ensure_peer_venv() -> Path:
    python = PEER_VENV / "bin" / "python"
    probe = "import cython_orderbook, lightmatchingengine"
    if python.exists() and subprocess.run([python, "-c", probe], capture_output=True).returncode == 0:
        return python
    print(f"installing {', '.join(PEERS)} into {PEER_VENV} (benchmark only)", flush=True)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(PEER_VENV)], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", *PEERS], check=True)
    return python


# -- our engines and the stream (project side) ---------------------------------------------------

def market():
    from matching.model import Market
    return Market("BTC-USDT", "BTC", "USDT", lot_size=10_000, quote_per_tick_lot=1, min_notional=0)


def fees():
    from matching.fees import FeeSchedule, FeeTier
    return FeeSchedule({"default": FeeTier(1_000, 2_000)})


def generate(n: int, seed: int, resting: int = 2_000) -> tuple[list, list]:
    """(commands that build about `resting` resting orders, `n` mixed commands), for our engine."""
    from matching import Amend, Cancel, Engine, Place, Side, TimeInForce
    from matching.events import OrderClosed, OrderRejected
    rng = random.Random(seed)
    engine = Engine(market(), fees())
    live: list[str] = []
    where: dict[str, int] = {}
    counter = 0

    def drop(order_id: str) -> None:
        i = where.pop(order_id, None)
        if i is not None:
            last = live.pop()
            if last != order_id:
                live[i] = last
                where[last] = i

    def new(tif=None) -> Place:
        nonlocal counter
        counter += 1
        side = rng.choice((Side.buy, Side.sell))
        if tif is TimeInForce.ioc:  # takes liquidity near the touch
            price, qty = (MID + BAND // 4 if side is Side.buy else MID - BAND // 4), rng.randint(1, 8)
        else:
            off = rng.randint(1, BAND)
            price, qty = (MID - off if side is Side.buy else MID + off), rng.randint(1, 20)
        # An account per order: the peers have no self-trade prevention (see the module).
        return Place(f"o{counter}", f"a{counter}", f"c{counter}", side, qty=qty, price=price, tif=tif)

    def run(cmd) -> None:
        for event in engine.apply(engine.last_seq + 1, cmd):
            if isinstance(event, (OrderClosed, OrderRejected)):
                drop(event.order_id)
        if isinstance(cmd, Place) and cmd.tif is None and cmd.order_id in engine.live:
            where[cmd.order_id] = len(live)
            live.append(cmd.order_id)

    seeds = []
    while len(live) < resting:
        seeds.append(new())
        run(seeds[-1])
    mixed = []
    for _ in range(n):
        r = rng.random()
        if r < 0.10 or not live:
            cmd = new()
        elif r < 0.13:
            cmd = new(TimeInForce.ioc)
        elif r < 0.19:
            order = engine.orders[live[rng.randrange(len(live))]]
            cmd = Cancel(order.order_id, order.account)
        else:  # a move: a new price on its side, now and then through the touch
            order = engine.orders[live[rng.randrange(len(live))]]
            off = rng.randint(-5, BAND)
            cmd = Amend(order.order_id, order.account,
                        price=MID - off if order.side is Side.buy else MID + off)
        mixed.append(cmd)
        run(cmd)
    return seeds, mixed


def to_ops(commands: list) -> list:
    """Our commands as the peers' drivers take them (plain tuples, picklable)."""
    from matching import Amend, Cancel, Side, TimeInForce
    ops = []
    for cmd in commands:
        if isinstance(cmd, Amend):
            ops.append((MOVE, cmd.order_id, cmd.price))
        elif isinstance(cmd, Cancel):
            ops.append((CANCEL, cmd.order_id))
        else:
            ops.append((IOC if cmd.tif is TimeInForce.ioc else NEW, cmd.order_id,
                        0 if cmd.side is Side.buy else 1, cmd.price, cmd.qty))
    return ops


def _our_fills(engine_cls, commands: list) -> list:
    from matching.events import Fill
    engine = engine_cls(market(), fees())
    fills = []
    for i, cmd in enumerate(commands, 1):
        for e in engine.apply(i, cmd):
            if type(e) is Fill:
                fills.append((e.maker_order_id, e.taker_order_id, e.price_ticks, e.qty_lots))
    return fills


def _our_runner(engine_cls, seeds: list, mixed: list):
    engine = engine_cls(market(), fees())
    for i, cmd in enumerate(seeds, 1):
        engine.apply(i, cmd)

    def run() -> int:
        apply = engine.apply
        for i, cmd in enumerate(mixed, len(seeds) + 1):
            apply(i, cmd)
        return len(mixed)
    return run


def _first_difference(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"fill {i}: {x} != {y}"
    return f"{len(a)} fills against {len(b)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commands", type=int, default=300_000)
    parser.add_argument("--resting", type=int, default=2_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument("--peer", choices=PEERS, help=argparse.SUPPRESS)  # child process mode
    parser.add_argument("--ops", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--record", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        peer_main(args.peer, args.ops, args.repeat, args.out, args.record)
        return

    sys.path.insert(0, str(ROOT))
    from matching import Engine
    from matching.compiled import compiled_engine
    compiled_cls, why = compiled_engine()
    if compiled_cls is None:
        sys.exit(f"the compiled engine is {why}: run scripts/bootstrap.sh first")
    python = _ensure_peer_venv()
    print(f"machine: {os.cpu_count()} cores, shared with other sessions; Python "
          f"{sys.version.split()[0]}; {load()}")
    seeds, mixed = generate(args.commands, args.seed, args.resting)
    kinds = [type(c).__name__ for c in mixed]
    ioc = sum(getattr(c, "tif", None) is not None for c in mixed)
    print(f"stream: {len(seeds):,} orders to build the book, then {len(mixed):,} commands: new limit "
          f"{(kinds.count('Place') - ioc) / len(mixed):.1%}, IOC {ioc / len(mixed):.1%}, cancel "
          f"{kinds.count('Cancel') / len(mixed):.1%}, move {kinds.count('Amend') / len(mixed):.1%}")

    expected = _our_fills(Engine, seeds + mixed)
    if _our_fills(compiled_cls, seeds + mixed) != expected:
        sys.exit("the compiled engine's fills differ from the pure engine's")
    results: dict[str, list] = {name: [] for name in (*PEERS, "ours, pure", "ours, compiled")}
    gc.collect()
    gc.freeze()
    print(f"before: {load()}")
    with tempfile.TemporaryDirectory() as tmp:
        ops_file = os.path.join(tmp, "ops.pickle")
        with open(ops_file, "wb") as f:
            pickle.dump((to_ops(seeds), to_ops(mixed)), f)
        # Rounds: each engine once per round, so that the machine's load (shared) falls on all.
        for round_no in range(args.repeat):
            for peer in PEERS:
                out = os.path.join(tmp, f"{peer}.pickle")
                subprocess.run([python, __file__, "--peer", peer, "--ops", ops_file, "--out", out,
                                "--repeat", "1", *(["--record"] if round_no == 0 else [])],
                               check=True)
                with open(out, "rb") as f:
                    got = pickle.load(f)
                if round_no == 0 and got["fills"] != expected:
                    sys.exit(f"{peer}: fills differ from ours: "
                             f"{_first_difference(expected, got['fills'])}")
                results[peer] += got["rates"]
            results["ours, pure"].append(_timed(_our_runner(Engine, seeds, mixed)))
            results["ours, compiled"].append(_timed(_our_runner(compiled_cls, seeds, mixed)))
    print(f"fills: identical in all four engines ({len(expected):,} fills, compared as "
          f"(maker, taker, price, lots) in order)")
    print(f"after:  {load()}")
    medians = {}
    for name, rates in results.items():
        wall = statistics.median(r[0] for r in rates)
        cpu = statistics.median(r[1] for r in rates)
        medians[name] = (wall, cpu)
        print(f"{name:>20}: {wall:>11,.0f} commands/s wall, {cpu:>11,.0f}/s per CPU second "
              f"(median of {len(rates)})")
    for name in ("ours, compiled", "ours, pure"):
        wall_peer = max(PEERS, key=lambda p: medians[p][0])
        cpu_peer = max(PEERS, key=lambda p: medians[p][1])
        print(f"{name} / fastest peer: {medians[name][0] / medians[wall_peer][0]:.2f}x wall "
              f"({wall_peer}), {medians[name][1] / medians[cpu_peer][1]:.2f}x per CPU second "
              f"({cpu_peer})")
    print(f"compiled / pure: {medians['ours, compiled'][1] / medians['ours, pure'][1]:.2f}x per CPU second")
    print(json.dumps({k: round(v[1]) for k, v in medians.items()}))


if __name__ == "__main__":
    main()
