"""Checks on a `Place` (and an amend's new values) before an order enters the engine.

Checks run in the order of the `ErrorCode` table; the first failure is the result. Integers must
be real `int` (a `bool` or a float is refused) because every amount derives from them.
"""
from __future__ import annotations

from matching.errors import ErrorCode
from matching.fees import FeeSchedule
from matching.model import Market, OrderType, Place, Side, TimeInForce

_LIMIT_PRICED = (OrderType.limit, OrderType.stop_limit)
_STOPS = (OrderType.stop, OrderType.stop_limit)


def is_positive_int(value: object) -> bool:
    return type(value) is int and value > 0


def default_tif(order_type: OrderType) -> TimeInForce:
    """GTC for orders with a limit price; IOC for market orders, which never rest."""
    return TimeInForce.gtc if order_type in _LIMIT_PRICED else TimeInForce.ioc


def uses_budget(side: Side, order_type: OrderType) -> bool:
    """A market (or stop-market) bid is sized by a quote budget, not a quantity."""
    return side is Side.buy and order_type not in _LIMIT_PRICED


def validate_place(cmd: Place, market: Market, fees: FeeSchedule) -> ErrorCode | None:
    """The first reason to reject `cmd`, or None."""
    budgeted = uses_budget(cmd.side, cmd.order_type)
    priced = cmd.order_type in _LIMIT_PRICED
    tif = cmd.tif or default_tif(cmd.order_type)
    if not _present_iff(cmd.qty, not budgeted):
        return ErrorCode.invalid_quantity
    if not _present_iff(cmd.price, priced):
        return ErrorCode.invalid_price
    if not _present_iff(cmd.budget, budgeted):
        return ErrorCode.invalid_budget
    if not _present_iff(cmd.stop_price, cmd.order_type in _STOPS):
        return ErrorCode.invalid_stop_price
    if cmd.display_qty is not None and not _display_ok(cmd, priced, tif):
        return ErrorCode.invalid_display_quantity
    if not _tif_ok(cmd, priced, budgeted, tif):
        return ErrorCode.invalid_time_in_force
    if not fees.has(cmd.fee_tier):
        return ErrorCode.unknown_fee_tier
    if notional(cmd.price, cmd.qty, cmd.budget, priced, budgeted, market) < market.min_notional:
        return ErrorCode.below_min_notional
    return None


def _present_iff(value: object, required: bool) -> bool:
    """A required field is a positive int; a field that does not apply is absent."""
    return is_positive_int(value) if required else value is None


def _display_ok(cmd: Place, priced: bool, tif: TimeInForce) -> bool:
    return (priced and tif is TimeInForce.gtc and is_positive_int(cmd.display_qty)
            and cmd.display_qty <= cmd.qty)


def _tif_ok(cmd: Place, priced: bool, budgeted: bool, tif: TimeInForce) -> bool:
    if type(cmd.post_only) is not bool or not isinstance(tif, TimeInForce):
        return False
    if cmd.post_only:
        return priced and tif is TimeInForce.gtc
    if priced:
        return True
    # market orders never rest; a market bid has no quantity for FOK to be "all" of
    return tif is TimeInForce.ioc or (tif is TimeInForce.fok and not budgeted)


def notional(price: int | None, qty: int | None, budget: int | None, priced: bool,
             budgeted: bool, market: Market) -> int:
    """Quote value checked against `min_notional`; a market ask (no price) passes."""
    if priced:
        return market.quote_amount(price, qty)
    if budgeted:
        return budget
    return market.min_notional
