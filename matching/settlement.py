"""The money layer of one market: holds before sequencing, one journal transaction per fill, exact
release at every terminal state. Talks to the ledger only through `ledger.service.Ledger`.

Guarantees (checked by the integration tests and by `Ledger.verify`):
- an order's hold is decided and reserved before its command reaches the sequencer (stops: before
  `ActivateTriggered`): against the headroom of the owner's locked balance rows in a unit of work,
  by the ledger itself while rebuilding. Its row is written in the same database transaction as
  the command's journal row, so no committed state has one without the other;
- each `Fill` is ONE balanced journal transaction, key `fill:<market>:<seq>:<match_no>`, posted on
  the caller's connection, i.e. in the same database transaction as the fill row. Each party pays
  its own fee, so each statement shows only its own (settlement version 2, `SETTLEMENT_VERSION`):
      buyer quote (captured from the buyer's hold) -> seller quote   quote amount (full notional)
      seller quote -> fee income                                      seller's fee
      buyer quote (captured from the buyer's hold) -> fee income     buyer's fee
      seller base (captured from the seller's hold) -> buyer base    base amount
  Fees are in the quote asset, rounded up on each order's cumulative fee (`matching.fees`), so
  there is no dust: every rounded unit is fee income;
- the fill row records the format it was settled with (`fill.settlement_version`, migration 0033).
  Version 1, every fill before it, posted buyer -> seller `quote - seller fee` and buyer -> fee
  income both fees (`fill_legs`): re-settling a fill (a market rebuilt from its journal) posts the
  format its row names, so the journal answers `exists` and an old fill keeps its postings;
- on `OrderClosed` / `OrderRejected` the remaining hold is released exactly (hold - captured), which
  returns a bid's price improvement and unused fee allowance to its owner. Before releasing, the
  captures recorded for the order must equal the event's `hold_captured`, or settlement stops;
- replaying a command's events is harmless: a fill key posted before answers `exists`, a released
  hold is not released again, fill rows are inserted with ON CONFLICT DO NOTHING.

Round trips: every ledger command of a unit of work is queued and sent when the unit is finished
(`flush`), in one `Ledger.apply` statement, in the order they happened. Whether a hold will be
accepted is known in advance: at the start of the unit the service locks the balance rows of the
accounts its commands will hold from (`track`, `Ledger.lock_available`, in the postings' lock
order), so no one else can change them until COMMIT, and this class keeps their headroom as it
queues holds, releases and credits. New holds take ids reserved from the ledger
(`Ledger.reserve_hold_ids`), so later commands of the unit can name them. A queued command
answering anything but `created` means the books and this class disagree: `SettlementError`, and
the transaction does not commit. While the service rebuilds a market from its journal
(`immediate`), every command is sent at once, the ledger decides each hold, and a replay
(`exists`) is expected.

Ledger accounts: a trading account is an owner string; its balance in an asset is the customer
account named `customer:<owner>:<asset>` (the convention custody uses for deposits), opened on
first use. Fees go to the market's `fee_income` account. Every hold is owned by
`matching:<market>` and references the order id; an order has one live hold at a time (an amend
that needs more swaps it for a larger one: `hold_no` counts the swaps, `prior_captured` keeps what
earlier holds paid).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from sqlalchemy import Connection, text

from ledger.errors import ErrorCode as LedgerCode
from ledger.errors import LedgerError
from ledger.model import (AccountKind, CommandResult, HoldState, LedgerCommand, PlaceHold, PostTransfers,
                          ReleaseHold, ReplaceHold, Transfer)
from ledger.service import Ledger
from matching.engine import Engine
from matching.errors import ErrorCode, MatchingError
from matching.events import Event, Fill, OrderClosed, OrderRejected, Triggered
from matching.model import Amend, Market, OrderType, Place, Side
from matching.order import Order
from matching.validation import check_shape, unstorable_field
from matching.states import OrderState, transition
from matching.store import UnitOfWork

_STOP_TYPES = (OrderType.stop, OrderType.stop_limit)

# The posting format of new fills (recorded on each fill row): 2 = each party pays its own fee.
SETTLEMENT_VERSION = 2

# A hold that cannot be placed for these reasons rejects the order; anything else is a failure.
_REFUSALS = (LedgerCode.insufficient_funds, LedgerCode.account_closed)


class SettlementError(RuntimeError):
    """The ledger disagrees with the engine (a bug): the command's transaction must not commit."""


@dataclass
class OrderHold:
    """The live hold of one order, as far as this process has seen it."""

    hold_id: int
    amount: int
    captured: int = 0
    released: bool = False
    hold_no: int = 0
    prior_captured: int = 0
    account_id: int | None = None  # the held account

    @property
    def remaining(self) -> int:
        return 0 if self.released else self.amount - self.captured

    @property
    def captured_total(self) -> int:
        return self.prior_captured + self.captured


def customer_account_name(owner: str, asset: str) -> str:
    return f"customer:{owner}:{asset}"


class Settlement:
    """Holds and postings for one market. Not thread-safe: the market's service lock guards it."""

    def __init__(self, ledger: Ledger, market: Market, fee_account_id: int) -> None:
        self.ledger = ledger
        self.market = market
        self.fee_account_id = fee_account_id
        self.owner = f"matching:{market.symbol}"
        self._accounts: dict[tuple[str, str], int] = {}
        self._holds: dict[str, OrderHold | None] = {}
        # Queued commands and what to do with each answer (see the module docstring).
        self._pending: list[tuple[LedgerCommand, Callable[[CommandResult], None]]] = []
        self.immediate = False
        # Headroom of the accounts locked in this unit of work (available; unbounded; closed).
        self._available: dict[int, int] = {}
        self._unbounded: set[int] = set()
        self._closed: set[int] = set()
        self._hold_ids: list[int] = []  # reserved, not used yet

    # ---- accounts and holds ----------------------------------------------------------------

    def account_id(self, conn: Connection, owner: str, asset: str) -> int:
        key = (owner, asset)
        account_id = self._accounts.get(key)
        if account_id is None:
            account = self.ledger.open_account(asset, AccountKind.customer,
                                               customer_account_name(owner, asset), owner=owner,
                                               conn=conn)
            account_id = self._accounts[key] = account.id
        return account_id

    def receive_account(self, conn: Connection, owner: str, side: Side) -> int:
        """The account a fill credits for an order of `owner` on `side` (a buyer receives base)."""
        market = self.market
        return self.account_id(conn, owner, market.base_asset if side is Side.buy else market.quote_asset)

    def pay_account(self, conn: Connection, owner: str, side: Side) -> int:
        """The account an order of `owner` on `side` holds from and a fill debits (a seller pays base)."""
        market = self.market
        return self.account_id(conn, owner, market.base_asset if side is Side.sell else market.quote_asset)

    def is_closed(self, account_id: int) -> bool:
        """Whether a tracked account (locked in this unit of work) is closed."""
        return account_id in self._closed

    def place_hold(self, conn: Connection, order_id: str, owner: str, asset: str,
                   amount: int) -> OrderHold | None:
        """Hold `amount` for a new (or just triggered) order; None if the owner cannot cover it."""
        account_id = self.account_id(conn, owner, asset)
        key = f"order:{order_id}:hold:0"
        if self.immediate:
            result = self._answer(conn, PlaceHold(key, account_id, amount, self.owner, order_id))
            if result is None:
                return None
            captured = 0
            if result.status == "exists":  # a replay: the hold may have been captured from since
                captured = self.ledger.get_hold(result.id, conn=conn).captured
            held = self._holds[order_id] = OrderHold(result.id, amount, captured, account_id=account_id)
            return held
        if not self._covers(conn, account_id, amount):
            return None
        hold_id = self._reserve_hold_id(conn)
        self._send(conn, PlaceHold(key, account_id, amount, self.owner, order_id, hold_id), _placed(hold_id))
        self._available[account_id] -= amount
        held = self._holds[order_id] = OrderHold(hold_id, amount, account_id=account_id)
        return held

    # ---- headroom of the accounts locked in this unit of work ---------------------------------

    def track(self, conn: Connection, account_ids: Iterable[int]) -> None:
        """Lock the balance rows of `account_ids` (those not locked yet in this unit of work) and
        keep their headroom: holds on them are then decided here, without a round trip."""
        missing = [a for a in account_ids if a not in self._available and a not in self._closed]
        if not missing:
            return
        # Queued releases and credits may concern these accounts, and only tracked accounts count
        # them here: send the queue first, so the headroom read below includes them.
        self.flush(conn)
        for account_id, room in self.ledger.lock_available(missing, conn=conn).items():
            self._available[account_id] = room.available
            if room.may_go_negative:
                self._unbounded.add(account_id)
            if room.closed:
                self._closed.add(account_id)

    def accounts_to_track(self, conn: Connection, engine: Engine, commands: Iterable[object]) -> list[int]:
        """The accounts `commands` may place holds on (a new order's, an amended order's), and the
        account a fill of a new order would credit: opened now if need be, so that a fill never
        has to open one (a name taken by another owner is refused before the order is
        sequenced), and locked, so the gateway knows whether it is closed."""
        market = self.market
        ids = []
        for command in commands:
            try:
                check_shape(command)
            except MatchingError:
                continue  # refused on its own later; locks and opens nothing
            if unstorable_field(command) is not None:
                continue
            kind = type(command)
            if kind is Place:
                if command.order_type in _STOP_TYPES or engine.order_by_client_id(command.account, command.client_order_id):
                    continue  # a stop holds nothing until it fires; a retry holds nothing again
                owner, side = command.account, command.side
                try:
                    ids.append(self.receive_account(conn, owner, side))
                except LedgerError:
                    continue  # its name is taken: the gateway refuses the order
            elif kind is Amend:
                order = engine.orders.get(command.order_id)
                if order is None or order.account != command.account:
                    continue
                owner, side = order.account, order.side
            else:
                continue
            asset = market.base_asset if side is Side.sell else market.quote_asset
            try:
                ids.append(self.account_id(conn, owner, asset))
            except LedgerError:
                continue  # its name is taken: the gateway refuses the order
        return ids

    def end_unit(self) -> None:
        """The unit of work committed or rolled back: its locks are gone, and so is the headroom."""
        self._available.clear()
        self._unbounded.clear()
        self._closed.clear()

    def _covers(self, conn: Connection, account_id: int, amount: int, freed: int = 0) -> bool:
        self.track(conn, [account_id])  # a round trip only for an account not locked yet
        if account_id in self._closed:
            return False
        if account_id not in self._available:
            raise SettlementError(f"account {account_id} has no balance rows")
        return account_id in self._unbounded or self._available[account_id] + freed >= amount

    def _credit(self, account_id: int, amount: int) -> None:
        if account_id in self._available:
            self._available[account_id] += amount

    def _reserve_hold_id(self, conn: Connection) -> int:
        if not self._hold_ids:
            self._hold_ids = self.ledger.reserve_hold_ids(64, conn=conn)[::-1]
        return self._hold_ids.pop()

    def _answer(self, conn: Connection, command: LedgerCommand) -> CommandResult | None:
        """Send the queued commands and `command`; its result, or None if the owner cannot cover it."""
        (result,) = self.flush(conn, command)
        if result.ok:
            return result
        if result.status in {code.value for code in _REFUSALS}:
            return None
        raise LedgerError(LedgerCode(result.status), hold_id=getattr(command, "hold_id", None))

    def flush(self, conn: Connection, *then: LedgerCommand) -> list[CommandResult]:
        """Send the queued commands followed by `then` in one statement; return the answers to `then`."""
        pending, self._pending = self._pending, []
        commands = [command for command, _ in pending] + list(then)
        if not commands:
            return []
        results = self.ledger.apply(commands, conn=conn)
        for (_, on_result), result in zip(pending, results):
            on_result(result)
        return results[len(pending):]

    def _send(self, conn: Connection, command: LedgerCommand, on_result: Callable[[CommandResult], None]) -> None:
        """Queue a command that must succeed (immediately sent while rebuilding)."""
        if self.immediate:
            (result,) = self.ledger.apply([command], conn=conn)
            on_result(result)
        else:
            self._pending.append((command, on_result))

    def ensure_hold(self, conn: Connection, order: Order, asset: str, required_total: int) -> bool:
        """Make the order's holds total at least `required_total` (captures included) before an
        amend is sequenced. A hold cannot grow, so a short one is replaced by one for the new
        remainder in one ledger command: if the owner cannot cover it, nothing changes."""
        held = self.hold(conn, order.order_id)
        if held is None:
            raise SettlementError(f"order {order.order_id} has no hold to amend")
        needed = required_total - held.captured_total
        if held.remaining >= needed:
            return True
        account_id = self.account_id(conn, order.account, asset)
        no = held.hold_no + 1
        key = f"order:{order.order_id}:hold:{no}"
        if self.immediate:
            if held.remaining > 0:
                command = ReplaceHold(held.hold_id, key, account_id, needed, self.owner, order.order_id)
            else:
                command = PlaceHold(key, account_id, needed, self.owner, order.order_id)
            result = self._answer(conn, command)
            if result is None:
                return False
            new_id = result.id
        else:
            freed = held.remaining
            if not self._covers(conn, account_id, needed, freed):
                return False
            new_id = self._reserve_hold_id(conn)
            if freed > 0:
                command = ReplaceHold(held.hold_id, key, account_id, needed, self.owner, order.order_id, new_id)
            else:
                command = PlaceHold(key, account_id, needed, self.owner, order.order_id, new_id)
            self._send(conn, command, _placed(new_id))
            self._available[account_id] += freed - needed
        self._holds[order.order_id] = OrderHold(new_id, needed, 0, False, no, held.captured_total, account_id)
        return True

    def hold(self, conn: Connection, order_id: str) -> OrderHold | None:
        """The order's live hold (loaded from its row and the ledger after a restart)."""
        if order_id in self._holds:
            return self._holds[order_id]
        row = conn.execute(text("SELECT hold_id, hold_no, prior_captured FROM trade_order WHERE id = :i"),
                           {"i": order_id}).first()
        held = None
        if row is not None and row.hold_id is not None:
            h = self.ledger.get_hold(row.hold_id, conn=conn)
            resolved = h.state in (HoldState.released, HoldState.expired)
            held = OrderHold(h.id, h.amount, h.captured, resolved, row.hold_no, int(row.prior_captured),
                             h.account_id)
        self._holds[order_id] = held
        return held

    def forget(self, order_id: str) -> None:
        self._holds.pop(order_id, None)

    def reset(self) -> None:
        """Drop every cached value and queued command (after a failed transaction)."""
        self._accounts.clear()
        self._holds.clear()
        self._pending.clear()
        self._hold_ids.clear()
        self.end_unit()

    # ---- events ----------------------------------------------------------------------------

    def settle(self, conn: Connection, uow: UnitOfWork, events: list[Event]) -> list[Triggered]:
        """Post what `events` ask for; return the stops that fired (the caller answers them)."""
        fired = []
        for event in events:
            kind = type(event)
            if kind is Fill:
                self._fill(conn, uow, event)
            elif kind is OrderClosed:
                self._release(conn, event.order_id, event.hold_captured)
            elif kind is OrderRejected:
                self._release(conn, event.order_id, 0)
            elif kind is Triggered:
                fired.append(event)
        return fired

    def _fill(self, conn: Connection, uow: UnitOfWork, fill: Fill) -> None:
        base, quote = self.market.base_asset, self.market.quote_asset
        buyer, seller = fill.buyer_account, fill.seller_account
        buyer_hold = self._live_hold(conn, fill.buyer_order_id)
        seller_hold = self._live_hold(conn, fill.seller_order_id)
        symbol = self.market.symbol
        # A fill settled before (re-settled while rebuilding) keeps the format its row records.
        version = self._settled_version(conn, symbol, fill) if self.immediate else SETTLEMENT_VERSION
        legs, roles = fill_legs(version, fill, buyer_quote=self.account_id(conn, buyer, quote),
                         seller_quote=self.account_id(conn, seller, quote),
                         buyer_base=self.account_id(conn, buyer, base), seller_base=self.account_id(conn, seller, base),
                         fee_account=self.fee_account_id, buyer_hold=buyer_hold.hold_id,
                         seller_hold=seller_hold.hold_id)
        row = {"market": symbol, "seq": fill.seq, "match_no": fill.match_no,
               "maker_order_id": fill.maker_order_id, "taker_order_id": fill.taker_order_id,
               "maker_account": fill.maker_account, "taker_account": fill.taker_account,
               "taker_side": fill.taker_side.value, "price_ticks": fill.price_ticks,
               "qty_lots": fill.qty_lots, "base_amount": fill.base_amount,
               "quote_amount": fill.quote_amount, "maker_fee": fill.maker_fee,
               "taker_fee": fill.taker_fee, "journal_transaction_id": None, "settlement_version": version}
        key = f"fill:{symbol}:{fill.seq}:{fill.match_no}"
        immediate = self.immediate

        def posted(result: CommandResult) -> None:
            _require(result, f"fill {key}", immediate)
            row["journal_transaction_id"] = result.id
            if immediate and result.status == "created":
                buyer_hold.captured += fill.buyer_pays
                seller_hold.captured += fill.base_amount

        if not immediate:  # counted now: the release check of a later event needs it
            buyer_hold.captured += fill.buyer_pays
            seller_hold.captured += fill.base_amount
            if fill.seller_receives:
                self._credit(self.account_id(conn, seller, quote), fill.seller_receives)
            self._credit(self.account_id(conn, buyer, base), fill.base_amount)
        metadata: dict = {"market": symbol, "seq": fill.seq, "match_no": fill.match_no}
        if version >= 2:  # each leg says what it is (version 1's metadata stays as it was posted)
            metadata["legs"] = [{"role": role} for role in roles]
        self._send(conn, PostTransfers(key, legs, "fill", metadata, self.owner), posted)
        uow.fill(row)

    @staticmethod
    def _settled_version(conn: Connection, symbol: str, fill: Fill) -> int:
        """The settlement version of a fill row written before, else the current one."""
        found = conn.execute(text("SELECT settlement_version FROM fill WHERE market = :m AND seq = :s AND match_no = :n"),
                             {"m": symbol, "s": fill.seq, "n": fill.match_no}).scalar()
        return SETTLEMENT_VERSION if found is None else int(found)

    def _live_hold(self, conn: Connection, order_id: str) -> OrderHold:
        held = self.hold(conn, order_id)
        if held is None:  # a resolved hold is refused by the ledger unless this is a replay
            raise SettlementError(f"order {order_id} traded without a hold")
        return held

    def _release(self, conn: Connection, order_id: str, captured: int) -> None:
        held = self.hold(conn, order_id)
        if held is None:  # a stop that never held anything
            return
        if held.captured_total != captured:
            raise SettlementError(f"order {order_id}: ledger captured {held.captured_total}, "
                                  f"engine says {captured}")
        if held.remaining > 0:
            self._send(conn, ReleaseHold(held.hold_id, self.owner), _released(held.hold_id, self.immediate))
            if held.account_id is not None:
                self._credit(held.account_id, held.remaining)
        held.released = True


def fill_legs(version: int, fill: Fill, *, buyer_quote: int, seller_quote: int, buyer_base: int, seller_base: int,
              fee_account: int, buyer_hold: int, seller_hold: int) -> tuple[tuple[Transfer, ...], tuple[str, ...]]:
    """The transfers of a fill in settlement format `version` (see the module docstring) and what
    each one is. Both formats move the same net amounts: only the legs, and so the statements, differ."""
    legs: list[tuple[Transfer, str]] = []
    if version == 1:  # buyer -> seller net of the seller's fee; the buyer pays both fees
        if fill.seller_receives:
            legs.append((Transfer(buyer_quote, seller_quote, fill.seller_receives, buyer_hold), "quote_net"))
        if fill.maker_fee + fill.taker_fee:
            legs.append((Transfer(buyer_quote, fee_account, fill.maker_fee + fill.taker_fee, buyer_hold), "fees"))
    elif version == 2:  # the full notional, then each party's own fee
        legs.append((Transfer(buyer_quote, seller_quote, fill.quote_amount, buyer_hold), "quote"))
        if fill.seller_fee:
            legs.append((Transfer(seller_quote, fee_account, fill.seller_fee), "seller_fee"))
        if fill.buyer_fee:
            legs.append((Transfer(buyer_quote, fee_account, fill.buyer_fee, buyer_hold), "buyer_fee"))
    else:
        raise SettlementError(f"unknown settlement version {version}")
    legs.append((Transfer(seller_base, buyer_base, fill.base_amount, seller_hold), "base"))
    return tuple(t for t, _ in legs), tuple(role for _, role in legs)


def _placed(hold_id: int) -> Callable[[CommandResult], None]:
    def check(result: CommandResult) -> None:
        if result.status != "created" or result.id != hold_id:
            raise SettlementError(f"hold {hold_id}: the ledger answered {result.status} (id {result.id})")
    return check


def _released(hold_id: int, immediate: bool) -> Callable[[CommandResult], None]:
    return lambda result: _require(result, f"release of hold {hold_id}", immediate)


def _require(result: CommandResult, what: str, immediate: bool) -> None:
    """A queued command must have been carried out now; while rebuilding, a replay is fine too."""
    if result.status != "created" and not (immediate and result.status == "exists"):
        raise SettlementError(f"{what}: the ledger answered {result.status}")


# ---- order rows ----------------------------------------------------------------------------

def order_row(symbol: str, order: Order, last_seq: int, held: OrderHold | None,
              reject_code: str | None = None, close_reason: str | None = None) -> dict:
    """The `trade_order` row mirroring the engine's order."""
    return {
        "id": order.order_id, "market": symbol, "account": order.account,
        "client_order_id": order.client_order_id, "side": order.side.value,
        "order_type": order.order_type.value, "tif": order.tif.value if order.tif else None,
        "post_only": order.post_only, "price": order.price, "qty": order.qty,
        "display_qty": order.display_qty, "stop_price": order.stop_price, "budget": order.budget,
        "fee_tier": order.fee_tier, "state": order.state.value, "seq": order.seq,
        "last_seq": last_seq, "filled": order.filled, "remaining": order.remaining,
        "quote_traded": order.quote_traded, "fees_paid": order.fees_paid,
        "hold_id": held.hold_id if held else None, "hold_no": held.hold_no if held else 0,
        "prior_captured": held.prior_captured if held else 0, "reject_code": reject_code,
        "close_reason": close_reason,
    }


def rejected_row(symbol: str, cmd: Place, code: str) -> dict:
    """The row of an order refused before sequencing (its hold could not be placed)."""
    state = transition(cmd.order_id, OrderState.received, OrderState.rejected)
    return {
        "id": cmd.order_id, "market": symbol, "account": cmd.account,
        "client_order_id": cmd.client_order_id, "side": cmd.side.value,
        "order_type": cmd.order_type.value, "tif": cmd.tif.value if cmd.tif else None,
        "post_only": cmd.post_only, "price": cmd.price, "qty": cmd.qty,
        "display_qty": cmd.display_qty, "stop_price": cmd.stop_price, "budget": cmd.budget,
        "fee_tier": cmd.fee_tier, "state": state.value, "seq": None, "last_seq": None,
        "filled": 0, "remaining": cmd.qty, "quote_traded": 0, "fees_paid": 0, "hold_id": None,
        "hold_no": 0, "prior_captured": 0, "reject_code": code, "close_reason": None,
    }


def engine_order(engine: Engine, order_id: str) -> Order:
    order = engine.order(order_id)
    if order is None:
        raise MatchingError(ErrorCode.order_not_found, order_id=order_id)
    return order
