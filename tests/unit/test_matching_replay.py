"""Sequencer, journal, snapshots and replay."""
from __future__ import annotations

import pytest

from matching import Amend, Cancel, Engine, MemoryJournal, OrderType, Place, Sequencer, Side
from matching.errors import SequenceError
from matching.model import command_from_record, command_to_record
from matching.snapshot import replay, restore, state_hash, take
from matching.testing import BTC_USDT, FEES, Harness, lots, ticks

BUY, SELL = Side.buy, Side.sell


def busy_harness() -> Harness:
    h = Harness()
    for account in ("a", "b", "c"):
        h.fund(account)
    h.place("a", SELL, lots("3"), ticks(100), display_qty=lots("1"))
    h.place("b", SELL, lots("1"), ticks(100))
    h.place("c", BUY, lots("0.5"), ticks(99))
    h.place("c", BUY, lots("0.4"), ticks(101), order_type=OrderType.stop_limit,
            stop_price=ticks(100))
    return h


def test_snapshot_restore_gives_the_same_hash_and_queue_order():
    h = busy_harness()
    snap = take(h.engine)
    engine = restore(snap)
    assert state_hash(engine) == snap.hash == state_hash(h.engine)
    queue = [o.order_id for o in engine.book.asks.best().orders()]
    assert queue == [o.order_id for o in h.engine.book.asks.best().orders()]


def test_replay_from_a_snapshot_reproduces_the_live_engine():
    h = busy_harness()
    snap = take(h.engine)
    h.place("c", BUY, lots("1.5"), ticks(100))        # fills, refills the iceberg, fires the stop
    h.submit(Amend("o3", "c", price=ticks(98)))
    h.submit(Cancel("o2", "b"))
    assert h.engine.order("o4").order_type is OrderType.limit      # the stop fired and worked
    rebuilt = replay(snap, h.journal.entries)
    assert state_hash(rebuilt) == state_hash(h.engine)
    from_zero = replay(take(Engine(BTC_USDT, FEES)), h.journal.entries)
    assert state_hash(from_zero) == state_hash(h.engine)


def test_engine_refuses_a_sequence_gap():
    engine = Engine(BTC_USDT, FEES)
    with pytest.raises(SequenceError):
        engine.apply(2, Cancel("x", "a"))


def test_journal_first_a_failing_sink_applies_nothing():
    class Broken:
        def append(self, seq, command):
            raise OSError("disk full")

    engine = Engine(BTC_USDT, FEES)
    seq = Sequencer(engine, Broken())
    with pytest.raises(OSError):
        seq.submit(Place("o1", "a", "c1", BUY, qty=lots("1"), price=ticks(100)))
    assert engine.last_seq == 0 and engine.orders == {}


def test_sequencer_halts_after_an_engine_failure():
    engine = Engine(BTC_USDT, FEES)
    seq = Sequencer(engine, MemoryJournal())
    engine.handlers[Cancel] = lambda s, c: 1 / 0  # what the sequencer calls for a cancel
    with pytest.raises(ZeroDivisionError):
        seq.submit(Cancel("x", "a"))
    assert seq.halted


def test_tampered_snapshot_is_refused():
    snap = take(busy_harness().engine)
    bad = type(snap)(snap.seq, snap.data.replace(b'"b"', b'"z"'), snap.hash)
    with pytest.raises(ValueError):
        restore(bad)


def test_commands_round_trip_through_the_journal_record():
    for cmd in (Place("o1", "a", "c1", BUY, OrderType.stop, stop_price=5, budget=7),
                Cancel("o1", "a"), Amend("o1", "a", qty=3)):
        assert command_from_record(command_to_record(cmd)) == cmd


def test_a_snapshot_is_due_after_enough_commands_or_enough_time_with_something_new():
    from matching.snapshot import due

    assert not due(100, 100, 10_000.0, every_commands=10, every_seconds=60)  # nothing new
    assert not due(105, 100, 59.9, every_commands=10, every_seconds=60)
    assert due(110, 100, 0.0, every_commands=10, every_seconds=60)
    assert due(101, 100, 60.0, every_commands=10, every_seconds=60)
    assert due(1, 0, 0.0, every_commands=1, every_seconds=60)  # never snapshotted
