"""Review R1 (branch int, 0051/0052/0054): custody_api alone still drains the convert liquidity.

0054 keeps the liquidity guard out of `convert_accept` (it posts through `ledger_post_by(NULL, ...)`:
"its liquidity legs are its own checked quote's"). But every figure the quote is checked against is
one custody_api writes itself:
- the operator's price (`convert_price_set`, EXECUTE for custody_api): 0052 requires `by` to name a
  live operator or admin key; the names are readable and any deployment has one, so custody_api
  sets any price under an operator's name (0052 says so; 0054 then exempts what follows from it);
- a book source (`book:<symbol>`) is bounded by the market's last `fill`, and custody_api INSERTs
  `market`, `matching_command`, `trade_order` and `fill` (all a fill's references).
So with the api's credentials alone a customer account of the attacker's buys the house's BTC
liquidity for a few cents. Everything runs in one rolled-back transaction per test.
"""
from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from custody.convert.service import Convert
from custody.settings import Settings
from ledger.model import AccountKind


@pytest.fixture()
def house(engine, ledger):
    run = uuid.uuid4().hex[:6].upper()
    eur, btc = f"E{run}", f"B{run}"
    ledger.create_asset(eur, 2)
    ledger.create_asset(btc, 8)
    convert = Convert(engine, ledger, Settings(environment="test"))
    liquidity = {a: convert.open_accounts(a).id for a in (eur, btc)}
    equity = {a: ledger.open_account(a, AccountKind.equity, f"equity:{a}").id for a in (eur, btc)}
    ledger.transfer(f"r1c:{run}:fund-house", equity[btc], liquidity[btc], 10**8, kind="test_funding")
    owner = f"r1c{run.lower()}"
    mallory_eur = ledger.open_account(eur, AccountKind.customer, f"customer:{owner}:{eur}", owner=owner).id
    mallory_btc = ledger.open_account(btc, AccountKind.customer, f"customer:{owner}:{btc}", owner=owner).id
    ledger.transfer(f"r1c:{run}:fund-mallory", equity[eur], mallory_eur, 10_00, kind="test_funding")
    return {"run": run, "eur": eur, "btc": btc, "liquidity": liquidity, "mallory_eur": mallory_eur,
            "mallory_btc": mallory_btc, "equity": equity}


QUOTE = ("SELECT quote_id FROM convert_quote_create('mallory', :cust, :recv, :frm, :fee, :to, :num, :den, "
         "2500, 0, :src, 30, :key, 'h')")


def _drain(c, house, steps) -> tuple[str, int]:
    """Run `steps` (SQL, params) as custody_api, then quote 1000 EUR cents for BTC at 10^5 sat a cent
    (a price of 10 EUR per BTC) and accept; answer the first refusal (or 'posted') and what
    mallory's BTC account then holds."""
    outcome = "posted"
    try:
        with c.begin_nested():
            for sql, params in steps:
                c.execute(text(sql), params)
            quote = c.execute(text(QUOTE), {
                "cust": house["mallory_eur"], "recv": house["mallory_btc"], "frm": 1000, "fee": 3,
                "to": 997 * 10**5, "num": 10**5, "den": 1, "src": steps[-1][1].get("src", "operator"),
                "key": f"r1c:{house['run']}"}).scalar_one()
            status = c.execute(text("SELECT status FROM convert_accept(:q, 'mallory', :k)"),
                               {"q": quote, "k": f"r1c:{house['run']}:accept"}).scalar_one()
            if status != "created":
                outcome = status
            c.execute(text("SET CONSTRAINTS ALL IMMEDIATE"))
    except DBAPIError as exc:
        outcome = exc.orig.sqlstate
    got = c.execute(text("SELECT coalesce(sum(posted), 0) FROM account_balance WHERE account_id = :a"),
                    {"a": house["mallory_btc"]}).scalar_one()
    return outcome, int(got)


def test_api_role_cannot_set_the_convert_price_it_then_sells_at(engine, ledger, house):
    with engine.connect() as c:
        tx = c.begin()
        try:
            operator = f"r1c-ops-{house['run'].lower()}"  # an operator's key, as every deployment has
            c.execute(text("INSERT INTO api_key (name, role, key_prefix, key_hash) VALUES (:n, 'operator', 'p', :h)"),
                      {"n": operator, "h": uuid.uuid4().hex})
            c.execute(text("SET LOCAL ROLE custody_api"))
            name = c.execute(text("SELECT name FROM api_key WHERE name = :n AND role = 'operator'"),
                             {"n": operator}).scalar_one()  # readable by the api
            outcome, got = _drain(c, house, [
                ("SELECT 1 FROM convert_price_set(:by, :b, :q, 1000)",
                 {"by": f"api:{name}", "b": house["btc"], "q": house["eur"]}),
            ])
        finally:
            tx.rollback()
    # 10 EUR at the honest ~58 000 EUR/BTC buys ~17 000 sat; the forged price pays 99 700 000 sat
    assert outcome == "42501" and got == 0, (outcome, got)
    ledger.verify()


def test_api_role_cannot_bound_a_book_quote_with_a_market_and_fill_it_wrote(engine, ledger, house):
    with engine.connect() as c:
        tx = c.begin()
        try:
            c.execute(text("SET LOCAL ROLE custody_api"))
            symbol = f"R1C{house['run']}"
            tx_id = c.execute(text("SELECT max(t.id) FROM journal_transaction t WHERE NOT EXISTS "
                                   "(SELECT 1 FROM fill f WHERE f.journal_transaction_id = t.id)")).scalar_one()
            order = ("INSERT INTO trade_order (id, market, account, client_order_id, side, order_type, fee_tier, state) "
                     "VALUES (:i, :s, 'x', :i, 'buy', 'limit', 'default', 'filled')")
            outcome, got = _drain(c, house, [
                ("INSERT INTO market (symbol, base_asset, quote_asset, lot_size, quote_per_tick_lot, fees, default_stp, "
                 "fee_account_id) VALUES (:s, :b, :q, 1, 1, '{}'::jsonb, 'cancel_newest', :f)",
                 {"s": symbol, "b": house["btc"], "q": house["eur"], "f": house["equity"][house["eur"]]}),
                ("INSERT INTO matching_command (market, seq, record) VALUES (:s, 1, '{}'::jsonb)", {"s": symbol}),
                (order, {"i": f"{symbol}-a", "s": symbol}),
                (order, {"i": f"{symbol}-b", "s": symbol}),
                # the last trade: 10^8 sat for 1000 cents (10 EUR per BTC)
                ("INSERT INTO fill (market, seq, match_no, maker_order_id, taker_order_id, maker_account, taker_account, "
                 "taker_side, price_ticks, qty_lots, base_amount, quote_amount, maker_fee, taker_fee, "
                 "journal_transaction_id) VALUES (:s, 1, 1, :a, :b, 'a', 'b', 'buy', 1, 1, 100000000, 1000, 0, 0, :t)",
                 {"s": symbol, "a": f"{symbol}-a", "b": f"{symbol}-b", "t": tx_id, "src": f"book:{symbol}"}),
            ])
        finally:
            tx.rollback()
    assert outcome == "42501" and got == 0, (outcome, got)
    ledger.verify()
