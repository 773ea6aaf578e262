"""How much an order must have held for it: the one formula the money layer and the engine share.

- bid, limit / stop_limit: quote at the LIMIT price for the open quantity, plus the largest fee the
  order could still owe (its tier's max(maker, taker) rate, rounded up on the cumulative fee),
  plus whatever it has already captured. Fills at better (maker) prices capture less; the
  difference is released on the terminal state, which is how price improvement returns to the
  buyer (the Bitsten bug cannot happen if the money layer releases `hold - captured`).
- bid, market / stop: its quote `budget` (fees included; the engine never spends past it).
- ask (any type): base for its total quantity, lot_size * (filled + remaining).

For a fresh `Place` this is the amount to hold before sequencing; for a live `Order` it is the total
the hold must have reached (captured so far included), e.g. after an amend. An untriggered stop
reserves nothing: call this when `Triggered` arrives (the event carries the result already).
"""
from __future__ import annotations

from matching.fees import PPM, FeeSchedule
from matching.model import Market, OrderType, Place, Side
from matching.states import OrderState

from .order import Order

_SELL = Side.sell
_QUOTE_BUDGET_TYPES = (OrderType.market, OrderType.stop)


def hold_requirement(order: Order | Place, market: Market,
                     fee_schedule: FeeSchedule) -> tuple[str, int]:
    """(asset code, minor units) the order's hold must total."""
    if isinstance(order, Place):  # a fresh order: nothing filled, captured or charged yet
        order = Order.from_place(order, 0, order.tif, order.stp_group, order.stp_policy,
                                 OrderState.received)
    return order_hold(order, market, fee_schedule)


def order_hold(order: Order, market: Market, fee_schedule: FeeSchedule) -> tuple[str, int]:
    """`hold_requirement` of a live `Order`: the one formula (the engine states it in every
    `OrderAmended`, so it is written for speed)."""
    if order.side is _SELL:
        return market.base_asset, (order.filled + (order.remaining or 0)) * market.lot_size
    if order.order_type in _QUOTE_BUDGET_TYPES:
        return market.quote_asset, order.budget or 0
    open_quote = (order.price or 0) * (order.remaining or 0) * market.quote_per_tick_lot
    max_ppm = fee_schedule.tiers[order.fee_tier].max_ppm
    fee_bound = -((-(order.fee_num + open_quote * max_ppm)) // PPM)  # ceil_div, inlined
    return market.quote_asset, order.quote_traded + open_quote + fee_bound


def hold_captured(order: Order, market: Market) -> tuple[str, int]:
    """(asset code, minor units) already captured from the order's hold by its fills."""
    if order.side is _SELL:
        return market.base_asset, order.filled * market.lot_size
    return market.quote_asset, order.quote_traded + order.fees_paid
