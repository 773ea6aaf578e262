"""The signer's checks of ethereum rebalances (signer.service `sign_ethereum_rebalance`): it builds
the transfer itself from the hot key to its OWN warm address or the cold address pinned in its
configuration (ether as the value, or transfer(destination, amount) to its own asset table's
contract), and refuses an unpinned cold tier, a row that is not an open hot -> tier move of that
asset, amount and destination (a row redirected by a database writer included), a hot nonce it
already signed anything at, a nonce past its highest record + 1, a re-sign at another nonce, and
anything while the kill switch is on. Rows are written directly, as a database writer could.
Runs on a database of its own."""
from __future__ import annotations

import pytest
from eth_account import Account
from eth_account.typed_transactions import TypedTransaction
from eth_utils import keccak, to_checksum_address
from hexbytes import HexBytes
from sqlalchemy import text

from custody.controls import KILL_SWITCH, set_flag
from custody.wallets import Wallets
from ledger.service import Ledger
from regtest.util import assert_equal
from signer.assets import SignerAsset
from signer.ethereum_tx import erc20_transfer_data
from signer.keys import Secret, SignerKeys, seed_from_text
from signer.protocol import RefusalCode, SigningRefused
from signer.service import Signer
from tests.integration.own_database import own_database

KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
USDT = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
CHAIN_ID = 31337
COLD = to_checksum_address("0x" + keccak(b"signer-eth-rebalances: pinned cold")[-20:].hex())
ATTACKER = to_checksum_address("0x" + "ab" * 20)
FEES = {"gas": 60_000, "max_fee_wei": 2 * 10**9, "priority_fee_wei": 10**9}
ASSETS = {"ETH": SignerAsset("ethereum", None, 18), "USDT": SignerAsset("ethereum", USDT, 6)}


def eth_address(tier: str) -> str:
    return Account.from_key(KEYS.private_key_for("ethereum", tier, 0, 0)).address


@pytest.fixture(scope="module")
def env(database_url):
    with own_database(database_url, "eth_rebalance_signer") as engine:
        wallets = Wallets(engine, Ledger(engine))
        wallets.configure_asset("ETH", 18, "ethereum", finality=2)
        wallets.configure_asset("USDT", 6, "ethereum", finality=2, contract_address=USDT)
        signer = Signer(engine, KEYS, bitcoin_network="regtest", ethereum_chain_id=CHAIN_ID, assets=ASSETS,
                        cold_addresses={"ethereum": COLD})
        yield engine, signer


def row(engine, asset: str, tier: str, amount: int, destination: str, source: str = "hot") -> int:
    """An open rebalance row, written as any database writer could (a refill claiming it needs no
    approval); the previous unfinished ones of the asset, or of warm, closed."""
    with engine.begin() as c:
        c.execute(text("UPDATE eth_rebalance SET state = 'final', txid = 'x' || id, raw = '\\x00', nonce = 1000000 + id "
                       "WHERE (asset = :a OR source_tier = 'warm') AND state = 'open'"), {"a": asset})
        return c.execute(text(
            "INSERT INTO eth_rebalance (asset, source_tier, destination_tier, destination, amount, spendable, ceiling, target, "
            "gas_limit, max_fee_wei, priority_fee_wei, state, approvals_required) VALUES (:a, :s, :t, :d, :m, 0, 0, 0, 60000, "
            "2000000000, 1000000000, 'open', 0) RETURNING id"),
            {"a": asset, "s": source, "t": tier, "d": destination, "m": amount}).scalar_one()


def decoded(raw: bytes) -> dict:
    tx = TypedTransaction.from_bytes(HexBytes(raw)).as_dict()
    return {"from": Account.recover_transaction(raw), "to": to_checksum_address(tx["to"]), "value": tx["value"],
            "data": bytes(tx["data"]), "nonce": tx["nonce"]}


def refused(code: RefusalCode, call) -> None:
    with pytest.raises(SigningRefused) as exc:
        call()
    assert_equal(exc.value.code, code)


def test_ether_to_warm_and_usdt_to_cold_are_built_by_the_signer_at_consecutive_hot_nonces(env):
    engine, signer = env
    hot, warm = eth_address("hot"), eth_address("warm")
    r1 = row(engine, "ETH", "warm", 2 * 10**18, warm)
    tx = signer.sign_ethereum_rebalance(r1, asset="ETH", amount=2 * 10**18, destination_tier="warm", chain_id=CHAIN_ID,
                                        nonce=0, **FEES)
    assert_equal(decoded(tx.raw), {"from": hot, "to": warm, "value": 2 * 10**18, "data": b"", "nonce": 0})
    again = signer.sign_ethereum_rebalance(r1, asset="ETH", amount=2 * 10**18, destination_tier="warm", chain_id=CHAIN_ID,
                                           nonce=0, **FEES)
    assert_equal(again.txid, tx.txid)  # a re-sign after a lost reply: the same slot, the same transaction
    refused(RefusalCode.already_signed, lambda: signer.sign_ethereum_rebalance(
        r1, asset="ETH", amount=2 * 10**18, destination_tier="warm", chain_id=CHAIN_ID, nonce=1, **FEES))

    r2 = row(engine, "USDT", "cold", 600 * 10**6, COLD)
    refused(RefusalCode.already_signed, lambda: signer.sign_ethereum_rebalance(  # nonce 0 is r1's
        r2, asset="USDT", amount=600 * 10**6, destination_tier="cold", chain_id=CHAIN_ID, nonce=0, **FEES))
    refused(RefusalCode.nonce_gap, lambda: signer.sign_ethereum_rebalance(
        r2, asset="USDT", amount=600 * 10**6, destination_tier="cold", chain_id=CHAIN_ID, nonce=5, **FEES))
    tx = signer.sign_ethereum_rebalance(r2, asset="USDT", amount=600 * 10**6, destination_tier="cold", chain_id=CHAIN_ID,
                                        nonce=1, **FEES)
    assert_equal(decoded(tx.raw), {"from": hot, "to": USDT, "value": 0, "data": erc20_transfer_data(COLD, 600 * 10**6),
                                   "nonce": 1})


def test_a_row_that_names_another_destination_asset_amount_or_tier_is_refused(env):
    engine, signer = env
    warm = eth_address("warm")
    redirected = row(engine, "ETH", "warm", 10**18, ATTACKER)  # a writer points warm at its own address
    refused(RefusalCode.rebalance_not_open, lambda: signer.sign_ethereum_rebalance(
        redirected, asset="ETH", amount=10**18, destination_tier="warm", chain_id=CHAIN_ID, nonce=2, **FEES))
    to_cold = row(engine, "ETH", "cold", 10**18, ATTACKER)
    refused(RefusalCode.rebalance_not_open, lambda: signer.sign_ethereum_rebalance(
        to_cold, asset="ETH", amount=10**18, destination_tier="cold", chain_id=CHAIN_ID, nonce=2, **FEES))
    honest = row(engine, "ETH", "warm", 10**18, warm)
    for asset, amount, tier in (("ETH", 2 * 10**18, "warm"), ("USDT", 10**18, "warm"), ("ETH", 10**18, "cold")):
        refused(RefusalCode.rebalance_not_open, lambda asset=asset, amount=amount, tier=tier: signer.sign_ethereum_rebalance(
            honest, asset=asset, amount=amount, destination_tier=tier, chain_id=CHAIN_ID, nonce=2, **FEES))
    refused(RefusalCode.asset_unknown, lambda: signer.sign_ethereum_rebalance(
        honest, asset="DOGE", amount=10**18, destination_tier="warm", chain_id=CHAIN_ID, nonce=2, **FEES))
    refused(RefusalCode.chain_id_mismatch, lambda: signer.sign_ethereum_rebalance(
        honest, asset="ETH", amount=10**18, destination_tier="warm", chain_id=1, nonce=2, **FEES))
    refused(RefusalCode.fee_above_ceiling, lambda: signer.sign_ethereum_rebalance(
        honest, asset="ETH", amount=10**18, destination_tier="warm", chain_id=CHAIN_ID, nonce=2, gas=10**9,
        max_fee_wei=10**12, priority_fee_wei=1))


def test_unpinned_cold_and_the_kill_switch_are_refused(env):
    engine, signer = env
    unpinned = Signer(engine, KEYS, bitcoin_network="regtest", ethereum_chain_id=CHAIN_ID, assets=ASSETS)
    cold = row(engine, "USDT", "cold", 10**6, COLD)
    refused(RefusalCode.destination_not_cold, lambda: unpinned.sign_ethereum_rebalance(
        cold, asset="USDT", amount=10**6, destination_tier="cold", chain_id=CHAIN_ID, nonce=2, **FEES))
    with engine.begin() as c:
        set_flag(c, KILL_SWITCH, True, "test", "test")
    try:
        refused(RefusalCode.kill_switch_on, lambda: signer.sign_ethereum_rebalance(
            cold, asset="USDT", amount=10**6, destination_tier="cold", chain_id=CHAIN_ID, nonce=2, **FEES))
    finally:
        with engine.begin() as c:
            set_flag(c, KILL_SWITCH, False, "test", "test")


def test_a_refill_row_that_claims_no_approval_is_still_refused_without_the_signers_quorum(env):
    engine, signer = env
    refill = row(engine, "ETH", "hot", 10**18, eth_address("hot"), source="warm")
    refused(RefusalCode.rebalance_not_approved, lambda: signer.sign_ethereum_rebalance(
        refill, asset="ETH", amount=10**18, destination_tier="hot", chain_id=CHAIN_ID, nonce=0, **FEES))
    to_warm = row(engine, "ETH", "hot", 10**18, eth_address("warm"), source="warm")  # a refill pointed elsewhere
    with engine.begin() as c:
        c.execute(text("UPDATE eth_rebalance SET destination = :d WHERE id = :r"), {"d": ATTACKER, "r": to_warm})
    refused(RefusalCode.rebalance_not_open, lambda: signer.sign_ethereum_rebalance(
        to_warm, asset="ETH", amount=10**18, destination_tier="hot", chain_id=CHAIN_ID, nonce=0, **FEES))
