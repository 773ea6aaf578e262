"""The matching engine of one market: applies sequenced commands to the book and returns events.

Pure and deterministic: no clock, no I/O, no randomness, no dependence on dict ordering other than
insertion order. The same commands with the same sequence numbers give the same events and the
same state hash on any machine. Only the `Sequencer` (or a replay) should apply commands.

Guarantees:
- Commands apply strictly in sequence (`apply` refuses any seq but `last_seq + 1`), and a
  malformed command raises `invalid_request` before anything changes.
- Price-time priority; every trade is at the resting (maker) order's price.
- Self-trade prevention is decided before a fill exists (see `stp`).
- An FOK order trades its whole quantity or nothing at all (see `matcher`).
- A client order id is unique per account: a second `Place` with it changes nothing and answers
  `OrderExists` (rejected orders keep their client order id too).
- The book never rests crossed: an incoming order matches until it no longer crosses.
- A triggered stop never matches in the command that fired it; it waits in `received` for the
  money layer's `ActivateTriggered` / `RejectTriggered`, so its hold exists before it trades.

Speed (issue 4 asks for 400,000 commands a second in pure Python, where a function call or an
object costs about as much as twenty simple operations, so the hot paths count both):
- enum members are bound to module constants (an Enum class attribute lookup costs several
  global lookups); events are built as tuples (`events.make`);
- cancels and amends find their order in `live`, the open orders only;
- `handlers` apply a command given its number: `apply` checks number and shape first, the
  `Sequencer` (which numbers commands and checks them before journaling) calls them directly;
- stops are looked at only where one can become triggerable (after a match, for a new or an
  amended stop), not after every command;
- the common amends (a new price, or a new size, of a plain resting limit order) are checked
  and applied inline in `_amend`, stating the hold `holds.order_hold` would;
- a limit order that cannot cross skips the match plan: `_enter` for a new order and
  `Book.reprice` for a moved one do exactly what `_match` does with an empty plan.
Unit tests (`test_matching_fastpaths`) compare every event of mixed streams with the engine as
it was before this work, run the shortcuts against the general path, and check stated holds.
"""
from __future__ import annotations

from typing import Callable

from . import matcher
from .book import Book
from matching.errors import ErrorCode, SequenceError
from matching.events import (CloseReason, Event, Fill, OrderAccepted, OrderAmended, OrderClosed,
                             OrderDecremented, OrderExists, OrderRejected, OrderStateChanged,
                             RequestRejected, Triggered, make)
from matching.fees import PPM, FeeSchedule, fee_increment
from .holds import hold_captured, hold_requirement, order_hold
from .order import Order
from matching.model import (ActivateTriggered, Amend, Cancel, Command, Evict, Market,
                            OrderType, Place, RejectTriggered, Side, TimeInForce)
from matching.states import OPEN, TERMINAL, OrderState, transition
from .stops import StopBook
from matching.stp import DEFAULT_POLICY, StpPolicy
from .validation import DEFAULT_TIF, check_shape, validate_place

S = OrderState
_RECEIVED, _PENDING_NEW, _WORKING, _PARTIAL = (S.received, S.pending_new, S.working,
                                              S.partially_filled)
_FILLED, _CANCELLED, _EXPIRED, _REJECTED, _UNTRIGGERED = (S.filled, S.cancelled, S.expired,
                                                          S.rejected, S.untriggered)
_LIMIT, _MARKET = OrderType.limit, OrderType.market
_SELL = Side.sell
_PPM_LESS_1 = PPM - 1
_GTC, _FOK = TimeInForce.gtc, TimeInForce.fok
_STOP, _STOP_LIMIT = OrderType.stop, OrderType.stop_limit
_BECOMES = {OrderType.stop: OrderType.market, OrderType.stop_limit: OrderType.limit}
_FILL, _STP_CANCEL_MAKER = matcher.FILL, matcher.STP_CANCEL_MAKER


class Engine:
    """Book, stops and every order of one market, changed only through `apply` (`handlers`)."""

    def __init__(self, market: Market, fees: FeeSchedule,
                 default_stp: StpPolicy = DEFAULT_POLICY) -> None:
        self.market = market
        self.fees = fees
        self.default_stp = default_stp
        self.book = Book()
        self.stops = StopBook()
        self._stop_keys = self.stops.keys  # empty when no stop waits
        self._tiers = fees.tiers
        self.orders: dict[str, Order] = {}
        # The orders in an OPEN state, kept by `_move`: cancels and amends look here first, a
        # map the size of the book rather than of the market's whole history.
        self.live: dict[str, Order] = {}
        self.by_client: dict[tuple[str, str], str] = {}
        self.awaiting: dict[str, Order] = {}  # triggered stops waiting for their hold
        self.last_seq = 0
        self.last_price: int | None = None
        self._events: list[Event] = []  # the events of the command being applied
        self._match_no = 0
        # What applies each command type, given its number (`last_seq + 1`) and the command,
        # shape-checked: `apply` checks both and calls it, and so does the `Sequencer` (it
        # numbers commands itself and checks them before journaling). Each starts the command
        # (`last_seq`, a new events list) and returns its events.
        self.handlers: dict[type, Callable[[int, Command], list[Event]]] = {
            Place: self._place, Cancel: self._cancel, Amend: self._amend,
            ActivateTriggered: self._activate, RejectTriggered: self._reject_triggered,
            Evict: self._evict}

    # -- queries (for the gateway; they change nothing) --------------------------------------

    def order(self, order_id: str) -> Order | None:
        return self.orders.get(order_id)

    def restore_record(self, record: dict) -> None:
        """Register an order from its snapshot record (`Order.to_record`), built as this engine's
        own `Order` type (the compiled engine's is an extension type)."""
        self.restore_order(Order.from_record(record))

    def restore_order(self, order: Order) -> None:
        """Register an order read from a snapshot (for `snapshot.restore` only)."""
        self.orders[order.order_id] = order
        self.by_client[(order.account, order.client_order_id)] = order.order_id
        if order.state in OPEN:
            self.live[order.order_id] = order

    def order_by_client_id(self, account: str, client_order_id: str) -> Order | None:
        order_id = self.by_client.get((account, client_order_id))
        return self.orders[order_id] if order_id is not None else None

    def hold_after_amend(self, cmd: Amend) -> tuple[str, int] | None:
        """(asset, total) the order's hold must reach before `cmd` is sequenced, or None when the
        amend would be refused or the order holds nothing (an untriggered stop). Changes nothing."""
        order = self.orders.get(cmd.order_id)
        if (order is None or order.account != cmd.account or order.state not in OPEN
                or order.state in (S.untriggered, S.received)
                or self._amend_error(order, cmd) is not None):
            return None
        # Apply the new size and price to the order itself and put them back afterwards: the
        # formula reads only these fields, and a copy of the order cost more than the rest.
        saved = order.remaining, order.qty, order.price
        try:
            self._set_size(order, cmd)
            return order_hold(order, self.market, self.fees)
        finally:
            order.remaining, order.qty, order.price = saved

    def makers_in_reach(self, side: Side, price: int | None, qty: int | None, budget: int | None,
                        account: str, stp_group: str) -> list[Order]:
        """Resting orders an incoming order could trade with now: a superset, read-only.

        The levels that cross `price` (None: a market order, every level), from the best, each
        whole, until the open lots (or, for a budget, the quote value) of the orders it may trade
        with (not STP-prevented) cover `qty` (or `budget`). Whole levels, because an iceberg's
        refills can bring the walk back to every order of its level. The money layer checks that
        a fill could pay each of these before it sequences the order (`Evict`)."""
        book_side = self.book.asks if side is Side.buy else self.book.bids
        keys, queues, sign = book_side.keys, book_side.queues, book_side.sign
        room = qty if qty is not None else budget
        per_lot = self.market.quote_per_tick_lot
        reach: list[Order] = []
        for i in range(len(keys) - 1, -1, -1):
            level = keys[i] * sign
            if price is not None and (level > price if side is Side.buy else level < price):
                break
            for maker in queues[level].values():
                reach.append(maker)
                if maker.account != account and maker.stp_group != stp_group:
                    room -= maker.remaining if qty is not None else level * maker.remaining * per_lot
            if room is None or room <= 0:
                break
        return reach

    # -- the one entry point ------------------------------------------------------------------

    def apply(self, seq: int, command: Command) -> list[Event]:
        """Apply `command` stamped `seq` (must be `last_seq + 1`); return what happened."""
        if seq != self.last_seq + 1:
            raise SequenceError(self.last_seq + 1, seq)
        check_shape(command)
        return self.handlers[type(command)](seq, command)

    # -- commands -------------------------------------------------------------------------

    def _place(self, seq: int, cmd: Place) -> list[Event]:
        self.last_seq = seq
        self._events = events = []
        account, client_order_id = cmd.account, cmd.client_order_id
        key = (account, client_order_id)
        existing = self.by_client.get(key)
        if existing is not None:
            existing = self.orders[existing]
            events.append(make(OrderExists, (seq, existing.order_id, account, client_order_id,
                                             existing.state)))
            return events
        orders, order_id = self.orders, cmd.order_id
        if order_id in orders:  # not recorded: the id belongs to another order
            events.append(make(OrderRejected, (seq, order_id, account, client_order_id,
                                               ErrorCode.duplicate_order_id)))
            return events
        order_type = cmd.order_type
        is_stop = order_type is _STOP or order_type is _STOP_LIMIT
        order = Order.from_place(cmd, seq, cmd.tif or DEFAULT_TIF[order_type],
                                 cmd.stp_group or account, cmd.stp_policy or self.default_stp,
                                 _RECEIVED if is_stop else _PENDING_NEW)
        orders[order_id] = order
        self.by_client[key] = order_id
        code = validate_place(cmd, self.market, self.fees)
        if code is not None:
            self._reject(order, code)
            return events
        if is_stop:
            self._move(order, _UNTRIGGERED)
            self.stops.add(order)
        events.append(make(OrderAccepted, (seq, order_id, account, client_order_id, cmd.side,
                                           order_type, order.state)))
        if is_stop:
            self._fire_stops()  # it may be triggered already
        else:
            self._enter(order)
        return events

    def _cancel(self, seq: int, cmd: Cancel) -> list[Event]:
        self.last_seq = seq
        self._events = events = []
        order = self.live.get(cmd.order_id)
        if order is None or order.account != cmd.account:
            self._refuse_closed(cmd, "cancel")
            return events
        self._take_out(order)
        self._close(order, _CANCELLED, CloseReason.cancelled_by_owner)
        return events

    def _evict(self, seq: int, cmd: Evict) -> list[Event]:
        """Cancel an open order whose owner a fill could not pay (see `Evict`)."""
        self.last_seq = seq
        self._events = events = []
        order = self.live.get(cmd.order_id)
        if order is None:
            self._refuse("evict", cmd.order_id, self._missing_code(cmd.order_id))
            return events
        self._take_out(order)
        self._close(order, _CANCELLED, CloseReason.account_closed)
        return events

    def _take_out(self, order: Order) -> None:
        """Remove an open order from wherever it waits: the stops, the awaiting queue or the book."""
        state = order.state
        if state is _UNTRIGGERED:
            self.stops.remove(order)
        elif state is _RECEIVED:
            del self.awaiting[order.order_id]
        else:
            self.book.remove(order)

    def _activate(self, seq: int, cmd: ActivateTriggered) -> list[Event]:
        self.last_seq = seq
        self._events = events = []
        order = self.awaiting.pop(cmd.order_id, None)
        if order is None:
            self._refuse("activate", cmd.order_id, self._missing_code(cmd.order_id))
            return events
        self._move(order, _PENDING_NEW)
        self._enter(order)
        return events

    def _reject_triggered(self, seq: int, cmd: RejectTriggered) -> list[Event]:
        self.last_seq = seq
        self._events = events = []
        order = self.awaiting.pop(cmd.order_id, None)
        if order is None:
            self._refuse("reject_triggered", cmd.order_id, self._missing_code(cmd.order_id))
            return events
        self._reject(order, ErrorCode.hold_failed)
        return events

    def _amend(self, seq: int, cmd: Amend) -> list[Event]:
        """Refuse the amend, or change a stop, or change a resting order: a reduction at the
        same price keeps its place; a new price or a larger size loses it, and the order
        re-enters at the back of its (new) level, matching first if it now crosses.

        Most commands of a busy market are amends of a plain resting limit order that change
        only its price or only its size, so those two are checked inline: of `_amend_error`'s
        checks only the notional can fail them there (the shape is checked, and a resting limit
        order always has open quantity, `remaining == qty - filled - decremented > 0`). For the
        same reason the change is written here rather than in methods of its own, and the hold
        it states is `holds.order_hold` of a resting limit order written out
        (`test_matching_fastpaths` checks it against that)."""
        self.last_seq = seq
        self._events = events = []
        order = self.live.get(cmd.order_id)
        if order is None or order.account != cmd.account:
            self._refuse_closed(cmd, "amend")
            return events
        price, qty, state = cmd.price, cmd.qty, order.state
        old_price = order.price
        market = self.market
        if (qty is None and price is not None and cmd.stop_price is None and price > 0
                and price != old_price and order.order_type is _LIMIT
                and (state is _WORKING or state is _PARTIAL) and not order.post_only):
            if price * order.qty * market.quote_per_tick_lot < market.min_notional:
                self._refuse("amend", order.order_id, ErrorCode.below_min_notional)
                return events
            keeps_place = False
            order.price = price
        elif (price is None and qty is not None and cmd.stop_price is None
              and order.order_type is _LIMIT and (state is _WORKING or state is _PARTIAL)
              and qty - order.filled - order.decremented > 0):
            if old_price * qty * market.quote_per_tick_lot < market.min_notional:
                self._refuse("amend", order.order_id, ErrorCode.below_min_notional)
                return events
            keeps_place = qty <= order.qty
            order.remaining = qty - order.filled - order.decremented
            order.qty = qty
            price = old_price
        else:
            keeps_place = self._amend_checked(order, cmd)
            if keeps_place is None:
                return events
            price = order.price
        remaining = order.remaining
        if order.side is _SELL:
            asset, amount = market.base_asset, (order.filled + remaining) * market.lot_size
        else:
            open_quote = price * remaining * market.quote_per_tick_lot
            # ceil(fee bound / PPM) of a non-negative numerator, without two negations
            fee_bound = ((order.fee_num + open_quote * self._tiers[order.fee_tier].max_ppm
                          + _PPM_LESS_1) // PPM)
            asset, amount = market.quote_asset, order.quote_traded + open_quote + fee_bound
        events.append(make(OrderAmended, (seq, order.order_id, order.account, order.qty, price,
                                          order.stop_price, remaining, keeps_place, asset,
                                          amount)))
        if keeps_place:
            visible = order.visible
            order.visible = visible if visible < remaining else remaining
            return events
        book = self.book
        if book.reprice(order, old_price):  # it did not cross: moved, resting as `_enter`
            display = order.display_qty
            order.visible = display if display and display < remaining else remaining
        else:
            book.remove(order, old_price)
            self._match(order)
        return events

    def _amend_checked(self, order: Order, cmd: Amend) -> bool | None:
        """Any other amend: every check in order, then a stop's amend whole, or a resting
        order's new size and price set. Whether the resting order keeps its place; None when the
        amend was refused or is done."""
        code = self._amend_error(order, cmd)
        if code is not None:
            self._refuse("amend", order.order_id, code)
            return None
        if order.state is _UNTRIGGERED:
            self._amend_stop(order, cmd)
            return None
        price, qty = cmd.price, cmd.qty
        keeps_place = (price is None or price == order.price) and (qty is None or qty <= order.qty)
        self._set_size(order, cmd)
        return keeps_place

    # -- amend ------------------------------------------------------------------------------

    def _amend_error(self, order: Order, cmd: Amend) -> ErrorCode | None:
        if order.order_type is _MARKET:
            return ErrorCode.order_not_amendable
        state = order.state
        if state is _RECEIVED:
            return ErrorCode.order_not_open
        qty = order.qty if cmd.qty is None else cmd.qty
        price = order.price if cmd.price is None else cmd.price
        if order.budget is not None:  # an untriggered stop-market bid: only its stop moves
            if cmd.qty is not None:
                return ErrorCode.invalid_quantity
        elif type(qty) is not int or qty - order.filled - order.decremented <= 0:
            return ErrorCode.invalid_quantity
        if cmd.price is not None and (order.price is None or type(price) is not int or price <= 0):
            return ErrorCode.invalid_price
        if cmd.stop_price is not None and (state is not _UNTRIGGERED
                                           or type(cmd.stop_price) is not int
                                           or cmd.stop_price <= 0):
            return ErrorCode.invalid_stop_price
        market = self.market
        if price is not None and price * qty * market.quote_per_tick_lot < market.min_notional:
            return ErrorCode.below_min_notional
        if order.post_only and state is not _UNTRIGGERED and price != order.price \
                and self.book.would_cross(order.side, price):
            return ErrorCode.post_only_would_cross
        return None

    def _set_size(self, order: Order, cmd: Amend) -> None:
        if cmd.qty is not None:
            order.remaining = cmd.qty - order.filled - order.decremented
            order.qty = cmd.qty
        if cmd.price is not None:
            order.price = cmd.price

    def _amend_stop(self, order: Order, cmd: Amend) -> None:
        self.stops.remove(order)
        self._set_size(order, cmd)
        if cmd.stop_price is not None:
            order.stop_price = cmd.stop_price
        order.visible = order.remaining
        self.stops.add(order)
        self._emit_amended(order, priority_kept=True)
        self._fire_stops()  # its new stop price may be reached already

    # -- entering and matching ------------------------------------------------------------

    def _enter(self, order: Order) -> None:
        """A pending_new order meets the book: post-only check, then match, rest or end.

        A limit order that does not cross gets an empty match plan, so it skips planning and
        does here what `_match` would: a GTC order rests (working if it was pending_new), an IOC
        or FOK one expires. Its open quantity is positive (validation guarantees it)."""
        book = self.book
        if order.post_only and book.would_cross(order.side, order.price):
            self._reject(order, ErrorCode.post_only_would_cross)
        elif order.order_type is not _LIMIT or book.would_cross(order.side, order.price):
            self._match(order)
        elif order.tif is _GTC:
            remaining, display = order.remaining, order.display_qty
            order.visible = display if display and display < remaining else remaining
            book.add(order)
            if order.state is _PENDING_NEW:
                self._move(order, _WORKING)
        elif order.tif is _FOK:
            self._close(order, _EXPIRED, CloseReason.fok_unfillable)
        else:
            self._close(order, _EXPIRED, CloseReason.ioc_remainder)

    def _match(self, order: Order) -> None:
        """Plan the match, apply the FOK rule to the plan, execute it, then rest or end."""
        self._match_no = 0  # numbers this command's fills; a command matches at most once
        plan = matcher.plan_match(order, self.book, self.market, self.fees)
        if order.tif is _FOK and plan.filled < order.remaining:
            self._end_unfilled(order, _EXPIRED, CloseReason.fok_unfillable)
            return
        self._execute(order, plan)
        self._finish(order, plan)
        if plan.steps and self._stop_keys:  # the last trade price may have moved: fire stops
            self._fire_stops()

    def _execute(self, taker: Order, plan: matcher.Plan) -> None:
        for step in plan.steps:
            kind, maker = step[0], step[1]
            if kind == _FILL:
                self._fill(maker, taker, step[2])
            elif kind == _STP_CANCEL_MAKER:
                self.book.remove(maker)
                self._close(maker, _CANCELLED, CloseReason.self_trade_prevented)
            else:
                self._decrement(maker, taker, step[2])

    def _decrement(self, maker: Order, taker: Order, qty: int) -> None:
        """STP decrement_both: both lose `qty` open lots; nothing trades."""
        maker.remaining -= qty
        maker.decremented += qty
        taker.remaining -= qty
        taker.decremented += qty
        if maker.remaining == 0:
            self.book.remove(maker)
            self._close(maker, _CANCELLED, CloseReason.self_trade_prevented)
        else:
            maker.visible = min(maker.visible, maker.remaining)
            self._events.append(make(OrderDecremented, (self.last_seq, maker.order_id,
                                                        maker.account, qty, maker.remaining)))

    def _fill(self, maker: Order, taker: Order, qty: int) -> None:
        price = maker.price
        market, tiers = self.market, self._tiers
        quote = price * qty * market.quote_per_tick_lot
        maker_fee, maker.fee_num = fee_increment(maker.fee_num, quote,
                                                 tiers[maker.fee_tier].maker_ppm)
        taker_fee, taker.fee_num = fee_increment(taker.fee_num, quote,
                                                 tiers[taker.fee_tier].taker_ppm)
        maker.fees_paid += maker_fee
        taker.fees_paid += taker_fee
        maker.filled += qty
        maker.quote_traded += quote
        maker.remaining -= qty  # a resting maker always has a quantity
        maker.visible -= qty
        taker.filled += qty
        taker.quote_traded += quote
        if taker.remaining is not None:
            taker.remaining -= qty
        self._match_no += 1
        self.last_price = price
        self._events.append(make(Fill, (self.last_seq, self._match_no, maker.order_id,
                                        taker.order_id, maker.account, taker.account,
                                        taker.side, price, qty, qty * market.lot_size, quote,
                                        maker_fee, taker_fee)))
        if maker.remaining == 0:
            self.book.remove(maker)
            self._close(maker, _FILLED, CloseReason.filled)
        else:
            self._move(maker, _PARTIAL)
            if maker.visible == 0:  # iceberg refill: a new slice at the back of the level
                maker.visible = min(maker.display_qty, maker.remaining)
                self.book.requeue(maker)
        if taker.remaining == 0:
            self._close(taker, _FILLED, CloseReason.filled)
        else:
            self._move(taker, _PARTIAL)

    def _finish(self, order: Order, plan: matcher.Plan) -> None:
        """After matching: the taker rests, or ends as filled / expired / STP-removed."""
        if order.state in TERMINAL:
            return
        if plan.stp_kill or order.remaining == 0:  # remaining 0 here means decremented away
            self._end_unfilled(order, None, CloseReason.self_trade_prevented)
        elif order.budget is not None and plan.budget_exhausted and order.filled:
            self._close(order, _FILLED, CloseReason.budget_exhausted)
        elif order.order_type is _MARKET or order.tif is not _GTC:
            reason = CloseReason.budget_exhausted if plan.budget_exhausted \
                else CloseReason.ioc_remainder
            self._end_unfilled(order, _EXPIRED, reason)
        else:
            order.visible = min(order.display_qty or order.remaining, order.remaining)
            self.book.add(order)
            if order.state is _PENDING_NEW:
                self._move(order, _WORKING)

    def _end_unfilled(self, order: Order, state: OrderState | None, reason: str) -> None:
        """End an order's remainder. Never traded and never acknowledged -> `rejected` for STP."""
        if state is None:  # STP: rejected if it never traded, else cancelled
            if order.state is _PENDING_NEW:
                self._reject(order, ErrorCode.self_trade_prevented)
                return
            state = _CANCELLED
        self._close(order, state, reason)

    def _would_cross(self, order: Order, price: int) -> bool:
        return self.book.would_cross(order.side, price)

    # -- stops ------------------------------------------------------------------------------

    def _fire_stops(self) -> None:
        if self.last_price is None:
            return
        for order_id in self.stops.pop_triggered(self.last_price):
            order = self.orders[order_id]
            order.order_type = _BECOMES[order.order_type]
            self._move(order, _RECEIVED)
            self.awaiting[order_id] = order
            asset, amount = hold_requirement(order, self.market, self.fees)
            self._emit(Triggered(self.last_seq, order_id, order.account, order.stop_price,
                                 self.last_price, order.order_type, asset, amount))

    # -- state changes and events -----------------------------------------------------------

    def _move(self, order: Order, new: OrderState) -> None:
        old = order.state
        order.state = transition(order.order_id, old, new)
        if old is not new:
            if new in OPEN:
                self.live[order.order_id] = order
            elif old in OPEN:
                self.live.pop(order.order_id, None)  # a new stop rejected from `received`
            self._events.append(make(OrderStateChanged, (self.last_seq, order.order_id,
                                                         order.account, old, new)))

    def _close(self, order: Order, state: OrderState, reason: str) -> None:
        self._move(order, state)
        asset, captured = hold_captured(order, self.market)
        self._events.append(make(OrderClosed, (self.last_seq, order.order_id, order.account, state,
                                               reason, order.filled, order.remaining,
                                               order.quote_traded, order.fees_paid, asset,
                                               captured)))

    def _reject(self, order: Order, code: ErrorCode) -> None:
        self._move(order, _REJECTED)
        self._events.append(make(OrderRejected, (self.last_seq, order.order_id, order.account,
                                                 order.client_order_id, code)))

    def _emit_amended(self, order: Order, priority_kept: bool) -> None:
        asset, amount = order_hold(order, self.market, self.fees)
        if order.state is _UNTRIGGERED:  # a stop reserves nothing until it fires
            amount = 0
        self._events.append(make(OrderAmended, (self.last_seq, order.order_id, order.account,
                                                order.qty, order.price, order.stop_price,
                                                order.remaining, priority_kept, asset, amount)))

    def _refuse(self, command: str, order_id: str, code: ErrorCode) -> None:
        self._events.append(make(RequestRejected, (self.last_seq, command, order_id, code)))

    def _refuse_closed(self, cmd: Cancel | Amend, command: str) -> None:
        """Refuse a cancel / amend whose order is missing, someone else's, or not open."""
        order = self.orders.get(cmd.order_id)
        if order is None:
            code = ErrorCode.order_not_found
        elif order.account != cmd.account:
            code = ErrorCode.order_owner_mismatch
        else:
            code = ErrorCode.order_not_open
        self._refuse(command, cmd.order_id, code)

    def _missing_code(self, order_id: str) -> ErrorCode:
        return ErrorCode.order_not_open if order_id in self.orders else ErrorCode.order_not_found

    def _emit(self, event: Event) -> None:
        self._events.append(event)
