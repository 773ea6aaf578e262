"""Property: random command streams across several accounts keep every invariant, and replay.

Invariants checked after every command (the money model in `matching.testing` additionally
asserts on every event that no capture exceeds its hold and no balance goes negative):
- the book is never crossed at rest, and only open orders rest, each with 0 < visible <= remaining;
- quantity is conserved: filled + remaining + STP-decremented == quantity for every order, and the
  fills reported for each order add up to its `filled`;
- an order holds value exactly while it is in a holding state; every terminal order's hold was
  released as `placed - captured`;
- per asset, customer balances plus fee income never change;
- replay of the journal, from zero and from a snapshot taken mid-stream, gives the same hash.
"""
from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from matching import (Amend, Cancel, Engine, FeeSchedule, FeeTier, Market, OrderType, Place,
                      Side, StpPolicy, TimeInForce)
from matching.events import Fill
from matching.snapshot import replay, state_hash, take
from matching.states import HOLDING, OPEN, TERMINAL, OrderState
from matching.testing import Harness

MARKET = Market("T-Q", "T", "Q", lot_size=7, quote_per_tick_lot=3)
FEES = FeeSchedule({"default": FeeTier(1_000, 2_500), "vip": FeeTier(0, 333_333)})
ACCOUNTS = ("a", "b", "c", "d")
GROUPS = {"a": "g1", "b": "g1", "c": None, "d": None}  # a and b are under common control

prices = st.integers(98, 102)  # narrow, so orders cross often
qtys = st.integers(1, 12)


@st.composite
def places(draw):
    account = draw(st.sampled_from(ACCOUNTS))
    side = draw(st.sampled_from(Side))
    kind = draw(st.sampled_from(["limit", "limit", "limit", "ioc", "fok", "post", "iceberg",
                                 "market", "stop", "stop_limit"]))
    common = dict(account=account, side=side, stp_group=GROUPS[account],
                  stp_policy=draw(st.sampled_from([None, *StpPolicy])),
                  fee_tier=draw(st.sampled_from(["default", "vip"])))
    qty = draw(qtys)
    if kind in ("market", "stop"):
        budgeted = side is Side.buy
        extra = dict(order_type=OrderType.market if kind == "market" else OrderType.stop,
                     qty=None if budgeted else qty,
                     budget=draw(st.integers(1, 5_000)) if budgeted else None)
        if kind == "stop":
            extra["stop_price"] = draw(prices)
        return common | extra
    extra = dict(qty=qty, price=draw(prices))
    if kind == "ioc":
        extra["tif"] = TimeInForce.ioc
    elif kind == "fok":
        extra["tif"] = TimeInForce.fok
    elif kind == "post":
        extra["post_only"] = True
    elif kind == "iceberg":
        extra["display_qty"] = draw(st.integers(1, qty))
    elif kind == "stop_limit":
        extra.update(order_type=OrderType.stop_limit, stop_price=draw(prices))
    return common | extra


commands = st.one_of(
    places().map(lambda p: ("place", p)),
    places().map(lambda p: ("place", p)),
    places().map(lambda p: ("place", p)),
    st.tuples(st.just("cancel"), st.integers(0, 60)),
    st.tuples(st.just("amend"), st.integers(0, 60), st.one_of(st.none(), qtys),
              st.one_of(st.none(), prices)),
)


def run(stream, snapshot_at):
    h = Harness(market=MARKET, fees=FEES)
    for account in ACCOUNTS:
        h.money.deposit(account, "T", 10**9)
        h.money.deposit(account, "Q", 10**9)
    totals = {asset: h.money.total(asset) for asset in ("T", "Q")}
    ids: list[str] = []
    snapshot = None
    for i, cmd in enumerate(stream):
        if i == snapshot_at:
            snapshot = take(h.engine)
        submit(h, cmd, ids)
        check(h, totals)
    return h, snapshot


def submit(h, cmd, ids):
    if cmd[0] == "place":
        order_id = f"o{len(ids)}"
        ids.append(order_id)
        h.submit(Place(order_id=order_id, client_order_id=order_id, **cmd[1]))
    elif ids:
        order_id = ids[cmd[1] % len(ids)]
        owner = h.engine.order(order_id).account if h.engine.order(order_id) else "a"
        if cmd[0] == "cancel":
            h.submit(Cancel(order_id, owner))
        else:
            h.submit(Amend(order_id, owner, qty=cmd[2], price=cmd[3]))


def check(h, totals):
    engine, money = h.engine, h.money
    assert not engine.book.is_crossed()
    for order in engine.book.index.values():
        assert order.state in OPEN and order.state not in TERMINAL
        assert 0 < order.visible <= order.remaining
    filled = defaultdict(int)
    for event in h.events:
        if isinstance(event, Fill):
            filled[event.maker_order_id] += event.qty_lots
            filled[event.taker_order_id] += event.qty_lots
    open_holds = money.open_holds()
    for order in engine.orders.values():
        assert filled[order.order_id] == order.filled
        if order.qty is not None and order.state is not OrderState.rejected:
            assert order.filled + order.remaining + order.decremented == order.qty
        in_book = order.order_id in engine.book.index
        assert in_book == (order.state in (OrderState.working, OrderState.partially_filled))
        assert (order.order_id in open_holds) == (order.state in HOLDING)
    for asset, total in totals.items():
        assert money.total(asset) == total


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=st.lists(commands, min_size=5, max_size=80), data=st.data())
def test_random_streams_keep_invariants_and_replay_to_the_same_hash(stream, data):
    snapshot_at = data.draw(st.integers(0, len(stream) - 1))
    h, snapshot = run(stream, snapshot_at)
    live = state_hash(h.engine)
    assert state_hash(replay(snapshot, h.journal.entries)) == live
    assert state_hash(replay(take(Engine(MARKET, FEES)), h.journal.entries)) == live
