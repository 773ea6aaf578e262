"""Order routes under /v1: markets, place / cancel / amend, queries by order id and client order
id, fills, and a depth snapshot with its sequence number.

Order entry (place, cancel, amend) is asynchronous and grouped across requests: each command goes
to its market's group commit (`Trading.submit_grouped`: commands arriving together share ONE
database transaction, in a thread of the market's own, off the event loop) and is answered with its
order's row as that transaction committed it; nothing is answered before the commit. A refusal of
one command is that command's answer only. With several api processes
(custody.api.market_owners), a command for a market another process owns is forwarded there, and
a depth read too (the book is in the owner's memory); order and fill reads are served by every
process from the database.

Quantities and prices cross the API as decimal strings in asset units ("0.5" BTC, "60000" USDT per
BTC) and are converted EXACTLY to lots and ticks; anything not an exact multiple of the lot or tick
is refused (`invalid_quantity` / `invalid_price`), never rounded. Responses carry both the decimal
string and the integer (`*_lots`, `*_ticks`) the engine uses.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import weakref
from typing import Annotated, Any, Literal

import anyio.to_thread
from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from custody.api.deps import Admin, Backend, ContainerDep, Reader
from custody.api.errors import ApiError, responses
from custody.api.ledger_schemas import Money
from custody.api.market_owners import owners_of
from custody.api.paging import PAGED, pager
from custody.api.params import MAX_ID
from custody.money_rules import OWNER_PATTERN
from custody.errors import CustodyError, CustodyErrorCode
from custody.trading import attach
from ledger.amounts import format_amount, parse_amount
from ledger.errors import LedgerError
from ledger.errors import ErrorCode as LedgerCode
from matching.errors import ErrorCode, MatchingError
from matching.fees import FeeSchedule, FeeTier
from matching.model import Amend, Cancel, Command, Market, OrderType, Place, Side, TimeInForce
from matching.service import MarketNotHere, Outcome, Trading, order_id_for
from matching.stp import StpPolicy

router = APIRouter(prefix="/v1", tags=["orders"])
MarketsPage = pager("markets", newest_first=False, default=1000, maximum=1000, key_type=str)
FillsPage = pager("fills", newest_first=False, default=100, maximum=1000)


async def _trading(container: ContainerDep) -> Trading:
    if container.trading is not None:
        return container.trading
    return await anyio.to_thread.run_sync(attach, container)


TradingDep = Annotated[Trading, Depends(_trading)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FeeTierIn(Strict):
    maker_ppm: int = Field(ge=0, le=1_000_000)
    taker_ppm: int = Field(ge=0, le=1_000_000)


class MarketIn(Strict):
    model_config = ConfigDict(json_schema_extra={'examples': [{'symbol': 'BTC-USDT', 'base_asset': 'BTC', 'quote_asset': 'USDT', 'lot_size': 10000, 'quote_per_tick_lot': 1, 'min_notional': 0, 'fees': {'default': {'maker_ppm': 1000, 'taker_ppm': 2000}}, 'default_stp': 'cancel_newest'}]})
    symbol: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,40}$")
    base_asset: str
    quote_asset: str
    lot_size: int = Field(gt=0, description="base minor units per lot")
    quote_per_tick_lot: int = Field(gt=0, description="quote minor units for one lot at one tick")
    min_notional: int = Field(default=0, ge=0, description="quote minor units")
    fees: dict[str, FeeTierIn] = Field(min_length=1)
    default_stp: StpPolicy = StpPolicy.cancel_newest


# An order's `account` is its owner: matching opens `customer:<owner>:<asset>`, so the owner obeys
# the same rule as one named over POST /v1/accounts (custody.money_rules.OWNER_PATTERN): no ':'.
Owner = Field(min_length=1, max_length=100, pattern=OWNER_PATTERN.pattern,
              description="the customer (owner) the order is for: letters, digits, . _ @ + -")


class OrderIn(Strict):
    model_config = ConfigDict(json_schema_extra={'examples': [{'account': 'alice', 'client_order_id': 'alice-0001', 'side': 'buy', 'type': 'limit', 'qty': '0.5', 'price': '60000', 'tif': 'gtc'}]})
    account: str = Owner
    client_order_id: str = Field(min_length=1, max_length=64)
    side: Side
    type: OrderType = OrderType.limit
    qty: str | None = Field(default=None, description="base asset units, e.g. \"0.5\"")
    price: str | None = Field(default=None, description="quote units per whole base unit")
    budget: str | None = Field(default=None, description="market bid: quote units, fees included")
    stop_price: str | None = None
    display_qty: str | None = None
    tif: TimeInForce | None = None
    post_only: bool = False
    stp_group: str | None = Field(default=None, max_length=120)
    stp_policy: StpPolicy | None = None
    fee_tier: str = "default"


# Cancel and amend name an existing order's owner: any owner matching accepted before the owner
# rule must still be able to cancel (matching checks the order belongs to it).
AnyOwner = Field(min_length=1, max_length=120)


class CancelIn(Strict):
    model_config = ConfigDict(json_schema_extra={'examples': [{'account': 'alice'}]})
    account: str = AnyOwner


class AmendIn(Strict):
    model_config = ConfigDict(json_schema_extra={'examples': [{'account': 'alice', 'qty': '0.25'}]})
    account: str = AnyOwner
    qty: str | None = None
    price: str | None = None
    stop_price: str | None = None


class FeeTierOut(BaseModel):
    maker_ppm: int
    taker_ppm: int


class MarketOut(BaseModel):
    symbol: str
    base_asset: str
    quote_asset: str
    lot_size: int
    quote_per_tick_lot: int
    min_notional: int
    default_stp: str
    fees: dict[str, FeeTierOut]
    fee_account_id: int | None


class OrderOut(BaseModel):
    """An order as the engine holds it: decimal strings beside the integer lots and ticks."""

    order_id: str
    market: str
    account: str
    client_order_id: str
    side: str
    type: str
    tif: str | None
    post_only: bool
    state: str
    price: str | None
    price_ticks: int | None
    qty: str | None
    qty_lots: int | None
    filled: str | None
    filled_lots: int
    remaining: str | None
    remaining_lots: int | None
    display_qty: str | None
    stop_price: str | None
    budget: str | None
    quote_traded: str
    fees_paid: str
    hold_id: int | None
    reject_code: str | None
    close_reason: str | None
    seq: int | None
    last_seq: int | None
    created_at: dt.datetime
    updated_at: dt.datetime
    amounts: dict[str, Money] = Field(description="the figures above as {value, minor}, in minor units of the base "
                                                  "asset (qty, filled, remaining, display_qty) or the quote asset "
                                                  "(budget, quote_traded, fees_paid; price and stop_price per whole "
                                                  "base unit, when a whole number of quote minor units); absent when null")


class FillOut(BaseModel):
    id: int
    seq: int
    match_no: int
    maker_order_id: str
    taker_order_id: str
    maker_account: str
    taker_account: str
    taker_side: str
    price: str | None
    price_ticks: int
    qty: str | None
    qty_lots: int
    quote_amount: str
    maker_fee: str
    taker_fee: str
    journal_transaction_id: int | None
    created_at: dt.datetime
    amounts: dict[str, Money] = Field(description="qty (base asset), quote_amount, maker_fee, taker_fee and price "
                                                  "(quote asset, per whole base unit, when a whole number of minor "
                                                  "units) as {value, minor}")


class FillsOut(BaseModel):
    fills: list[FillOut]
    next_after: int | None = Field(description="the fill id to send as `after` for the next page (kept for existing "
                                               "clients; `next_cursor` is the same position as a cursor)")
    next_cursor: str | None = Field(default=None, description="the next page's `cursor`; null on the last page")


class LevelOut(BaseModel):
    price: str | None
    price_ticks: int
    qty: str | None
    qty_lots: int


class DepthOut(BaseModel):
    market: str
    seq: int
    bids: list[LevelOut]
    asks: list[LevelOut]


MARKET = ("market_not_found",)
PLACE = ("invalid_quantity", "invalid_price", "invalid_budget", "invalid_stop_price", "invalid_display_quantity",
         "invalid_time_in_force", "unknown_fee_tier", "below_min_notional", "duplicate_order_id", "hold_failed",
         "account_frozen", "insufficient_funds", "invalid_amount", "excess_precision", "kind_not_permitted",
         "account_closed", "withdrawals_halted", "conflict")
ORDER = ("order_not_found", "order_owner_mismatch", "order_not_open")


class _Units:
    """Exact conversions between decimal strings and the market's lots and ticks."""

    def __init__(self, trading: Trading, symbol: str) -> None:
        row = trading.market(symbol)
        self.market = m = row.market
        ledger = trading.ledger
        self.bd = ledger.get_asset(m.base_asset).decimals
        self.qd = ledger.get_asset(m.quote_asset).decimals
        # price in quote minor units per whole base unit = ticks * tick_num / lot_size
        self.tick_num = m.quote_per_tick_lot * 10**self.bd

    def lots(self, text: str | None, field: str = "qty") -> int | None:
        if text is None:
            return None
        minor = _parse(text, self.bd, ErrorCode.invalid_quantity, field)
        if minor % self.market.lot_size:
            raise MatchingError(ErrorCode.invalid_quantity, f"{field} {text!r} is not a whole number of lots "
                                f"({format_amount(self.market.lot_size, self.bd)})")
        return minor // self.market.lot_size

    def ticks(self, text: str | None, field: str = "price") -> int | None:
        if text is None:
            return None
        minor = _parse(text, self.qd, ErrorCode.invalid_price, field)
        ticks, rest = divmod(minor * self.market.lot_size, self.tick_num)
        if rest:
            raise MatchingError(ErrorCode.invalid_price, f"{field} {text!r} is not a whole number of ticks")
        return ticks

    def quote(self, text: str | None) -> int | None:
        return None if text is None else _parse(text, self.qd, ErrorCode.invalid_budget, "budget")

    def fmt_lots(self, lots: Any) -> str | None:
        return None if lots is None else format_amount(int(lots) * self.market.lot_size, self.bd)

    def fmt_ticks(self, ticks: Any) -> str | None:
        if ticks is None:
            return None
        num = int(ticks) * self.tick_num
        if num % self.market.lot_size == 0:
            return format_amount(num // self.market.lot_size, self.qd)
        return None  # not representable in quote minor units: use the *_ticks field

    def fmt_quote(self, amount: Any) -> str:
        return format_amount(int(amount), self.qd)

    def base_minor(self, lots: Any) -> int | None:
        return None if lots is None else int(lots) * self.market.lot_size

    def quote_minor_per_unit(self, ticks: Any) -> int | None:
        """A price in quote minor units per whole base unit, or None (null, or not a whole number)."""
        if ticks is None:
            return None
        num = int(ticks) * self.tick_num
        return num // self.market.lot_size if num % self.market.lot_size == 0 else None

    def amounts(self, *, base: dict[str, Any], quote: dict[str, Any]) -> dict[str, Money]:
        """{name: Money} of the figures that are not None (base or quote asset minor units)."""
        out = {name: Money.of(int(v), self.bd) for name, v in base.items() if v is not None}
        out.update({name: Money.of(int(v), self.qd) for name, v in quote.items() if v is not None})
        return out


_units_cache: weakref.WeakKeyDictionary[Trading, dict[str, _Units]] = weakref.WeakKeyDictionary()


def _units_sync(t: Trading, symbol: str) -> _Units:
    """The market's `_Units` (a market and its assets' decimals never change: built once)."""
    cache = _units_cache.setdefault(t, {})
    units = cache.get(symbol)
    if units is None:
        units = cache[symbol] = _Units(t, symbol)
    return units


async def _units(t: Trading, symbol: str) -> _Units:
    """`_units_sync` on the event loop: the first use of a market reads the database in a thread."""
    units = _units_cache.get(t, {}).get(symbol)
    return units if units is not None else await anyio.to_thread.run_sync(_units_sync, t, symbol)


async def _routed(request: Request, t: Trading, symbol: str) -> Response | None:
    """The owner's answer when another api process owns the market (custody.api.market_owners);
    None when this process serves it."""
    owners = owners_of(t)
    if owners is None or t.holds(symbol):
        return None
    await _units(t, symbol)  # market_not_found, answered here
    return await owners.route(request, symbol)


async def _entry(request: Request, t: Trading, symbol: str, command: Command) -> Outcome | Response:
    """Run `command` in the market's next group commit; the owner's answer instead when the market
    is (or, meanwhile, went) elsewhere."""
    while True:
        try:
            return await asyncio.wrap_future(t.submit_grouped(symbol, command))
        except MarketNotHere:
            owners = owners_of(t)
            if owners is None:
                raise
            answer = await owners.route(request, symbol)
            if answer is not None:
                return answer


def _parse(text: str, decimals: int, code: ErrorCode, field: str) -> int:
    try:
        return parse_amount(text, decimals)
    except LedgerError as exc:
        raise MatchingError(code, f"{field}: {exc.message}") from None


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def _order_out(u: _Units, row: Any) -> dict:
    return {
        "order_id": row.id, "market": row.market, "account": row.account,
        "client_order_id": row.client_order_id, "side": row.side, "type": row.order_type,
        "tif": row.tif, "post_only": row.post_only, "state": row.state,
        "price": u.fmt_ticks(row.price), "price_ticks": _int(row.price),
        "qty": u.fmt_lots(row.qty), "qty_lots": _int(row.qty),
        "filled": u.fmt_lots(row.filled), "filled_lots": int(row.filled),
        "remaining": u.fmt_lots(row.remaining), "remaining_lots": _int(row.remaining),
        "display_qty": u.fmt_lots(row.display_qty), "stop_price": u.fmt_ticks(row.stop_price),
        "budget": None if row.budget is None else u.fmt_quote(row.budget),
        "quote_traded": u.fmt_quote(row.quote_traded), "fees_paid": u.fmt_quote(row.fees_paid),
        "hold_id": row.hold_id, "reject_code": row.reject_code, "close_reason": row.close_reason,
        "seq": row.seq, "last_seq": row.last_seq, "created_at": row.created_at, "updated_at": row.updated_at,
        "amounts": u.amounts(
            base={"qty": u.base_minor(row.qty), "filled": u.base_minor(row.filled),
                  "remaining": u.base_minor(row.remaining), "display_qty": u.base_minor(row.display_qty)},
            quote={"price": u.quote_minor_per_unit(row.price), "stop_price": u.quote_minor_per_unit(row.stop_price),
                   "budget": row.budget, "quote_traded": row.quote_traded, "fees_paid": row.fees_paid}),
    }


async def _answer(t: Trading, u: _Units, outcome: Outcome, *, refuse: bool) -> dict:
    """The order after a command, as its unit committed it. A refused cancel / amend is an error; a
    refused order is a row."""
    if outcome.code is not None and (refuse or outcome.seq is None and not _is_rejection(outcome)):
        _raise(outcome.code)
    row = outcome.row
    if row is None:  # not written by this unit (a retried client order id): read it
        row = await anyio.to_thread.run_sync(t.order, outcome.order_id)
    if row is None:
        raise MatchingError(ErrorCode.order_not_found)
    return _order_out(u, row)


def _is_rejection(outcome: Outcome) -> bool:
    """Refusals recorded as a rejected order (the client order id is used up) rather than errors."""
    return outcome.code == LedgerCode.insufficient_funds.value


def _raise(code: str) -> None:
    if code == CustodyErrorCode.account_frozen.value:  # Trading.blocked_code (custody.trading)
        raise CustodyError(CustodyErrorCode.account_frozen, "an account of the order's owner in this market is "
                           "frozen: a credit of it was reorged out after finality; an operator must resolve the "
                           "incident first")
    try:
        raise MatchingError(ErrorCode(code))
    except ValueError:
        raise LedgerError(LedgerCode(code)) from None


@router.post("/markets", status_code=201, response_model=MarketOut,
             responses=responses("asset_not_found", "market_assets_must_be_different", "conflict"))
def create_market(body: MarketIn, t: TradingDep, _: Admin) -> dict:
    if body.base_asset == body.quote_asset:
        raise MatchingError(ErrorCode.market_assets_must_be_different, "base and quote asset must differ")
    fees = FeeSchedule({name: FeeTier(f.maker_ppm, f.taker_ppm) for name, f in body.fees.items()})
    try:
        market = Market(body.symbol, body.base_asset, body.quote_asset, body.lot_size,
                        body.quote_per_tick_lot, body.min_notional)
    except ValueError as exc:
        raise MatchingError(ErrorCode.invalid_request, str(exc)) from None
    t.create_market(market, fees, body.default_stp)
    return _market_out(t, body.symbol)


def _market_out(t: Trading, symbol: str) -> dict:
    row = t.market(symbol)
    m = row.market
    return {"symbol": m.symbol, "base_asset": m.base_asset, "quote_asset": m.quote_asset,
            "lot_size": m.lot_size, "quote_per_tick_lot": m.quote_per_tick_lot,
            "min_notional": m.min_notional, "default_stp": row.default_stp.value,
            "fees": {k: {"maker_ppm": v[0], "taker_ppm": v[1]} for k, v in row.fees.to_record().items()},
            "fee_account_id": row.fee_account_id}


@router.get("/markets", response_model=list[MarketOut], responses=responses(*PAGED))
def list_markets(t: TradingDep, _: Reader, page: MarketsPage) -> list[dict]:
    """Markets by symbol (paged: `X-Next-Cursor`)."""
    return [_market_out(t, r.market.symbol) for r in page.slice(t.markets(), key=lambda r: r.market.symbol)]


@router.post("/markets/{symbol}/orders", status_code=201, response_model=OrderOut,
             responses=responses(*MARKET, *PLACE))
async def place_order(symbol: str, body: OrderIn, t: TradingDep, _: Backend, request: Request,
                      response: Response) -> Any:
    """Place an order. A retry with the same client order id answers 200 with the existing order.
    An order refused for funds, post-only crossing or self-trade prevention is answered 201 in
    state `rejected` with its `reject_code` (its client order id is used up)."""
    if (routed := await _routed(request, t, symbol)) is not None:
        return routed
    u = await _units(t, symbol)
    command = Place(
        order_id_for(symbol, body.account, body.client_order_id), body.account, body.client_order_id, body.side,
        order_type=body.type, qty=u.lots(body.qty), price=u.ticks(body.price), budget=u.quote(body.budget),
        stop_price=u.ticks(body.stop_price, "stop_price"), display_qty=u.lots(body.display_qty, "display_qty"),
        tif=body.tif, post_only=body.post_only, stp_group=body.stp_group, stp_policy=body.stp_policy,
        fee_tier=body.fee_tier)
    outcome = await _entry(request, t, symbol, command)
    if isinstance(outcome, Response):
        return outcome
    if outcome.existed:
        response.status_code = 200
    return await _answer(t, u, outcome, refuse=False)


@router.post("/markets/{symbol}/orders/{order_id}/cancel", response_model=OrderOut,
             responses=responses(*MARKET, *ORDER))
async def cancel_order(symbol: str, order_id: str, body: CancelIn, t: TradingDep, _: Backend,
                       request: Request) -> Any:
    if (routed := await _routed(request, t, symbol)) is not None:
        return routed
    u = await _units(t, symbol)
    outcome = await _entry(request, t, symbol, Cancel(order_id, body.account))
    return outcome if isinstance(outcome, Response) else await _answer(t, u, outcome, refuse=True)


@router.post("/markets/{symbol}/orders/{order_id}/amend", response_model=OrderOut,
             responses=responses(*MARKET, *ORDER, *PLACE, "order_not_amendable"))
async def amend_order(symbol: str, order_id: str, body: AmendIn, t: TradingDep, _: Backend,
                      request: Request) -> Any:
    if (routed := await _routed(request, t, symbol)) is not None:
        return routed
    u = await _units(t, symbol)
    command = Amend(order_id, body.account, qty=u.lots(body.qty), price=u.ticks(body.price),
                    stop_price=u.ticks(body.stop_price, "stop_price"))
    outcome = await _entry(request, t, symbol, command)
    return outcome if isinstance(outcome, Response) else await _answer(t, u, outcome, refuse=True)


@router.get("/markets/{symbol}/orders/{order_id}", response_model=OrderOut,
            responses=responses(*MARKET, "order_not_found"))
def get_order(symbol: str, order_id: str, t: TradingDep, _: Reader) -> dict:
    u = _units_sync(t, symbol)
    row = t.order(order_id)
    if row is None or row.market != symbol:
        raise MatchingError(ErrorCode.order_not_found)
    return _order_out(u, row)


@router.get("/markets/{symbol}/orders", response_model=OrderOut,
            responses=responses(*MARKET, "order_not_found"))
def get_order_by_client_id(symbol: str, t: TradingDep, _: Reader, account: str = Query(),
                           client_order_id: str = Query()) -> dict:
    u = _units_sync(t, symbol)
    row = t.order_by_client_id(symbol, account, client_order_id)
    if row is None:
        raise MatchingError(ErrorCode.order_not_found)
    return _order_out(u, row)


@router.get("/markets/{symbol}/fills", response_model=FillsOut, responses=responses(*MARKET, *PAGED))
def list_fills(symbol: str, t: TradingDep, _: Reader, page: FillsPage, order_id: str | None = None,
               account: str | None = None,
               after: int | None = Query(default=None, ge=0, le=MAX_ID,
                                         description="older form of `cursor`: the last fill id of the previous page")) -> dict:
    """Fills oldest first (paged: `cursor`, or the older `after`; not both)."""
    if after is not None and page.key is not None:
        raise ApiError(422, "invalid_request", "send either cursor or after, not both")
    u = _units_sync(t, symbol)
    rows = page.finish(t.fills(symbol, order_id=order_id, account=account, after=page.key or after or 0, limit=page.fetch),
                       key=lambda r: r.id)
    return {"fills": [{
        "id": r.id, "seq": r.seq, "match_no": r.match_no, "maker_order_id": r.maker_order_id,
        "taker_order_id": r.taker_order_id, "maker_account": r.maker_account,
        "taker_account": r.taker_account, "taker_side": r.taker_side,
        "price": u.fmt_ticks(r.price_ticks), "price_ticks": int(r.price_ticks),
        "qty": u.fmt_lots(r.qty_lots), "qty_lots": int(r.qty_lots),
        "quote_amount": u.fmt_quote(r.quote_amount), "maker_fee": u.fmt_quote(r.maker_fee),
        "taker_fee": u.fmt_quote(r.taker_fee), "journal_transaction_id": r.journal_transaction_id,
        "created_at": r.created_at,
        "amounts": u.amounts(base={"qty": u.base_minor(r.qty_lots)},
                             quote={"price": u.quote_minor_per_unit(r.price_ticks), "quote_amount": r.quote_amount,
                                    "maker_fee": r.maker_fee, "taker_fee": r.taker_fee})} for r in rows],
        "next_after": rows[-1].id if page.next_cursor else None, "next_cursor": page.next_cursor}


@router.get("/markets/{symbol}/depth", response_model=DepthOut, responses=responses(*MARKET))
async def depth(symbol: str, t: TradingDep, _: Reader, request: Request,
                levels: int = Query(default=50, ge=1, le=1000)) -> Any:
    if (routed := await _routed(request, t, symbol)) is not None:
        return routed
    u = await _units(t, symbol)
    try:
        seq, bids, asks = await anyio.to_thread.run_sync(t.depth, symbol, levels)
    except MarketNotHere:  # released meanwhile: the new owner answers
        if (routed := await _routed(request, t, symbol)) is not None:
            return routed
        seq, bids, asks = await anyio.to_thread.run_sync(t.depth, symbol, levels)

    def side(levels_: list) -> list[dict]:
        return [{"price": u.fmt_ticks(p), "price_ticks": p, "qty": u.fmt_lots(q), "qty_lots": q}
                for p, q in levels_]

    return {"market": symbol, "seq": seq, "bids": side(bids), "asks": side(asks)}


__all__ = ["router", "Literal"]
