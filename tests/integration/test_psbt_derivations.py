"""A cold -> hot PSBT states the BIP32 derivation of every key it involves (custody.psbt): each input's
cold key, the hot receive address's key and the cold change key, so an offline signer (a hardware
wallet, Bitcoin Core's `walletprocesspsbt`) finds its own key and recognises our outputs.

Without a recorded origin the fingerprint is the account xpub's own (HASH160 of its public key) and
the path `<change>/<index>` below it; with the tier's master fingerprint configured
(`RebalanceConfig.master_fingerprints`, deployed `[wallets.bitcoin] cold_fingerprint` /
`hot_fingerprint`) the full BIP84 path from that master. Each stated key is checked against an
independent derivation from the test seed. The e2e test bitcoin_tiers_psbt signs such a PSBT with
bitcoind. Rows and coins are written directly (no node: the fee estimate is a fake's). Own database."""
from __future__ import annotations

import pytest
from bip_utils import Bip39SeedGenerator, Bip44Changes, Bip84, Bip84Coins
from sqlalchemy import text

from custody.addresses import derive_btc_address
from custody.psbt import HARDENED, IN_BIP32_DERIVATION, OUT_BIP32_DERIVATION, decode, parse
from custody.rebalances import RebalanceConfig, Rebalances
from custody.wallets import Wallets
from ledger.service import Ledger
from regtest.util import assert_equal
from signer.bitcoin_tx import _hash160
from signer.keys import Secret, SignerKeys, seed_from_text
from tests.integration.own_database import own_database

MNEMONIC = "abandon " * 11 + "about"
KEYS = SignerKeys(seed_from_text(Secret(MNEMONIC)), "regtest")
ACCOUNTS = {"hot": 1, "cold": 3}  # the signer's BIP84 accounts of the tiers (signer.keys)
HOT = derive_btc_address(KEYS.account_xpub("bitcoin", "hot"), "regtest", 0, 0)


class FakeBitcoin:
    class _Fee:
        sat_per_kvb = 2_000

    def estimate_fee(self):
        return self._Fee()


def account(tier: str):
    return Bip84.FromSeed(Bip39SeedGenerator(MNEMONIC).Generate(), Bip84Coins.BITCOIN_REGTEST).Purpose().Coin() \
        .Account(ACCOUNTS[tier])


def key_at(tier: str, change: int, index: int) -> bytes:
    branch = Bip44Changes.CHAIN_EXT if change == 0 else Bip44Changes.CHAIN_INT
    return account(tier).Change(branch).AddressIndex(index).PublicKey().RawCompressed().ToBytes()


def own_fingerprint(tier: str) -> bytes:
    return _hash160(account(tier).PublicKey().RawCompressed().ToBytes())[:4]


def path(*children: int) -> bytes:
    return b"".join(i.to_bytes(4, "little") for i in children)


@pytest.fixture(scope="module")
def env(database_url):
    with own_database(database_url, "psbt_derivations") as engine:
        ledger = Ledger(engine)
        wallets = Wallets(engine, ledger)
        wallets.configure_asset("BTC", 8, "bitcoin", finality=2)
        for tier in ("hot", "cold"):
            assert_equal(account(tier).PublicKey().ToExtended(), KEYS.account_xpub("bitcoin", tier))
            wallets.register_wallet("bitcoin", tier, "regtest", KEYS.account_xpub("bitcoin", tier))
        with engine.begin() as c:  # two cold coins at receive indices 1 and 4, both issued
            for _ in range(5):  # one step at a time (custody_wallet_next_index_step)
                c.execute(text("UPDATE wallet SET next_index = next_index + 1 WHERE tier = 'cold'"))
            for txid, index in (("c1" * 32, 1), ("c4" * 32, 4)):
                c.execute(text("INSERT INTO btc_wallet_output (txid, vout, address, tier, derivation_change, derivation_index, "
                               "amount, block_height, block_hash) VALUES (:t, 0, :a, 'cold', 0, :i, 100000000, 1, 'h')"),
                          {"t": txid, "a": derive_btc_address(KEYS.account_xpub("bitcoin", "cold"), "regtest", 0, index),
                           "i": index})
        yield engine, ledger, wallets
        ledger.assert_verified()


def opened(engine, ledger, wallets, config: RebalanceConfig):
    """Open a 1.5 BTC cold -> hot move (two coins) and answer its unsigned PSBT parsed, then abandon it."""
    rebalances = Rebalances(engine, ledger, wallets, FakeBitcoin(), None, hot_address=HOT, config=config)  # type: ignore[arg-type]
    rebalance_id = rebalances.open_cold_to_hot(150_000_000, by="op-test")
    _, ins, outs = parse(decode(rebalances.export_psbt(rebalance_id)))
    with engine.connect() as c:
        coins = c.execute(text("SELECT derivation_index FROM rebalance_input WHERE rebalance_id = :r ORDER BY txid, vout"),
                          {"r": rebalance_id}).scalars().all()
        change_index = c.execute(text("SELECT change_index FROM rebalance WHERE id = :r"), {"r": rebalance_id}).scalar_one()
    rebalances.abandon(rebalance_id, by="op-test", reason="test: only the PSBT was wanted")
    return ins, outs, coins, change_index


def test_without_an_origin_each_key_is_stated_below_its_account_xpub(env):
    engine, ledger, wallets = env
    ins, outs, coins, change_index = opened(engine, ledger, wallets, RebalanceConfig())
    assert_equal(sorted(coins), [1, 4])
    for fields, index in zip(ins, coins):
        assert_equal(fields[bytes((IN_BIP32_DERIVATION,)) + key_at("cold", 0, index)], own_fingerprint("cold") + path(0, index))
    assert_equal(len(outs), 2)  # the hot receive address, then the cold change
    assert_equal(outs[0], {bytes((OUT_BIP32_DERIVATION,)) + key_at("hot", 0, 0): own_fingerprint("hot") + path(0, 0)})
    assert_equal(outs[1], {bytes((OUT_BIP32_DERIVATION,)) + key_at("cold", 0, change_index):
                           own_fingerprint("cold") + path(0, change_index)})


def test_with_the_master_fingerprint_each_key_is_stated_from_the_master(env):
    engine, ledger, wallets = env
    master = bytes.fromhex(KEYS.master_fingerprint)
    ins, outs, coins, change_index = opened(engine, ledger, wallets,
                                            RebalanceConfig(master_fingerprints={"cold": KEYS.master_fingerprint,
                                                                                 "hot": KEYS.master_fingerprint}))
    bip84 = (84 | HARDENED, 1 | HARDENED)
    for fields, index in zip(ins, coins):
        assert_equal(fields[bytes((IN_BIP32_DERIVATION,)) + key_at("cold", 0, index)],
                     master + path(*bip84, 3 | HARDENED, 0, index))
    assert_equal(outs[0], {bytes((OUT_BIP32_DERIVATION,)) + key_at("hot", 0, 0): master + path(*bip84, 1 | HARDENED, 0, 0)})
    assert_equal(outs[1], {bytes((OUT_BIP32_DERIVATION,)) + key_at("cold", 0, change_index):
                           master + path(*bip84, 3 | HARDENED, 0, change_index)})
    with pytest.raises(ValueError):
        RebalanceConfig(master_fingerprints={"cold": "73C5DA0"})
