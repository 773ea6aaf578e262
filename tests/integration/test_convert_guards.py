"""The database keeps the house's liquidity out of the api's reach (issue 17, migration 0033).

As custody_api (the api process's role), on connections of its own:
- a posting that debits a liquidity account, sent straight to `ledger_post`, is refused, and so is
  one under a treasury adjustment's key without its quorum of approvals; the same debit as a leg
  of an approved adjustment, or inside `convert_accept`, goes through;
- the api cannot write `convert_quote` rows itself, and `convert_quote_create` refuses figures that
  do not follow from each other (a payout above the stated rate, a fee below it, a rate better than
  the operator's price, an expiry beyond 60 s).
The ledger is verified at the end.
"""
from __future__ import annotations

import json
import logging
import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from custody.convert.service import Convert
from custody.settings import Settings
from ledger.model import AccountKind, Transfer

log = logging.getLogger(__name__)


@pytest.fixture()
def world(engine, ledger):
    run = uuid.uuid4().hex[:6].upper()
    eur, btc = f"E{run}", f"B{run}"
    ledger.create_asset(eur, 2)
    ledger.create_asset(btc, 8)
    convert = Convert(engine, ledger, Settings(environment="test"))
    liquidity = {a: convert.open_accounts(a).id for a in (eur, btc)}
    equity = {a: ledger.open_account(a, AccountKind.equity, f"equity:{a}").id for a in (eur, btc)}
    ledger.transfer(f"test:{run}:fund-house", equity[btc], liquidity[btc], 10**8, kind="test_funding")
    owner = f"guard{run.lower()}"
    alice = ledger.open_account(eur, AccountKind.customer, f"customer:{owner}:{eur}", owner=owner).id
    alice_btc = ledger.open_account(btc, AccountKind.customer, f"customer:{owner}:{btc}", owner=owner).id
    ledger.transfer(f"test:{run}:fund-alice", equity[eur], alice, 100_00, kind="test_funding")
    return {"run": run, "eur": eur, "btc": btc, "liquidity": liquidity, "equity": equity, "alice": alice,
            "alice_btc": alice_btc, "convert": convert}


def as_api(engine, sql: str, params: dict, role: str = "custody_api"):
    with engine.connect() as c:
        try:
            with c.begin():
                c.exec_driver_sql(f"SET LOCAL ROLE {role}")
                return c.execute(text(sql), params).all()
        finally:
            c.rollback()


POST = ("SELECT status FROM ledger_post(:k, 'h', 'transfer', '{}'::jsonb, ARRAY[:d]::bigint[], ARRAY[:c]::bigint[], "
        "ARRAY[:a]::numeric[], ARRAY[NULL]::bigint[], NULL, NULL)")


def refused(engine, sql: str, params: dict, role: str = "custody_api") -> str:
    with pytest.raises(DBAPIError) as caught:
        as_api(engine, sql, params, role)
    return caught.value.orig.sqlstate


def test_the_process_roles_cannot_debit_liquidity_but_by_an_approved_adjustment(engine, ledger, world):
    """The worker posts treasury adjustments; custody_api never debits liquidity through ledger_post
    (migration 0054), even under an approved adjustment's key."""
    btc_liquidity, btc_equity = world["liquidity"][world["btc"]], world["equity"][world["btc"]]
    worker = "custody_worker"
    log.info("a direct posting from liquidity is refused (insufficient_privilege)")
    assert refused(engine, POST, {"k": f"x:{world['run']}:1", "d": btc_liquidity, "c": btc_equity, "a": 5}) == "42501"
    assert refused(engine, POST, {"k": f"x:{world['run']}:1", "d": btc_liquidity, "c": btc_equity, "a": 5}, worker) == "42501"

    log.info("so is one under an adjustment's key that has no approvals")
    with engine.begin() as c:
        adjustment = c.execute(text(
            "INSERT INTO treasury_adjustment (idempotency_key, proposed_by, reason, transfers, quorum, state) "
            "VALUES (:k, 'mallory', 'drain', CAST(:t AS jsonb), 1, 'proposed') RETURNING id"),
            {"k": f"guard-{world['run']}", "t": json.dumps([{"debit_account_id": btc_liquidity,
                                                              "credit_account_id": btc_equity, "amount": "5"}])}
        ).scalar_one()
    key = f"treasury-adjustment:{adjustment}"
    assert refused(engine, POST, {"k": key, "d": btc_liquidity, "c": btc_equity, "a": 5}, worker) == "42501"
    log.info("an approval by the proposer does not count; one by another operator does")
    with engine.begin() as c:
        c.execute(text("INSERT INTO treasury_adjustment_vote (adjustment_id, operator, decision, comment) "
                       "VALUES (:i, 'mallory', 'approve', 'me')"), {"i": adjustment})
    assert refused(engine, POST, {"k": key, "d": btc_liquidity, "c": btc_equity, "a": 5}, worker) == "42501"
    with engine.begin() as c:
        c.execute(text("INSERT INTO treasury_adjustment_vote (adjustment_id, operator, decision, comment) "
                       "VALUES (:i, 'olga', 'approve', 'ok')"), {"i": adjustment})
    log.info("another amount than the proposal's is still refused; the proposal's own goes through")
    assert refused(engine, POST, {"k": key, "d": btc_liquidity, "c": btc_equity, "a": 6}, worker) == "42501"
    assert refused(engine, POST, {"k": key, "d": btc_liquidity, "c": btc_equity, "a": 5}) == "42501"  # the api: never
    assert as_api(engine, POST, {"k": key, "d": btc_liquidity, "c": btc_equity, "a": 5}, worker)[0].status == "created"
    assert ledger.balance(btc_liquidity).posted == 10**8 - 5


def test_quotes_are_written_only_through_their_checked_function(engine, ledger, world):
    convert, eur, btc = world["convert"], world["eur"], world["btc"]
    log.info("the api may not insert a quote row")
    assert refused(engine, "INSERT INTO convert_quote (created_by) VALUES ('x')", {}) == "42501"

    convert.set_price(by="ops", base=btc, quote=eur, price_minor=5_800_000)
    create = ("SELECT quote_id AS id FROM convert_quote_create('b', :cust, :recv, :frm, :fee, :to, :num, :den, "
              "2500, 0, :src, :ttl, :key, 'h')")
    honest = {"cust": world["alice"], "recv": world["alice_btc"], "frm": 10_000, "fee": 25, "to": 171_982,
              "num": 500, "den": 29, "src": "operator", "ttl": 10, "key": f"guard-{world['run']}"}
    log.info("figures that do not follow from each other are refused")
    for forged in ({"to": 171_983}, {"fee": 24}, {"ttl": 61}, {"num": 501, "to": 172_326},
                   {"recv": world["liquidity"][btc]}):
        assert refused(engine, create, {**honest, **forged}) == "42501", forged
    log.info("the honest figures are accepted, and accepting books them from the row")
    quote_id = as_api(engine, create, honest)[0].id
    answer = as_api(engine, "SELECT status, transaction_id FROM convert_accept(:q, 'b', 'k1')", {"q": quote_id})[0]
    assert answer.status == "created"
    legs = ledger.transaction_transfers(answer.transaction_id)
    assert legs == [Transfer(world["alice"], world["liquidity"][eur], 9_975),
                    Transfer(world["liquidity"][btc], world["alice_btc"], 171_982),
                    Transfer(world["alice"], ledger.account_by_name(f"fees:{eur}").id, 25)]
    log.info("another caller cannot accept it (it does not exist for them)")
    assert as_api(engine, "SELECT status FROM convert_accept(:q, 'other', 'k1')", {"q": quote_id})[0].status == \
        "quote_not_found"
