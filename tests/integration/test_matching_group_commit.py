"""Group commits: a unit of several commands decides its holds in memory against the headroom of the
accounts it locked, and must answer exactly as the same commands would one at a time.

Each case runs the same commands twice, on two markets of the same database: once through
`submit_batch` (one unit of work), once one command per unit, and compares the outcomes, the order
states and the owners' balances (the ledger is verified after every test by the fixture)."""
from __future__ import annotations

import uuid

import pytest

from matching.model import Amend, Cancel, OrderType, Place, Side
from matching.service import Trading, order_id_for
from matching.testing import lots, ticks
from tests.integration.test_matching_support import BTC, USDT, Env, check_holds, new_market

BUY, SELL = Side.buy, Side.sell


def _env(ledger) -> Env:
    run = uuid.uuid4().hex[:10]
    trading = Trading(ledger.engine, ledger)
    return Env(ledger, trading, run, new_market(ledger, trading, run))


def _place(env: Env, who: str, cid: str, side: Side, **kw) -> Place:
    owner = env.owner(who)
    return Place(order_id_for(env.symbol, owner, cid), owner, cid, side, **kw)


def _state(env: Env, who_and_cids) -> dict:
    return {cid: (row.state, row.reject_code)
            for who, cid in who_and_cids
            for row in [env.trading.order_by_client_id(env.symbol, env.owner(who), cid)] if row is not None}


def _run_both_ways(ledger, setup, commands_of):
    """(batched env, one-by-one env) after running the same script both ways."""
    envs = []
    for batched in (True, False):
        env = _env(ledger)
        setup(env)
        commands = commands_of(env)
        if batched:
            outcomes = env.trading.submit_batch(env.symbol, commands)
        else:
            outcomes = [env.trading.submit(env.symbol, c) for c in commands]
        env.codes = [o.code for o in outcomes]
        envs.append(env)
        check_holds(env)
    return envs


def test_a_stop_paid_by_the_fill_that_fires_it_is_held_not_rejected(ledger):
    """Carol's stop is funded only by the proceeds of her sell that the same command fills; her
    quote account is not among those locked at the unit's start."""
    def setup(env):
        env.fund("carol", btc=1 * BTC)
        env.fund("bob", usdt=1_000 * USDT)
        env.ledger.open_account("USDT", "customer", f"customer:{env.owner('carol')}:USDT", owner=env.owner("carol"))
        t, m = env.trading, env.symbol
        t.place(m, env.owner("carol"), "s1", SELL, qty=lots("0.1"), price=ticks(101))
        t.place(m, env.owner("carol"), "stop", BUY, order_type=OrderType.stop, budget=5 * USDT,
                stop_price=ticks(101))

    batched, single = _run_both_ways(
        ledger, setup, lambda env: [_place(env, "bob", "b1", BUY, qty=lots("0.1"), price=ticks(101))])
    names = [("carol", "stop"), ("carol", "s1"), ("bob", "b1")]
    assert _state(batched, names) == _state(single, names)
    assert _state(batched, names)["stop"][1] is None  # activated (then expired), not rejected


def test_a_release_earlier_in_the_unit_funds_a_stop_that_fires_later_in_it(ledger):
    def setup(env):
        env.fund("carol", usdt=20 * USDT)
        env.fund("alice", btc=1 * BTC)
        env.fund("bob", usdt=1_000 * USDT)
        t, m = env.trading, env.symbol
        t.place(m, env.owner("carol"), "r1", BUY, qty=lots("0.1"), price=ticks(100))
        t.place(m, env.owner("carol"), "stop", BUY, order_type=OrderType.stop, budget=15 * USDT,
                stop_price=ticks(101))
        t.place(m, env.owner("alice"), "a1", SELL, qty=lots("0.1"), price=ticks(101))

    def commands(env):
        rest = order_id_for(env.symbol, env.owner("carol"), "r1")
        return [Cancel(rest, env.owner("carol")), _place(env, "bob", "b1", BUY, qty=lots("0.1"), price=ticks(101))]

    batched, single = _run_both_ways(ledger, setup, commands)
    names = [("carol", "stop"), ("carol", "r1"), ("bob", "b1"), ("alice", "a1")]
    assert _state(batched, names) == _state(single, names)
    assert _state(batched, names)["stop"][1] is None


def test_funds_freed_and_spent_within_one_unit_match_one_by_one(ledger):
    """Cancel, then spend the freed funds; amend up beyond them (refused); a retry; a bad command."""
    def setup(env):
        env.fund("carol", usdt=30 * USDT)
        env.fund("alice", btc=1 * BTC)
        env.trading.place(env.symbol, env.owner("carol"), "r1", BUY, qty=lots("0.2"), price=ticks(100))

    def commands(env):
        carol = env.owner("carol")
        return [
            _place(env, "carol", "r2", BUY, qty=lots("0.2"), price=ticks(100)),   # short: r1 holds most
            Cancel(order_id_for(env.symbol, carol, "r1"), carol),
            _place(env, "carol", "r3", BUY, qty=lots("0.2"), price=ticks(100)),   # now fits
            Amend(order_id_for(env.symbol, carol, "r3"), carol, price=ticks(200)),  # needs more: refused
            Amend(order_id_for(env.symbol, carol, "r3"), carol, price=ticks(140)),  # fits exactly? no
            Amend(order_id_for(env.symbol, carol, "r3"), carol, price=ticks(110)),  # fits
            _place(env, "carol", "r3", BUY, qty=lots("0.2"), price=ticks(100)),   # a retry
            _place(env, "alice", "a1", SELL, qty=lots("0.1"), price=ticks(110)),  # fills r3 in part
            Amend("no-such-order", carol, price=ticks(1)),
        ]

    batched, single = _run_both_ways(ledger, setup, commands)
    assert batched.codes == single.codes
    names = [("carol", c) for c in ("r1", "r2", "r3")] + [("alice", "a1")]
    assert _state(batched, names) == _state(single, names)
    for who in ("carol", "alice"):
        for asset in ("USDT", "BTC"):
            b, s = batched.balance(batched.owner(who), asset), single.balance(single.owner(who), asset)
            assert (b.posted, b.held) == (s.posted, s.held), (who, asset)
    assert "insufficient_funds" in batched.codes


@pytest.mark.parametrize("sqlstate, aborts, retried", [
    ("40P01", 1, True), ("40001", 1, True), ("40P01", 3, True), ("40P01", 4, False), ("23505", 1, False),
])
def test_a_deadlock_victim_unit_runs_again_other_failures_raise(ledger, monkeypatch, sqlstate, aborts, retried):
    """A unit PostgreSQL aborts as a deadlock victim committed nothing and answered nothing: the
    market is rebuilt and the same commands run again (up to four runs in all), with the same
    result as a clean run. A fourth abort, or any other failure, reaches the caller."""
    import psycopg
    from sqlalchemy.exc import DBAPIError

    from ledger.service import Ledger

    env = _env(ledger)
    env.fund("alice", btc=1 * BTC)
    env.fund("bob", usdt=1_000 * USDT)
    env.trading.place(env.symbol, env.owner("alice"), "a1", SELL, qty=lots("0.1"), price=ticks(101))
    original = Ledger.apply
    calls = {"n": 0}

    class Aborted(psycopg.errors.OperationalError):
        pass

    Aborted.sqlstate = sqlstate

    def aborted_once(self, commands, **kw):
        calls["n"] += 1
        if calls["n"] <= aborts:
            raise DBAPIError.instance("ledger_apply", None, Aborted("aborted by the test"), psycopg.Error)
        return original(self, commands, **kw)

    monkeypatch.setattr(Ledger, "apply", aborted_once)
    command = _place(env, "bob", "b1", BUY, qty=lots("0.1"), price=ticks(101))
    if not retried:
        with pytest.raises(DBAPIError):
            env.trading.submit_batch(env.symbol, [command])
        monkeypatch.setattr(Ledger, "apply", original)
        env.trading.submit_batch(env.symbol, [command])  # the client's own retry
    else:
        (outcome,) = env.trading.submit_batch(env.symbol, [command])
        assert outcome.code is None and outcome.seq is not None
        assert calls["n"] == aborts + 1  # the first units were aborted, the last committed
    assert _state(env, [("bob", "b1"), ("alice", "a1")]) == {"b1": ("filled", None), "a1": ("filled", None)}
    assert env.balance(env.owner("bob"), "BTC").posted == lots("0.1") * 10_000
    check_holds(env)


def test_a_unit_locks_the_accounts_its_orders_will_meet_with_its_first_statement(ledger, monkeypatch):
    """The resting orders a new order can meet as the book stands are foreseen: their owners' accounts
    are locked (and asked about the reorg freeze) with the unit's first statements, so the taker's
    `_clear_reach` finds them locked and the unit sends its ledger commands once, at its end, instead
    of flushing them to lock the makers' accounts in the middle. Same outcomes as one by one."""
    env = _env(ledger)
    for who in ("alice", "dave"):
        env.fund(who, btc=1 * BTC)
    env.fund("carol", usdt=1_000 * USDT)
    env.fund("bob", usdt=1_000 * USDT)
    t, m = env.trading, env.symbol
    t.place(m, env.owner("alice"), "a1", SELL, qty=lots("0.1"), price=ticks(100))
    t.place(m, env.owner("dave"), "d1", SELL, qty=lots("0.1"), price=ticks(101))
    calls = {"lock_available": 0, "apply": 0, "blocked": 0}
    for name in ("lock_available", "apply"):
        original = getattr(type(ledger), name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(type(ledger), name, counted)

    def blocked(conn, account_ids):
        calls["blocked"] += 1
        return set()

    t.blocked_accounts = blocked
    outcomes = t.submit_batch(m, [_place(env, "carol", "c1", BUY, qty=lots("0.1"), price=ticks(99)),  # rests
                                  _place(env, "bob", "b1", BUY, qty=lots("0.2"), price=ticks(101))])  # meets both
    assert [o.code for o in outcomes] == [None, None]
    assert calls == {"lock_available": 1, "apply": 1, "blocked": 1}, calls
    names = [("alice", "a1"), ("dave", "d1"), ("bob", "b1"), ("carol", "c1")]
    assert _state(env, names) == {"a1": ("filled", None), "d1": ("filled", None), "b1": ("filled", None),
                                  "c1": ("working", None)}
    check_holds(env)
