"""The single writer of one market: number each command, journal it, then apply it.

The order is the guarantee: a command reaches the journal sink BEFORE the engine sees it, so
nothing the engine did (no fill, no acknowledgement) can be missing from the journal. If the sink
raises, the command is not applied and its number is not used. If the engine raises (a bug), the
command is journaled but the in-memory state is suspect: the sequencer halts and refuses further
commands; recovery is a restore from snapshot plus journal replay (see `snapshot.replay`).

The sink is an interface (`JournalSink`); `MemoryJournal` is the in-process implementation used by
tests and benchmarks. A database-backed sink implements the same `append`.

`GroupCommitter` is the queue in front of a market's database writer (`Trading.submit_grouped`):
commands arriving concurrently from many requests are committed together in one transaction, in a
thread of the market's own, and each caller is answered only after that commit.
"""
from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterator, Protocol, Sequence

from matching.engine import Engine
from matching.events import Event, OrderExists
from matching.model import Command, Place
from matching.order import Order
from matching.validation import check_shape


class JournalSink(Protocol):
    """Durable, append-only store of sequenced commands."""

    def append(self, seq: int, command: Command) -> None:
        """Persist `command` under `seq` (which is always the previous seq + 1) or raise."""


class MemoryJournal:
    """An in-memory `JournalSink`. The sink only ever receives consecutive numbers, so it keeps
    the commands in one list and each one's number is implied by its position: journaling a
    command allocates nothing the garbage collector would have to walk again and again."""

    def __init__(self) -> None:
        self.first_seq = 0
        self.commands: list[Command] = []
        self._next: int | None = None  # the number the next command must carry

    def append(self, seq: int, command: Command) -> None:
        if seq != self._next:
            if self.commands:
                raise ValueError(f"journal expects seq {self._next}, got {seq}")
            self.first_seq = seq
        self._next = seq + 1
        self.commands.append(command)

    @property
    def entries(self) -> list[tuple[int, Command]]:
        """(seq, command) pairs, in order."""
        return list(zip(range(self.first_seq, self.first_seq + len(self.commands)), self.commands))

    def since(self, seq: int) -> Iterator[tuple[int, Command]]:
        """Entries with a sequence number above `seq`, in order."""
        return (entry for entry in self.entries if entry[0] > seq)


class Submitted:
    """What a submission did: its sequence number (None if not journaled) and the events.

    One is built per command, so it is a plain slotted object (the sequencer fills in the two
    slots, which costs a third less than building a named tuple); treat it as read-only."""

    __slots__ = ("seq", "events")

    def __init__(self, seq: int | None, events: list[Event]) -> None:
        self.seq = seq
        self.events = events

    def __eq__(self, other: object) -> bool:
        if type(other) is not Submitted:
            return NotImplemented
        return self.seq == other.seq and self.events == other.events

    __hash__ = None  # type: ignore[assignment]  # its events list is mutable

    def __repr__(self) -> str:
        return f"Submitted(seq={self.seq!r}, events={self.events!r})"


_new = object.__new__


class SequencerHalted(RuntimeError):
    """The engine failed while applying a journaled command; rebuild it from the journal."""


class Sequencer:
    """Stamps, journals and applies commands for one engine, one at a time."""

    def __init__(self, engine: Engine, sink: JournalSink) -> None:
        self.engine = engine
        self.sink = sink
        self.halted = False
        self._lock = threading.Lock()
        # Bound once: the engine's handler table is fixed for the sequencer's life.
        self._handlers = engine.handlers

    def submit(self, command: Command) -> Submitted:
        """Sequence `command`. A `Place` retrying a known client order id is answered from the
        engine's state without a sequence number: it has no effect, so there is nothing to log."""
        lock = self._lock
        lock.acquire()  # acquire/release costs half of `with lock:` and this runs per command
        try:
            if self.halted:
                raise SequencerHalted("sequencer halted after an engine failure")
            check_shape(command)  # malformed commands are refused, never journaled
            engine = self.engine
            kind = type(command)  # check_shape admits exact command types only
            if kind is Place:
                known = engine.by_client.get((command.account, command.client_order_id))
                if known is not None:
                    return Submitted(None, [self._exists(engine.orders[known])])
            seq = engine.last_seq + 1
            self.sink.append(seq, command)
            try:  # numbered and checked here, so straight to what applies it (see Engine.apply)
                events = self._handlers[kind](seq, command)
            except Exception:
                self.halted = True
                raise
            submitted = _new(Submitted)  # `Submitted(seq, events)` without a Python frame
            submitted.seq = seq
            submitted.events = events
            return submitted
        finally:
            lock.release()

    def _exists(self, order: Order) -> OrderExists:
        return OrderExists(self.engine.last_seq, order.order_id, order.account,
                           order.client_order_id, order.state)


# ---- order entry grouped across requests ----------------------------------------------------------

class GroupCommitter:
    """Order entry grouped across requests: the queue in front of ONE market's single writer.

    Callers (HTTP handlers on the event loop, or plain threads) `submit(command)` and get a
    `concurrent.futures.Future` (an event loop awaits it with `asyncio.wrap_future`, so nothing
    here is bound to a loop). One thread of its own per market runs the group commits, one at a
    time: each takes every command queued since the previous one started (up to `max_group`, in
    arrival order) and runs `commit(commands)`, which is `Trading.submit_batch`: ONE database
    transaction, and no outcome returned before it commits. Only then are the futures resolved, so
    no caller is acknowledged before its command is durable. No timer waits for company: a command
    that arrives at an idle market is committed at once; commands that arrive while a commit runs
    form the next group, so the group grows with the load.

    Refusals of one command (validation, funds, an unknown order, ...) are outcomes of that command
    and do not touch the others. If the group commit itself raises (nothing of it was committed:
    the transaction rolled back and `Trading` rebuilds the market from its journal before its next
    unit if a command had been sequenced), each command of a group of more than one is run again
    ALONE, in order, so a command that fails a unit fails only its own caller, with its own error.

    `groups` and `commands` count the group commits run and the commands they carried (tests,
    monitoring)."""

    def __init__(self, commit: Callable[[Sequence[Command]], list], name: str, max_group: int = 512) -> None:
        self._commit = commit
        self.max_group = max_group
        self._pending: deque[tuple[Command, Future]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"group-commit-{name}")
        self.groups = 0
        self.commands = 0

    def submit(self, command: Command) -> Future:
        """Queue `command`; the future answers its outcome after the commit, or its exception."""
        future: Future = Future()
        with self._lock:
            self._pending.append((command, future))
            if self._scheduled:
                return future
            self._scheduled = True
        try:
            self._executor.submit(self._drain)
        except RuntimeError as exc:  # shut down: nothing of it runs
            with self._lock:
                self._scheduled = False
                self._pending.remove((command, future))
            future.set_exception(exc)
        return future

    def shutdown(self) -> None:
        """Run what is queued, then stop the thread (a later `submit` fails with RuntimeError)."""
        self._executor.shutdown(wait=True)

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._scheduled = False
                    return
                group = [self._pending.popleft() for _ in range(min(len(self._pending), self.max_group))]
            # a caller that gave up before its group started (its request was cancelled) is left out
            self._run([item for item in group if item[1].set_running_or_notify_cancel()])

    def _run(self, group: list[tuple[Command, Future]]) -> None:
        if not group:
            return
        try:
            outcomes = self._commit([command for command, _ in group])
        except Exception as exc:  # noqa: BLE001 - handed to the callers
            if len(group) == 1:
                group[0][1].set_exception(exc)
                return
            for item in group:  # nothing was committed: each alone, so only the culprit fails
                self._run([item])
            return
        self.groups += 1
        self.commands += len(group)
        for (_, future), outcome in zip(group, outcomes, strict=True):
            future.set_result(outcome)
