"""Convert routes under /v1 (custody.convert): quotes, their acceptance, the operator's prices and
the house's liquidity.

- `POST /v1/quotes` (backend): a quote for a customer account selling its asset for `to_asset`,
  either exactly `from_amount` (the fee included) or enough to receive at least `to_amount`. It
  states the fee (rounded up), the payout (rounded down), the exact rate, what rounding kept back
  and the accounts each leg will touch; it expires after `CONVERT_QUOTE_TTL_SECONDS`.
- `POST /v1/quotes/{quote_id}/accept` (backend, the key that asked): books the quote's ONE linked
  transaction, once; a replay of the idempotency key answers 200 with the same transaction.
- `GET /v1/quotes/{quote_id}` (a backend reads its own quotes; operators and auditors every one).
- `POST /v1/convert/prices` (operator): PROPOSE the price of a pair (the price of a pair without a
  market, and the band every book quote of a pair with one must stay within). Nothing counts yet:
  the answer is the change (`proposed`, expiring in 10 minutes) with the payload to sign.
- `GET /v1/convert/prices/changes/{id}/approval-payload` (operator, auditor): what an operator signs
  (kind `convert-price`: id, pair, price, proposer, expiry).
- `POST /v1/convert/prices/changes/{id}/approve` (operator; body `{"comment", "signature"}`, the
  key the caller's own): stores the verified signature (`signed`). The worker's `convert-prices`
  job verifies it again against its own approver keys and sets the price (`applied`) through
  `convert_price_set`, which the api's database role may not call (migration 0056).
- `GET /v1/convert/prices/changes/{id}` (operator, auditor): the change and its outcome.
- `GET /v1/convert/liquidity/{asset}` (operator, auditor): the house's liquidity account of the
  asset (opened if it was not) and its balance; fund or drain it with a treasury adjustment.
"""
from __future__ import annotations

import base64
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
from custody.api.withdrawal_routes import ApproveIn, _signature
from custody.convert.prices import PriceChangeView, payload as price_payload
from custody.convert.service import Convert, QuoteView
from custody.errors import CustodyError, CustodyErrorCode
from custody.money_rules import caller_key
from custody.trading import attach
from ledger.amounts import format_amount, parse_amount
from signer.approvals import b64url, webauthn_challenge

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
        {"idempotency_key": "price-btc-eur-0412", "base_asset": "BTC", "quote_asset": "EUR", "price": "58000.00"}]})
    idempotency_key: str = Key
    base_asset: str = Field(min_length=1, max_length=32, pattern=r"^[A-Z0-9][A-Z0-9_.-]*$")
    quote_asset: str = Field(min_length=1, max_length=32, pattern=r"^[A-Z0-9][A-Z0-9_.-]*$")
    price: str = Field(min_length=1, max_length=100, description="quote-asset units per whole base unit")


class PriceChangeOut(BaseModel):
    id: int
    state: str = Field(description="proposed, signed (awaiting the worker), applied (the price counts) or refused")
    base_asset: str
    quote_asset: str
    price: Money = Field(description="quote-asset per whole base unit")
    proposed_by: str
    signed_by: str | None
    refusal: str | None = Field(description="why the worker refused it (expired, superseded by change N, a signature "
                                            "its keys do not verify)")
    expires_at: dt.datetime
    created_at: dt.datetime


class PriceChangePayloadOut(BaseModel):
    """What an operator signs. `payload` is the exact text (UTF-8), `payload_base64` its bytes,
    `challenge` the WebAuthn challenge (base64url of SHA-256 of the bytes)."""

    change_id: int
    state: str
    payload: str
    payload_base64: str
    challenge: str


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


PRICE_SIGN_CODES = ("price_change_not_found", "invalid_state", "price_change_expired", "approval_signature_required",
                    "approval_signature_malformed", "approver_unknown", "approval_scheme_mismatch",
                    "approval_signature_invalid", "approver_not_caller", "conflict")


def _change_out(c: Container, change: PriceChangeView) -> PriceChangeOut:
    decimals = c.ledger.get_asset(change.quote_asset).decimals
    return PriceChangeOut(id=change.id, state=change.state, base_asset=change.base_asset, quote_asset=change.quote_asset,
                          price=Money.of(change.quote_minor_per_base_unit, decimals), proposed_by=change.proposed_by,
                          signed_by=change.signed_by, refusal=change.refusal, expires_at=change.expires_at,
                          created_at=change.created_at)


@router.post("/convert/prices", response_model=PriceChangeOut, status_code=201,
             responses=responses("asset_not_found", "invalid_amount", "excess_precision", "idempotency_conflict",
                                 "conflict"))
def propose_price(body: PriceIn, c: ContainerDep, who: Operator, response: Response) -> PriceChangeOut:
    """Propose the price of a pair; it counts once an operator signed it (`.../approve`) and the
    worker set it. A replay of the idempotency key answers 200 with the change it made."""
    quote_decimals = c.ledger.get_asset(body.quote_asset).decimals
    c.ledger.get_asset(body.base_asset)
    change = c.price_changes.propose(caller_key(who.name, body.idempotency_key), by=f"api:{who.name}",
                                     base=body.base_asset, quote=body.quote_asset,
                                     price_minor=parse_amount(body.price, quote_decimals))
    if not change.created:
        response.status_code = 200
    return _change_out(c, change)


@router.get("/convert/prices/changes/{change_id}", response_model=PriceChangeOut,
            responses=responses("price_change_not_found"))
def get_price_change(change_id: IdPath, c: ContainerDep, _: Auditor) -> PriceChangeOut:
    return _change_out(c, c.price_changes.get(change_id))


@router.get("/convert/prices/changes/{change_id}/approval-payload", response_model=PriceChangePayloadOut,
            responses=responses("price_change_not_found"))
def get_price_payload(change_id: IdPath, c: ContainerDep, _: Auditor) -> PriceChangePayloadOut:
    """The canonical payload an operator signs to set this price."""
    change = c.price_changes.get(change_id)
    signed = price_payload(change)
    return PriceChangePayloadOut(change_id=change_id, state=change.state, payload=signed.decode("utf-8"),
                                 payload_base64=base64.b64encode(signed).decode("ascii"),
                                 challenge=b64url(webauthn_challenge(signed)))


@router.post("/convert/prices/changes/{change_id}/approve", response_model=PriceChangeOut,
             responses=responses(*PRICE_SIGN_CODES))
def sign_price(change_id: IdPath, body: ApproveIn, c: ContainerDep, who: Operator) -> PriceChangeOut:
    """Sign the change with the operator's own key over `.../approval-payload` (see ApproveIn): it
    becomes `signed`; the worker's `convert-prices` job verifies it again and sets the price."""
    return _change_out(c, c.price_changes.sign(change_id, by=f"api:{who.name}", comment=body.comment,
                                               signature=_signature(body)))


@router.get("/convert/liquidity/{asset}", response_model=LiquidityOut, responses=responses("asset_not_found"))
def liquidity(c: ContainerDep, _: Auditor, asset: str = AssetPath) -> LiquidityOut:
    """The house's liquidity account of `asset` (`convert:liquidity:<asset>`, opened if it was not)
    and its balance. Fund or drain it with a treasury adjustment (`POST /v1/treasury/adjustments`)."""
    decimals = c.ledger.get_asset(asset).decimals
    account = _convert(c).open_accounts(asset)
    b = c.ledger.balance(account.id)
    return LiquidityOut(asset=asset, account_id=account.id, name=account.name, posted=Money.of(b.posted, decimals),
                        held=Money.of(b.held, decimals), available=Money.of(b.available, decimals))
