"""Events the engine returns for each sequenced command: everything settlement needs, nothing more.

Every event carries the `seq` of the command that produced it; the list an `apply` returns is in
the order things happened. How the money layer uses them:

- `OrderAccepted`: the order entered the engine (its hold is already in place, or it is a stop).
- `OrderRejected`: terminal, nothing traded; release the order's hold in full (if any).
- `OrderExists`: a retried client order id; nothing changed. Release any hold placed for the retry.
  (From the sequencer it is not journaled and its `seq` is the last applied one, for reference.)
- `Fill`: post one balanced journal transaction, key `fill:<market>:<seq>:<match_no>`:
  buyer's hold captures `buyer_pays` (quote + buyer fee), seller's hold captures `base_amount`,
  the seller receives `seller_receives`, the buyer `base_amount`, fee income `maker_fee + taker_fee`.
- `OrderClosed`: terminal; release the order's remaining hold = hold placed - `hold_captured`.
  This is where a bid's price improvement goes back to its owner.
- `OrderAmended`: the order's hold must now total `hold_required` (captures included). A larger
  requirement must have been topped up BEFORE the amend was sequenced (fills only lower it); an
  excess may be released now or simply left to the terminal release of `hold - captured`.
- `Triggered`: a stop fired; place `hold_amount` of `hold_asset`, then sequence
  `ActivateTriggered` (or `RejectTriggered` if the hold fails).
- `OrderStateChanged`: mirror the state onto the order row (one per actual change).
- `RequestRejected`: a cancel / amend / activation / eviction was refused; the order is unchanged.
- `OrderDecremented`: STP `decrement_both` took `qty` open lots off a resting order that stays
  open; nothing traded, the hold is unchanged (its excess is released at the terminal state).

Representation: each event is an immutable named tuple (`typing.NamedTuple`) read by attribute, as
before. Tuples because the engine builds one or more per command and a tuple costs a tenth of a
frozen dataclass to build (the engine calls `make(EventType, (fields...))` on its hot paths).
Equality is per type, as for dataclasses: two events are equal only if they are of the same type
and have equal fields, never equal to a plain tuple.
"""
from __future__ import annotations

from typing import NamedTuple, Union

from matching.errors import ErrorCode
from matching.model import OrderType, Side
from matching.states import OrderState


make = tuple.__new__  # make(EventType, (field, ...)): build an event without a Python frame


def _eq(self: tuple, other: object) -> bool:
    if type(other) is type(self):
        return tuple.__eq__(self, other)
    return False if isinstance(other, tuple) else NotImplemented


def _ne(self: tuple, other: object) -> bool:
    if type(other) is type(self):
        return tuple.__ne__(self, other)
    return True if isinstance(other, tuple) else NotImplemented


def typed_equality(cls: type) -> type:
    """Compare like the frozen dataclasses these events were: same type and same fields."""
    cls.__eq__, cls.__ne__, cls.__hash__ = _eq, _ne, tuple.__hash__
    return cls


@typed_equality
class OrderAccepted(NamedTuple):
    seq: int
    order_id: str
    account: str
    client_order_id: str
    side: Side
    order_type: OrderType
    state: OrderState


@typed_equality
class OrderRejected(NamedTuple):
    seq: int
    order_id: str
    account: str
    client_order_id: str
    code: ErrorCode


@typed_equality
class OrderExists(NamedTuple):
    seq: int
    order_id: str
    account: str
    client_order_id: str
    state: OrderState


@typed_equality
class Fill(NamedTuple):
    seq: int
    match_no: int
    maker_order_id: str
    taker_order_id: str
    maker_account: str
    taker_account: str
    taker_side: Side
    price_ticks: int
    qty_lots: int
    base_amount: int
    quote_amount: int
    maker_fee: int
    taker_fee: int

    @property
    def buyer_is_taker(self) -> bool:
        return self.taker_side is Side.buy

    @property
    def buyer_order_id(self) -> str:
        return self.taker_order_id if self.buyer_is_taker else self.maker_order_id

    @property
    def seller_order_id(self) -> str:
        return self.maker_order_id if self.buyer_is_taker else self.taker_order_id

    @property
    def buyer_account(self) -> str:
        return self.taker_account if self.buyer_is_taker else self.maker_account

    @property
    def seller_account(self) -> str:
        return self.maker_account if self.buyer_is_taker else self.taker_account

    @property
    def buyer_fee(self) -> int:
        return self.taker_fee if self.buyer_is_taker else self.maker_fee

    @property
    def seller_fee(self) -> int:
        return self.maker_fee if self.buyer_is_taker else self.taker_fee

    @property
    def buyer_pays(self) -> int:
        """Quote minor units captured from the buyer's hold: price plus the buyer's fee."""
        return self.quote_amount + self.buyer_fee

    @property
    def seller_receives(self) -> int:
        """Quote minor units credited to the seller: price minus the seller's fee."""
        return self.quote_amount - self.seller_fee


@typed_equality
class OrderStateChanged(NamedTuple):
    seq: int
    order_id: str
    account: str
    old: OrderState
    new: OrderState


@typed_equality
class OrderClosed(NamedTuple):
    """Terminal (filled, cancelled, expired). `reason` names why; `hold_captured` is in `hold_asset`."""

    seq: int
    order_id: str
    account: str
    state: OrderState
    reason: str
    filled_lots: int
    remaining_lots: int | None
    quote_traded: int
    fees_paid: int
    hold_asset: str
    hold_captured: int


@typed_equality
class OrderAmended(NamedTuple):
    seq: int
    order_id: str
    account: str
    qty: int | None
    price: int | None
    stop_price: int | None
    remaining: int | None
    priority_kept: bool
    hold_asset: str
    hold_required: int


@typed_equality
class Triggered(NamedTuple):
    seq: int
    order_id: str
    account: str
    stop_price: int
    last_price: int
    becomes: OrderType
    hold_asset: str
    hold_amount: int


@typed_equality
class OrderDecremented(NamedTuple):
    seq: int
    order_id: str
    account: str
    qty: int
    remaining: int


@typed_equality
class RequestRejected(NamedTuple):
    seq: int
    command: str
    order_id: str
    code: ErrorCode


Event = Union[OrderAccepted, OrderRejected, OrderExists, Fill, OrderStateChanged, OrderClosed,
              OrderAmended, Triggered, RequestRejected, OrderDecremented]


class CloseReason:
    """Why an order reached a terminal state (`OrderClosed.reason`)."""

    filled = "filled"
    cancelled_by_owner = "cancelled_by_owner"
    ioc_remainder = "ioc_remainder"            # IOC / market: what could not trade now
    fok_unfillable = "fok_unfillable"          # FOK: the whole quantity was not there
    budget_exhausted = "budget_exhausted"      # market bid: next lot did not fit the budget
    self_trade_prevented = "self_trade_prevented"
    account_closed = "account_closed"          # `Evict`: a fill could not pay the owner
