"""Property test through PostgreSQL and the ledger: random command streams across several accounts
(some short of funds) keep every asset conserved and every total at zero, never overdraw, release
every hold exactly at its terminal state, and replay from any snapshot to the same state hash."""
from __future__ import annotations

import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from matching import snapshot
from matching.model import Amend, Cancel, OrderType, Side, TimeInForce
from matching.service import Trading, order_id_for
from matching.store import load_commands, load_markets
from tests.integration.test_matching_support import USDT, Env, check_holds, new_market

BTC = 100_000_000
WHO = ("a", "b", "c", "d")
FUNDS = {"a": (5 * BTC, 50_000 * USDT), "b": (2 * BTC, 20_000 * USDT), "c": (BTC // 10, 500 * USDT),
         "d": (0, 100 * USDT)}

price = st.integers(9_500, 10_500)            # ticks around 100 USDT
qty = st.integers(1, 30_000)                  # up to 3 BTC
place = st.builds(
    lambda who, side, kind, q, p, tif, post, disp, budget: ("place", who, side, kind, q, p, tif, post, disp, budget),
    st.sampled_from(WHO), st.sampled_from(Side), st.sampled_from(["limit", "limit", "limit", "market", "stop_limit"]),
    qty, price, st.sampled_from([None, None, TimeInForce.ioc, TimeInForce.fok]), st.booleans(),
    st.one_of(st.none(), st.integers(1, 5_000)), st.integers(1, 5_000) .map(lambda u: u * USDT))
cancel = st.tuples(st.just("cancel"), st.integers(0, 40))
amend = st.tuples(st.just("amend"), st.integers(0, 40), st.one_of(st.none(), qty), st.one_of(st.none(), price))
snap = st.tuples(st.just("snapshot"))
streams = st.lists(st.one_of(place, place, cancel, amend, snap), min_size=5, max_size=30)


def apply(env: Env, placed: list, op: tuple) -> None:
    t, m = env.trading, env.symbol
    if op[0] == "place":
        _, who, side, kind, q, p, tif, post, disp, budget = op
        owner, cid = env.owner(who), f"o{len(placed)}"
        fields = {"tif": tif, "post_only": post and kind == "limit" and tif is None}
        if kind == "limit":
            fields.update(qty=q, price=p, display_qty=min(disp, q) if disp and tif is None and not post else None)
        elif kind == "market":
            fields = {"order_type": OrderType.market}
            fields.update(budget=budget) if side is Side.buy else fields.update(qty=q)
        else:
            fields = {"order_type": OrderType.stop_limit, "qty": q, "price": p,
                      "stop_price": p - 50 if side is Side.sell else p + 50}
        t.place(m, owner, cid, side, **fields)
        placed.append((owner, cid))
    elif op[0] in ("cancel", "amend") and placed:
        owner, cid = placed[op[1] % len(placed)]
        oid = order_id_for(m, owner, cid)
        if op[0] == "cancel":
            t.submit(m, Cancel(oid, owner))
        else:
            t.submit(m, Amend(oid, owner, qty=op[2], price=op[3]))
    elif op[0] == "snapshot":
        t.take_snapshot(m)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(stream=streams)
def test_random_streams_conserve_money_and_replay_to_the_same_hash(ledger, stream):
    run = uuid.uuid4().hex[:10]
    trading = Trading(ledger.engine, ledger)
    env = Env(ledger, trading, run, new_market(ledger, trading, run))
    for who, (btc, usdt) in FUNDS.items():
        env.fund(who, btc=btc, usdt=usdt)
    placed: list = []
    for op in stream:
        apply(env, placed, op)

    # conservation: customers + fee income hold exactly what was funded, per asset
    for i, asset in enumerate(("BTC", "USDT")):
        total = sum(env.balance(env.owner(w), asset).posted for w in WHO
                    if _has_account(env, env.owner(w), asset))
        total += env.fee_income() if asset == "USDT" else 0
        assert total == sum(f[i] for f in FUNDS.values())
        for w in WHO:
            if _has_account(env, env.owner(w), asset):
                assert env.balance(env.owner(w), asset).available >= 0
    assert all(v == 0 for v in ledger.totals().values())
    check_holds(env)

    # replay from every stored snapshot (and from nothing) reproduces the live state hash
    live = snapshot.state_hash(trading.engine(env.symbol))
    with ledger.engine.connect() as conn:
        snaps = conn.execute(text("SELECT seq, hash, data FROM matching_snapshot WHERE market = :m"),
                             {"m": env.symbol}).all()
        (row,) = load_markets(conn, env.symbol)
        from matching.engine import Engine

        fresh = Engine(row.market, row.fees, row.default_stp)
        for seq, cmd in load_commands(conn, env.symbol):
            fresh.apply(seq, cmd)
        assert snapshot.state_hash(fresh) == live
        for s in snaps:
            snap = snapshot.Snapshot(s.seq, bytes(s.data), s.hash)
            engine = snapshot.replay(snap, load_commands(conn, env.symbol, s.seq))
            assert snapshot.state_hash(engine) == live
    assert snapshot.state_hash(env.restart().engine(env.symbol)) == live


def _has_account(env: Env, owner: str, asset: str) -> bool:
    from ledger.errors import LedgerError

    try:
        env.balance(owner, asset)
        return True
    except LedgerError:
        return False
