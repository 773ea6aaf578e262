"""Convert routes under /v1 (custody.convert): quotes, their acceptance, the operator's prices and
the house's liquidity.

- `POST /v1/quotes` (backend): a quote for a customer account selling its asset for `to_asset`,
  either exactly `from_amount` (the fee included) or enough to receive at least `to_amount`. It
  states the fee (rounded up), the payout (rounded down), the exact rate, what rounding kept back
  and the accounts each leg will touch; it expires after `CONVERT_QUOTE_TTL_SECONDS`.
- `POST /v1/quotes/{quote_id}/accept` (backend, the key that asked): books the quote's ONE linked
  transaction, once; a replay of the idempotency key answers 200 with the same transaction.
- `GET /v1/quotes/{quote_id}` (a backend reads its own quotes; operators and auditors every one).
- `POST /v1/convert/prices` (operator): the price of a pair without a market, and the reference a
  market's book is checked against until the market trades (written with its audit row by the
  database function `convert_price_set`).
- `GET /v1/convert/liquidity/{asset}` (operator, auditor): the house's liquidity account of the
  asset (opened if it was not) and its balance; fund or drain it with a treasury adjustment.
"""
from __future__ import annotations

import datetime as dt
from fractions import Fraction

from fastapi import APIRouter, Path, Response
from pydantic import BaseModel, ConfigDict, Field

from custody.api.deps import Auditor, Backend, ContainerDep, Operator, Reader
from custody.api.errors import responses
from custody.api.ledger_schemas import Key, Money
from custody.api.params import Id, IdPath
from custody.auth import Role
from custody.container import Container
from custody.convert.service import Convert, QuoteView
from custody.errors import CustodyError, CustodyErrorCode
from custody.money_rules import caller_key
from custody.trading import attach
from ledger.amounts import format_amount, parse_amount

router = APIRouter(prefix="/v1", tags=["convert"])

QUOTE_CODES = ("account_not_found", "asset_not_found", "invalid_amount", "excess_precision", "kind_not_permitted",
               "account_closed", "account_frozen", "convert_pair_unavailable", "convert_book_unreliable",
               "convert_depth_insufficient",
               "convert_amount_too_small", "insufficient_liquidity", "idempotency_conflict", "conflict")
ACCEPT_CODES = ("quote_not_found", "quote_already_used", "quote_expired", "idempotency_conflict", "account_frozen",
                "insufficient_funds", "insufficient_liquidity", "account_closed", "limit_exceeded", "conflict")
AssetPath = Path(min_length=1, max_length=32, pattern=r"^[A-Z0-9][A-Z0-9_.-]*$")


class QuoteIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"idempotency_key": "convert-881-quote", "account_id": 7, "to_asset": "BTC", "from_amount": "100.00"}]})
    idempotency_key: str = Key
    account_id: Id = Field(description="the customer account that sells (its asset is the from-asset)")
    to_asset: str = Field(min_length=1, max_length=32, pattern=r"^[A-Z0-9][A-Z0-9_.-]*$")
    from_amount: str | None = Field(default=None, max_length=100,
                                    description="sell exactly this much, the fee included (decimal string)")
    to_amount: str | None = Field(default=None, max_length=100,
                                  description="or receive at least this much (decimal string); not both")


class Ratio(BaseModel):
    numerator: str
    denominator: str


class QuoteOut(BaseModel):
    id: int
    state: str = Field(description="open or accepted")
    account_id: int
    receive_account_id: int = Field(description="the owner's customer account in the to-asset")
    from_asset: str
    to_asset: str
    from_amount: Money = Field(description="debited from the customer in total")
    fee: Money = Field(description="from-asset, to fee income; rounded up")
    net: Money = Field(description="from-asset converted: from_amount - fee = cost + rounding")
    to_amount: Money = Field(description="credited to the customer: floor(net * rate), rounded down")
    cost: Money = Field(description="from-asset, to the house's liquidity: ceil(to_amount / rate), rounded up")
    rounding: Money = Field(description="from-asset minor units the payout's rounding left (net - cost), booked to "
                                        "rounding_account_id")
    rate: Ratio = Field(description="exact to-asset minor units per from-asset minor unit, after the spread")
    price: str | None = Field(description="the rate as quote-asset units per base unit of the pair, when exact")
    remainder: Ratio = Field(description="the part of one from-asset minor unit (< 1) the house keeps beyond the "
                                         "rounding: cost - to_amount / rate")
    fee_ppm: int
    spread_ppm: int
    source: str = Field(description="book:<market symbol> or operator")
    liquidity_in_account_id: int
    liquidity_out_account_id: int
    fee_account_id: int
    rounding_account_id: int
    expires_at: dt.datetime
    transaction_id: int | None
    created_at: dt.datetime


class AcceptIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"idempotency_key": "convert-881"}]})
    idempotency_key: str = Key


class AcceptOut(BaseModel):
    transaction_id: int
    created: bool = Field(description="false: a replay of the key; nothing was booked now")
    quote: QuoteOut


class PriceIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"base_asset": "BTC", "quote_asset": "EUR", "price": "58000.00"}]})
    base_asset: str = Field(min_length=1, max_length=32, pattern=r"^[A-Z0-9][A-Z0-9_.-]*$")
    quote_asset: str = Field(min_length=1, max_length=32, pattern=r"^[A-Z0-9][A-Z0-9_.-]*$")
    price: str = Field(min_length=1, max_length=100, description="quote-asset units per whole base unit")


class PriceOut(BaseModel):
    base_asset: str
    quote_asset: str
    price: Money = Field(description="quote-asset per whole base unit")
    set_by: str
    updated_at: dt.datetime


class LiquidityOut(BaseModel):
    asset: str
    account_id: int
    name: str
    posted: Money
    held: Money
    available: Money


def _convert(c: Container) -> Convert:
    """The process's convert service, built on the first request (like `trading`)."""
    if c.convert is None:
        c.convert = Convert(c.engine, c.ledger, c.settings)
    return c.convert


def _ratio(value: Fraction) -> Ratio:
    return Ratio(numerator=str(value.numerator), denominator=str(value.denominator))


def _quote_out(c: Container, q: QuoteView) -> QuoteOut:
    fd, td = _convert(c).decimals(q.from_asset), _convert(c).decimals(q.to_asset)
    f = q.figures
    return QuoteOut(
        id=q.id, state=q.state, account_id=q.customer_account_id, receive_account_id=q.receive_account_id,
        from_asset=q.from_asset, to_asset=q.to_asset, from_amount=Money.of(q.from_amount, fd),
        fee=Money.of(q.fee, fd), net=Money.of(f.net, fd), to_amount=Money.of(q.to_amount, td),
        cost=Money.of(f.cost, fd), rounding=Money.of(f.rounding, fd), rate=_ratio(q.rate), price=_price(c, q),
        remainder=_ratio(f.remainder), fee_ppm=q.fee_ppm, spread_ppm=q.spread_ppm,
        source=q.source, liquidity_in_account_id=q.liquidity_in_account_id,
        liquidity_out_account_id=q.liquidity_out_account_id, fee_account_id=q.fee_account_id,
        rounding_account_id=q.rounding_account_id,
        expires_at=q.expires_at, transaction_id=q.transaction_id, created_at=q.created_at)


def _price(c: Container, q: QuoteView) -> str | None:
    """The rate as the pair's price: quote-asset units per whole base unit of the market (book) or
    of the operator's price, when it is a whole number of quote minor units (else null)."""
    if q.source.startswith("book:"):
        books = c.trading if c.trading is not None else attach(c)
        base = books.market(q.source.removeprefix("book:")).market.base_asset
    else:
        price = _convert(c).price(q.from_asset, q.to_asset)
        if price is None:
            return None
        base = price.base_asset
    selling_base = base == q.from_asset
    quote = q.to_asset if selling_base else q.from_asset
    per_base_minor = q.rate if selling_base else 1 / q.rate
    value = per_base_minor * 10 ** _convert(c).decimals(base)
    if value.denominator != 1:
        return None
    return format_amount(value.numerator, _convert(c).decimals(quote))


@router.post("/quotes", response_model=QuoteOut, status_code=201, responses=responses(*QUOTE_CODES))
def create_quote(body: QuoteIn, c: ContainerDep, who: Backend, response: Response) -> QuoteOut:
    """Quote a conversion for a customer account; nothing moves until it is accepted. A replay of
    the idempotency key with the same request answers 200 with the quote it made."""
    convert = _convert(c)
    account = c.ledger.get_account(body.account_id)
    if account.kind.value != "customer":
        raise CustodyError(CustodyErrorCode.kind_not_permitted,
                           f"role {who.role.value} may not convert from a {account.kind.value} account",
                           account_id=account.id, action="debit", kind=account.kind.value)
    to_decimals, from_decimals = convert.decimals(body.to_asset), convert.decimals(account.asset)
    from_amount = None if body.from_amount is None else parse_amount(body.from_amount, from_decimals)
    to_amount = None if body.to_amount is None else parse_amount(body.to_amount, to_decimals)
    books = c.trading if c.trading is not None else attach(c)
    quote, created = convert.quote(caller=who.name, key=caller_key(who.name, body.idempotency_key),
                                   account_id=body.account_id, to_asset=body.to_asset, from_amount=from_amount,
                                   to_amount=to_amount, books=books)
    if not created:
        response.status_code = 200
    return _quote_out(c, quote)


@router.get("/quotes/{quote_id}", response_model=QuoteOut, responses=responses("quote_not_found"))
def get_quote(quote_id: IdPath, c: ContainerDep, who: Reader) -> QuoteOut:
    """A quote: a backend reads the quotes its own key asked for; operators and auditors any."""
    caller = who.name if who.role is Role.backend else None
    return _quote_out(c, _convert(c).get(quote_id, caller=caller))


@router.post("/quotes/{quote_id}/accept", response_model=AcceptOut, status_code=201,
             responses=responses(*ACCEPT_CODES))
def accept_quote(quote_id: IdPath, body: AcceptIn, c: ContainerDep, who: Backend, response: Response) -> AcceptOut:
    """Book the quote: ONE linked transaction (customer -> liquidity, liquidity -> customer,
    customer -> fee income). A replay of the key answers 200 with the original transaction."""
    quote, created = _convert(c).accept(caller=who.name, quote_id=quote_id, key=caller_key(who.name, body.idempotency_key))
    if not created:
        response.status_code = 200
    assert quote.transaction_id is not None
    return AcceptOut(transaction_id=quote.transaction_id, created=created, quote=_quote_out(c, quote))


@router.post("/convert/prices", response_model=PriceOut, responses=responses("asset_not_found", "invalid_amount",
                                                                              "excess_precision", "conflict"))
def set_price(body: PriceIn, c: ContainerDep, who: Operator) -> PriceOut:
    """Set the price of a pair without a market (audited as `api:<the caller's name>`, the actor every
    route names; the database refuses any other). A pair with a market is priced from its book."""
    quote_decimals = c.ledger.get_asset(body.quote_asset).decimals
    c.ledger.get_asset(body.base_asset)
    price = _convert(c).set_price(by=f"api:{who.name}", base=body.base_asset, quote=body.quote_asset,
                                  price_minor=parse_amount(body.price, quote_decimals))
    return PriceOut(base_asset=price.base_asset, quote_asset=price.quote_asset,
                    price=Money.of(price.quote_minor_per_base_unit, quote_decimals), set_by=price.set_by,
                    updated_at=price.updated_at)


@router.get("/convert/liquidity/{asset}", response_model=LiquidityOut, responses=responses("asset_not_found"))
def liquidity(c: ContainerDep, _: Auditor, asset: str = AssetPath) -> LiquidityOut:
    """The house's liquidity account of `asset` (`convert:liquidity:<asset>`, opened if it was not)
    and its balance. Fund or drain it with a treasury adjustment (`POST /v1/treasury/adjustments`)."""
    decimals = c.ledger.get_asset(asset).decimals
    account = _convert(c).open_accounts(asset)
    b = c.ledger.balance(account.id)
    return LiquidityOut(asset=asset, account_id=account.id, name=account.name, posted=Money.of(b.posted, decimals),
                        held=Money.of(b.held, decimals), available=Money.of(b.available, decimals))
