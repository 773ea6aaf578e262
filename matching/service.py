"""`Trading`: the matching gateway over PostgreSQL and the ledger, one sequencer per market.

For each command, in ONE database transaction (the unit of work):
1. gateway: dedupe the client order id, validate (text PostgreSQL can store included), and place
   the hold (`pending_new`); an order whose hold cannot be placed is recorded `rejected` and never
   sequenced. Whatever the ledger could refuse for a fill is refused or decided here, before the
   engine commits to it, so no client input can fail a unit after matching (issue 11): the
   account a fill would credit is opened at placement (a name another owner holds refuses the
   order) and must be open; resting orders the order could meet whose owner cannot be paid, or
   whose account a fill would debit is blocked (`blocked_accounts`: custody's reorg freeze), are
   cancelled first by a journaled `Evict`; a closed fee account refuses crossing orders;
2. sequencer: number the command, append it to the journal (`matching_command`), apply it;
3. settlement: one journal transaction per fill, exact release at terminal states, holds for
   stops that fired (answered with `ActivateTriggered` / `RejectTriggered` in the same unit);
   every ledger command is queued and reaches the ledger at step 4, in order, in one statement;
   holds are decided in advance against the headroom of the accounts locked at the start of the
   unit (`matching.settlement`);
4. order rows, fill rows and journal rows are flushed; COMMIT; only then is the caller answered.

A crash anywhere before COMMIT leaves nothing behind (the client retries under the same client
order id, which maps to the same order id); after COMMIT, everything. If anything fails inside
the unit of work, the in-memory engine may be ahead of the database, so the market is rebuilt
from the database before the next command: latest snapshot + journal replay, then the events of
the last journaled command are settled again (idempotent: ledger keys answer `exists`) and any
stop left waiting for its hold is answered.

`submit_batch` puts several commands in one transaction (group commit): more throughput, same
guarantee, because no outcome is returned before the commit. `submit_grouped` does it for commands
that arrive concurrently from many callers (the HTTP API's order entry): each market's
`matching.sequencer.GroupCommitter` queues them and runs `submit_batch` on the queue, in a thread of
its own, one group at a time; every outcome carries its order's row as committed (`Outcome.row`,
from the unit's own upsert), so the caller needs no read after the commit.

Several processes (custody.market_owners): a market's runtime (engine, sequencer) lives only in the
process that owns it. Every process knows every market's configuration (`market`, read once from
the database); `load(symbol)` builds the runtime (the new owner), `release(symbol)` drops it, and a
command for a market whose runtime is not here raises `MarketNotHere` (the caller routes it to the
owner). With `autoload` (the default: one process, tests, benchmarks) a market created by another
`Trading` is loaded on first use. The journal's key (market, seq) fences two writers: a process that
wrongly believes it still owns a market fails its next unit on the duplicate seq (nothing of that
unit is committed), and rebuilds from the journal.
"""
from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator, Sequence

from sqlalchemy import Connection, Engine as DbEngine
from sqlalchemy.exc import DBAPIError

from ledger.errors import ErrorCode as LedgerCode
from ledger.errors import LedgerError
from ledger.model import AccountKind
from ledger.service import Ledger
from matching import snapshot, store
from matching.compiled import engine_class
from matching.engine import Engine
from matching.errors import ErrorCode, MatchingError
from matching.events import Event, Fill, OrderClosed, OrderRejected, RequestRejected
from matching.fees import FeeSchedule
from matching.holds import hold_requirement
from matching.model import (ActivateTriggered, Amend, Cancel, Command, Evict, Market,
                            OrderType, Place, RejectTriggered)
from matching.order import Order
from matching.sequencer import GroupCommitter, Sequencer
from matching.settlement import Settlement, order_row, rejected_row
from matching.states import TERMINAL, OrderState
from matching.stp import DEFAULT_POLICY, StpPolicy
from matching.validation import (check_shape, market_error, storable, unstorable_field,
                                 validate_place)

_STOPS = (OrderType.stop, OrderType.stop_limit)
_RESTING = (OrderState.working, OrderState.partially_filled)
# SQLSTATEs after which the whole unit may simply run again: deadlock victim, serialization failure.
_RETRYABLE = ("40P01", "40001")
# A unit aborted for one of those runs again, up to this many runs in all, after a short random
# pause that grows with each attempt (so the writers that collided do not collide again in step).
_ATTEMPTS = 4
_ORDER_NS = uuid.UUID("5d0c1c52-9d8e-4f4e-9a57-6a7c1f0d4b11")

# Which of the given ledger accounts may not be debited by a fill or held for a fired stop (read in
# the unit of work, after their balance rows are locked). Matching knows no reason for a block:
# the money layer injects it (custody: an account frozen by a reorged-out credit).
BlockedAccounts = Callable[[Connection, Sequence[int]], set[int]]


def no_blocked_accounts(conn: Connection, account_ids: Sequence[int]) -> set[int]:
    return set()


def order_id_for(symbol: str, account: str, client_order_id: str) -> str:
    """The order id of a client order id: deterministic, so a retry after a crash is the same order."""
    return str(uuid.uuid5(_ORDER_NS, f"{symbol}\x00{account}\x00{client_order_id}"))


@dataclass(frozen=True)
class Outcome:
    """What one command did. `code` is set when the order or request was refused (by the gateway
    or the engine); `seq` is None when the command was not journaled."""

    order_id: str | None
    seq: int | None
    events: list[Event]
    code: str | None = None
    existed: bool = False
    row: Any = None  # the order's trade_order row as this unit committed it (None: not written by it)


class MarketNotHere(RuntimeError):
    """The market exists, but its runtime is not in this process: another process owns it (see the
    module docstring). Nothing was done; route the command to the owner."""


class _Runtime:
    """One market in memory: engine, sequencer and settlement caches. A rebuild replaces the whole
    runtime; the market's lock (`Trading._locks`) outlives it. `replayed` counts the journal
    commands the rebuild that made it applied after its snapshot (`snapshot_seq`, 0 for none)."""

    def __init__(self, row: store.MarketRow, engine: Engine, ledger: Ledger,
                 risk_rejected: dict[tuple[str, str], str], snapshot_seq: int = 0,
                 replayed: int = 0) -> None:
        self.row = row
        self.engine = engine
        self.journal = store.JournalBuffer()
        self.sequencer = Sequencer(engine, self.journal)
        self.settlement = Settlement(ledger, row.market, row.fee_account_id)
        self.risk_rejected = risk_rejected
        self.broken = False
        self.snapshot_seq = snapshot_seq  # of the latest snapshot stored (by the rebuild or since)
        self.snapshot_at = time.monotonic()  # when that was known to be the latest
        self.replayed = replayed


class Trading:
    """Markets, order entry and queries. Thread-safe: each market has one lock (single writer).

    The lock belongs to the market, not to its runtime, and whoever holds it looks the runtime up
    again (`_writer`): a rebuild swaps the runtime while requests wait for the lock, and one that
    ran on the runtime it had looked up before waiting would number its commands from a stale
    engine (issue 11: racing requests answered 500, duplicate `matching_command` key)."""

    def __init__(self, db: DbEngine, ledger: Ledger, blocked_accounts: BlockedAccounts = no_blocked_accounts,
                 *, blocked_code: str | None = None, autoload: bool = True) -> None:
        self.db = db
        self.ledger = ledger
        # Resting orders debiting a blocked account are evicted before anything trades with them,
        # and a stop of one is not activated when it fires. Only the live path asks: an eviction is
        # journaled, so a replay needs no answer of it (determinism).
        self.blocked_accounts = blocked_accounts
        # With a code (custody: `account_frozen`), a new order or an amend whose owner's account in
        # either asset of the market is blocked is refused with it, inside the unit of work, after
        # the accounts are locked; nothing is recorded (the client order id stays unused).
        self.blocked_code = blocked_code
        self.autoload = autoload  # see the module docstring
        self._rows: dict[str, store.MarketRow] = {}  # every market's configuration (never changes)
        self._markets: dict[str, _Runtime] = {}  # the runtimes this process holds
        self._committers: dict[str, GroupCommitter] = {}
        self._locks: dict[str, threading.Lock] = {}  # one per market, never replaced
        self._lock = threading.Lock()  # guards the two maps
        # Rebuilds forced by a failed unit of work (not the first load): none is expected, since
        # no client input may leave a market needing one; counted for tests and monitoring.
        self.rebuilds = 0
        # When the snapshot job snapshots a market (`snapshot_markets`, `snapshot.due`).
        self.snapshot_every_commands = snapshot.EVERY_COMMANDS
        self.snapshot_every_seconds = snapshot.EVERY_SECONDS

    # ---- markets -------------------------------------------------------------------------

    def create_market(self, market: Market, fees: FeeSchedule,
                      default_stp: StpPolicy = DEFAULT_POLICY) -> store.MarketRow:
        """Create a market (idempotent for identical content) with its fee income account."""
        problem = market_error(market, fees)
        if problem is not None:
            raise MatchingError(ErrorCode.invalid_request, problem)
        with self.db.begin() as conn:
            self.ledger.get_asset(market.base_asset, conn=conn)  # asset_not_found
            self.ledger.get_asset(market.quote_asset, conn=conn)
            # One balance shard: only this market's single writer posts to its fee account, so
            # shards would spread no contention and cost every fill the sharded path.
            fee_account = self.ledger.open_account(
                market.quote_asset, AccountKind.fee_income, f"matching:{market.symbol}:fees",
                owner=f"matching:{market.symbol}", balance_shards=1, conn=conn)
            row = store.MarketRow(market, fees, default_stp, fee_account.id)
            if not store.insert_market(conn, row):
                (existing,) = store.load_markets(conn, market.symbol)
                if existing != row:
                    raise LedgerError(LedgerCode.idempotency_conflict,
                                      f"market {market.symbol} exists with other content")
        self._rows.setdefault(market.symbol, row)
        if self.autoload and market.symbol not in self._markets:
            self.load(market.symbol)
        return row

    def load(self, symbol: str | None = None) -> None:
        """(Re)build markets from the database: snapshot + journal replay, then recovery. Each
        under its market's lock, so no command runs on a runtime while it is replaced."""
        with self.db.connect() as conn:
            rows = store.load_markets(conn, symbol)
        for row in rows:
            with self._lock:
                lock = self._locks.setdefault(row.market.symbol, threading.Lock())
                self._rows.setdefault(row.market.symbol, row)
            with lock:
                runtime = self._rebuild(row)
                with self._lock:
                    self._markets[row.market.symbol] = runtime

    def release(self, symbol: str) -> None:
        """Drop the market's runtime (this process no longer owns it); a command waiting for the
        market's lock then finds no runtime and raises `MarketNotHere`."""
        lock = self._locks.get(symbol)
        if lock is None:
            return
        with lock:
            with self._lock:
                self._markets.pop(symbol, None)

    def holds(self, symbol: str) -> bool:
        """Whether this process holds the market's runtime (serves its commands and depth)."""
        return symbol in self._markets

    def markets(self) -> list[store.MarketRow]:
        """Every market, read from the database (another process may have created one)."""
        with self.db.connect() as conn:
            rows = store.load_markets(conn)
        with self._lock:
            for row in rows:
                self._rows.setdefault(row.market.symbol, row)
        return rows

    def market(self, symbol: str) -> store.MarketRow:
        """The market's configuration (read from the database once; a market never changes)."""
        row = self._rows.get(symbol)
        if row is None:
            if storable(symbol):
                with self.db.connect() as conn:
                    found = store.load_markets(conn, symbol)
                if found:
                    with self._lock:
                        return self._rows.setdefault(symbol, found[0])
            raise MatchingError(ErrorCode.market_not_found, f"no market {symbol!r}")
        return row

    def _runtime(self, symbol: str) -> _Runtime:
        """The market's current runtime (market_not_found; MarketNotHere when another process owns
        it; loaded first under `autoload`)."""
        rt = self._markets.get(symbol)
        if rt is None:
            self.market(symbol)  # market_not_found
            if not self.autoload:
                raise MarketNotHere(symbol)
            self.load(symbol)
            rt = self._markets[symbol]
        return rt

    @contextlib.contextmanager
    def _writer(self, symbol: str) -> Iterator[_Runtime]:
        """Hold the market's lock and yield its current runtime, rebuilt first if a failed unit of
        work left it broken. Looked up only once the lock is held (see the class docstring)."""
        self._runtime(symbol)  # market_not_found, MarketNotHere
        with self._locks[symbol]:
            rt = self._markets.get(symbol)
            if rt is None:  # released while this waited for the lock
                raise MarketNotHere(symbol)
            if rt.broken:
                rt = self._recover(rt)
            yield rt

    def rebuild_stats(self, symbol: str) -> tuple[int, int]:
        """(snapshot seq, journal commands replayed after it) of the market's last rebuild."""
        with self._writer(symbol) as rt:
            return rt.snapshot_seq, rt.replayed

    def _rebuild(self, row: store.MarketRow) -> _Runtime:
        symbol = row.market.symbol
        last_events: list[Event] = []
        replayed = 0
        with self.db.connect() as conn:
            snap = store.latest_snapshot(conn, symbol)
            engine = (snapshot.restore(snap) if snap
                      else engine_class()(row.market, row.fees, row.default_stp))
            for seq, command in store.load_commands(conn, symbol, engine.last_seq):
                last_events = engine.apply(seq, command)
                replayed += 1
            risk_rejected = store.risk_rejected_keys(conn, symbol)
        rt = _Runtime(row, engine, self.ledger, risk_rejected, snap.seq if snap else 0, replayed)
        rt.settlement.immediate = True  # replays expected: each ledger command answered at once
        with self.db.begin() as conn:  # idempotent: finish the last command, answer waiting stops
            uow = self._begin(rt, conn)
            touched = self._settle(rt, conn, uow, last_events)
            for order_id in list(engine.awaiting):
                touched += self._answer_trigger(rt, conn, uow, order_id)
            self._finish(rt, conn, uow, touched)
        rt.settlement.immediate = False
        return rt

    # ---- commands ------------------------------------------------------------------------

    def place(self, symbol: str, account: str, client_order_id: str, side, **fields) -> Outcome:
        """Place an order; `fields` are those of `matching.model.Place` (qty, price, ...)."""
        cmd = Place(order_id_for(symbol, account, client_order_id), account, client_order_id,
                    side, **fields)
        return self.submit(symbol, cmd)

    def cancel(self, symbol: str, account: str, order_id: str) -> Outcome:
        return self.submit(symbol, Cancel(order_id, account))

    def amend(self, symbol: str, account: str, order_id: str, **fields) -> Outcome:
        return self.submit(symbol, Amend(order_id, account, **fields))

    def submit(self, symbol: str, command: Command) -> Outcome:
        return self.submit_batch(symbol, [command])[0]

    def submit_grouped(self, symbol: str, command: Command) -> Future:
        """Queue `command` for the market's next group commit (`matching.sequencer.GroupCommitter`,
        run by `submit_batch` in the market's own thread); the future answers its Outcome once the
        group committed, or the exception that failed it alone (MarketNotHere included)."""
        committer = self._committers.get(symbol)
        if committer is None:
            self.market(symbol)  # market_not_found, before a thread is made for a name
            with self._lock:
                committer = self._committers.setdefault(
                    symbol, GroupCommitter(lambda commands: self.submit_batch(symbol, commands), symbol))
        return committer.submit(command)

    def group_stats(self, symbol: str) -> tuple[int, int]:
        """(group commits, commands they carried) of the market's `submit_grouped` so far."""
        committer = self._committers.get(symbol)
        return (committer.groups, committer.commands) if committer else (0, 0)

    def close(self) -> None:
        """Finish the queued group commits and stop their threads."""
        for committer in list(self._committers.values()):
            committer.shutdown()

    def submit_batch(self, symbol: str, commands: Sequence[Command]) -> list[Outcome]:
        """Run `commands` in order in ONE database transaction; answer after it commits.

        If PostgreSQL aborts the transaction as a deadlock victim or for a serialization failure
        (another writer locked the same balance rows in another order), nothing was committed or
        answered: the market is rebuilt from the journal and the commands run again, up to
        `_ATTEMPTS` runs in all; after that the error reaches the caller."""
        with self._writer(symbol) as rt:
            for attempt in range(1, _ATTEMPTS + 1):
                if rt.broken:
                    rt = self._recover(rt)
                try:
                    return self._unit(rt, commands)
                except DBAPIError as exc:
                    if attempt == _ATTEMPTS or getattr(exc.orig, "sqlstate", None) not in _RETRYABLE:
                        raise
                time.sleep(random.uniform(0, 0.005 * 2 ** attempt))
        raise AssertionError("unreachable")

    def _unit(self, rt: _Runtime, commands: Sequence[Command]) -> list[Outcome]:
        """One unit of work (the caller holds the market's lock).

        If it fails, the transaction rolls back. The market needs a rebuild only if a command was
        sequenced (the engine is then ahead of the database); a failure before that (a ledger
        refusal while opening an account, say) leaves the engine as the database has it, and only
        this unit's caches are dropped."""
        seq_before, rejected_before = rt.engine.last_seq, len(rt.risk_rejected)
        try:
            with self.db.begin() as conn:
                uow = self._begin(rt, conn)
                # Lock the accounts these commands may hold from, and those their fills would
                # touch as the book stands, in one statement, so each hold is decided without a
                # round trip (matching.settlement) and `_clear_reach` usually finds its accounts
                # locked; ask about the blocked ones in one more.
                s = rt.settlement
                lock, ask = self._foreseen(rt, conn, commands)
                s.track(conn, s.accounts_to_track(conn, rt.engine, commands) + lock)
                if self.blocked_code is not None:
                    uow.blocked_owners = self._blocked_owners(rt, conn, uow, commands, ask)
                elif ask:
                    self._blocked(conn, uow, ask)
                outcomes, touched = [], []
                for command in commands:
                    outcome, ids = self._one(rt, conn, uow, command)
                    outcomes.append(outcome)
                    touched += ids
                rows = self._finish(rt, conn, uow, touched)
            outcomes = [replace(o, row=rows.get(o.order_id)) if o.order_id in rows else o for o in outcomes]
        except BaseException:
            rt.settlement.reset()
            if rt.engine.last_seq != seq_before or rt.sequencer.halted:
                rt.broken = True  # memory is ahead of the database: rebuild before next use
            else:
                for key in list(rt.risk_rejected)[rejected_before:]:  # rows rolled back
                    del rt.risk_rejected[key]
            raise
        finally:
            rt.journal.uow = None
            rt.settlement.end_unit()  # committed or rolled back: the locks are gone
        return outcomes

    def _recover(self, rt: _Runtime) -> _Runtime:
        """Replace a broken runtime by one rebuilt from the database (the caller holds the lock)."""
        self.rebuilds += 1
        fresh = self._rebuild(rt.row)
        with self._lock:
            self._markets[rt.row.market.symbol] = fresh
        return fresh

    def _foreseen(self, rt: _Runtime, conn: Connection, commands: Sequence[Command]) -> tuple[list[int], list[int]]:
        """What `_clear_reach` will ask about for the unit's orders and amends that may trade, as
        the book stands before the unit: (the accounts it will lock: the fee account, the order's
        own receive account, the receive and pay accounts of the resting orders in its reach; the
        pay accounts it will ask `blocked_accounts` about). The unit locks and asks about them with
        its first statements, so that `_clear_reach` finds them known. A guess, never a decision:
        the book changes within the unit, and an account not foreseen is locked and asked about
        when it is met, as before; one foreseen and not met was only locked until COMMIT."""
        engine, s, market, fees = rt.engine, rt.settlement, rt.row.market, rt.row.fees
        lock: list[int] = []
        ask: list[int] = []
        for command in commands:
            kind = type(command)
            if kind is Place:
                try:
                    check_shape(command)
                except MatchingError:
                    continue  # refused on its own
                if (unstorable_field(command) is not None or command.order_type in _STOPS
                        or engine.order_by_client_id(command.account, command.client_order_id) is not None
                        or validate_place(command, market, fees) is not None):
                    continue  # refused, a stop (it trades only once it fires) or a retry
                taker, price, qty, budget = command, command.price, command.qty, command.budget
                if command.order_type is not OrderType.limit:
                    price = None
            elif kind is Amend:
                order = engine.live.get(command.order_id)
                if (order is None or order.account != command.account or command.price is None
                        or order.order_type is not OrderType.limit or order.state not in _RESTING):
                    continue
                taker, price, budget = order, command.price, None
                qty = order.remaining if command.qty is None else command.qty - order.filled - order.decremented
            else:
                continue
            makers = engine.makers_in_reach(taker.side, price, qty, budget, taker.account,
                                            taker.stp_group or taker.account)
            if not makers:
                continue
            lock.append(s.fee_account_id)
            for owner, side in [(taker.account, taker.side)] + [(m.account, m.side) for m in makers]:
                try:
                    lock.append(s.receive_account(conn, owner, side))
                except LedgerError:
                    pass  # a name another owner holds: the gateway decides
            for maker in makers:
                pay = s.pay_account(conn, maker.account, maker.side)
                lock.append(pay)
                ask.append(pay)
        return lock, ask

    def _blocked_owners(self, rt: _Runtime, conn: Connection, uow: store.UnitOfWork,
                        commands: Sequence[Command], also: Sequence[int] = ()) -> set[str]:
        """Owners of the unit's new orders and amends with an account of the market blocked
        (`blocked_code`), in one query, which also asks about `also` (accounts locked already).
        A new order's accounts are opened (as its gateway would); an amend names only accounts that
        exist: those of its order, when it is the order's owner."""
        s, market = rt.settlement, rt.row.market
        owners: dict[str, list[int]] = {}
        for command in commands:
            if type(command) is Place:
                try:
                    check_shape(command)
                except MatchingError:
                    continue  # refused on its own
                if unstorable_field(command) is not None:
                    continue
                owner = command.account
            elif type(command) is Amend:
                order = rt.engine.live.get(command.order_id)
                if order is None or order.account != command.account:
                    continue
                owner = order.account
            else:
                continue
            if owner not in owners:
                try:
                    owners[owner] = [s.account_id(conn, owner, a) for a in (market.base_asset, market.quote_asset)]
                except LedgerError:
                    continue  # a name another owner holds: refused by the gateway
        accounts = sorted({a for ids in owners.values() for a in ids})
        s.track(conn, accounts)  # locked before the block is read (and so memoized: `_blocked`)
        blocked = self._blocked(conn, uow, accounts + list(also))
        return {owner for owner, ids in owners.items() if blocked.intersection(ids)}

    def _blocked(self, conn: Connection, uow: store.UnitOfWork, account_ids: Sequence[int]) -> set[int]:
        """`blocked_accounts`, asked once per unit of work for each account. Callers pass accounts
        they have locked (`Settlement.track`) in this unit: a freeze locks them too, so what was
        read stays true until the unit ends."""
        memo = uow.blocked
        unknown = sorted({a for a in account_ids if a not in memo})
        if unknown:
            found = self.blocked_accounts(conn, unknown)
            memo.update((a, a in found) for a in unknown)
        return {a for a in account_ids if memo[a]}

    def _begin(self, rt: _Runtime, conn: Connection) -> store.UnitOfWork:
        uow = store.UnitOfWork(rt.row.market.symbol)
        rt.journal.uow = uow
        return uow

    def _one(self, rt: _Runtime, conn: Connection, uow: store.UnitOfWork,
             command: Command) -> tuple[Outcome, list]:
        """Gateway checks, then sequence and settle one client command. Anything the ledger could
        refuse for it is refused (or decided) here, before the engine commits to it."""
        order_id = getattr(command, "order_id", None)
        try:
            check_shape(command)
        except MatchingError as exc:
            return Outcome(order_id, None, [], exc.code.value), []
        if isinstance(command, (ActivateTriggered, RejectTriggered, Evict)):
            return Outcome(order_id, None, [], ErrorCode.invalid_request.value), []  # internal
        if unstorable_field(command) is not None:
            return Outcome(order_id, None, [], ErrorCode.invalid_request.value), []
        touched: list = []
        if isinstance(command, Place):
            refused = self._gateway_place(rt, conn, uow, command, touched)
            if refused is not None:
                return refused, touched
        elif isinstance(command, Amend):
            if command.account in uow.blocked_owners:
                return Outcome(command.order_id, None, [], self.blocked_code), touched
            order = rt.engine.live.get(command.order_id)
            if (order is not None and order.account == command.account and command.price is not None
                    and order.order_type is OrderType.limit and order.state in _RESTING):
                qty = (order.remaining if command.qty is None
                       else command.qty - order.filled - order.decremented)
                refused = self._clear_reach(rt, conn, uow, order, command.price, qty, None, touched)
                if refused is not None:
                    return Outcome(command.order_id, None, [], refused), touched
            need = rt.engine.hold_after_amend(command)
            if need is not None:
                order = rt.engine.order(command.order_id)
                if not rt.settlement.ensure_hold(conn, order, need[0], need[1]):
                    return Outcome(command.order_id, None, [],
                                   LedgerCode.insufficient_funds.value), touched
        submitted = rt.sequencer.submit(command)
        touched += self._settle(rt, conn, uow, submitted.events)
        return Outcome(command.order_id, submitted.seq, submitted.events,
                       _refusal(command.order_id, submitted.events)), touched

    def _clear_reach(self, rt: _Runtime, conn: Connection, uow: store.UnitOfWork, taker: Order | Place,
                     price: int | None, qty: int | None, budget: int | None,
                     touched: list) -> str | None:
        """Before an order that may trade is sequenced: every account a fill of it could credit
        must be open, or the ledger would refuse the fill after the engine made it (and the market
        would need a rebuild). The resting orders it could meet (`Engine.makers_in_reach`) whose
        owner cannot be paid (the account is closed, or its name is taken), or whose account a
        fill would debit is blocked (`blocked_accounts`: a frozen seller must not be sold from by
        a counterparty's order), are cancelled first, by a journaled `Evict`; the reach is then
        walked again, since the order now reaches deeper. A closed fee account, or a closed account
        of the order's own owner (an amended order rested before it was closed), refuses the order
        (`account_closed`). Events of the evictions are settled and added to `touched`. Returns a
        refusal code or None."""
        group = taker.stp_group or taker.account
        while True:
            makers = rt.engine.makers_in_reach(taker.side, price, qty, budget, taker.account, group)
            if not makers:
                return None
            s = rt.settlement
            try:
                own = s.receive_account(conn, taker.account, taker.side)
            except LedgerError as exc:
                return exc.code.value
            receive: dict[str, int | None] = {}
            for maker in makers:
                try:
                    receive[maker.order_id] = s.receive_account(conn, maker.account, maker.side)
                except LedgerError:
                    receive[maker.order_id] = None  # the name is another owner's: it cannot be paid
            pay = {maker.order_id: s.pay_account(conn, maker.account, maker.side) for maker in makers}
            # locked before the block is read: a freeze committed meanwhile is seen (it locks them too)
            s.track(conn, [s.fee_account_id, own, *(a for a in receive.values() if a is not None), *pay.values()])
            if s.is_closed(s.fee_account_id) or s.is_closed(own):
                return LedgerCode.account_closed.value
            blocked = self._blocked(conn, uow, list(pay.values()))
            evicted = False
            for maker in makers:
                account = receive[maker.order_id]
                if account is None or s.is_closed(account) or pay[maker.order_id] in blocked:
                    touched += self._settle(rt, conn, uow, rt.sequencer.submit(Evict(maker.order_id)).events)
                    evicted = True
            if not evicted:
                return None

    def _gateway_place(self, rt: _Runtime, conn: Connection, uow: store.UnitOfWork,
                       cmd: Place, touched: list) -> Outcome | None:
        """Dedupe, validate, check the account a fill would pay (open, and its name the owner's),
        clear the orders it may meet (`_clear_reach`) and hold; an Outcome if the order must not
        reach the sequencer."""
        engine, key = rt.engine, (cmd.account, cmd.client_order_id)
        existing = engine.order_by_client_id(*key)
        existing_id = existing.order_id if existing else rt.risk_rejected.get(key)
        if existing_id is not None:
            return Outcome(existing_id, None, [], existed=True)
        if cmd.account in uow.blocked_owners:
            return Outcome(cmd.order_id, None, [], self.blocked_code)
        if not 1 <= len(cmd.client_order_id) <= 64:
            return Outcome(cmd.order_id, None, [], ErrorCode.invalid_request.value)
        code = validate_place(cmd, rt.row.market, rt.row.fees)
        if code is not None:
            return Outcome(cmd.order_id, None, [], code.value)
        try:
            receive = rt.settlement.receive_account(conn, cmd.account, cmd.side)
        except LedgerError as exc:  # the name is taken by another owner or kind
            return Outcome(cmd.order_id, None, [], exc.code.value)
        rt.settlement.track(conn, [receive])  # tracked at the start of the unit already
        if rt.settlement.is_closed(receive):
            return Outcome(cmd.order_id, None, [], LedgerCode.account_closed.value)
        if cmd.order_type in _STOPS:
            return None  # a stop reserves nothing until it fires (nor trades)
        price = cmd.price if cmd.order_type is OrderType.limit else None
        refused = self._clear_reach(rt, conn, uow, cmd, price, cmd.qty, cmd.budget, touched)
        if refused is not None:
            return Outcome(cmd.order_id, None, [], refused)
        asset, amount = hold_requirement(cmd, rt.row.market, rt.row.fees)
        try:
            rt.settlement.account_id(conn, cmd.account, asset)  # opened before the hold is queued
        except LedgerError as exc:  # the name is taken by another owner or kind
            return Outcome(cmd.order_id, None, [], exc.code.value)
        if rt.settlement.place_hold(conn, cmd.order_id, cmd.account, asset, amount) is None:
            uow.order(rejected_row(rt.row.market.symbol, cmd, LedgerCode.insufficient_funds.value))
            rt.risk_rejected[key] = cmd.order_id
            return Outcome(cmd.order_id, None, [], LedgerCode.insufficient_funds.value)
        return None

    def _settle(self, rt: _Runtime, conn: Connection, uow: store.UnitOfWork,
                events: list[Event]) -> list:
        """Settle events, answer fired stops (which may fire more); return (order id, event) pairs
        whose rows need writing."""
        touched = [(order_id, e) for e in events for order_id in _orders_of(e)]
        for trig in rt.settlement.settle(conn, uow, events):
            touched += self._answer_trigger(rt, conn, uow, trig.order_id)
        return touched

    def _answer_trigger(self, rt: _Runtime, conn: Connection, uow: store.UnitOfWork,
                        order_id: str) -> list:
        order = rt.engine.awaiting.get(order_id)
        if order is None:
            return []
        touched: list = []
        s = rt.settlement
        try:
            receive = s.receive_account(conn, order.account, order.side)
            pay = s.pay_account(conn, order.account, order.side)
            s.track(conn, [receive, pay])
            payable = not s.is_closed(receive) and not self._blocked(conn, uow, [pay])
        except LedgerError:
            payable = False  # (a stop of a blocked account is rejected, not activated)
        if payable:  # orders it may meet, whose owners cannot be paid, are evicted first
            price = order.price if order.order_type is OrderType.limit else None
            payable = self._clear_reach(rt, conn, uow, order, price, order.remaining, order.budget,
                                        touched) is None
        asset, amount = hold_requirement(order, rt.row.market, rt.row.fees)
        held = (s.place_hold(conn, order_id, order.account, asset, amount)
                if amount and payable else None)
        reply = ActivateTriggered(order_id) if held else RejectTriggered(order_id)
        return touched + self._settle(rt, conn, uow, rt.sequencer.submit(reply).events)

    def _finish(self, rt: _Runtime, conn: Connection, uow: store.UnitOfWork, touched: list) -> dict[str, Any]:
        """Send the queued ledger commands, write the rows of every order the commands touched,
        flush and COMMIT in one round trip (`UnitOfWork.flush`: this is the last work of every
        unit), and drop closed orders' caches. Returns the order rows written, by order id."""
        rt.settlement.flush(conn)
        engine, symbol = rt.engine, rt.row.market.symbol
        reasons: dict[str, tuple[str | None, str | None]] = {}
        for order_id, event in touched:
            if isinstance(event, OrderRejected):
                reasons[order_id] = (event.code.value, None)
            elif isinstance(event, OrderClosed):
                reasons[order_id] = (None, event.reason)
            else:
                reasons.setdefault(order_id, (None, None))
        closed = []
        for order_id, (code, reason) in reasons.items():
            order = engine.orders[order_id]
            held = rt.settlement.hold(conn, order_id)
            uow.order(order_row(symbol, order, engine.last_seq, held, code, reason))
            if order.state in TERMINAL:
                closed.append(order_id)
        rows = uow.flush(conn, commit=True)
        for order_id in closed:
            rt.settlement.forget(order_id)
        return rows

    # ---- queries -------------------------------------------------------------------------

    # Text PostgreSQL cannot store names nothing stored: such a query finds nothing (no query).

    def order(self, order_id: str):
        if not storable(order_id):
            return None
        with self.db.connect() as conn:
            return store.order_row(conn, order_id)

    def order_by_client_id(self, symbol: str, account: str, client_order_id: str):
        if not all(storable(t) for t in (symbol, account, client_order_id)):
            return None
        with self.db.connect() as conn:
            return store.order_row_by_client_id(conn, symbol, account, client_order_id)

    def fills(self, symbol: str, **filters):
        self._runtime(symbol)
        if not all(storable(v) for v in filters.values() if isinstance(v, str)):
            return []
        with self.db.connect() as conn:
            return store.fills(conn, symbol, **filters)

    def depth(self, symbol: str, levels: int | None = 50) -> tuple[int, list, list]:
        """(sequence number, bids, asks) with [(price ticks, displayed lots)] from the best price."""
        with self._writer(symbol) as rt:
            book = rt.engine.book
            return rt.engine.last_seq, book.bids.depth(levels), book.asks.depth(levels)

    def engine(self, symbol: str) -> Engine:
        """The live engine (tests and benchmarks; read it only while no command runs)."""
        with self._writer(symbol) as rt:
            return rt.engine

    def take_snapshot(self, symbol: str) -> snapshot.Snapshot:
        """Store a snapshot of the committed state (a derived row: replay starts from it). The
        state is read under the market's lock, between units of work, when the engine is exactly
        what the database has committed; the row is written after the lock is released."""
        with self._writer(symbol) as rt:
            snap = snapshot.take(rt.engine)
        with self.db.begin() as conn:
            store.save_snapshot(conn, symbol, snap)
        if snap.seq > rt.snapshot_seq:
            rt.snapshot_seq, rt.snapshot_at = snap.seq, time.monotonic()
        return snap

    def snapshot_markets(self) -> list[snapshot.Snapshot]:
        """The snapshot job: snapshot every market that is `snapshot.due`, so a rebuild replays at
        most about `snapshot_every_commands` commands (or `snapshot_every_seconds` worth of them).
        Returns the snapshots taken."""
        taken = []
        for symbol, rt in list(self._markets.items()):
            if snapshot.due(rt.engine.last_seq, rt.snapshot_seq, time.monotonic() - rt.snapshot_at,
                            every_commands=self.snapshot_every_commands,
                            every_seconds=self.snapshot_every_seconds):
                taken.append(self.take_snapshot(symbol))
        return taken


def _orders_of(event: Event) -> tuple[str, ...]:
    """Ids of the orders whose rows `event` changes."""
    if isinstance(event, Fill):
        return event.maker_order_id, event.taker_order_id
    if isinstance(event, RequestRejected):
        return ()
    return (event.order_id,)


def _refusal(order_id: str, events: Iterable[Event]) -> str | None:
    for event in events:
        if isinstance(event, (OrderRejected, RequestRejected)) and event.order_id == order_id:
            return event.code.value
    return None


__all__ = ["MarketNotHere", "Outcome", "Trading", "order_id_for"]
