"""Checks on a `Place` (and an amend's new values) before an order enters the engine.

Checks run in the order of the `ErrorCode` table; the first failure is the result. Integers must
be real `int` (a `bool` or a float is refused) because every amount derives from them.
"""
from __future__ import annotations

from dataclasses import fields

from matching.errors import ErrorCode, MatchingError
from matching.fees import FeeSchedule
from matching.model import (ActivateTriggered, Amend, Cancel, Command, Evict, Market, OrderType,
                            Place, RejectTriggered, Side, TimeInForce)
from matching.stp import StpPolicy

_LIMIT_PRICED = (OrderType.limit, OrderType.stop_limit)
_GTC, _IOC = TimeInForce.gtc, TimeInForce.ioc
_STOPS = (OrderType.stop, OrderType.stop_limit)


# Field name -> (allowed type, may be None). Shape is checked before a command is journaled, so
# the journal only ever holds commands every engine version can apply without crashing.
_SHAPE: dict[str, tuple[type, bool]] = {
    "order_id": (str, False), "account": (str, False), "client_order_id": (str, False),
    "fee_tier": (str, False), "stp_group": (str, True), "side": (Side, False),
    "order_type": (OrderType, False), "tif": (TimeInForce, True), "stp_policy": (StpPolicy, True),
    "post_only": (bool, False), "qty": (int, True), "price": (int, True),
    "display_qty": (int, True), "stop_price": (int, True), "budget": (int, True),
}
_COMMAND_TYPES = (Place, Cancel, Amend, ActivateTriggered, RejectTriggered, Evict)


_SPECS = {cls: tuple((f.name, *_SHAPE[f.name]) for f in fields(cls)) for cls in _COMMAND_TYPES}
_EXACT = (int, bool, str)  # exact type: a bool is not a quantity, a str subclass is not an id


def _compile(specs: dict) -> object:
    """`check_shape` as one straight-line function (the hot path runs it for every command): a
    branch per command class, most frequent first, each testing every field's declared type
    without a loop or a getattr per field; anything else goes to `_refuse`."""
    env: dict = {"_refuse": _refuse}
    branches = []
    for j, (cls, spec) in enumerate(specs.items()):
        env[f"C{j}"] = cls
        tests = []
        for i, (name, kind, optional) in enumerate(spec):
            env[f"k{j}_{i}"] = kind
            test = (f"type(c.{name}) is k{j}_{i}" if kind in _EXACT
                    else f"isinstance(c.{name}, k{j}_{i})")
            tests.append(f"(c.{name} is None or {test})" if optional else test)
        branches.append(f"    {'if' if j == 0 else 'elif'} t is C{j}:\n"
                        f"        if {' and '.join(tests) or 'True'}:\n            return\n")
    source = "def check_shape(c):\n    t = type(c)\n" + "".join(branches) + "    _refuse(c)\n"
    exec(source, env)  # noqa: S102 - text built from the fixed field table above
    return env["check_shape"]


def _refuse(command: Command) -> None:
    """Raise `invalid_request` for a command that failed the shape check, naming the field."""
    spec = _SPECS.get(type(command))
    if spec is None:
        raise MatchingError(ErrorCode.invalid_request, f"not a command: {type(command).__name__}")
    for name, kind, optional in spec:
        value = getattr(command, name)
        if value is None and optional:
            continue
        if not (type(value) is kind if kind in _EXACT else isinstance(value, kind)):
            raise MatchingError(ErrorCode.invalid_request, f"{name}={value!r}", field=name)


_BY_FREQUENCY = (Amend, Place, Cancel, ActivateTriggered, RejectTriggered, Evict)
check_shape = _compile({cls: _SPECS[cls] for cls in _BY_FREQUENCY})
check_shape.__doc__ = """Raise `MatchingError(invalid_request)` unless `command` is a command
whose every field has its declared type."""


_TEXT_FIELDS = {cls: tuple(name for name, kind, _ in spec if kind is str)
                for cls, spec in _SPECS.items()}
MAX_UNITS = 10**78 - 1  # the widest integer the tables store (NUMERIC(78,0), as ledger amounts)


def storable(text: str) -> bool:
    """Whether PostgreSQL can store `text`: no NUL character, no lone surrogate (which UTF-8
    cannot encode)."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unstorable_field(command: Command) -> str | None:
    """The first text field of a (shape-checked) command that PostgreSQL could not store. The
    gateway refuses such a command before it reaches the ledger or the journal, where it would
    fail the whole unit of work."""
    for name in _TEXT_FIELDS[type(command)]:
        value = getattr(command, name)
        if value is not None and not storable(value):
            return name
    return None


def market_error(market: Market, fees: FeeSchedule) -> str | None:
    """Why a market's configuration cannot be stored, or None: text PostgreSQL cannot store, one
    asset on both sides, a size beyond `MAX_UNITS`, no fee tier."""
    if not all(storable(t) for t in (market.symbol, market.base_asset, market.quote_asset, *fees.tiers)):
        return "text with a NUL character or a lone surrogate"
    if market.base_asset == market.quote_asset:
        return "base and quote asset must differ"
    if max(market.lot_size, market.quote_per_tick_lot, market.min_notional) > MAX_UNITS:
        return "lot_size, quote_per_tick_lot and min_notional must be below 10^78"
    if not fees.tiers:
        return "at least one fee tier"
    return None


def is_positive_int(value: object) -> bool:
    return type(value) is int and value > 0


def default_tif(order_type: OrderType) -> TimeInForce:
    """GTC for orders with a limit price; IOC for market orders, which never rest."""
    return _GTC if order_type in _LIMIT_PRICED else _IOC


DEFAULT_TIF = {order_type: default_tif(order_type) for order_type in OrderType}  # for hot paths


def uses_budget(side: Side, order_type: OrderType) -> bool:
    """A market (or stop-market) bid is sized by a quote budget, not a quantity."""
    return side is Side.buy and order_type not in _LIMIT_PRICED


_LIMIT = OrderType.limit


def validate_place(cmd: Place, market: Market, fees: FeeSchedule) -> ErrorCode | None:
    """The first reason to reject `cmd`, or None."""
    if (cmd.order_type is _LIMIT and cmd.post_only is False and cmd.display_qty is None
            and cmd.budget is None and cmd.stop_price is None
            and (cmd.tif is None or isinstance(cmd.tif, TimeInForce))
            and type(cmd.qty) is int and cmd.qty > 0 and type(cmd.price) is int and cmd.price > 0
            and cmd.fee_tier in fees.tiers
            and cmd.price * cmd.qty * market.quote_per_tick_lot >= market.min_notional):
        return None  # the common plain limit order passes every check: say so at once
    return first_failure(cmd, market, fees)


def first_failure(cmd: Place, market: Market, fees: FeeSchedule) -> ErrorCode | None:
    """`validate_place` without its shortcut: every check, in the order of the code table."""
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
