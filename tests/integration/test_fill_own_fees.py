"""Each party pays its own fee in a fill (issue 17, must-show 3), and old fills keep their postings.

1. Over the API (as the api's role): a seller rests 0.5 BTC at 60,000 USDT (maker, 0.1%), a buyer
   takes it (taker, 0.2%). The buyer's USDT statement shows the full notional paid to the seller
   and ITS fee (60 USDT) to fee income; the seller's shows the notional received and ITS fee
   (30 USDT); each line names its counterpart leg, and the transaction's legs say which fee is whose.
2. A fill settled in the old format (version 1: buyer -> seller net of the seller's fee, the buyer
   paying both fees) is re-settled when the market is rebuilt from its journal: its journal key
   answers `exists` with the same transfers, and the next fill is settled in the new format.
The ledger is verified at the end of each test.
"""
from __future__ import annotations

import logging
import uuid

from fastapi.testclient import TestClient
from sqlalchemy import text

import matching.settlement as settlement
from custody.api.app import create_app
from custody.auth import Role, create_api_key
from custody.container import Container
from custody.settings import Settings
from ledger.model import AccountKind, Transfer
from matching.model import Side
from matching.settlement import customer_account_name
from matching.testing import lots, ticks
from regtest.util import assert_equal
from tests.integration.test_matching_support import BTC, USDT, env  # noqa: F401 - the fixture

log = logging.getLogger(__name__)


def test_buyer_and_seller_statements_show_only_their_own_fee(engine, ledger):
    settings = Settings(environment="test")
    run = uuid.uuid4().hex[:8]
    client = TestClient(create_app(Container(settings=settings, engine=engine, ledger=ledger)),
                        raise_server_exceptions=False)
    keys = {r: create_api_key(engine, f"ownfee-{r.value}-{run}", r, settings.api_key_pepper) for r in Role}

    def call(role, method, path, **kw):
        return client.request(method, path, headers={"X-API-Key": keys[role]}, **kw)

    for code, decimals in (("BTC", 8), ("USDT", 6)):
        call(Role.admin, "POST", "/v1/assets", json={"code": code, "decimals": decimals})
    symbol = f"BTC-USDT-OWN{run}"
    r = call(Role.admin, "POST", "/v1/markets", json={
        "symbol": symbol, "base_asset": "BTC", "quote_asset": "USDT", "lot_size": 10_000, "quote_per_tick_lot": 1,
        "fees": {"default": {"maker_ppm": 1_000, "taker_ppm": 2_000}}})
    assert r.status_code == 201, r.text
    fee_account = r.json()["fee_account_id"]
    seller, buyer = f"{run}-seller", f"{run}-buyer"
    equity = {a: ledger.open_account(a, AccountKind.equity, f"ownfee:{run}:equity:{a}").id for a in ("BTC", "USDT")}
    accounts = {}
    for owner, asset, amount in ((seller, "BTC", BTC), (buyer, "USDT", 40_000 * USDT), (seller, "USDT", 0),
                                 (buyer, "BTC", 0)):
        accounts[(owner, asset)] = ledger.open_account(asset, AccountKind.customer,
                                                       customer_account_name(owner, asset), owner=owner).id
        if amount:
            ledger.transfer(f"ownfee:{run}:fund:{owner}:{asset}", equity[asset], accounts[(owner, asset)], amount)

    log.info("the seller rests (maker), the buyer takes (taker)")
    r = call(Role.backend, "POST", f"/v1/markets/{symbol}/orders", json={
        "account": seller, "client_order_id": "s1", "side": "sell", "qty": "0.5", "price": "60000"})
    assert r.status_code == 201, r.text
    r = call(Role.backend, "POST", f"/v1/markets/{symbol}/orders", json={
        "account": buyer, "client_order_id": "b1", "side": "buy", "qty": "0.5", "price": "60000"})
    assert r.status_code == 201 and r.json()["state"] == "filled", r.text

    def fill_lines(owner: str, asset: str) -> list:
        page = call(Role.backend, "GET", f"/v1/accounts/{accounts[(owner, asset)]}/statement").json()
        return [(l["amount"]["value"], l["counterpart_account_id"]) for l in page["lines"] if l["kind"] == "fill"]

    log.info("the buyer's statement: the notional to the seller, its own (taker) fee to fee income")
    assert_equal(fill_lines(buyer, "USDT"), [("-30000.000000", accounts[(seller, "USDT")]), ("-60.000000", fee_account)])
    log.info("the seller's statement: the notional from the buyer, its own (maker) fee to fee income")
    assert_equal(fill_lines(seller, "USDT"), [("30000.000000", accounts[(buyer, "USDT")]), ("-30.000000", fee_account)])
    assert_equal(fill_lines(buyer, "BTC"), [("0.50000000", accounts[(seller, "BTC")])])

    log.info("the transaction's legs: each with its counterpart, references and role")
    line = call(Role.backend, "GET", f"/v1/accounts/{accounts[(buyer, 'USDT')]}/statement").json()["lines"][-1]
    t = call(Role.backend, "GET", f"/v1/transactions/{line['transaction_id']}").json()
    legs = t["entries"]
    assert_equal([(l["metadata"].get("role"), l["account_id"], l["amount"]["minor"]) for l in legs], [
        ("quote", accounts[(buyer, "USDT")], "-30000000000"), ("quote", accounts[(seller, "USDT")], "30000000000"),
        ("seller_fee", accounts[(seller, "USDT")], "-30000000"), ("seller_fee", fee_account, "30000000"),
        ("buyer_fee", accounts[(buyer, "USDT")], "-60000000"), ("buyer_fee", fee_account, "60000000"),
        ("base", accounts[(seller, "BTC")], "-50000000"), ("base", accounts[(buyer, "BTC")], "50000000")])
    ids = [l["id"] for l in legs]
    for i, leg in enumerate(legs):
        assert_equal(leg["counterpart_entry_id"], ids[i ^ 1])
        assert_equal(sorted(leg["references"]), sorted(x for x in ids if x != leg["id"]))
    assert_equal(line["entry_id"], legs[4]["id"])
    assert_equal(line["counterpart_entry_id"], legs[5]["id"])


def test_an_old_fill_keeps_its_postings_when_the_market_is_rebuilt(env, monkeypatch):  # noqa: F811
    seller, buyer = env.fund("seller", btc=BTC), env.fund("buyer", usdt=100_000 * USDT)
    log.info("a fill settled in format 1 (as before migration 0033)")
    monkeypatch.setattr(settlement, "SETTLEMENT_VERSION", 1)
    env.trading.place(env.symbol, seller, "s1", Side.sell, qty=lots("0.3"), price=ticks(60_000))
    env.trading.place(env.symbol, buyer, "b1", Side.buy, qty=lots("0.1"), price=ticks(60_000))
    monkeypatch.setattr(settlement, "SETTLEMENT_VERSION", 2)

    def fill_rows():
        with env.ledger.engine.connect() as c:
            return c.execute(text("SELECT seq, settlement_version, journal_transaction_id FROM fill WHERE market = :m "
                                  "ORDER BY seq, match_no"), {"m": env.symbol}).all()

    [(_, version, old_tid)] = fill_rows()
    assert_equal(version, 1)
    old_transfers = env.ledger.transaction_transfers(old_tid)
    fee = env.trading.market(env.symbol).fee_account_id
    usdt = {o: env.ledger.account_by_name(customer_account_name(o, "USDT")).id for o in (seller, buyer)}
    # 0.1 BTC at 60,000: 6,000 USDT; maker (seller) 0.1% = 6, taker (buyer) 0.2% = 12
    assert_equal(old_transfers[:2], [Transfer(usdt[buyer], usdt[seller], 5_994 * USDT, old_transfers[0].hold_id),
                                     Transfer(usdt[buyer], fee, 18 * USDT, old_transfers[0].hold_id)])

    log.info("a restart rebuilds the market from its journal, re-settling the old fill as format 1")
    env.restart()
    assert_equal(env.ledger.transaction_transfers(old_tid), old_transfers)

    log.info("the next fill is settled in format 2: each party its own fee")
    env.trading.place(env.symbol, buyer, "b2", Side.buy, qty=lots("0.1"), price=ticks(60_000))
    rows = fill_rows()
    assert_equal([r.settlement_version for r in rows], [1, 2])
    new = env.ledger.transaction_transfers(rows[1].journal_transaction_id)
    assert_equal([(t.debit_account_id, t.credit_account_id, t.amount) for t in new[:3]],
                 [(usdt[buyer], usdt[seller], 6_000 * USDT), (usdt[seller], fee, 6 * USDT), (usdt[buyer], fee, 12 * USDT)])
    assert_equal((env.balance(seller, "USDT").posted, env.balance(buyer, "USDT").posted),
                 (2 * 5_994 * USDT, 100_000 * USDT - 2 * 6_012 * USDT))
