"""Adversarial review of convert (issue 17, migration 0033): its findings, fixed by migration 0040.

Each test showed a defect of 0033's code (as a strict xfail) and passes since the fix:
- R15-C1: `convert_quote_create` trusts any source named `book:<anything>`: the api role (or a
  compromised api process) labels a quote of a pair that has no market at all `book:NOPE` and so
  skips the operator-price bound, at any rate; `convert_accept` then pays it out of the house's
  liquidity. The liquidity guard (only quorum may drain it) is bypassed through the definer.
- R15-C2: the fee and spread rates a quote is checked against are the caller's (`p_fee_ppm`,
  `p_spread_ppm`), so the api role books a quote with no fee and no spread.
- R15-C3: a one-sided book prices a quote: a customer posts an ask far below the market, converts
  against the house's liquidity at that price, cancels the ask, and keeps the difference.
- R15-C4: two concurrent quote requests under one idempotency key: the loser's `INSERT` hits the
  unique key and raises instead of answering the quote the winner made (over HTTP a generic 409
  `conflict`, not the replay's 200 with the quote).
Fixed: a book source names a market of the pair and every rate is bounded by the market's last
trade or the operator's price (written only through `convert_price_set`), the rates come from
`convert_config`, a book prices only when two-sided and within the band (`convert_book_unreliable`),
and the insert is ON CONFLICT DO NOTHING then answers the winner's quote.
The ledger is verified at the end of each test (the `ledger` fixture).
"""
from __future__ import annotations

import logging
import threading
import time
from fractions import Fraction

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from custody.auth import create_api_key
from custody.convert.service import write_config
from custody.settings import Settings
from ledger.model import AccountKind
from regtest.util import assert_equal
from tests.integration.test_convert_guards import as_api, world  # noqa: F401  (fixture)
from tests.integration.test_convert_quotes import Desk
from tests.integration.test_db_roles import sqlstate

log = logging.getLogger(__name__)

CREATE = ("SELECT quote_id AS id, status FROM convert_quote_create('b', :cust, :recv, :frm, :fee, :to, :num, :den, "
          ":fee_ppm, :spread_ppm, :src, 10, :key, 'h')")
ACCEPT = "SELECT status, transaction_id FROM convert_accept(:q, 'b', :k)"


@pytest.fixture()
def desk(engine, ledger):
    return Desk(engine, ledger)


def test_a_forged_book_source_cannot_price_a_quote_beyond_the_operators_price(engine, ledger, world):  # noqa: F811
    convert, eur, btc = world["convert"], world["eur"], world["btc"]
    convert.set_price(by="ops", base=btc, quote=eur, price_minor=5_800_000)  # 58,000.00 EUR/BTC; no market exists
    btc_liquidity = world["liquidity"][btc]
    before = ledger.balance(btc_liquidity).posted
    # 100.00 EUR, fee 0.25 EUR, at 100x the operator's rate (500/29 satoshi per cent at 58,000 EUR/BTC)
    forged = {"cust": world["alice"], "recv": world["alice_btc"], "frm": 10_000, "fee": 25,
              "to": 9_975 * 50_000 // 29, "num": 50_000, "den": 29, "fee_ppm": 2500, "spread_ppm": 0,
              "src": "book:NO-SUCH-MARKET", "key": f"forged-{world['run']}"}
    try:
        quote_id = as_api(engine, CREATE, forged)[0].id
    except DBAPIError as refused:
        assert_equal(refused.orig.sqlstate, "42501")
        return  # fixed: a book source must name a market of the pair
    answer = as_api(engine, ACCEPT, {"q": quote_id, "k": f"forged-{world['run']}"})[0]
    paid = before - ledger.balance(btc_liquidity).posted
    log.info("forged quote %d accepted (%s): the house paid %d satoshi for 100.00 EUR; 171,982 at the operator's price",
             quote_id, answer.status, paid)
    assert paid <= 171_982, f"the house paid {paid} satoshi for 100.00 EUR (operator's price: 171,982)"


def test_the_api_role_cannot_choose_the_fee_rate_of_a_quote(engine, ledger, world):  # noqa: F811
    convert, eur, btc = world["convert"], world["eur"], world["btc"]
    convert.set_price(by="ops", base=btc, quote=eur, price_minor=5_800_000)
    fees = ledger.account_by_name(f"fees:{eur}").id
    before = ledger.balance(fees).posted
    free = {"cust": world["alice"], "recv": world["alice_btc"], "frm": 10_000, "fee": 0, "to": 10_000 * 500 // 29,
            "num": 500, "den": 29, "fee_ppm": 0, "spread_ppm": 0, "src": "operator", "key": f"free-{world['run']}"}
    try:
        quote_id = as_api(engine, CREATE, free)[0].id
    except DBAPIError as refused:
        assert_equal(refused.orig.sqlstate, "42501")
        return  # fixed: the fee (and spread) rate comes from the database, not the caller
    assert_equal(as_api(engine, ACCEPT, {"q": quote_id, "k": f"free-{world['run']}"})[0].status, "created")
    charged = ledger.balance(fees).posted - before
    assert charged >= 25, f"100.00 EUR converted for a fee of {charged} cents; the service's rate (2500 ppm) is 25"


def test_a_customer_cannot_price_a_quote_with_an_ask_of_their_own(desk):
    base, quote, symbol = desk.market()
    desk.set_price(base, quote, "60000")
    equity = {a: desk.ledger.account_by_name(f"equity:{a}").id for a in (base, quote)}
    desk.adjust(equity[base], desk.liquidity(base)["account_id"], "1", f"fund-{base}")

    def customer(name: str, asset: str, minor: int) -> tuple[str, int]:
        owner = f"cv{desk.run}-{name}"
        account = desk.ledger.open_account(asset, AccountKind.customer, f"customer:{owner}:{asset}", owner=owner).id
        desk.ledger.transfer(f"test:{desk.run}:{name}:{asset}", equity[asset], account, minor)
        return owner, account

    maker, _ = customer("maker", base, 10**7)
    taker, _ = customer("taker", quote, 10_000 * 10**6)
    log.info("the market trades 0.1 %s at 60,000: its last price", base)
    for who, side, cid in ((maker, "sell", "m1"), (taker, "buy", "t1")):
        r = desk.call("backend", "POST", f"/v1/markets/{symbol}/orders", json={
            "account": who, "client_order_id": cid, "side": side, "qty": "0.1", "price": "60000"})
        assert r.status_code == 201 and r.json()["state"] in ("working", "filled"), r.text

    mallory, mallory_quote = customer("mallory", quote, 10 * 10**6)
    mallory_base = desk.ledger.open_account(base, AccountKind.customer, f"customer:{mallory}:{base}", owner=mallory).id
    desk.ledger.transfer(f"test:{desk.run}:mallory:{base}", equity[base], mallory_base, 10**8)
    log.info("mallory posts an ask of 1 %s at 1 %s (no bid to meet it) and asks a quote for 1 %s", base, quote, quote)
    r = desk.call("backend", "POST", f"/v1/markets/{symbol}/orders", json={
        "account": mallory, "client_order_id": "bait", "side": "sell", "qty": "1", "price": "1"})
    assert r.status_code == 201 and r.json()["state"] == "working", r.text
    bait = r.json()["order_id"]
    r = desk.ask(mallory_quote, base, from_amount="1")
    if r.status_code != 201:
        log.info("refused: %s", r.text)
        return  # fixed: a one-sided or off-market book does not price a quote
    q = r.json()
    r = desk.accept(q["id"], "bait-1")
    assert_equal(r.status_code, 201)
    r = desk.call("backend", "POST", f"/v1/markets/{symbol}/orders/{bait}/cancel", json={"account": mallory})
    assert_equal(r.status_code, 200)
    got = desk.posted(mallory_base) - 10**8
    fair = Fraction(10**6 - 2_500, 1) * 10**8 / (60_000 * 10**6)  # 1 quote less the fee, at 60,000
    log.info("mallory paid 1 %s and received %d base minor units (%s at the last price); the ask is cancelled",
             quote, got, float(fair))
    assert got <= fair * 2, f"the house sold {got} {base} minor units for 1 {quote}; at the market's 60,000: {float(fair):.0f}"


def _race(first, second, *, hold: float = 0.5):
    """Run `first` on one connection (its transaction left open `hold` seconds), `second` on another
    meanwhile; what `second` answered or raised."""
    out: dict = {}

    def run_second() -> None:
        try:
            out["answer"] = second()
        except DBAPIError as exc:
            out["error"] = exc

    thread = threading.Thread(target=run_second)
    first(lambda: (thread.start(), time.sleep(hold)))
    thread.join(30)
    return out


def _as_api_open(engine, sql: str, params: dict, meanwhile) -> None:
    """`sql` as custody_api in a transaction that stays open while `meanwhile()` runs, then commits."""
    with engine.connect() as c:
        with c.begin():
            c.exec_driver_sql("SET LOCAL ROLE custody_api")
            c.execute(text(sql), params).all()
            meanwhile()


def test_concurrent_quote_requests_under_one_key_answer_one_quote(engine, ledger, world):  # noqa: F811
    convert, eur, btc = world["convert"], world["eur"], world["btc"]
    convert.set_price(by="ops", base=btc, quote=eur, price_minor=5_800_000)
    honest = {"cust": world["alice"], "recv": world["alice_btc"], "frm": 10_000, "fee": 25, "to": 171_982,
              "num": 500, "den": 29, "fee_ppm": 2500, "spread_ppm": 0, "src": "operator", "key": f"race-{world['run']}"}
    out = _race(lambda meanwhile: _as_api_open(engine, CREATE, honest, meanwhile),
                lambda: as_api(engine, CREATE, honest)[0])
    assert "error" not in out, f"the second request under the key raised: {out.get('error')!s:.200}"
    assert_equal(out["answer"].status, "exists")


def test_the_database_bounds_a_book_priced_rate_by_the_markets_last_trade(desk):
    """R15-C1/C3 in the database: as custody_api, a `book:` quote of a real market is refused
    without an operator price of the pair (0056), above its last trade plus the band (5 %), and
    booked at it; a market of another pair is refused; the operator's price bounds it as well."""
    base, quote, symbol = desk.market("P", "Q")
    equity = {a: desk.ledger.account_by_name(f"equity:{a}").id for a in (base, quote)}
    desk.adjust(equity[base], desk.liquidity(base)["account_id"], "1", f"fund-{base}")
    owners = {}
    for name, asset, minor in (("maker", base, 10**7), ("taker", quote, 10_000 * 10**6)):
        owners[name] = f"cv{desk.run}-{name}"
        account = desk.ledger.open_account(asset, AccountKind.customer, f"customer:{owners[name]}:{asset}",
                                           owner=owners[name]).id
        desk.ledger.transfer(f"test:{desk.run}:{name}:{asset}", equity[asset], account, minor)
        owners[f"{name}_account"] = account
    receive = desk.ledger.open_account(base, AccountKind.customer, f"customer:{owners['taker']}:{base}",
                                       owner=owners["taker"]).id
    sql = ("SELECT quote_id AS id, status FROM convert_quote_create('b', :cust, :recv, :frm, :fee, :to, :num, :den, "
           "2500, 0, :src, 10, :key, 'h')")

    def forged(key: str, num: int, den: int, src: str = f"book:{symbol}") -> dict:
        frm = 10 * 10**6  # 10 quote units
        fee = (frm * 2500 + 999_999) // 10**6
        return {"cust": owners["taker_account"], "recv": receive, "frm": frm, "fee": fee,
                "to": (frm - fee) * num // den, "num": num, "den": den, "src": src, "key": f"{key}-{desk.run}"}

    log.info("no trade and no operator price: nothing bounds a book-priced rate, so the database refuses it")
    with pytest.raises(DBAPIError) as refused:
        as_api(desk.engine, sql, forged("untraded", 1, 600))
    assert_equal(refused.value.orig.sqlstate, "42501")
    for who, side, cid in (("maker", "sell", "m1"), ("taker", "buy", "t1")):
        r = desk.call("backend", "POST", f"/v1/markets/{symbol}/orders", json={
            "account": owners[who], "client_order_id": cid, "side": side, "qty": "0.1", "price": "60000"})
        assert r.status_code == 201, r.text
    log.info("a traded market without an operator price bounds nothing either: the api writes fills (0056)")
    with pytest.raises(DBAPIError) as refused:
        as_api(desk.engine, sql, forged("traded-unpriced", 1, 600))
    assert_equal(refused.value.orig.sqlstate, "42501")
    desk.set_price(base, quote, "60000")
    # the last trade: 60,000 quote units per base unit = 10^8 / (60,000 * 10^6) = 1/600 base minor per quote minor
    log.info("twice the last trade's rate, and just beyond the band, are refused")
    for key, num, den in (("double", 2, 600), ("beyond", 1_050_001, 600 * 10**6)):
        with pytest.raises(DBAPIError) as refused:
            as_api(desk.engine, sql, forged(key, num, den))
        assert_equal(refused.value.orig.sqlstate, "42501")
    log.info("a market that is not of the quote's pair is refused")
    with pytest.raises(DBAPIError) as refused:
        as_api(desk.engine, sql, forged("other", 1, 600, src="book:BTC-EUR-NONE"))
    assert_equal(refused.value.orig.sqlstate, "42501")
    log.info("the band's edge is booked")
    assert_equal(as_api(desk.engine, sql, forged("edge", 1_050_000, 600 * 10**6))[0].status, "created")
    log.info("an operator's price of the pair bounds it too: at 70,000 the same rate beats it by more than the band")
    desk.set_price(base, quote, "70000")
    with pytest.raises(DBAPIError) as refused:
        as_api(desk.engine, sql, forged("edge-2", 1_050_000, 600 * 10**6))
    assert_equal(refused.value.orig.sqlstate, "42501")


def test_the_rates_are_the_workers_and_the_api_writes_neither_them_nor_a_price(engine, ledger, world):  # noqa: F811
    """R15-C1/C2: custody_api may not write `convert_config` or `convert_price`, nor call
    `convert_price_set` (0056: the worker calls it once an operator's signature verified; it
    audits); the worker's settings, written at start-up, are what a quote is charged."""
    convert, eur, btc = world["convert"], world["eur"], world["btc"]
    for sql in ("UPDATE convert_config SET fee_ppm = 0",
                f"INSERT INTO convert_price (base_asset, quote_asset, quote_minor_per_base_unit, set_by) "
                f"VALUES ('{btc}', '{eur}', 1, 'mallory')"):
        with pytest.raises(DBAPIError) as refused:
            as_api(engine, sql, {})
        assert_equal(refused.value.orig.sqlstate, "42501")
    log.info("the api role may not call convert_price_set, even in a live operator's name (0056); the worker may "
             "(in such a name: 0052), which writes the audit row")
    operator = f"ops-a-{world['run']}"
    create_api_key(engine, operator, "operator", Settings(environment="test").api_key_pepper)
    set_price = "SELECT * FROM convert_price_set(:by, :b, :q, 5900000)"
    with pytest.raises(DBAPIError) as refused:
        as_api(engine, set_price, {"by": f"api:{operator}", "b": btc, "q": eur})
    assert_equal(refused.value.orig.sqlstate, "42501")
    assert_equal(sqlstate(engine, "custody_worker", set_price, {"by": f"api:{operator}", "b": btc, "q": eur}), None)
    assert_equal(sqlstate(engine, "custody_worker", set_price, {"by": "api:nobody", "b": btc, "q": eur}), "42501")
    convert.set_price(by="ops-b", base=btc, quote=eur, price_minor=5_800_000)  # the owner's session names anyone
    with engine.connect() as c:
        audited = c.execute(text("SELECT actor, detail->>'quote_minor_per_base_unit' FROM audit_event "
                                 "WHERE action = 'convert.price' AND subject = :s ORDER BY id"),
                            {"s": f"convert-price:{btc}/{eur}"}).all()
    assert_equal([tuple(a) for a in audited], [("ops-b", "5800000")])  # the worker's run above was rolled back
    assert_equal((convert.price(btc, eur).quote_minor_per_base_unit, convert.price(btc, eur).set_by), (5_800_000, "ops-b"))
    try:
        write_config(engine, Settings(environment="test", convert_fee_ppm=5_000), by="test")
        quote, created = convert.quote(caller="b", key=f"rates-{world['run']}", account_id=world["alice"],
                                       to_asset=btc, from_amount=10_000, to_amount=None, books=None)
        assert_equal((created, quote.fee, quote.fee_ppm), (True, 50, 5_000))
    finally:
        write_config(engine, Settings(environment="test"), by="test")
