"""Deposit addresses without a node: issuance is idempotent per key, indexes are persisted and never
reused, only customer accounts get addresses, and the gap-limit monitor raises a warning incident
while too many issued addresses are unused."""
from __future__ import annotations

import uuid

import pytest

from custody.errors import CustodyError
from sqlalchemy import text

from custody.addresses import derive_btc_address
from custody.wallets import Wallets
from ledger.errors import LedgerError
from signer.keys import Secret, SignerKeys, seed_from_text


@pytest.fixture
def wallets(engine, ledger):
    w = Wallets(engine, ledger)
    keys = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
    w.register_wallet("bitcoin", "deposit", "regtest", keys.account_xpub("bitcoin", "deposit"), gap_limit=3)
    w.configure_asset("BTC", 8, "bitcoin", finality=3)
    return w, keys


def test_issue_is_idempotent_and_indexes_persist(wallets, engine, ledger):
    w, keys = wallets
    acct = w.customer_account(f"addr-{uuid.uuid4().hex[:8]}", "BTC")
    first = w.issue_address(f"k:{acct}:1", acct)
    again = w.issue_address(f"k:{acct}:1", acct)
    second = w.issue_address(f"k:{acct}:2", acct)
    assert (again.address, again.derivation_index, again.created) == (first.address, first.derivation_index, False)
    assert second.derivation_index > first.derivation_index
    assert first.address == derive_btc_address(keys.account_xpub("bitcoin", "deposit"), "regtest", 0, first.derivation_index)
    other = w.customer_account(f"addr-{uuid.uuid4().hex[:8]}", "BTC")
    with pytest.raises(LedgerError) as err:
        w.issue_address(f"k:{acct}:1", other)
    assert err.value.code.value == "idempotency_conflict"
    fees = w.firm_account("fees", "BTC")
    with pytest.raises(CustodyError) as err:  # a documented 403, as the route's schema says
        w.issue_address(f"k:{fees}", fees)
    assert err.value.code.value == "kind_not_permitted"


def test_gap_limit_monitor_warns_while_addresses_are_unused(wallets, engine, ledger):
    w, _ = wallets
    acct = w.customer_account(f"gap-{uuid.uuid4().hex[:8]}", "BTC")
    for i in range(5):
        w.issue_address(f"gap:{acct}:{i}", acct)
    with engine.connect() as c:
        incidents = c.execute(text("SELECT severity, detail FROM incident WHERE kind = 'gap_limit'")).all()
    assert incidents and all(i.severity == "warning" for i in incidents)
    assert max(int(i.detail["unused"]) for i in incidents) > 3
