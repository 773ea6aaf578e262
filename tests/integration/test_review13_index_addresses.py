"""Review of issue 13 (R1): what the wallet index watches is decided by rows a compromised api may
write. Each test below demonstrates a finding; it failed on the code under review (it was marked
`xfail(strict=True)` then) and passes since branch fix13 fixed it (custody.wallet_index: verified
deposit rows, cold addresses from rebalances, ids followed with their gaps; migration 0028).

- The index takes every `deposit_address.address` as given (custody.wallet_index.WalletIndex.refresh):
  it never checks that the address is the deposit key's derivation at the row's index. custody_api
  keeps INSERT on deposit_address with every column (migration 0022), so a compromised api can make
  the scanner watch, and credit to an account of its choosing, an address it holds the key of (the
  coins stay with the attacker while reconciliation's index figure counts them), or the firm's own
  hot receive address (a later row overrides the hot tier: outputs to the hot wallet become
  "deposits").
- The cold addresses watched are `<cold>/0/0 .. next_index - 1`, derived one by one on every
  refresh, and custody_api may UPDATE wallet.next_index: one statement makes the worker derive (at
  about 0.6 ms each here) and watch millions of addresses no rebalance was ever told to pay.

Runs on a database of its own (own_database): it writes rows as custody_api by hand.
"""
from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from custody.addresses import derive_btc_address
from custody.destinations import HOT_RECEIVE_INDEX
from custody.wallet_index import WATCH_AHEAD, WalletIndex
from custody.wallets import Wallets
from ledger.model import AccountKind
from ledger.service import Ledger
from signer.keys import Secret, SignerKeys, seed_from_text
from tests.integration.own_database import own_database

KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
OTHER = SignerKeys(seed_from_text(Secret("00" * 32)), "regtest")  # the attacker's own key


def _setup(eng):
    ledger = Ledger(eng)
    wallets = Wallets(eng, ledger)
    wallets.configure_asset("BTC", 8, "bitcoin", finality=2)
    ids = {tier: wallets.register_wallet("bitcoin", tier, "regtest", KEYS.account_xpub("bitcoin", tier))
           for tier in ("deposit", "hot", "cold")}
    account = ledger.open_account("BTC", AccountKind.customer, "customer:mallory:BTC", owner="mallory").id
    wallets.issue_address("honest:1", account)  # one honest address, so the index has something to hold
    return wallets, ids, account


def _as_api(eng, sql: str, params: dict) -> None:
    """One statement run as custody_api (the api process's role), committed."""
    with eng.begin() as c:
        c.execute(text("SET LOCAL ROLE custody_api"))
        c.execute(text(sql), params)


@pytest.mark.parametrize("target", ["attacker_address", "hot_receive_address"])
def test_the_index_watches_only_addresses_derived_from_our_keys(database_url, target):
    with own_database(database_url, "r1_addr") as eng:
        wallets, ids, account = _setup(eng)
        index = WalletIndex("bitcoin")
        with eng.connect() as c:
            index.refresh(c)  # the worker's index, loaded before the forged row (a running worker)
        hot = derive_btc_address(KEYS.account_xpub("bitcoin", "hot"), "regtest", 0, HOT_RECEIVE_INDEX)
        address = derive_btc_address(OTHER.account_xpub("bitcoin", "deposit"), "regtest", 0, 0) \
            if target == "attacker_address" else hot
        # what a compromised api can write (migration 0022: custody_api keeps INSERT on deposit_address)
        _as_api(eng, "INSERT INTO deposit_address (wallet_id, chain, address, derivation_index, account_id, owner, "
                     "idempotency_key) VALUES (:w, 'bitcoin', :a, 77, :acc, 'mallory', 'forged:1')",
                {"w": ids["deposit"], "a": address, "acc": account})
        with eng.connect() as c:
            index.refresh(c)
        deposit_xpub = KEYS.account_xpub("bitcoin", "deposit")
        watched_deposit = {a: o.index for a, o in index.addresses.items() if o.tier == "deposit"}
        not_derived = {a: i for a, i in watched_deposit.items() if derive_btc_address(deposit_xpub, "regtest", 0, i) != a}
        assert not_derived == {}, f"the index watches as deposit addresses {not_derived}, not derived from the deposit key"
        assert index.addresses[hot].tier == "hot", "the hot receive address must stay in the hot tier"


def test_raising_the_cold_next_index_does_not_make_the_index_watch_unpaid_cold_addresses(database_url):
    with own_database(database_url, "r1_cold") as eng:
        wallets, ids, _account = _setup(eng)
        index = WalletIndex("bitcoin")
        with eng.connect() as c:
            index.refresh(c)
        # custody_api may UPDATE wallet (next_index) (migration 0022): the api's own rebalance route takes
        # the next cold index; a compromised api sets any value (here small, for the test's time: at
        # ~0.6 ms per derivation, 2**31 - 1 would keep every worker scan busy for weeks)
        # (fixed: migration 0028's trigger refuses the jump for every role; what remains possible, one
        # index at a time as the rebalance route takes it, must not make the index watch more)
        with pytest.raises(DBAPIError) as refused:
            _as_api(eng, "UPDATE wallet SET next_index = 3000 WHERE id = :w", {"w": ids["cold"]})
        assert refused.value.orig.sqlstate == "23514", refused.value
        # (branch lookahead: the index watches the cold key's addresses WATCH_AHEAD past next_index, as
        # the node's own view does; each step of next_index then costs one derivation, never a jump)
        before = {a for a, o in index.addresses.items() if o.tier == "cold"}
        for _ in range(3):
            _as_api(eng, "UPDATE wallet SET next_index = next_index + 1 WHERE id = :w", {"w": ids["cold"]})
        with eng.connect() as c:
            index.refresh(c)
            next_index = c.execute(text("SELECT next_index FROM wallet WHERE id = :w"), {"w": ids["cold"]}).scalar_one()
        cold = {a: o.index for a, o in index.addresses.items() if o.tier == "cold"}
        assert len(cold) == next_index + WATCH_AHEAD and len(set(cold) - before) == 3, (
            f"the index derived and watches {len(cold)} cold addresses ({len(set(cold) - before)} new) for next_index "
            f"{next_index}")
        cold_xpub = KEYS.account_xpub("bitcoin", "cold")
        assert all(derive_btc_address(cold_xpub, "regtest", 0, i) == a for a, i in cold.items())


def test_a_batch_committed_after_a_higher_one_has_its_change_address_watched(database_url):
    with own_database(database_url, "r1_batch") as eng:
        _setup(eng)
        index = WalletIndex("bitcoin")
        with eng.connect() as c:
            index.refresh(c)
        insert = text("INSERT INTO withdrawal_batch (chain, asset, state) VALUES ('bitcoin', 'BTC', 'open') RETURNING id")
        with eng.connect() as slow, eng.connect() as fast:
            slow.begin()
            first = slow.execute(insert).scalar_one()  # worker A's batch: id taken, not committed yet
            with fast.begin():
                second = fast.execute(insert).scalar_one()  # worker B's batch commits first
            assert second > first
            with eng.connect() as c:
                index.refresh(c)  # a scan runs now
            slow.commit()
        with eng.connect() as c:
            index.refresh(c)  # and every scan after it
        hot_xpub = KEYS.account_xpub("bitcoin", "hot")
        for batch in (first, second):
            change = derive_btc_address(hot_xpub, "regtest", 1, batch)
            assert change in index.addresses, f"batch {batch}'s change address {change} is not watched"
