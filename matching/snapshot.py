"""Snapshots of an engine, its deterministic state hash, and replay from snapshot plus journal.

The canonical form is a JSON document with sorted keys and no whitespace, containing only strings,
ints, bools, nulls and lists: the market and fee configuration, the last sequence number and trade
price, every order ever placed (sorted by id), each book level's queue in time priority, the stops
in firing order, and the triggered stops awaiting activation. Queue handles are left out (they are
not state), so a book rebuilt from a snapshot hashes the same as the one it was taken from.
`state_hash` is the sha256 of that document: two engines with equal hashes have the same book down
to who stands where in each queue.

A rebuild replays the journal after the latest snapshot only, so snapshots bound its cost: the
service takes one of each market when `due` says so (a scheduled job, `custody.jobs`).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Iterable

from matching.book import BookSide
from matching.compiled import engine_class
from matching.engine import Engine
from matching.fees import FeeSchedule
from matching.model import Command, Market
from matching.stp import StpPolicy

FORMAT = 1


@dataclass(frozen=True)
class Snapshot:
    """An engine's state at `seq`: canonical bytes and their sha256."""

    seq: int
    data: bytes
    hash: str


def _side_record(side: BookSide) -> list:
    return [[level.price, [o.order_id for o in level.orders()]] for level in side.levels_from_best()]


def state_record(engine: Engine) -> dict:
    """The canonical plain-value form of `engine`."""
    return {
        "format": FORMAT,
        "market": engine.market.to_record(),
        "fees": engine.fees.to_record(),
        "default_stp": engine.default_stp.value,
        "last_seq": engine.last_seq,
        "last_price": engine.last_price,
        "orders": [engine.orders[k].to_record() for k in sorted(engine.orders)],
        "bids": _side_record(engine.book.bids),
        "asks": _side_record(engine.book.asks),
        "stops": engine.stops.in_firing_order(),
        "awaiting": list(engine.awaiting),
    }


def _canonical(record: dict) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def state_hash(engine: Engine) -> str:
    """sha256 hex of the canonical state."""
    return hashlib.sha256(_canonical(state_record(engine))).hexdigest()


def take(engine: Engine) -> Snapshot:
    data = _canonical(state_record(engine))
    return Snapshot(engine.last_seq, data, hashlib.sha256(data).hexdigest())


def restore(snapshot: Snapshot, engine_cls: type[Engine] | None = None) -> Engine:
    """A new engine in exactly the snapshot's state (checked against its hash), of `engine_cls`
    (default: the one this process runs, `matching.compiled.engine_class()`)."""
    if hashlib.sha256(snapshot.data).hexdigest() != snapshot.hash:
        raise ValueError("snapshot data does not match its hash")
    record = json.loads(snapshot.data)
    cls = engine_cls or engine_class()
    engine = cls(Market(**record["market"]), FeeSchedule.from_record(record["fees"]),
                 StpPolicy(record["default_stp"]))
    engine.last_seq = record["last_seq"]
    engine.last_price = record["last_price"]
    for rec in record["orders"]:
        engine.restore_record(rec)
    for side in ("bids", "asks"):
        for _price, ids in reversed(record[side]):  # worst level first; order within kept
            for order_id in ids:
                engine.book.add(engine.orders[order_id])
    for order_id in record["stops"]:
        engine.stops.add(engine.orders[order_id])
    for order_id in record["awaiting"]:
        engine.awaiting[order_id] = engine.orders[order_id]
    if state_hash(engine) != snapshot.hash:
        raise ValueError("restored engine does not reproduce the snapshot hash")
    return engine


# Defaults of the snapshot job: a market gets a new snapshot once this many commands were journaled
# since its last one, or once this many seconds passed since then with at least one new command.
EVERY_COMMANDS = 10_000
EVERY_SECONDS = 300.0


def due(last_seq: int, snapshot_seq: int, seconds_since: float, *,
        every_commands: int = EVERY_COMMANDS, every_seconds: float = EVERY_SECONDS) -> bool:
    """Whether a market at `last_seq`, last snapshotted at `snapshot_seq` (0: never) `seconds_since`
    seconds ago, needs a new snapshot: `every_commands` commands since, or any command and
    `every_seconds` elapsed. A market with nothing new never does."""
    behind = last_seq - snapshot_seq
    return behind > 0 and (behind >= every_commands or seconds_since >= every_seconds)


def replay(snapshot: Snapshot, entries: Iterable[tuple[int, Command]]) -> Engine:
    """Restore `snapshot`, then apply every journal entry after it, in order (gaps raise)."""
    engine = restore(snapshot)
    for seq, command in entries:
        if seq > snapshot.seq:
            engine.apply(seq, command)
    return engine
