"""The engine's speed shortcuts change nothing: a golden digest of every event, shortcut against
general path, the validation shortcut against the full check table, and the tuple-based events
and journal behaving as the dataclasses and list they replaced.

The golden digests were computed with the engine as it was before the performance work (commit
c389e23), on streams that mix every order type, STP policy, refusal and trigger answer. If a
change of semantics is intended, recompute them and say so in the commit. Recomputed once (issue
11): an account no longer trades with itself under two caller-chosen STP groups; the old streams
held 2, 18 and 16 such fills (which the ledger would have refused), the new ones none.
"""
from __future__ import annotations

import enum
import hashlib
import random

import pytest

from matching import (ActivateTriggered, Amend, Cancel, Engine, MemoryJournal, OrderType, Place,
                      RejectTriggered, Sequencer, Side, StpPolicy, TimeInForce)
from matching.errors import ErrorCode, MatchingError
from matching.book import Book
from matching.events import Fill, OrderDecremented, OrderStateChanged
from matching.fees import FeeSchedule, FeeTier
from matching.model import Market
from matching.snapshot import replay, state_hash, take
from matching.states import OPEN

FEES = FeeSchedule({"default": FeeTier(1000, 2000), "vip": FeeTier(0, 500),
                    "odd": FeeTier(333_333, 777_777)})
GOLDEN = {  # (seed, crowded) -> digest of stream_digest(seed, 2500, crowded)
    (0, False): "5499abf2c9313a9d3f7c0e3fb2390644bc1f0ae784c00c3aaea44458a1074587",
    (1, True): "febf6fc1d0983a4d272d52a396cd41eba71af372e0e02f7ed1d14c82c9d27403",
    (2, True): "a467735ca6da8ba8cc153bc083fcdae5cf1290b7ccaf45199ca5f0edeb6a0aec",
}


def _norm(value: object) -> object:
    return value.value if isinstance(value, enum.Enum) else value


def event_key(event: object) -> tuple:
    """An event as plain values: its type name and its fields in declaration order."""
    return (type(event).__name__,) + tuple(_norm(getattr(event, name))
                                           for name in type(event).__match_args__)


def _pick(rng: random.Random, engine: Engine, ids: list[str]) -> str:
    live = sorted(engine.book.index) + sorted(engine.stops.keys)
    return rng.choice(live) if live and rng.random() < 0.85 else rng.choice(ids)


def _place(rng: random.Random, ids: list[str], account: str, mid: int) -> Place:
    order_id = f"o{len(ids)}"
    client_id = f"c{rng.randrange(len(ids) + 5)}" if rng.random() < 0.05 else f"k{len(ids)}"
    ids.append(order_id)
    side = rng.choice((Side.buy, Side.sell))
    kind, price, qty = rng.random(), mid + rng.randint(-30, 30), rng.randint(1, 30)
    if kind < 0.55:
        kw: dict = dict(qty=qty, price=price)
        t = rng.random()
        if t < 0.1:
            kw["tif"] = TimeInForce.ioc
        elif t < 0.15:
            kw["tif"] = TimeInForce.fok
        elif t < 0.2:
            kw["post_only"] = True
        elif t < 0.3:
            kw["display_qty"] = rng.randint(1, qty)
        elif t < 0.32:
            kw["tif"] = TimeInForce.gtc
    elif kind < 0.65:
        kw = dict(order_type=OrderType.market)
        if side is Side.buy:
            kw["budget"] = rng.randint(1, 200_000)
        else:
            kw["qty"] = qty
        if rng.random() < 0.2 and side is Side.sell:
            kw["tif"] = TimeInForce.fok
    elif kind < 0.75:
        kw = dict(order_type=OrderType.stop_limit, qty=qty, price=price,
                  stop_price=mid + rng.randint(-30, 30))
    elif kind < 0.82:
        kw = dict(order_type=OrderType.stop, stop_price=mid + rng.randint(-30, 30))
        if side is Side.buy:
            kw["budget"] = rng.randint(1, 200_000)
        else:
            kw["qty"] = qty
    elif kind < 0.9:  # refused one way or another
        kw = rng.choice([dict(qty=0, price=price), dict(qty=qty, price=-1), dict(qty=qty),
                         dict(qty=qty, price=price, budget=5),
                         dict(qty=qty, price=price, fee_tier="nope"),
                         dict(qty=qty, price=price, display_qty=qty + 1),
                         dict(qty=qty, price=price, post_only=True, tif=TimeInForce.ioc),
                         dict(qty=1, price=1),
                         dict(order_type=OrderType.market, qty=qty, tif=TimeInForce.gtc)])
    else:
        kw = dict(qty=qty, price=price, stp_policy=rng.choice(list(StpPolicy)),
                  fee_tier=rng.choice(["vip", "odd", "default"]),
                  stp_group=rng.choice([None, "g1", "g2"]))
    return Place(order_id, account, client_id, side, **kw)


def _amend(rng: random.Random, engine: Engine, ids: list[str], account: str, mid: int) -> Amend:
    order_id = _pick(rng, engine, ids)
    order = engine.order(order_id)
    owner = order.account if order and rng.random() < 0.97 else account
    t = rng.random()
    if t < 0.5:
        return Amend(order_id, owner, price=mid + rng.randint(-30, 30))
    if t < 0.7:
        done = order.filled + order.decremented if order else 0
        return Amend(order_id, owner, qty=done + rng.randint(-2, 25))
    if t < 0.8:
        return Amend(order_id, owner, qty=(order.qty or 5) if order else 5,
                     price=mid + rng.randint(-30, 30))
    if t < 0.9:
        return Amend(order_id, owner, stop_price=mid + rng.randint(-30, 30))
    if t < 0.95:
        return Amend(order_id, owner, qty=(order.qty or 3) - 1 if order else 1)
    return Amend(order_id, owner, price=rng.choice([0, -3, mid]),
                 qty=rng.choice([None, 0, 1, 10**6]))


def stream_digest(seed: int, n: int, crowded: bool, engine_cls: type = Engine) -> str:
    """sha256 over every submission's (seq, events), errors and periodic state hashes; replay
    from the previous snapshot is checked on the way."""
    rng = random.Random(seed)
    market = Market("T-Q", "T", "Q", lot_size=7, quote_per_tick_lot=3,
                    min_notional=50 if crowded else 0)
    engine = engine_cls(market, FEES,
                        StpPolicy.cancel_newest if seed % 2 else StpPolicy.decrement_both)
    journal = MemoryJournal()
    sequencer = Sequencer(engine, journal)
    digest = hashlib.sha256()
    ids: list[str] = []
    snap = None
    accounts = ["a", "b", "c", "d", "e"] if crowded else [f"x{i}" for i in range(40)]
    mid = 1000
    for i in range(n):
        r, account = rng.random(), rng.choice(accounts)
        if r < 0.35 or not ids:
            cmd: object = _place(rng, ids, account, mid)
        elif r < 0.45:
            order_id = _pick(rng, engine, ids)
            order = engine.order(order_id)
            cmd = Cancel(order_id, order.account if order and rng.random() < 0.95 else account)
        elif r < 0.93:
            cmd = _amend(rng, engine, ids, account, mid)
        else:
            order_id = (rng.choice(list(engine.awaiting))
                        if engine.awaiting and rng.random() < 0.9 else rng.choice(ids))
            cmd = (ActivateTriggered if rng.random() < 0.8 else RejectTriggered)(order_id)
        if rng.random() < 0.003:
            cmd = rng.choice([Cancel(5, "a"), Place("z", "a", "z", "buy", qty=1, price=1),
                              Amend("o1", "a", qty=True), "junk"])
        try:
            sub = sequencer.submit(cmd)
            digest.update(repr((sub.seq, [event_key(e) for e in sub.events])).encode())
        except MatchingError as exc:
            digest.update(repr(("error", exc.code.value, str(exc))).encode())
        if i % 997 == 0:
            digest.update(state_hash(engine).encode())
            if snap is not None:
                assert state_hash(replay(snap, journal.entries)) == state_hash(engine)
            snap = take(engine)
        mid += rng.choice((-1, 0, 1))
    digest.update(state_hash(engine).encode())
    return digest.hexdigest()


@pytest.mark.parametrize(("seed", "crowded"), sorted(GOLDEN))
def test_every_event_matches_the_engine_before_the_speedups(seed, crowded):
    assert stream_digest(seed, 2500, crowded) == GOLDEN[(seed, crowded)]


class NeverRepricedBook(Book):
    """A book that reports every moved order as crossing, so the engine plans its match."""

    def reprice(self, order, old_price):
        return False


class GeneralPathEngine(Engine):
    """The engine with its shortcuts turned off: every order that meets the book is planned."""

    def __init__(self, *args):
        super().__init__(*args)
        self.book = NeverRepricedBook()

    def _enter(self, order):
        if order.post_only and self.book.would_cross(order.side, order.price):
            self._reject(order, ErrorCode.post_only_would_cross)
        else:
            self._match(order)


@pytest.mark.parametrize(("seed", "crowded"), sorted(GOLDEN))
def test_the_no_cross_shortcuts_are_what_an_empty_match_plan_does(seed, crowded):
    assert (stream_digest(seed, 1500, crowded, GeneralPathEngine)
            == stream_digest(seed, 1500, crowded))


def test_validate_place_shortcut_agrees_with_the_full_check_table():
    from matching.validation import first_failure, validate_place
    market = Market("T-Q", "T", "Q", lot_size=7, quote_per_tick_lot=3, min_notional=50)
    rng = random.Random(7)
    maybe_int = [None, 0, 1, 5, 16, 17, -1, True]
    for i in range(5000):
        cmd = Place(f"o{i}", "a", f"c{i}", rng.choice(list(Side)),
                    order_type=rng.choice(list(OrderType)), qty=rng.choice(maybe_int),
                    price=rng.choice(maybe_int), tif=rng.choice([None, *TimeInForce]),
                    post_only=rng.random() < 0.2,
                    display_qty=rng.choice([None, None, None, 1, 0, 20]),
                    stop_price=rng.choice([None, None, 3]), budget=rng.choice([None, None, 99]),
                    fee_tier=rng.choice(["default", "vip", "nope"]))
        assert validate_place(cmd, market, FEES) == first_failure(cmd, market, FEES), cmd


def test_events_compare_like_the_frozen_dataclasses_they_were():
    a = OrderDecremented(1, "o1", "a", 2, 3)
    b = OrderStateChanged(1, "o1", "a", 2, 3)  # same values, another type
    assert a == OrderDecremented(1, "o1", "a", 2, 3) and hash(a) == hash(OrderDecremented(*a))
    assert a != b and not a == b
    assert a != (1, "o1", "a", 2, 3) and (1, "o1", "a", 2, 3) != a
    with pytest.raises(AttributeError):
        a.qty = 5
    assert repr(a) == "OrderDecremented(seq=1, order_id='o1', account='a', qty=2, remaining=3)"
    fill = Fill(1, 1, "m", "t", "ma", "ta", Side.buy, 10, 2, 14, 60, 1, 2)
    assert (fill.buyer_order_id, fill.buyer_pays, fill.seller_receives) == ("t", 62, 59)


def test_memory_journal_numbers_entries_by_position_and_refuses_gaps():
    journal = MemoryJournal()
    assert journal.entries == []
    journal.append(5, Cancel("x", "a"))
    journal.append(6, Cancel("y", "a"))
    assert journal.entries == [(5, Cancel("x", "a")), (6, Cancel("y", "a"))]
    assert list(journal.since(5)) == [(6, Cancel("y", "a"))]
    with pytest.raises(ValueError):
        journal.append(8, Cancel("z", "a"))
    assert len(journal.entries) == 2


def test_open_orders_map_follows_every_state_change():
    seed_stream = random.Random(3)
    market = Market("T-Q", "T", "Q", lot_size=1, quote_per_tick_lot=1)
    engine = Engine(market, FEES)
    sequencer = Sequencer(engine, MemoryJournal())
    for i in range(600):
        side = seed_stream.choice((Side.buy, Side.sell))
        sequencer.submit(Place(f"o{i}", f"a{i % 7}", f"c{i}", side, qty=seed_stream.randint(1, 9),
                               price=100 + seed_stream.randint(-5, 5),
                               tif=seed_stream.choice([None, TimeInForce.ioc])))
        if i % 5 == 0:
            order_id = f"o{seed_stream.randrange(i + 1)}"
            sequencer.submit(Cancel(order_id, engine.order(order_id).account))
        assert engine.live == {k: o for k, o in engine.orders.items() if o.state in OPEN}
    restored = replay(take(engine), [])
    assert restored.live.keys() == engine.live.keys()


@pytest.mark.parametrize("seed", range(3))
def test_every_amend_states_the_hold_order_hold_computes(seed):
    """`Engine._amend` writes `holds.order_hold` out inline; after every amend that did nothing
    else (no match, no trigger) the hold it states is what `order_hold` says for the order."""
    from matching.events import OrderAmended
    from matching.holds import order_hold
    from matching.states import OrderState
    rng = random.Random(seed)
    market = Market("T-Q", "T", "Q", lot_size=7, quote_per_tick_lot=3, min_notional=50)
    engine = Engine(market, FEES)
    sequencer = Sequencer(engine, MemoryJournal())
    ids: list[str] = []
    checked = 0
    for i in range(3000):
        account = rng.choice("abcdefgh")
        cmd = (_place(rng, ids, account, 1000) if rng.random() < 0.4 or not ids
               else _amend(rng, engine, ids, account, 1000))
        events = sequencer.submit(cmd).events
        for event in events:
            if type(event) is OrderAmended and len(events) == 1:
                order = engine.order(event.order_id)
                expected = order_hold(order, market, FEES)
                if order.state is OrderState.untriggered:
                    expected = (expected[0], 0)
                assert (event.hold_asset, event.hold_required) == expected
                checked += 1
    assert checked > 500
