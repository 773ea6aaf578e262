"""An order as the engine tracks it: the one mutable object of the matching core.

Its own module (not `model`) so that the compiled core (`matching.compiled`) can compile it into an
extension type with the engine, its only writer; commands, enums and markets stay in `model`,
shared by both engines.
"""
from __future__ import annotations

import enum

from matching.model import OrderType, Place, Side, TimeInForce
from matching.states import OrderState
from matching.stp import StpPolicy


class Order:
    """An order as the engine tracks it (mutable; the engine is its only writer).

    `remaining` is open lots (None for a market bid); `visible` the displayed part for an iceberg
    (else equal to `remaining`); `quote_traded` the quote paid or received so far; `fee_num` the
    cumulative sum(quote_i * rate_i) from which `fees_paid = ceil(fee_num / 1e6)`; `decremented`
    lots removed by STP decrement without a trade. `seq` is the sequence number of the command
    that created it. Every slot is state (snapshots record them all).
    """

    __slots__ = ("order_id", "account", "client_order_id", "side", "order_type", "tif", "qty",
                 "price", "post_only", "display_qty", "stop_price", "budget", "stp_group",
                 "stp_policy", "fee_tier", "state", "seq", "remaining", "visible", "filled",
                 "quote_traded", "fee_num", "fees_paid", "decremented")

    _RECORD_FIELDS = __slots__

    def __init__(self, **values: object) -> None:
        for name in self.__slots__:
            setattr(self, name, values.get(name))

    @classmethod
    def from_place(cls, cmd: Place, seq: int, tif: TimeInForce, stp_group: str,
                   stp_policy: StpPolicy, state: OrderState) -> "Order":
        """A fresh order for an accepted `Place` (built field by field: this is a hot path)."""
        order = cls.__new__(cls)  # not object.__new__: compiled, Order is an extension type
        order.order_id = cmd.order_id
        order.account = cmd.account
        order.client_order_id = cmd.client_order_id
        order.side = cmd.side
        order.order_type = cmd.order_type
        order.tif = tif
        order.qty = order.remaining = order.visible = cmd.qty
        order.price = cmd.price
        order.post_only = cmd.post_only
        order.display_qty = cmd.display_qty
        order.stop_price = cmd.stop_price
        order.budget = cmd.budget
        order.stp_group = stp_group
        order.stp_policy = stp_policy
        order.fee_tier = cmd.fee_tier
        order.state = state
        order.seq = seq
        order.filled = order.quote_traded = order.fee_num = order.fees_paid = 0
        order.decremented = 0
        return order

    @property
    def is_bid(self) -> bool:
        return self.side is Side.buy

    def to_record(self) -> dict:
        """Canonical plain-value form, for snapshots and the state hash."""
        out = {}
        for name in self._RECORD_FIELDS:
            value = getattr(self, name)
            out[name] = value.value if isinstance(value, enum.Enum) else value
        return out

    @classmethod
    def from_record(cls, record: dict) -> "Order":
        order = cls(**record)
        order.side = Side(order.side)
        order.order_type = OrderType(order.order_type)
        order.tif = TimeInForce(order.tif)
        order.stp_policy = StpPolicy(order.stp_policy)
        order.state = OrderState(order.state)
        return order

    def __repr__(self) -> str:
        return (f"Order({self.order_id} {self.side.value} {self.order_type.value} "
                f"{self.remaining}@{self.price} {self.state.value})")
