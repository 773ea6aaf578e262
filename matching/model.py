"""Market reference data, order vocabulary, the commands the sequencer journals, and the live Order.

Units (all Python `int`, never float):

- A price is an integer number of TICKS; a quantity an integer number of LOTS.
- `Market.lot_size` is the base asset's minor units per lot:   base_amount = qty_lots * lot_size.
- `Market.quote_per_tick_lot` is the quote minor units paid for ONE lot at a price of ONE tick:
      quote_amount = price_ticks * qty_lots * quote_per_tick_lot.
  Both are exact integer products, so settlement never rounds. The market's tick size in the usual
  sense (quote minor units per whole base unit per tick) is
  `quote_per_tick_lot * base_scale / lot_size`; the market defines the integers so this is exact.
  Example, BTC/USDT with satoshis (1e8) and USDT micro-units (1e6), tick 0.01 USDT, lot 0.0001 BTC:
  lot_size = 10_000 sat, quote_per_tick_lot = 1; 60,000 USDT = 6_000_000 ticks, 0.5 BTC = 5_000 lots,
  quote = 6_000_000 * 5_000 * 1 = 30_000_000_000 micro-USDT = 30,000 USDT.
- `Market.min_notional` is in quote minor units; it is checked at the limit price (or against a
  market bid's budget). A market ask has no price, so it has no notional check.
"""
from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, fields
from typing import Union

from matching.states import OrderState
from matching.stp import StpPolicy


class Side(str, enum.Enum):
    """buy = bid (pays quote, receives base); sell = ask (pays base, receives quote)."""

    buy = "buy"
    sell = "sell"

    @property
    def opposite(self) -> "Side":
        return Side.sell if self is Side.buy else Side.buy


class OrderType(str, enum.Enum):
    """limit rests at its price; market never rests; stop / stop_limit wait for a trigger."""

    limit = "limit"
    market = "market"
    stop = "stop"              # becomes a market order when triggered
    stop_limit = "stop_limit"  # becomes a limit order when triggered


class TimeInForce(str, enum.Enum):
    """GTC rests until cancelled; IOC takes what it can now; FOK takes all now or nothing."""

    gtc = "gtc"
    ioc = "ioc"
    fok = "fok"


@dataclass(frozen=True)
class Market:
    """Reference data the matcher reads; see the module docstring for the unit convention."""

    symbol: str
    base_asset: str
    quote_asset: str
    lot_size: int
    quote_per_tick_lot: int
    min_notional: int = 0

    def __post_init__(self) -> None:
        for name in ("lot_size", "quote_per_tick_lot"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if type(self.min_notional) is not int or self.min_notional < 0:
            raise ValueError(f"min_notional must be a non-negative int, got {self.min_notional!r}")

    def quote_amount(self, price_ticks: int, qty_lots: int) -> int:
        """Quote minor units for `qty_lots` at `price_ticks` (exact)."""
        return price_ticks * qty_lots * self.quote_per_tick_lot

    def base_amount(self, qty_lots: int) -> int:
        """Base minor units in `qty_lots` (exact)."""
        return qty_lots * self.lot_size

    def to_record(self) -> dict:
        return asdict(self)


# Commands: what the sequencer stamps and journals. Frozen, plain values, JSON-codable. Slotted:
# a command is read field by field on the hot path, and a slotted one is one compact object.

@dataclass(frozen=True, slots=True)
class Place:
    """Enter a new order. The caller chooses `order_id` (the gateway's row id, used to key its hold).

    `qty` is lots (absent for a market bid, which carries `budget` in quote minor units instead,
    fees included). `price` is the limit in ticks (limit and stop_limit only). `tif` defaults to
    GTC for limits and IOC for market orders. `display_qty` makes a resting limit an iceberg.
    `stp_group` defaults to the account; `stp_policy` to the engine default; `fee_tier` names a
    tier of the engine's `FeeSchedule`.
    """

    order_id: str
    account: str
    client_order_id: str
    side: Side
    order_type: OrderType = OrderType.limit
    qty: int | None = None
    price: int | None = None
    tif: TimeInForce | None = None
    post_only: bool = False
    display_qty: int | None = None
    stop_price: int | None = None
    budget: int | None = None
    stp_group: str | None = None
    stp_policy: StpPolicy | None = None
    fee_tier: str = "default"


@dataclass(frozen=True, slots=True)
class Cancel:
    """Cancel an open order (resting, untriggered, or triggered but not yet activated)."""

    order_id: str
    account: str


@dataclass(frozen=True, slots=True)
class Amend:
    """Change an open order's total quantity (`qty`, lots), limit `price` or `stop_price`.

    Reducing quantity at the same price keeps queue priority. A price change or a quantity
    increase loses it: the order leaves the book and re-enters at the back of its (new) level,
    matching first if the new price crosses. `qty` is the new TOTAL quantity and must exceed what
    has already filled. A bid whose hold must grow needs its hold topped up BEFORE the amend is
    sequenced; `OrderAmended.hold_required` states the new total.
    """

    order_id: str
    account: str
    qty: int | None = None
    price: int | None = None
    stop_price: int | None = None


@dataclass(frozen=True, slots=True)
class ActivateTriggered:
    """The money layer placed the hold for a triggered stop: enter it as a new order."""

    order_id: str


@dataclass(frozen=True, slots=True)
class RejectTriggered:
    """The money layer could not place the hold for a triggered stop: reject it."""

    order_id: str


@dataclass(frozen=True, slots=True)
class Evict:
    """The money layer cannot pay the order's owner for a fill (the account a fill would credit is
    closed), or may not debit the account a fill would take from (blocked: custody's reorg freeze):
    cancel the open order before a command that could trade with it is sequenced."""

    order_id: str


Command = Union[Place, Cancel, Amend, ActivateTriggered, RejectTriggered, Evict]
_COMMANDS = {cls.__name__: cls
             for cls in (Place, Cancel, Amend, ActivateTriggered, RejectTriggered, Evict)}
_ENUM_FIELDS = {"side": Side, "order_type": OrderType, "tif": TimeInForce,
                "stp_policy": StpPolicy}


# Per command class: its name and field names, read once (fields() per call cost a third of
# writing a journal record).
_RECORD_FIELDS = {cls: (cls.__name__, tuple(f.name for f in fields(cls))) for cls in _COMMANDS.values()}


def command_to_record(command: Command) -> dict:
    """A JSON-ready dict for the journal: enum values as strings, the class name under `type`."""
    name, names = _RECORD_FIELDS[type(command)]
    record = {"type": name}
    for field_name in names:
        value = getattr(command, field_name)
        record[field_name] = value.value if isinstance(value, enum.Enum) else value
    return record


def command_from_record(record: dict) -> Command:
    """Inverse of `command_to_record`."""
    data = dict(record)
    cls = _COMMANDS[data.pop("type")]
    for name, enum_cls in _ENUM_FIELDS.items():
        if data.get(name) is not None:
            data[name] = enum_cls(data[name])
    return cls(**data)


def __getattr__(name: str) -> object:
    """`matching.model.Order` still names the order class, which lives in `matching.order` (the
    compiled core compiles that module on its own, see `matching.compiled`)."""
    if name == "Order":
        from matching.order import Order
        return Order
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
