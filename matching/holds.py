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

from matching.fees import PPM, FeeSchedule, ceil_div
from matching.model import Market, Order, OrderType, Place, Side

_QUOTE_BUDGET_TYPES = (OrderType.market, OrderType.stop)


def hold_requirement(order: Order | Place, market: Market,
                     fee_schedule: FeeSchedule) -> tuple[str, int]:
    """(asset code, minor units) the order's hold must total."""
    if isinstance(order, Place):
        return _for_values(order.side, order.order_type, order.price, 0, order.qty or 0,
                           order.budget, 0, 0, order.fee_tier, market, fee_schedule)
    remaining = order.remaining or 0
    return _for_values(order.side, order.order_type, order.price, order.filled, remaining,
                       order.budget, order.quote_traded, order.fee_num, order.fee_tier,
                       market, fee_schedule)


def _for_values(side: Side, order_type: OrderType, price: int | None, filled: int,
                remaining: int, budget: int | None, quote_traded: int, fee_num: int,
                fee_tier: str, market: Market, fees: FeeSchedule) -> tuple[str, int]:
    if side is Side.sell:
        return market.base_asset, market.base_amount(filled + remaining)
    if order_type in _QUOTE_BUDGET_TYPES:
        return market.quote_asset, budget or 0
    open_quote = market.quote_amount(price or 0, remaining)
    max_ppm = fees.tier(fee_tier).max_ppm
    fee_bound = ceil_div(fee_num + open_quote * max_ppm, PPM)
    return market.quote_asset, quote_traded + open_quote + fee_bound


def hold_captured(order: Order, market: Market) -> tuple[str, int]:
    """(asset code, minor units) already captured from the order's hold by its fills."""
    if order.side is Side.sell:
        return market.base_asset, market.base_amount(order.filled)
    return market.quote_asset, order.quote_traded + order.fees_paid
