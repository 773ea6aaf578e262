"""Convert: a customer sells one asset for another at a quoted price, against the house's
liquidity (issue 17). The quote is made here; its acceptance is booked by the database.

Guarantees:
- a quote states every figure before anything moves: the amount sold (fee included), the fee
  (rounded up), the payout (rounded down), the exact rate and what rounding kept back
  (`custody.convert.pricing`); it is stored by the SECURITY DEFINER function
  `convert_quote_create` (migrations 0033, 0040), which checks those figures against each other,
  looks the liquidity and fee accounts up itself, takes the fee and spread rates from
  `convert_config` (never the caller's), and bounds every rate by a reference the api cannot set
  at will: the operator's price less the spread, or for a book (a `market` of the pair) the
  operator's price and its last trade, within the band (a book quote of a pair without an operator
  price is refused: the api process writes fills, migration 0056); the api role cannot write quotes
  otherwise;
- a book prices a quote only when both its sides have orders and the average price for the
  amount lies within `CONVERT_PRICE_BAND_PPM` of the operator's price of the pair (which must exist)
  and of the market's last trade (if it traded): a customer's own ask on an empty side prices nothing
  (`convert_book_unreliable`);
- the fee, spread and band rates are the `convert_config` row, written by the worker at start-up
  from its settings (`write_config`) and read-only for the api;
- an operator's price is proposed over the API, signed by an operator and set by the worker
  (custody.convert.prices) through `convert_price_set` (SECURITY DEFINER), which writes its audit
  row with it; the api role can neither write `convert_price` nor call that function (0056);
- accepting books ONE journal transaction (`convert:<quote id>`, kind `convert`): customer ->
  liquidity (from-asset: the payout's cost at the rate, rounded up), liquidity -> customer
  (to-asset), customer -> fee income (from-asset), customer -> `convert:rounding:<from asset>`
  (the whole minor units the payout's rounding left, when any), through `convert_accept`, which re-reads the locked quote row; concurrent accepts
  book once, a replay of the same key answers the original transaction, and a refusal books
  nothing;
- the house's liquidity per asset is the account `convert:liquidity:<asset>` (kind liquidity:
  never below zero, checked by the ledger under its locks), funded and drained only by treasury
  adjustments (`custody.adjustments`, quorum); the database refuses any other debit of it by the
  api or the worker (`journal_entry_liquidity_guard`). A quote the liquidity cannot pay is refused
  when asked for, and an accept it can no longer pay is refused with `insufficient_liquidity`.

Codes, in the order they are checked. Quote: `idempotency_conflict` (the key made a quote for
another request; the same request answers the quote it made), the ledger's `account_not_found` / `asset_not_found`
/ `invalid_amount` / `excess_precision` / `invalid_request` (the account is not a customer
account, one asset twice, both amounts or neither), `account_frozen`,
`convert_pair_unavailable`, `convert_book_unreliable`, `convert_depth_insufficient`, `convert_amount_too_small`,
`insufficient_liquidity`. Accept: `quote_not_found`, `quote_already_used` (a replay of the same key
answers the original instead), `quote_expired`, `idempotency_conflict` (the key accepted another
quote), `account_frozen`, `insufficient_funds` (the customer), `insufficient_liquidity` (the
house), then whatever else the ledger answers (`account_closed`, ...).
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol, Sequence

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from custody.errors import CustodyError, CustodyErrorCode
from custody.incidents import refuse_frozen
from custody.settings import Settings
from ledger.errors import ErrorCode, LedgerError
from ledger.model import Account, AccountKind
from ledger.service import Ledger
from custody.convert import pricing
from custody.convert.pricing import Figures, Level, PricingRefused

log = logging.getLogger(__name__)

LIQUIDITY_PREFIX = "convert:liquidity:"
BOOK_LEVELS = 1000  # price levels read from a book to price one quote


def liquidity_account_name(asset: str) -> str:
    return f"{LIQUIDITY_PREFIX}{asset}"


def fee_account_name(asset: str) -> str:
    return f"fees:{asset}"  # the asset's firm fee income account (custody.wallets.FIRM_ACCOUNTS)


def rounding_account_name(asset: str) -> str:
    return f"convert:rounding:{asset}"  # kind dust: what the payout's rounding leaves of a sale


def check_price(ledger: Ledger, base: str, quote: str, price_minor: int) -> None:
    """An operator's price of a pair, before it is proposed or set: two different known assets
    (`invalid_request`, `asset_not_found`) and more than zero (`invalid_amount`)."""
    if base == quote:
        raise LedgerError(ErrorCode.invalid_request, "a price needs two different assets")
    if price_minor <= 0:
        raise LedgerError(ErrorCode.invalid_amount, "a price is more than zero")
    for asset in (base, quote):
        ledger.get_asset(asset)  # asset_not_found


class BookMarket(Protocol):
    """What a market row offers (matching.store.MarketRow.market)."""

    symbol: str
    base_asset: str
    quote_asset: str
    lot_size: int
    quote_per_tick_lot: int


class Books(Protocol):
    """The order books convert prices from (matching.service.Trading)."""

    def markets(self) -> Sequence[object]: ...

    def depth(self, symbol: str, levels: int | None = 50) -> tuple[int, list, list]: ...


@dataclass(frozen=True)
class QuoteView:
    id: int
    created_by: str
    customer_account_id: int
    receive_account_id: int
    from_asset: str
    to_asset: str
    from_amount: int
    fee: int
    to_amount: int
    rate: Fraction
    fee_ppm: int
    spread_ppm: int
    source: str
    liquidity_in_account_id: int
    liquidity_out_account_id: int
    fee_account_id: int
    rounding_account_id: int
    expires_at: dt.datetime
    state: str
    transaction_id: int | None
    created_at: dt.datetime

    @property
    def figures(self) -> Figures:
        return Figures(self.from_amount, self.fee, self.to_amount, self.rate)


@dataclass(frozen=True)
class PriceView:
    base_asset: str
    quote_asset: str
    quote_minor_per_base_unit: int
    set_by: str
    updated_at: dt.datetime


@dataclass(frozen=True)
class Config:
    """The `convert_config` row: what every quote is charged and bounded by."""

    fee_ppm: int
    spread_ppm: int
    band_ppm: int


def write_config(engine: Engine, settings: Settings, *, by: str) -> Config:
    """Write the settings' fee, spread and band rates into `convert_config` (the worker, at
    start-up; the api role may only read the row) and answer them."""
    config = Config(settings.convert_fee_ppm, settings.convert_spread_ppm, settings.convert_price_band_ppm)
    with engine.begin() as c:
        c.execute(text(_WRITE_CONFIG_SQL), {"f": config.fee_ppm, "s": config.spread_ppm, "b": config.band_ppm, "by": by})
    return config


class Convert:
    def __init__(self, engine: Engine, ledger: Ledger, settings: Settings) -> None:
        self.engine = engine
        self.ledger = ledger
        self.ttl_seconds = settings.convert_quote_ttl_seconds
        # Facts that never change once read (an account's id and kind by name, an asset's decimals),
        # kept per process; bounded by the number of assets.
        self._liquidity: dict[str, Account] = {}
        self._decimals: dict[str, int] = {}

    # ---- accounts and prices --------------------------------------------------------------

    def open_accounts(self, asset: str) -> Account:
        """Open (idempotently) the asset's liquidity account and the fee and rounding accounts
        convert credits; return the liquidity account."""
        found = self._liquidity.get(asset)
        if found is None:
            self.ledger.open_account(asset, AccountKind.fee_income, fee_account_name(asset))
            self.ledger.open_account(asset, AccountKind.dust, rounding_account_name(asset))
            found = self._liquidity[asset] = self.ledger.open_account(asset, AccountKind.liquidity,
                                                                       liquidity_account_name(asset))
        return found

    def decimals(self, asset: str) -> int:
        """The asset's decimals (`asset_not_found` if there is no such asset)."""
        found = self._decimals.get(asset)
        if found is None:
            found = self._decimals[asset] = self.ledger.get_asset(asset).decimals
        return found

    def set_price(self, *, by: str, base: str, quote: str, price_minor: int) -> PriceView:
        """Set the operator's price of a pair (quote minor units per whole base unit), audited: the
        worker's step once a signed change verified (custody.convert.prices), or the owner's session
        (tests, administrators); custody_api may not call `convert_price_set` (migration 0056). A
        pair with a market is priced from its book, within the band of this price."""
        check_price(self.ledger, base, quote, price_minor)
        with self.engine.begin() as c:  # the price and its audit row, written by convert_price_set
            row = c.execute(text(_SET_PRICE_SQL), {"b": base, "q": quote, "p": price_minor, "by": by}).one()
        return _price(row)

    def config(self) -> Config:
        """The fee, spread and band rates now (`convert_config`)."""
        with self.engine.connect() as c:
            row = c.execute(text(_CONFIG_SQL)).one()
        return Config(row.fee_ppm, row.spread_ppm, row.band_ppm)

    def price(self, base: str, quote: str) -> PriceView | None:
        """The operator's price of the pair in either orientation, or None."""
        with self.engine.connect() as c:
            row = c.execute(text(_PRICE_SQL), {"a": base, "b": quote}).first()
        return None if row is None else _price(row)

    # ---- quotes ---------------------------------------------------------------------------

    def quote(self, *, caller: str, key: str, account_id: int, to_asset: str, from_amount: int | None,
              to_amount: int | None, books: Books | None) -> tuple[QuoteView, bool]:
        """Price and store a quote for customer account `account_id` selling its asset for
        `to_asset`: exactly `from_amount` sold (fee included), or at least `to_amount` received.
        Idempotent per `key` (the caller's namespaced key): (the quote, True) when made now, (the
        quote made before, False) for a replay of the same request, whatever the price now."""
        if (from_amount is None) == (to_amount is None):
            raise LedgerError(ErrorCode.invalid_request, "give from_amount or to_amount, not both")
        request_hash = _digest([caller, account_id, to_asset, from_amount, to_amount])
        with self.engine.connect() as c:
            before = c.execute(text(_QUOTE_BY_KEY_SQL), {"k": key}).first()
        if before is not None:
            return _replayed(before, request_hash), False
        account = self.ledger.get_account(account_id)
        if account.kind is not AccountKind.customer or account.owner is None:
            raise LedgerError(ErrorCode.invalid_request, "a quote converts from a customer account")
        if account.asset == to_asset:
            raise LedgerError(ErrorCode.invalid_request, "a quote converts between two different assets")
        if account.closed:
            raise LedgerError(ErrorCode.account_closed, f"account {account_id} is closed")
        self.decimals(to_asset)  # asset_not_found
        refuse_frozen(self.engine, [account_id])
        receive = self.ledger.open_account(to_asset, AccountKind.customer, f"customer:{account.owner}:{to_asset}",
                                           owner=account.owner)
        if receive.closed:
            raise LedgerError(ErrorCode.account_closed, f"account {receive.id} is closed")
        config = self.config()
        source, figures = self._price(account.asset, to_asset, from_amount, to_amount, books, config)
        self.open_accounts(account.asset)
        liquidity_out = self.open_accounts(to_asset)
        available = self.ledger.balance(liquidity_out.id).available
        if available < figures.to_amount:
            raise CustodyError(CustodyErrorCode.insufficient_liquidity,
                               f"the house's {to_asset} liquidity cannot pay this amount", asset=to_asset)
        try:
            return self._store(caller, key, request_hash, account_id, receive.id, source, figures, config)
        except DBAPIError as refused:
            # The market traded between the book's check and the database's (a new last price): the
            # database's band refused the rate. Any other refusal of the function is a bug: raise it.
            if getattr(refused.orig, "sqlstate", None) != "42501" or not source.startswith("book:"):
                raise
            log.warning("convert: the database refused a %s quote's rate: %s", source, str(refused.orig).strip())
            raise CustodyError(CustodyErrorCode.convert_book_unreliable,
                               "the market's reference price moved while the quote was made; ask again",
                               market=source.removeprefix("book:")) from None

    def _store(self, caller: str, key: str, request_hash: str, account_id: int, receive_id: int, source: str,
               figures: Figures, config: Config) -> tuple[QuoteView, bool]:
        """Store the quote through `convert_quote_create`: (the quote, made now?)."""
        with self.engine.begin() as c:
            made = c.execute(text(_CREATE_SQL), {
                "by": caller, "customer": account_id, "receive": receive_id, "from_amount": figures.from_amount,
                "fee": figures.fee, "to_amount": figures.to_amount, "num": figures.rate.numerator,
                "den": figures.rate.denominator, "fee_ppm": config.fee_ppm, "spread_ppm": config.spread_ppm,
                "source": source, "ttl": self.ttl_seconds, "key": key, "hash": request_hash}).one()
            if made.status == "idempotency_conflict":
                raise LedgerError(ErrorCode.idempotency_conflict, "the key was used for another quote request")
            return _quote(c.execute(text(_QUOTE_SQL), {"i": made.quote_id}).one()), made.status == "created"

    def _price(self, from_asset: str, to_asset: str, from_amount: int | None, to_amount: int | None,
               books: Books | None, config: Config) -> tuple[str, Figures]:
        """(source, figures): from the book of a market of the pair (two-sided, its average within
        the band of the operator's price, which must exist, and of its last trade, if any), else the
        operator's price."""
        market = _market_of(books, from_asset, to_asset)
        try:
            operator = self._operator_rate(from_asset, to_asset)
            if market is not None:
                assert books is not None
                selling_base = from_asset == market.base_asset
                if operator is None:
                    # the api process writes fills; only an operator's (signed) price bands a book (0056)
                    raise CustodyError(CustodyErrorCode.convert_book_unreliable,
                                       f"{market.symbol} has no operator price of the pair to check its book against",
                                       market=market.symbol)
                _, bids, asks = books.depth(market.symbol, BOOK_LEVELS)
                if not bids or not asks:
                    raise CustodyError(CustodyErrorCode.convert_book_unreliable,
                                       f"the book of {market.symbol} has an empty side: it prices no quote",
                                       market=market.symbol)
                levels = _levels(market, bids if selling_base else asks, selling_base=selling_base)
                if from_amount is not None:
                    net = from_amount - pricing.fee_for(from_amount, config.fee_ppm)
                    if net <= 0:
                        raise PricingRefused("too_small", "the amount does not exceed its fee")
                    average = pricing.spend_through(levels, net) / net
                else:
                    assert to_amount is not None
                    average = to_amount / pricing.receive_through(levels, to_amount)
                references = [r for r in (self._last_trade_rate(market.symbol, selling_base=selling_base), operator)
                              if r is not None]
                if not all(pricing.within_band(average, r, config.band_ppm) for r in references):
                    raise CustodyError(CustodyErrorCode.convert_book_unreliable,
                                       f"the book of {market.symbol} prices this amount more than {config.band_ppm} "
                                       "ppm away from the market's last trade or the operator's price",
                                       market=market.symbol)
                source = f"book:{market.symbol}"
            elif operator is not None:
                average, source = operator, "operator"
            else:
                raise CustodyError(CustodyErrorCode.convert_pair_unavailable,
                                   f"no market and no operator price for {from_asset} -> {to_asset}")
            rate = pricing.apply_spread(average, config.spread_ppm)
            if from_amount is not None:
                return source, pricing.figures_for_from(from_amount, rate, config.fee_ppm)
            assert to_amount is not None
            return source, pricing.figures_for_to(to_amount, rate, config.fee_ppm)
        except PricingRefused as refused:
            if refused.reason == "too_large":
                raise LedgerError(ErrorCode.invalid_amount, str(refused)) from None
            code = {"depth": CustodyErrorCode.convert_depth_insufficient}.get(
                refused.reason, CustodyErrorCode.convert_amount_too_small)
            raise CustodyError(code, str(refused)) from None

    def _operator_rate(self, from_asset: str, to_asset: str) -> Fraction | None:
        """The operator's price of the pair as to-asset minor units per from-asset minor unit."""
        price = self.price(from_asset, to_asset)
        if price is None:
            return None
        return pricing.operator_rate(price.quote_minor_per_base_unit, self.decimals(price.base_asset),
                                     selling_base=from_asset == price.base_asset)

    def _last_trade_rate(self, symbol: str, *, selling_base: bool) -> Fraction | None:
        """The market's last fill as to-asset minor units per from-asset minor unit (the reference
        `convert_quote_create` bounds a book's rate by), or None if it never traded."""
        with self.engine.connect() as c:
            row = c.execute(text(_LAST_FILL_SQL), {"m": symbol}).first()
        if row is None:
            return None
        base, quote = int(row.base_amount), int(row.quote_amount)
        return Fraction(quote, base) if selling_base else Fraction(base, quote)

    def get(self, quote_id: int, *, caller: str | None = None) -> QuoteView:
        """The quote; with `caller` (a backend), only one that caller asked for."""
        with self.engine.connect() as c:
            row = c.execute(text(_QUOTE_SQL), {"i": quote_id}).first()
        if row is None or (caller is not None and row.created_by != caller):
            raise CustodyError(CustodyErrorCode.quote_not_found, f"no quote {quote_id}")
        return _quote(row)

    def accept(self, *, caller: str, quote_id: int, key: str) -> tuple[QuoteView, bool]:
        """Book the quote once (`convert_accept`); (the quote, True) when booked now, (the quote,
        False) for a replay of the same key."""
        quote = self.get(quote_id, caller=caller)
        refuse_frozen(self.engine, [quote.customer_account_id])
        with self.engine.begin() as c:
            row = c.execute(text(_ACCEPT_SQL), {"q": quote_id, "caller": caller, "key": key}).one()
            if row.status in ("created", "exists"):
                return _quote(c.execute(text(_QUOTE_SQL), {"i": quote_id}).one()), row.status == "created"
        if row.status in _CUSTODY_REFUSALS:
            raise CustodyError(CustodyErrorCode(row.status), _CUSTODY_REFUSALS[row.status], quote_id=quote_id)
        raise LedgerError(ErrorCode(row.status), quote_id=quote_id)


_CUSTODY_REFUSALS = {
    "quote_not_found": "no such quote for this caller",
    "quote_already_used": "the quote was accepted under another idempotency key",
    "quote_expired": "the quote has expired; ask for a new one",
    "insufficient_liquidity": "the house's liquidity cannot pay this quote now",
}


def _market_of(books: Books | None, from_asset: str, to_asset: str) -> BookMarket | None:
    if books is None:
        return None
    found = [row.market for row in books.markets()  # type: ignore[attr-defined]
             if {row.market.base_asset, row.market.quote_asset} == {from_asset, to_asset}]  # type: ignore[attr-defined]
    return min(found, key=lambda m: m.symbol) if found else None  # several markets of one pair: the first by symbol


def _levels(market: BookMarket, levels: list, *, selling_base: bool) -> list[Level]:
    """Book levels [(price ticks, lots)] as the converting customer meets them."""
    out = []
    for price_ticks, lots in levels:
        base = int(lots) * market.lot_size
        quote = int(price_ticks) * int(lots) * market.quote_per_tick_lot
        out.append(Level(base, quote) if selling_base else Level(quote, base))
    return out


_SET_PRICE_SQL = """
SELECT base_asset, quote_asset, quote_minor_per_base_unit, set_by, updated_at
FROM convert_price_set(:by, :b, :q, :p)
"""

_CONFIG_SQL = "SELECT fee_ppm, spread_ppm, band_ppm FROM convert_config WHERE id = 1"

_WRITE_CONFIG_SQL = """
INSERT INTO convert_config (id, fee_ppm, spread_ppm, band_ppm, updated_by) VALUES (1, :f, :s, :b, :by)
ON CONFLICT (id) DO UPDATE SET fee_ppm = excluded.fee_ppm, spread_ppm = excluded.spread_ppm,
                               band_ppm = excluded.band_ppm, updated_by = excluded.updated_by, updated_at = now()
"""

_LAST_FILL_SQL = """
SELECT base_amount, quote_amount FROM fill
WHERE market = :m AND base_amount > 0 AND quote_amount > 0
ORDER BY seq DESC, match_no DESC LIMIT 1
"""

_PRICE_SQL = """
SELECT base_asset, quote_asset, quote_minor_per_base_unit, set_by, updated_at
FROM convert_price
WHERE (base_asset, quote_asset) IN ((:a, :b), (:b, :a))
"""

_CREATE_SQL = """
SELECT quote_id, status
FROM convert_quote_create(:by, :customer, :receive, :from_amount, :fee, :to_amount, :num, :den,
                          :fee_ppm, :spread_ppm, :source, :ttl, :key, :hash)
"""

_QUOTE_COLUMNS = """
SELECT id, created_by, customer_account_id, receive_account_id, from_asset, to_asset, from_amount, fee_amount,
       to_amount, rate_num, rate_den, fee_ppm, spread_ppm, source, liquidity_in_account_id,
       liquidity_out_account_id, fee_account_id, rounding_account_id, expires_at, state, transaction_id,
       created_at, request_hash
FROM convert_quote
"""
_QUOTE_SQL = _QUOTE_COLUMNS + "WHERE id = :i"
_QUOTE_BY_KEY_SQL = _QUOTE_COLUMNS + "WHERE request_key = :k"

_ACCEPT_SQL = "SELECT status, transaction_id FROM convert_accept(:q, :caller, :key)"


def _digest(parts: list) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


def _replayed(row: object, request_hash: str) -> QuoteView:
    if row.request_hash != request_hash:  # type: ignore[attr-defined]
        raise LedgerError(ErrorCode.idempotency_conflict, "the key was used for another quote request")
    return _quote(row)


def _quote(row: object) -> QuoteView:
    r = row
    return QuoteView(
        r.id, r.created_by, r.customer_account_id, r.receive_account_id, r.from_asset, r.to_asset,  # type: ignore[attr-defined]
        int(r.from_amount), int(r.fee_amount), int(r.to_amount),  # type: ignore[attr-defined]
        Fraction(int(r.rate_num), int(r.rate_den)), r.fee_ppm, r.spread_ppm, r.source,  # type: ignore[attr-defined]
        r.liquidity_in_account_id, r.liquidity_out_account_id, r.fee_account_id,  # type: ignore[attr-defined]
        r.rounding_account_id,  # type: ignore[attr-defined]
        r.expires_at, r.state, r.transaction_id, r.created_at)  # type: ignore[attr-defined]


def _price(row: object) -> PriceView:
    r = row
    return PriceView(r.base_asset, r.quote_asset, int(r.quote_minor_per_base_unit), r.set_by,  # type: ignore[attr-defined]
                     r.updated_at)  # type: ignore[attr-defined]
