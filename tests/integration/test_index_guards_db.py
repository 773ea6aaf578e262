"""Migration 0028's guards, against PostgreSQL (issue 13, review R1):

- `wallet.next_index` steps by at most 1 per UPDATE for every role, the worker's and the owner's
  included (the api's refusal is in test_review13_index_addresses);
- the worker's index records its verdict on each deposit address row once, in the transaction
  `WalletIndex.prepare` commits, with a critical incident for a refused row; a process started
  later takes the verdicts as recorded and derives nothing again (shown with a verdict the owner
  forged: the fresh index watches it as recorded, so it did not re-derive it).

Runs on a database of its own (own_database): it writes rows by hand.
"""
from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from custody.addresses import derive_btc_address
from custody.controls import kill_switch
from custody.wallet_index import WalletIndex
from custody.wallets import Wallets
from ledger.model import AccountKind
from ledger.service import Ledger
from regtest.util import assert_equal
from signer.keys import Secret, SignerKeys, seed_from_text
from tests.integration.own_database import own_database

KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
OTHER = SignerKeys(seed_from_text(Secret("00" * 32)), "regtest")


def test_next_index_steps_by_one_for_every_role(database_url):
    with own_database(database_url, "guard_step") as eng:
        wallets = Wallets(eng, Ledger(eng))
        wallet = wallets.register_wallet("bitcoin", "deposit", "regtest", KEYS.account_xpub("bitcoin", "deposit"))
        for role in ("custody_worker", None):  # None: the owner (migrations, operators by hand)
            with pytest.raises(DBAPIError) as refused, eng.begin() as c:
                if role:
                    c.execute(text(f"SET LOCAL ROLE {role}"))
                c.execute(text("UPDATE wallet SET next_index = next_index + 2 WHERE id = :w"), {"w": wallet})
            assert_equal(refused.value.orig.sqlstate, "23514")
            with pytest.raises(DBAPIError), eng.begin() as c:  # nor back
                c.execute(text("UPDATE wallet SET next_index = -1 WHERE id = :w"), {"w": wallet})
        with eng.begin() as c:
            c.execute(text("UPDATE wallet SET next_index = next_index + 1, gap_limit = 30 WHERE id = :w"), {"w": wallet})
            c.execute(text("UPDATE wallet SET next_index = next_index, gap_limit = 20 WHERE id = :w"), {"w": wallet})
            assert_equal(c.execute(text("SELECT next_index FROM wallet WHERE id = :w"), {"w": wallet}).scalar_one(), 1)


def test_verdicts_are_recorded_once_and_trusted_by_a_later_process(database_url):
    with own_database(database_url, "guard_verdict") as eng:
        ledger = Ledger(eng)
        wallets = Wallets(eng, ledger)
        wallets.configure_asset("BTC", 8, "bitcoin", finality=2)
        wallet = wallets.register_wallet("bitcoin", "deposit", "regtest", KEYS.account_xpub("bitcoin", "deposit"))
        account = ledger.open_account("BTC", AccountKind.customer, "customer:eve:BTC", owner="eve").id
        honest = wallets.issue_address("eve:1", account)
        forged = derive_btc_address(OTHER.account_xpub("bitcoin", "deposit"), "regtest", 0, 0)
        with eng.begin() as c:
            c.execute(text("SET LOCAL ROLE custody_api"))
            c.execute(text("INSERT INTO deposit_address (wallet_id, chain, address, derivation_index, account_id, owner, "
                           "idempotency_key) VALUES (:w, 'bitcoin', :a, 5, :acc, 'eve', 'forged:5')"),
                      {"w": wallet, "a": forged, "acc": account})
        index = WalletIndex("bitcoin")
        index.prepare(eng, cursor=None)  # the worker's refresh before a scan: commits the verdicts
        assert honest.address in index.addresses and forged not in index.addresses
        with eng.connect() as c:
            verdicts = dict(c.execute(text("SELECT d.address, k.derived FROM deposit_address_check k "
                                           "JOIN deposit_address d ON d.id = k.deposit_address_id")).all())
            incidents = c.execute(text("SELECT kind, severity FROM incident")).all()
        assert_equal(verdicts, {honest.address: True, forged: False})
        assert_equal([tuple(i) for i in incidents], [("deposit_address_not_derived", "critical")])
        assert kill_switch(eng).engaged

        log_row = "a row the owner vouched for by hand (a verdict is the worker's word, never re-derived)"
        other = derive_btc_address(OTHER.account_xpub("bitcoin", "deposit"), "regtest", 0, 1)
        with eng.begin() as c:
            c.execute(text("UPDATE wallet SET next_index = next_index + 1 WHERE id = :w"), {"w": wallet})
            row = c.execute(text("INSERT INTO deposit_address (wallet_id, chain, address, derivation_index, account_id, "
                                 "owner, idempotency_key) VALUES (:w, 'bitcoin', :a, 1, :acc, 'eve', 'vouched:1') "
                                 "RETURNING id"), {"w": wallet, "a": other, "acc": account}).scalar_one()
            c.execute(text("INSERT INTO deposit_address_check (deposit_address_id, derived) VALUES (:i, true)"), {"i": row})
        later = WalletIndex("bitcoin")  # a process started later
        later.prepare(eng, cursor=None)
        assert other in later.addresses, log_row
        assert honest.address in later.addresses and forged not in later.addresses
        with pytest.raises(DBAPIError), eng.begin() as c:  # verdicts are never rewritten
            c.execute(text("UPDATE deposit_address_check SET derived = true"))
        ledger.assert_verified()


def test_an_address_issued_between_the_wallet_read_and_the_row_fetch_is_not_refused(database_url):
    """The refresh reads the wallets, then fetches the new deposit address rows in a later statement:
    an address the api issued and committed in between (row and next_index in one transaction) was
    refused as "never handed out" against the older next_index, opening a critical incident and
    engaging the kill switch (found by bench/soak.py while customers were being given addresses)."""
    from custody.wallet_index import _WALLETS_SQL

    with own_database(database_url, "guard_race") as eng:
        ledger = Ledger(eng)
        wallets = Wallets(eng, ledger)
        wallets.configure_asset("BTC", 8, "bitcoin", finality=2)
        wallets.register_wallet("bitcoin", "deposit", "regtest", KEYS.account_xpub("bitcoin", "deposit"))
        account = ledger.open_account("BTC", AccountKind.customer, "customer:eve:BTC", owner="eve").id
        index = WalletIndex("bitcoin")
        index.prepare(eng, cursor=None)
        with eng.begin() as c:
            stale = {r.id: r for r in c.execute(_WALLETS_SQL)}  # what the refresh read first
            issued = wallets.issue_address("eve:1", account)  # the api, committed in between
            index._refresh_deposit_addresses(c, stale)
        assert issued.address in index.addresses
        with eng.connect() as c:
            assert_equal(c.execute(text("SELECT count(*) FROM incident")).scalar_one(), 0)
        assert not kill_switch(eng).engaged
