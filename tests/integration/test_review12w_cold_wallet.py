"""Review of issue 12 (R2): the signer takes a rebalance's destination key from a row the custody
processes can write.

`Signer.sign_bitcoin_rebalance` checks that a rebalance pays "the registered cold wallet": the
`wallet` row (chain bitcoin, tier cold), which custody_api and custody_worker may INSERT and
UPDATE (migration 0020 grants them DML on every table but the signer's own). So a compromised API
process (or anyone with its database login) registers a cold key of its own, writes an `open`
rebalance of every hot coin to an address of that key, reserves the coins, and the signer signs
the transfer: the hot wallet drained with no approval at all. The issue's boundary is that the
signer trusts no database row for who gets paid; the cold key must be pinned in the signer's own
configuration (like its approver keys), and a rebalance to any other key refused
(`destination_not_cold`).

Each statement is made as custody_worker (`SET LOCAL ROLE` on the owner's connection), on a
database of the test's own; the books are verified at the end (the forged rows move no ledger
money). Since migration 0022 custody_api may not register a wallet at all (refused first, below);
the worker still may (it applies the reference data), so the signer's own check is what stops it.
"""
from __future__ import annotations

import logging
import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from custody.addresses import canonical_btc_account_key, derive_btc_address
from custody.wallets import Wallets
from ledger.service import Ledger
from regtest.util import assert_equal
from signer.keys import Secret, SignerKeys, seed_from_text
from signer.protocol import BtcCoin, RefusalCode, SigningRefused
from signer.service import Signer
from tests.integration.own_database import own_database
from tests.integration.hot_coins import index_hot_coin

log = logging.getLogger(__name__)
KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
ATTACKER = SignerKeys(seed_from_text(Secret("zoo " * 11 + "wrong")), "regtest")  # a seed the firm does not hold
COIN, FEE = 700_000_000, 5_000


def test_a_custody_role_cannot_make_the_signer_pay_a_cold_key_of_its_own(database_url):
    with own_database(database_url, "r12w_cold") as eng:
        ledger = Ledger(eng)
        wallets = Wallets(eng, ledger)
        wallets.configure_asset("BTC", 8, "bitcoin", finality=3)
        wallets.register_wallet("bitcoin", "hot", "regtest", KEYS.account_xpub("bitcoin", "hot"))
        signer = Signer(eng, KEYS, bitcoin_network="regtest")
        hot = derive_btc_address(KEYS.account_xpub("bitcoin", "hot"), "regtest", 0, 0)
        coin = BtcCoin(uuid.uuid4().hex * 2, 0, COIN, 0, 0)
        with eng.begin() as c:  # a confirmed hot coin, as sync_hot_wallet records one
            c.execute(text("INSERT INTO wallet_utxo (txid, vout, address, derivation_change, derivation_index, amount) "
                           "VALUES (:t, 0, :a, 0, 0, :m)"), {"t": coin.txid, "a": hot, "m": COIN})
            index_hot_coin(c, coin.txid, 0, hot, COIN)

        attacker_key = canonical_btc_account_key(ATTACKER.account_xpub("bitcoin", "hot"), "regtest")
        theirs = derive_btc_address(attacker_key, "regtest", 0, 0)
        with pytest.raises(DBAPIError) as refused, eng.begin() as c:
            c.execute(text("SET LOCAL ROLE custody_api"))
            c.execute(text("INSERT INTO wallet (chain, tier, network, xpub) VALUES ('bitcoin', 'cold', 'regtest', :x)"),
                      {"x": attacker_key})
        assert_equal(refused.value.orig.sqlstate, "42501")  # insufficient_privilege
        log.info("as custody_worker: register a cold wallet of the attacker's key, an open rebalance of the whole hot coin to it")
        with eng.begin() as c:
            c.execute(text("SET LOCAL ROLE custody_worker"))
            c.execute(text("INSERT INTO wallet (chain, tier, network, xpub) VALUES ('bitcoin', 'cold', 'regtest', :x)"),
                      {"x": attacker_key})
            rebalance = c.execute(text(
                "INSERT INTO rebalance (chain, asset, source_tier, destination_tier, state, destination, destination_index, "
                "amount, fee, change_amount, fee_rate, spendable, ceiling, target) VALUES ('bitcoin', 'BTC', 'hot', 'cold', "
                "'open', :d, 0, :a, :f, 0, 1000, :a, 1, 0) RETURNING id"), {"d": theirs, "a": COIN - FEE, "f": FEE}).scalar_one()
            c.execute(text("UPDATE wallet_utxo SET rebalance_id = :r WHERE txid = :t"), {"r": rebalance, "t": coin.txid})

        try:
            signed = signer.sign_bitcoin_rebalance(rebalance, [coin], theirs, COIN - FEE, None)
            outcome = f"signed {signed.txid}: {COIN - FEE} sat to {theirs}"
        except SigningRefused as refused:
            outcome = refused.code.value
        log.info("signer: %s", outcome)
        ledger.assert_verified()
    assert_equal(outcome, RefusalCode.destination_not_cold.value)
