"""Brief H2 item 1: custody_api INSERTs `account` (0049 left it), so it chose a new account's kind, flags
and owner: an equity account of its own naming, or a customer account with `may_go_negative`, is an
account it can post from while it holds nothing (money from nothing). Migration 0052 refuses, for
custody_api, any new account but the ones the service opens, under their names and with their kind's
limits (42501). Each forgery runs as custody_api in one transaction, rolled back; the service's own
openings, named by the code that makes them, still go through as custody_api.
"""
from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from custody.convert.service import fee_account_name, liquidity_account_name, rounding_account_name
from custody.wallets import FIRM_ACCOUNTS
from ledger.errors import LedgerError
from ledger.model import DEFAULT_LIMITS, AccountKind, Transfer
from matching.settlement import customer_account_name
from regtest.util import assert_equal

INSUFFICIENT_PRIVILEGE = "42501"


_CHAIN_ASSETS: list[str] = []  # chain rows this module wrote, removed when it ends (forget_chain_assets)


@pytest.fixture(scope="module", autouse=True)
def forget_chain_assets(engine):
    """The session's database is shared with the e2e suites, whose deposit scanners watch every
    ethereum chain_asset's contract: this module's made-up assets leave no chain row behind."""
    yield
    with engine.begin() as c:
        c.execute(text("DELETE FROM chain_asset WHERE asset = ANY(:a)"), {"a": _CHAIN_ASSETS})


def new_asset(engine, ledger, chain: str = "bitcoin") -> str:
    """An asset of this test's own on `chain` (its chain row written as the worker would), with no
    account opened yet: every name below is new. An ethereum one gets a well-formed contract address
    no chain has."""
    asset = f"T{uuid.uuid4().hex[:8].upper()}"
    ledger.create_asset(asset, 8)
    contract = None if chain == "bitcoin" else "0x" + (uuid.uuid4().hex + uuid.uuid4().hex)[:40]
    with engine.begin() as c:
        c.execute(text("INSERT INTO chain_asset (asset, chain, contract_address, finality_confirmations) "
                       "VALUES (:a, :c, :k, 1)"), {"a": asset, "c": chain, "k": contract})
    _CHAIN_ASSETS.append(asset)
    return asset


def as_api(engine, ledger, attempt) -> str:
    """Run `attempt(conn)` as custody_api in a transaction that is rolled back: 'done' (it went
    through) or the SQLSTATE / ledger code it was refused with."""
    with engine.connect() as c:
        tx = c.begin()
        try:
            c.execute(text("SET LOCAL ROLE custody_api"))
            attempt(c)
            c.execute(text("SET CONSTRAINTS ALL IMMEDIATE"))  # the deferred checks COMMIT would run
            return "done"
        except DBAPIError as exc:
            return getattr(exc.orig, "sqlstate", None) or type(exc).__name__
        except LedgerError as exc:
            return exc.code.value
        finally:
            tx.rollback()


FORGERIES = {
    # (kind, name pattern, owner pattern, may_go_negative): the asset is {a}, a fresh owner {o}
    "equity_of_its_own": (AccountKind.equity, "mint:{o}", None, None),
    "customer_that_may_go_negative": (AccountKind.customer, "customer:{o}:{a}", "{o}", True),
    "customer_named_for_another_owner": (AccountKind.customer, "customer:victim-{o}:{a}", "{o}", None),
    "fee_income_that_may_go_negative": (AccountKind.fee_income, "fees:{a}", None, True),
    "location_of_another_chain": (AccountKind.asset_location, "location:ethereum:hot:{a}", None, None),
    "location_of_an_unknown_tier": (AccountKind.asset_location, "location:bitcoin:attic:{a}", None, None),
    "suspense_with_an_owner": (AccountKind.suspense, "suspense:{a}", "{o}", None),
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_the_api_role_cannot_open_an_account_to_post_from(engine, ledger, forgery):
    kind, name, owner, negative = FORGERIES[forgery]
    asset = new_asset(engine, ledger)
    o = f"r-{uuid.uuid4().hex[:8]}"
    victim = ledger.open_account(asset, AccountKind.customer, f"customer:{o}:{asset}:victim", owner=o).id

    def forge(c) -> None:
        made = ledger.open_account(asset, kind, name.format(a=asset, o=o), owner=owner and owner.format(o=o),
                                   may_go_negative=negative, conn=c).id
        ledger.post(f"forge:{o}", [Transfer(made, victim, 50_000)], conn=c)

    assert_equal(as_api(engine, ledger, forge), INSUFFICIENT_PRIVILEGE)
    assert_equal(ledger.balance(victim).posted, 0)
    ledger.verify()


def test_the_api_role_still_opens_every_account_the_service_opens(engine, ledger):
    """The names and limits the code uses (custody.wallets, custody.convert, matching), each opened
    for the first time as custody_api, and again (idempotent), in one transaction rolled back; their
    limits are the kind's."""
    btc_like = new_asset(engine, ledger)
    eth_like = new_asset(engine, ledger, "ethereum")
    owner = f"r-{uuid.uuid4().hex[:8]}"
    wanted = [(btc_like, kind, f"{role}:{btc_like}", None, None) for role, kind in FIRM_ACCOUNTS.items()]
    wanted += [
        (btc_like, AccountKind.liquidity, liquidity_account_name(btc_like), None, None),
        (btc_like, AccountKind.dust, rounding_account_name(btc_like), None, None),
        (btc_like, AccountKind.fee_income, fee_account_name(btc_like), None, None),  # already in FIRM_ACCOUNTS: again
        (btc_like, AccountKind.fee_income, f"matching:M-{owner}:fees", f"matching:M-{owner}", 1),
        (btc_like, AccountKind.customer, customer_account_name(owner, btc_like), owner, None),
        (btc_like, AccountKind.customer, f"customer:{owner}:{btc_like}:savings", owner, None),
        *((btc_like, AccountKind.asset_location, f"location:bitcoin:{tier}:{btc_like}", None, None)
          for tier in ("deposit", "hot", "warm", "cold")),
        (eth_like, AccountKind.asset_location, f"location:ethereum:hot:{eth_like}", None, None),
    ]

    def open_each_twice(c) -> None:
        for asset, kind, name, who, shards in wanted:
            first = ledger.open_account(asset, kind, name, owner=who, balance_shards=shards, conn=c)
            again = ledger.open_account(asset, kind, name, owner=who, balance_shards=shards, conn=c)
            assert_equal((again.id, (first.may_go_negative, first.may_go_positive)), (first.id, DEFAULT_LIMITS[kind]))

    assert_equal(as_api(engine, ledger, open_each_twice), "done")
    assert {kind for _, kind, *_ in wanted} == set(AccountKind)  # every kind the service opens was tried
    ledger.verify()
