"""Crash at each step of a command, restart on the same database, finish the stream: books, orders,
holds and ledger agree with a clean run of the same commands (no fill lost, none posted twice).

A crash is simulated by raising inside the unit of work at one of the steps below, on the n-th time
that step runs; "restart" drops the service object and builds a fresh one on the same database
(snapshot + journal replay). The client then retries the command that never got an answer.
"""
from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy import text

from ledger.model import PostTransfers, ReleaseHold
from ledger.service import Ledger
from matching import store
from matching.model import Amend, Cancel, OrderType, Side, TimeInForce
from matching.service import Trading, order_id_for
from matching.settlement import Settlement
from matching.snapshot import state_hash
from matching.testing import lots, ticks
from tests.integration.test_matching_support import USDT, Env, check_holds, holds_of, new_market

BUY, SELL = Side.buy, Side.sell
BTC = 100_000_000


class Crash(Exception):
    """The process died here."""


def place(who, cid, side, **kw):
    return lambda env: env.trading.place(env.symbol, env.owner(who), cid, side, **kw)


def cancel(who, cid):
    return lambda env: env.trading.submit(env.symbol, Cancel(
        order_id_for(env.symbol, env.owner(who), cid), env.owner(who)))


def amend(who, cid, **kw):
    return lambda env: env.trading.submit(env.symbol, Amend(
        order_id_for(env.symbol, env.owner(who), cid), env.owner(who), **kw))


SCRIPT = [
    place("a", "a1", SELL, qty=lots("1"), price=ticks(100)),
    place("a", "a2", SELL, qty=lots("0.5"), price=ticks(101)),
    place("b", "s1", BUY, order_type=OrderType.stop_limit, qty=lots("0.3"), price=ticks(103),
          stop_price=ticks(101)),
    place("c", "c1", BUY, qty=lots("1.2"), price=ticks(101)),       # fills, fires s1, s1 fills
    place("b", "b2", BUY, qty=lots("0.5"), price=ticks(99)),
    amend("b", "b2", price=ticks(100)),                               # hold grows: swapped
    place("a", "a3", SELL, qty=lots("0.7"), price=ticks(99), tif=TimeInForce.ioc),
    place("c", "c2", BUY, qty=lots("1"), price=ticks(95)),
    cancel("c", "c2"),
    place("c", "c3", BUY, order_type=OrderType.market, budget=50 * USDT),
    place("a", "a4", SELL, qty=lots("0.4"), price=ticks(100), display_qty=lots("0.1")),
    place("b", "b3", BUY, qty=lots("1"), price=ticks(100), tif=TimeInForce.fok),
    place("b", "b4", BUY, qty=lots("0.4"), price=ticks(100)),
]


def new_env(ledger: Ledger) -> Env:
    run = uuid.uuid4().hex[:10]
    trading = Trading(ledger.engine, ledger)
    env = Env(ledger, trading, run, new_market(ledger, trading, run))
    for who in "abc":
        env.fund(who, btc=10 * BTC, usdt=100_000 * USDT)
    return env


def run_script(env: Env, start: int = 0) -> None:
    for step in SCRIPT[start:]:
        step(env)
        env.at += 1


def normalised(env: Env) -> dict:
    """Everything that must agree, with run-specific names replaced by stable ones."""
    engine = env.trading.engine(env.symbol)
    name = {o.order_id: f"{o.account.split('-')[-1]}/{o.client_order_id}" for o in engine.orders.values()}
    orders = {name[o.order_id]: (o.state.value, o.filled, o.remaining, o.quote_traded, o.fees_paid)
              for o in engine.orders.values()}
    book = [[(lvl.price, [name[o.order_id] for o in lvl.orders()]) for lvl in side.levels_from_best()]
            for side in (engine.book.bids, engine.book.asks)]
    with env.ledger.engine.connect() as conn:
        rows = conn.execute(text("SELECT id, state, filled, hold_no FROM trade_order WHERE market = :m"),
                            {"m": env.symbol}).all()
        fills = conn.execute(text("SELECT seq, match_no, maker_order_id, qty_lots, price_ticks FROM fill "
                                  "WHERE market = :m ORDER BY seq, match_no"), {"m": env.symbol}).all()
        journal = conn.execute(text("SELECT seq, record FROM matching_command WHERE market = :m ORDER BY seq"),
                               {"m": env.symbol}).all()
    holds = {name[r.id]: [(h.amount, h.captured, h.released, h.state.value) for h in holds_of(env.ledger, r.id)]
             for r in rows}
    balances = {(who, asset): (b.posted, b.held) for who in "abc" for asset in ("BTC", "USDT")
                for b in [env.balance(env.owner(who), asset)]}
    return {
        "orders": orders, "book": book, "rows": sorted((name[r.id], r.state, int(r.filled), r.hold_no) for r in rows),
        "fills": [(f.seq, f.match_no, name[f.maker_order_id], int(f.qty_lots), int(f.price_ticks)) for f in fills],
        "journal": [(j.seq, j.record["type"], j.record.get("client_order_id")) for j in journal],
        "holds": holds, "balances": balances, "fees": env.fee_income(), "last_seq": engine.last_seq,
    }


def _sends(kind):
    """Counts a `Ledger.apply` call only if it carries a command of `kind` (fills and releases are
    queued and reach the ledger together with the next hold or at the end of the unit of work)."""
    return lambda args, kwargs: any(isinstance(c, kind) for c in args[1])


# (what to patch, which call raises, which calls count): the steps of one command, in order.
STEPS = {
    "after_hold": (Settlement, "place_hold", "after", None),
    "after_journal_append": (store.JournalBuffer, "append", "after", None),
    "after_fill_posting": (Ledger, "apply", "after", _sends(PostTransfers)),
    "after_release": (Ledger, "apply", "after", _sends(ReleaseHold)),
    "before_rows_written": (store.UnitOfWork, "flush", "before", None),
    # the rows and the COMMIT go in one round trip (UnitOfWork.flush): a crash after it is after
    # the commit and before the answer (the retry is answered from what was committed)
    "after_commit": (store.UnitOfWork, "flush", "after", None),
}


@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("nth", [1, 3])
def test_crash_at_each_step_then_restart_matches_a_clean_run(ledger, monkeypatch, step, nth):
    clean = new_env(ledger)
    clean.at = 0
    run_script(clean)
    expected = normalised(clean)

    env = new_env(ledger)
    env.at = 0
    cls, attr, when, counts = STEPS[step]
    original = getattr(cls, attr)
    calls = {"n": 0}

    def crashing(*args, **kwargs):
        if counts is not None and not counts(args, kwargs):
            return original(*args, **kwargs)
        if when == "before":
            calls["n"] += 1
            if calls["n"] == nth:
                raise Crash(step)
        result = original(*args, **kwargs)
        if when == "after":
            calls["n"] += 1
            if calls["n"] == nth:
                raise Crash(step)
        return result

    monkeypatch.setattr(cls, attr, crashing)
    with pytest.raises(Crash):
        run_script(env)
    crashed_at = env.at
    monkeypatch.setattr(cls, attr, original)

    env.restart()                       # a new process: nothing from the old one survives
    run_script(env, crashed_at)         # the client retries the unanswered command, then goes on
    assert normalised(env) == expected
    check_holds(env)

    live_hash = state_hash(env.trading.engine(env.symbol))
    env.trading.take_snapshot(env.symbol)
    env.restart()
    assert state_hash(env.trading.engine(env.symbol)) == live_hash


def test_a_broken_market_rebuilds_itself_before_the_next_command(ledger, monkeypatch):
    env = new_env(ledger)
    env.at = 0
    run_script(env, 0)
    before = normalised(env)
    original = store.UnitOfWork.flush

    def boom(self, conn, **kw):
        raise Crash("flush")

    monkeypatch.setattr(store.UnitOfWork, "flush", boom)
    with pytest.raises(Crash):
        env.trading.place(env.symbol, env.owner("a"), "late", SELL, qty=lots("0.1"), price=ticks(100))
    monkeypatch.setattr(store.UnitOfWork, "flush", original)
    # same service object: the failed command left nothing, and the engine was rebuilt
    assert normalised(env) == before
    env.trading.place(env.symbol, env.owner("a"), "late", SELL, qty=lots("0.1"), price=ticks(100))
    assert normalised(env)["last_seq"] == before["last_seq"] + 1
    check_holds(env)


def test_replaying_the_last_command_settles_nothing_twice(ledger):
    env = new_env(ledger)
    env.at = 0
    run_script(env, 0)
    before = normalised(env)
    with ledger.engine.connect() as conn:
        n_tx = conn.execute(text("SELECT count(*) FROM journal_transaction")).scalar_one()
    env.restart()                       # restart re-settles the last journaled command
    env.restart()
    with ledger.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM journal_transaction")).scalar_one() == n_tx
    assert normalised(env) == before
    assert json.dumps(before["journal"])  # journal is plain JSON
