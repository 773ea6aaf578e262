"""Convert through quotes (issue 17, must-show 1 and 2), over the HTTP API as the api's role.

The worked example: a customer sells 100.00 EUR for BTC at 58,000 EUR/BTC (an operator's price, no
spread) with a 0.25% fee: the fee is 0.25 EUR, the customer receives 0.00171982 BTC, the house's
liquidity and fee accounts move by exactly the matching amounts, and the transaction's totals are
zero per asset. The house's liquidity is funded by a treasury adjustment (proposed by one operator,
signed by another, posted by the worker's job as custody_worker). Then every refusal books nothing and answers its own code: an expired quote,
a reused one, insufficient house liquidity, insufficient customer funds; concurrent accepts of one
quote book once. The ledger is verified at the end (the `ledger` fixture).
"""
from __future__ import annotations

import logging
import threading
from fractions import Fraction
import uuid

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from custody.api.app import create_app
from custody.auth import Role, create_api_key
from custody.container import Container
from custody.settings import Settings
from ledger.model import AccountKind
from regtest.util import assert_equal
from tests.approvers import ADJUSTMENTS, approve_over_api, registry
from tests.integration.adjustment_helpers import run_adjustments_job
from tests.integration.price_helpers import set_price_over_api

log = logging.getLogger(__name__)


class Desk:
    """The service with a backend, two operators and an auditor, EUR and BTC, a funded customer."""

    def __init__(self, engine, ledger) -> None:
        self.settings = Settings(environment="test", convert_fee_ppm=2500, convert_spread_ppm=0)
        self.run = uuid.uuid4().hex[:8]
        self.container = Container(settings=self.settings, engine=engine, ledger=ledger,
                                   approvers=registry(f"cv-ops1-{self.run}", f"cv-ops2-{self.run}"))
        self.ledger = ledger
        self.engine = engine
        self.client = TestClient(create_app(self.container), raise_server_exceptions=False)
        pepper = self.settings.api_key_pepper
        self.keys = {name: create_api_key(engine, f"cv-{name}-{self.run}", role, pepper) for name, role in
                     (("backend", Role.backend), ("ops1", Role.operator), ("ops2", Role.operator),
                      ("admin", Role.admin), ("auditor", Role.auditor))}
        for code, decimals in (("EUR", 2), ("BTC", 8)):
            r = self.call("admin", "POST", "/v1/assets", json={"code": code, "decimals": decimals})
            assert r.status_code == 201, r.text
        self.set_price("BTC", "EUR", "58000.00")
        self.location = self.container.wallets.location_account(f"test{self.run}", "deposit", "EUR")

    def set_price(self, base: str, quote: str, price: str, who: str = "ops1") -> None:
        """The operator `who` proposes and signs the pair's price; the worker's job sets it."""
        set_price_over_api(self.container, self.client, f"cv-{who}-{self.run}",
                           {"base_asset": base, "quote_asset": quote, "price": price},
                           headers={"X-API-Key": self.keys[who]})

    def call(self, who: str, method: str, path: str, **kw):
        return self.client.request(method, path, headers={"X-API-Key": self.keys[who]}, **kw)

    def customer(self, name: str, eur_minor: int) -> int:
        owner = f"cv{self.run}-{name}"
        account = self.ledger.open_account("EUR", AccountKind.customer, f"customer:{owner}:EUR", owner=owner)
        if eur_minor:
            self.ledger.transfer(f"test:{self.run}:fund:{name}", self.location, account.id, eur_minor, kind="deposit")
        return account.id

    def market(self, base_prefix: str = "X", quote_prefix: str = "Y") -> tuple[str, str, str]:
        """New assets (base 8 decimals, quote 6) and their market without fees: (base, quote, symbol)."""
        run = self.run.upper()[:6]
        base, quote = f"{base_prefix}{run}", f"{quote_prefix}{run}"
        for code, decimals in ((base, 8), (quote, 6)):
            assert self.call("admin", "POST", "/v1/assets", json={"code": code, "decimals": decimals}).status_code == 201
        symbol = f"{base}-{quote}"
        r = self.call("admin", "POST", "/v1/markets", json={
            "symbol": symbol, "base_asset": base, "quote_asset": quote, "lot_size": 10_000, "quote_per_tick_lot": 1,
            "fees": {"default": {"maker_ppm": 0, "taker_ppm": 0}}})
        assert r.status_code == 201, r.text
        return base, quote, symbol

    def adjust(self, debit: int, credit: int, amount: str, reason: str) -> None:
        """A treasury adjustment: ops1 proposes, ops2 signs its approval (quorum 1), the worker's job
        posts it: the only way to move liquidity but a quote."""
        r = self.call("ops1", "POST", "/v1/treasury/adjustments", json={
            "idempotency_key": f"{self.run}-{reason}", "reason": reason,
            "transfers": [{"debit_account_id": debit, "credit_account_id": credit, "amount": amount}]})
        assert r.status_code == 201, r.text
        adjustment = r.json()["id"]
        r = approve_over_api(self.client, adjustment, f"cv-ops2-{self.run}", "ok", resource=ADJUSTMENTS,
                             headers={"X-API-Key": self.keys["ops2"]})
        assert r.status_code == 200 and r.json()["state"] == "approved", r.text
        assert_equal(run_adjustments_job(self.container), [adjustment])

    def liquidity(self, asset: str) -> dict:
        r = self.call("auditor", "GET", f"/v1/convert/liquidity/{asset}")
        assert_equal(r.status_code, 200)
        return r.json()

    def posted(self, account_id: int) -> int:
        return self.ledger.balance(account_id).posted

    def ask(self, account_id: int, to_asset: str = "BTC", **amount):
        """POST /v1/quotes under a fresh idempotency key."""
        return self.call("backend", "POST", "/v1/quotes", json={
            "idempotency_key": uuid.uuid4().hex, "account_id": account_id, "to_asset": to_asset, **amount})

    def quote(self, account_id: int, **amount) -> dict:
        r = self.ask(account_id, **amount)
        assert r.status_code == 201, r.text
        return r.json()

    def accept(self, quote_id: int, key: str):
        return self.call("backend", "POST", f"/v1/quotes/{quote_id}/accept", json={"idempotency_key": key})

    def booked(self, quote_id: int) -> int:
        with self.engine.connect() as c:
            return c.execute(text("SELECT count(*) FROM journal_transaction WHERE idempotency_key = :k"),
                             {"k": f"convert:{quote_id}"}).scalar_one()


def refusal(r) -> tuple[int, str]:
    return r.status_code, r.json()["error"]["code"]


@pytest.fixture()
def desk(engine, ledger):
    return Desk(engine, ledger)


def _fund_house(desk: Desk, btc: str) -> dict:
    liquidity = desk.liquidity("BTC")
    equity = desk.ledger.account_by_name("equity:BTC").id
    desk.adjust(equity, liquidity["account_id"], btc, f"fund-{uuid.uuid4().hex[:6]}")
    return liquidity


def test_the_worked_example_sells_100_eur_for_btc(desk):
    alice = desk.customer("alice", 100_00)
    btc_liquidity = _fund_house(desk, "0.01")["account_id"]
    eur_liquidity = desk.liquidity("EUR")["account_id"]
    fees = desk.ledger.account_by_name("fees:EUR").id
    before = {a: desk.posted(a) for a in (btc_liquidity, eur_liquidity, fees)}

    log.info("the backend asks for a quote: 100.00 EUR -> BTC at 58,000 EUR/BTC, 0.25% fee")
    q = desk.quote(alice, from_amount="100.00")
    assert_equal((q["from_amount"]["value"], q["fee"]["value"], q["net"]["value"], q["to_amount"]["value"]),
                 ("100.00", "0.25", "99.75", "0.00171982"))
    assert_equal((q["cost"]["value"], q["rounding"]["value"]), ("99.75", "0.00"))
    assert_equal((q["price"], q["rate"], q["remainder"], q["source"], q["state"]),
                 ("58000.00", {"numerator": "500", "denominator": "29"}, {"numerator": "11", "denominator": "250"},
                  "operator", "open"))
    log.info("the same request under the same key answers the quote it made; another request is refused")
    request = {"idempotency_key": "wx-quote", "account_id": alice, "to_asset": "BTC", "from_amount": "100.00"}
    first = desk.call("backend", "POST", "/v1/quotes", json=request)
    again = desk.call("backend", "POST", "/v1/quotes", json=request)
    assert_equal((first.status_code, again.status_code, again.json()["id"]), (201, 200, first.json()["id"]))
    r = desk.call("backend", "POST", "/v1/quotes", json={**request, "from_amount": "50.00"})
    assert_equal(refusal(r), (409, "idempotency_conflict"))

    log.info("accepting books one linked transaction")
    r = desk.accept(q["id"], "wx-1")
    assert_equal(r.status_code, 201)
    tid = r.json()["transaction_id"]
    receive = q["receive_account_id"]
    assert_equal(desk.posted(alice), 0)
    assert_equal(desk.posted(receive), 171_982)
    assert_equal(desk.posted(eur_liquidity) - before[eur_liquidity], 99_75)
    assert_equal(desk.posted(btc_liquidity) - before[btc_liquidity], -171_982)
    assert_equal(desk.posted(fees) - before[fees], 25)
    t = desk.ledger.get_transaction(tid)
    assert_equal(t.kind, "convert")
    totals: dict[str, int] = {}
    for e in t.entries:
        totals[e.asset] = totals.get(e.asset, 0) + e.amount
    assert_equal(totals, {"EUR": 0, "BTC": 0})
    assert_equal(sorted((e.account_id, e.amount) for e in t.entries),
                 sorted([(alice, -99_75), (eur_liquidity, 99_75), (btc_liquidity, -171_982), (receive, 171_982),
                         (alice, -25), (fees, 25)]))

    log.info("the backend reads the legs back: each names its role, its counterpart and the other legs")
    legs = desk.call("backend", "GET", f"/v1/transactions/{tid}").json()["entries"]
    assert_equal([(l["metadata"]["role"], l["account_id"], l["amount"]["value"]) for l in legs], [
        ("customer_pays", alice, "-99.75"), ("customer_pays", eur_liquidity, "99.75"),
        ("house_pays", btc_liquidity, "-0.00171982"), ("house_pays", receive, "0.00171982"),
        ("fee", alice, "-0.25"), ("fee", fees, "0.25")])
    for i, leg in enumerate(legs):
        assert_equal((leg["counterpart_entry_id"], len(leg["references"])), (legs[i ^ 1]["id"], 5))
    lines = desk.call("backend", "GET", f"/v1/accounts/{alice}/statement").json()["lines"]
    assert_equal([(l["amount"]["value"], l["counterpart_account_id"]) for l in lines if l["kind"] == "convert"],
                 [("-99.75", eur_liquidity), ("-0.25", fees)])

    log.info("a replay of the key answers the original; the quote reads as accepted")
    r = desk.accept(q["id"], "wx-1")
    assert_equal((r.status_code, r.json()["transaction_id"], r.json()["created"]), (200, tid, False))
    assert_equal(desk.call("backend", "GET", f"/v1/quotes/{q['id']}").json()["state"], "accepted")
    assert_equal(desk.booked(q["id"]), 1)


def test_refusals_book_nothing_each_with_its_code(desk):
    rich = desk.customer("rich", 1_000_00)
    poor = desk.customer("poor", 10_00)
    _fund_house(desk, "0.02")

    log.info("expired: the quote's expiry has passed (moved back by the database owner)")
    q = desk.quote(rich, from_amount="10.00")
    with desk.engine.begin() as c:
        c.execute(text("UPDATE convert_quote SET expires_at = now() - interval '1 second' WHERE id = :i"),
                  {"i": q["id"]})
    r = desk.accept(q["id"], "exp-1")
    assert_equal(refusal(r), (409, "quote_expired"))
    assert_equal(desk.booked(q["id"]), 0)
    assert_equal(desk.posted(rich), 1_000_00)

    log.info("reused: accepted once, a second key is refused")
    q = desk.quote(rich, from_amount="10.00")
    assert_equal(desk.accept(q["id"], "use-1").status_code, 201)
    r = desk.accept(q["id"], "use-2")
    assert_equal(refusal(r), (409, "quote_already_used"))
    assert_equal(desk.booked(q["id"]), 1)
    assert_equal(desk.posted(rich), 990_00)

    log.info("insufficient funds: the customer has 10.00 EUR and sells 20.00")
    q = desk.quote(poor, from_amount="20.00")
    r = desk.accept(q["id"], "poor-1")
    assert_equal(refusal(r), (409, "insufficient_funds"))
    assert_equal(desk.booked(q["id"]), 0)
    assert_equal(desk.posted(poor), 10_00)

    log.info("insufficient liquidity: the house drains its BTC (an adjustment) after quoting")
    q = desk.quote(rich, from_amount="500.00")
    liquidity = desk.liquidity("BTC")
    left = int(liquidity["available"]["minor"])
    keep = int(q["to_amount"]["minor"]) - 1
    equity = desk.ledger.account_by_name("equity:BTC").id
    desk.adjust(liquidity["account_id"], equity, f"{(left - keep) / 10**8:.8f}", f"drain-{desk.run}")
    assert_equal(int(desk.liquidity("BTC")["available"]["minor"]), keep)
    r = desk.accept(q["id"], "liq-1")
    assert_equal(refusal(r), (409, "insufficient_liquidity"))
    assert_equal(desk.booked(q["id"]), 0)
    assert_equal((desk.posted(rich), int(desk.liquidity("BTC")["posted"]["minor"])), (990_00, keep))

    log.info("and a quote the liquidity cannot pay is not even made")
    r = desk.ask(rich, "BTC", from_amount="500.00")
    assert_equal(refusal(r), (409, "insufficient_liquidity"))


def test_concurrent_accepts_of_one_quote_book_once(desk):
    alice = desk.customer("racer", 100_00)
    _fund_house(desk, "0.01")
    q = desk.quote(alice, from_amount="50.00")
    answers: list = []
    start = threading.Barrier(8)

    def accept(i: int) -> None:
        start.wait()
        r = desk.accept(q["id"], f"race-{i % 2}")  # two keys: each used by four racers
        answers.append((r.status_code, r.json().get("transaction_id"), r.json().get("error", {}).get("code")))

    threads = [threading.Thread(target=accept, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    created = [a for a in answers if a[0] == 201]
    assert_equal(len(created), 1)
    tid = created[0][1]
    for status, transaction_id, code in answers:
        replayed = (status, transaction_id) == (200, tid)  # the winner's key: its transaction
        assert status == 201 or replayed or (status, code) == (409, "quote_already_used"), answers
    assert_equal(desk.booked(q["id"]), 1)
    assert_equal(desk.posted(alice), 50_00)


def test_a_pair_with_a_market_is_priced_from_its_book(desk):
    base, quote, symbol = desk.market()
    other = f"Z{desk.run.upper()[:6]}"
    assert desk.call("admin", "POST", "/v1/assets", json={"code": other, "decimals": 2}).status_code == 201
    seller, owner = f"cv{desk.run}-maker", f"cv{desk.run}-taker"
    equity = {a: desk.ledger.account_by_name(f"equity:{a}").id for a in (base, quote)}
    maker = desk.ledger.open_account(base, AccountKind.customer, f"customer:{seller}:{base}", owner=seller).id
    desk.ledger.transfer(f"test:{desk.run}:maker", equity[base], maker, 10**8)
    taker = desk.ledger.open_account(quote, AccountKind.customer, f"customer:{owner}:{quote}", owner=owner).id
    desk.ledger.transfer(f"test:{desk.run}:taker", equity[quote], taker, 20_000 * 10**6)
    desk.adjust(equity[base], desk.liquidity(base)["account_id"], "1", f"fund-{base}")
    for cid, price in (("a1", "60000"), ("a2", "61000")):
        r = desk.call("backend", "POST", f"/v1/markets/{symbol}/orders", json={
            "account": seller, "client_order_id": cid, "side": "sell", "qty": "0.1", "price": price})
        assert r.status_code == 201, r.text
    log.info("a one-sided book prices nothing; nor does a two-sided one without a reference price")
    r = desk.ask(taker, base, from_amount="9000")
    assert_equal(refusal(r), (409, "convert_book_unreliable"))
    r = desk.call("backend", "POST", f"/v1/markets/{symbol}/orders", json={
        "account": owner, "client_order_id": "b1", "side": "buy", "qty": "0.01", "price": "59000"})
    assert r.status_code == 201, r.text
    r = desk.ask(taker, base, from_amount="9000")
    assert_equal(refusal(r), (409, "convert_book_unreliable"))
    desk.set_price(base, quote, "60500")

    log.info("9,000 %s buys through both ask levels: the rate is their average for the net amount", quote)
    r = desk.ask(taker, base, from_amount="9000")
    assert r.status_code == 201, r.text
    q = r.json()
    net = 9_000 * 10**6 - 22_500_000  # 0.25% fee
    got = Fraction(10**7) + Fraction((net - 6_000 * 10**6) * 10**7, 6_100 * 10**6)  # 0.1 at 60,000, the rest at 61,000
    assert_equal((q["source"], q["fee"]["minor"], q["net"]["minor"]), (f"book:{symbol}", "22500000", str(net)))
    assert_equal(q["to_amount"]["minor"], str(got.numerator // got.denominator))
    assert_equal(Fraction(int(q["rate"]["numerator"]), int(q["rate"]["denominator"])), got / net)
    r = desk.accept(q["id"], "book-1")
    assert_equal(r.status_code, 201)
    assert_equal(desk.posted(q["receive_account_id"]), got.numerator // got.denominator)

    log.info("an average price more than the band (5%%) from the reference prices nothing")
    desk.set_price(base, quote, "56000")
    r = desk.ask(taker, base, from_amount="100")  # 60,000 against 56,000: 6.7% fewer base per quote unit
    assert_equal(refusal(r), (409, "convert_book_unreliable"))

    log.info("more than the book holds cannot be priced; a pair with neither book nor price is unavailable")
    r = desk.ask(taker, base, from_amount="13000")
    assert_equal(refusal(r), (409, "convert_depth_insufficient"))
    r = desk.ask(taker, other, to_amount="5")
    assert_equal(refusal(r), (422, "convert_pair_unavailable"))


def test_what_the_payouts_rounding_leaves_is_booked_to_its_own_account(desk):
    owner = f"cv{desk.run}-seller"
    seller = desk.ledger.open_account("BTC", AccountKind.customer, f"customer:{owner}:BTC", owner=owner).id
    location = desk.container.wallets.location_account(f"test{desk.run}", "deposit", "BTC")
    desk.ledger.transfer(f"test:{desk.run}:fund:btc-seller", location, seller, 172_000, kind="deposit")
    eur_liquidity = desk.liquidity("EUR")["account_id"]
    desk.adjust(desk.ledger.account_by_name("equity:EUR").id, eur_liquidity, "100.00", f"fund-eur-{desk.run}")
    rounding = desk.ledger.account_by_name("convert:rounding:BTC").id
    before = {a: desk.posted(a) for a in (eur_liquidity, rounding)}

    log.info("selling 0.00172000 BTC at 58,000 EUR/BTC: 9,951 cents cost 171,569 satoshi; 1 satoshi bought nothing")
    r = desk.ask(seller, "EUR", from_amount="0.00172000")
    assert_equal(r.status_code, 201)
    q = r.json()
    assert_equal((q["fee"]["minor"], q["net"]["minor"], q["to_amount"]["value"], q["cost"]["minor"],
                  q["rounding"]["minor"], q["rounding_account_id"]), ("430", "171570", "99.51", "171569", "1", rounding))
    r = desk.accept(q["id"], "round-1")
    assert_equal(r.status_code, 201)
    t = desk.ledger.get_transaction(r.json()["transaction_id"])
    assert_equal([(e.metadata["role"], e.account_id, e.amount) for e in t.entries if e.amount < 0], [
        ("customer_pays", seller, -171_569), ("house_pays", eur_liquidity, -99_51), ("fee", seller, -430),
        ("rounding", seller, -1)])
    assert_equal((desk.posted(seller), desk.posted(rounding) - before[rounding],
                  desk.posted(eur_liquidity) - before[eur_liquidity]), (0, 1, -99_51))
