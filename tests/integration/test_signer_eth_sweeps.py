"""The signer's checks of ethereum sweeps and their gas funding (signer.service, "Ethereum sweeps"):
it builds each transaction itself (sender: the deposit key it derives; destination: the hot address
it derives, or the token contract of its own asset table with transfer(hot, amount)), and refuses a
wrong chain id, an unknown asset, a row that is not an open sweep of that address, amount and nonce,
a token amount other than the booked deposits reserved for the sweep, a nonce that is not the next
one of the address by its own record, a second funding of a sweep, a hot nonce already signed, and
anything while the kill switch is on. Rows are written directly (as a database writer could): the
signer's answers must not depend on them being honest beyond what the table of its docstring says.
Runs on a database of its own."""
from __future__ import annotations

import itertools
import uuid

import pytest
from eth_account import Account
from eth_account.typed_transactions import TypedTransaction
from eth_utils import to_checksum_address
from hexbytes import HexBytes
from sqlalchemy import text

from custody.addresses import derive_eth_address
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
FEES = {"gas": 60_000, "max_fee_wei": 2 * 10**9, "priority_fee_wei": 10**9}
_txids = itertools.count()


@pytest.fixture(scope="module")
def env(database_url):
    with own_database(database_url, "eth_sweep_signer") as engine:
        ledger = Ledger(engine)
        wallets = Wallets(engine, ledger)
        wallets.register_wallet("ethereum", "deposit", "regtest", KEYS.account_xpub("ethereum", "deposit"))
        wallets.configure_asset("ETH", 18, "ethereum", finality=2)
        wallets.configure_asset("USDT", 6, "ethereum", finality=2, contract_address=USDT)
        signer = Signer(engine, KEYS, bitcoin_network="regtest", ethereum_chain_id=CHAIN_ID,
                        assets={"ETH": SignerAsset("ethereum", None, 18), "USDT": SignerAsset("ethereum", USDT, 6)})
        yield engine, wallets, signer


def decoded(raw: bytes) -> dict:
    tx = TypedTransaction.from_bytes(HexBytes(raw)).as_dict()
    return {"from": Account.recover_transaction(raw), "to": to_checksum_address(tx["to"]), "value": tx["value"], "data": bytes(tx["data"]),
            "nonce": tx["nonce"], "chain_id": tx["chainId"]}


def new_address(env) -> tuple[str, int]:
    """A fresh deposit address (checksummed) and its index."""
    _engine, wallets, _signer = env
    acct = wallets.customer_account(f"sweep-signer-{uuid.uuid4().hex[:8]}", "USDT")
    issued = wallets.issue_address(f"addr:{acct}", acct)
    return issued.address, issued.derivation_index


def sweep_row(env, address: str, index: int, *, asset: str = "USDT", amount: int = 500, nonce: int = 0,
              booked: tuple[int, ...] = (500,), state: str = "open") -> int:
    """An `eth_sweep` row and the booked deposits reserved for it, as custody writes them."""
    engine = env[0]
    with engine.begin() as c:
        sweep_id = c.execute(text(
            "INSERT INTO eth_sweep (asset, address, deposit_index, nonce, amount, gas_limit, max_fee_wei, priority_fee_wei, state, "
            "txid, raw) VALUES (:a, :addr, :i, :n, :amt, 60000, 2000000000, 1000000000, :st, :t, :r) RETURNING id"),
            {"a": asset, "addr": address, "i": index, "n": nonce, "amt": amount, "st": state,
             "t": None if state == "open" else f"0x{next(_txids):064x}", "r": None if state == "open" else b"x"}).scalar_one()
        d = c.execute(text("SELECT id, account_id FROM deposit_address WHERE address = :a"), {"a": address}).one()
        for amt in booked:
            c.execute(text(
                "INSERT INTO deposit_observation (chain, asset, txid, output_index, address, amount, block_hash, block_height, "
                "state, deposit_address_id, account_id, eth_swept_by) VALUES ('ethereum', :a, :t, 0, :addr, :amt, '0x00', 1, "
                "'credited', :d, :acct, :s)"),
                {"a": asset, "t": f"0x{next(_txids):064x}", "addr": address, "amt": amt, "d": d.id, "acct": d.account_id,
                 "s": sweep_id})
    return sweep_id


def finish(engine, sweep_id: int, txid: str) -> None:
    """The sweep went its way (signed, sent, booked): the address may have its next one."""
    with engine.begin() as c:
        c.execute(text("UPDATE eth_sweep SET state = 'final', txid = :t, raw = :r WHERE id = :s"),
                  {"s": sweep_id, "t": txid, "r": b"x"})


def refused(code: RefusalCode, fn, *args, **kwargs) -> SigningRefused:
    with pytest.raises(SigningRefused) as err:
        fn(*args, **kwargs)
    assert_equal(err.value.code, code)
    return err.value


def test_a_token_sweep_pays_the_hot_address_from_the_deposit_key_at_the_next_nonce(env):
    engine, _wallets, signer = env
    address, index = new_address(env)
    hot = derive_eth_address(KEYS.account_xpub("ethereum", "hot"), 0)
    first = sweep_row(env, address, index, booked=(200, 300))
    sign = signer.sign_ethereum_sweep
    signed = sign(first, deposit_index=index, asset="USDT", amount=500, chain_id=CHAIN_ID, nonce=0, **FEES)
    assert_equal(decoded(signed.raw), {"from": address, "to": USDT, "value": 0, "data": erc20_transfer_data(hot, 500),
                                       "nonce": 0, "chain_id": CHAIN_ID})
    again = sign(first, deposit_index=index, asset="USDT", amount=500, chain_id=CHAIN_ID, nonce=0, **FEES)
    assert_equal(again.txid, signed.txid)  # a re-sign after a lost reply: the same transaction
    finish(engine, first, signed.txid)

    second = sweep_row(env, address, index, amount=700, booked=(700,), nonce=2)
    refused(RefusalCode.nonce_gap, sign, second, deposit_index=index, asset="USDT", amount=700, chain_id=CHAIN_ID, nonce=2, **FEES)
    with engine.begin() as c:
        c.execute(text("UPDATE eth_sweep SET nonce = 1 WHERE id = :s"), {"s": second})
    signed = sign(second, deposit_index=index, asset="USDT", amount=700, chain_id=CHAIN_ID, nonce=1, **FEES)
    assert_equal(decoded(signed.raw)["nonce"], 1)
    finish(engine, second, signed.txid)
    with engine.begin() as c:  # a writer moves the first sweep back to open at another nonce: refused on the signer's record
        c.execute(text("UPDATE eth_sweep SET state = 'open', nonce = 5 WHERE id = :s"), {"s": first})
    refused(RefusalCode.already_signed, sign, first, deposit_index=index, asset="USDT", amount=500, chain_id=CHAIN_ID, nonce=5,
            **FEES)


def test_an_ether_sweep_pays_the_hot_address_its_value(env):
    _engine, _wallets, signer = env
    address, index = new_address(env)
    hot = derive_eth_address(KEYS.account_xpub("ethereum", "hot"), 0)
    sweep = sweep_row(env, address, index, asset="ETH", amount=10**17, booked=(10**17,))
    tx = decoded(signer.sign_ethereum_sweep(sweep, deposit_index=index, asset="ETH", amount=10**17, chain_id=CHAIN_ID, nonce=0,
                                            **FEES).raw)
    assert_equal((tx["from"], tx["to"], tx["value"], tx["data"]), (address, hot, 10**17, b""))


def test_sweep_refusals(env):
    engine, _wallets, signer = env
    address, index = new_address(env)
    other, other_index = new_address(env)
    sweep = sweep_row(env, address, index, booked=(400,))  # the row says 500, the reserved deposits 400
    sign = signer.sign_ethereum_sweep
    args = {"deposit_index": index, "asset": "USDT", "amount": 500, "nonce": 0}
    refused(RefusalCode.chain_id_mismatch, sign, sweep, chain_id=1, **args, **FEES)
    refused(RefusalCode.asset_unknown, sign, sweep, chain_id=CHAIN_ID, **{**args, "asset": "DAI"}, **FEES)
    refused(RefusalCode.sweep_not_open, sign, sweep, chain_id=CHAIN_ID, **{**args, "deposit_index": other_index}, **FEES)
    refused(RefusalCode.sweep_not_open, sign, sweep, chain_id=CHAIN_ID, **{**args, "amount": 400}, **FEES)
    refused(RefusalCode.sweep_not_open, sign, sweep + 1000, chain_id=CHAIN_ID, **args, **FEES)
    refused(RefusalCode.output_mismatch, sign, sweep, chain_id=CHAIN_ID, **args, **FEES)
    ok = sweep_row(env, other, other_index, booked=(500,))
    refused(RefusalCode.fee_above_ceiling, sign, ok, chain_id=CHAIN_ID, **{**args, "deposit_index": other_index},
            gas=10**6, max_fee_wei=10**12, priority_fee_wei=1)
    with engine.begin() as c:
        set_flag(c, KILL_SWITCH, True, "test", "test")
    try:
        refused(RefusalCode.kill_switch_on, sign, ok, chain_id=CHAIN_ID, **{**args, "deposit_index": other_index}, **FEES)
    finally:
        with engine.begin() as c:
            set_flag(c, KILL_SWITCH, False, "test", "test")
    with engine.connect() as c:
        codes = c.execute(text("SELECT code FROM signer_audit WHERE detail->>'sweep_id' = :s ORDER BY id"),
                          {"s": str(sweep)}).scalars().all()
    assert_equal(codes, ["chain_id_mismatch", "asset_unknown", "sweep_not_open", "sweep_not_open", "output_mismatch"])


def test_gas_funding_pays_our_deposit_address_at_most_its_sweeps_gas_once(env):
    engine, _wallets, signer = env
    address, index = new_address(env)
    sweep = sweep_row(env, address, index)
    need = 60_000 * 2 * 10**9
    fund = signer.sign_ethereum_gas_funding
    fees = {"gas": 21_000, "max_fee_wei": 2 * 10**9, "priority_fee_wei": 10**9}
    hot = derive_eth_address(KEYS.account_xpub("ethereum", "hot"), 0)
    with engine.begin() as c:  # the signer signed a withdrawal at hot nonce 39: a funding may take 40 (R15-S6)
        c.execute(text("INSERT INTO signer_signature (signed_at, withdrawal_id, batch_id, chain, asset, amount, destination, txid, "
                       "approvals, sender, nonce, chain_id) VALUES (now(), 1, 1, 'ethereum', 'ETH', 1, '0x', '0xw39', 1, :s, 39, :ci)"),
                  {"s": hot, "ci": CHAIN_ID})
    refused(RefusalCode.output_mismatch, fund, sweep, deposit_index=index, chain_id=CHAIN_ID, nonce=40, value=need + 1, **fees)
    _other, other_index = new_address(env)
    refused(RefusalCode.sweep_not_open, fund, sweep, deposit_index=other_index, chain_id=CHAIN_ID, nonce=40, value=need, **fees)
    ether_address, ether_index = new_address(env)
    ether_sweep = sweep_row(env, ether_address, ether_index, asset="ETH", amount=10**17, booked=(10**17,))
    refused(RefusalCode.sweep_not_open, fund, ether_sweep, deposit_index=ether_index, chain_id=CHAIN_ID, nonce=40, value=need, **fees)

    refused(RefusalCode.nonce_gap, fund, sweep, deposit_index=index, chain_id=CHAIN_ID, nonce=41, value=need, **fees)
    signed = fund(sweep, deposit_index=index, chain_id=CHAIN_ID, nonce=40, value=need, **fees)
    assert_equal(decoded(signed.raw), {"from": hot, "to": address, "value": need, "data": b"", "nonce": 40, "chain_id": CHAIN_ID})
    assert_equal(fund(sweep, deposit_index=index, chain_id=CHAIN_ID, nonce=40, value=need, **fees).txid, signed.txid)
    refused(RefusalCode.already_signed, fund, sweep, deposit_index=index, chain_id=CHAIN_ID, nonce=41, value=need, **fees)

    log_address, log_index = new_address(env)
    another = sweep_row(env, log_address, log_index)
    refused(RefusalCode.already_signed, fund, another, deposit_index=log_index, chain_id=CHAIN_ID, nonce=40, value=need, **fees)
    with engine.begin() as c:  # the signer signed a withdrawal at hot nonce 42
        c.execute(text("INSERT INTO signer_signature (signed_at, withdrawal_id, batch_id, chain, asset, amount, destination, txid, "
                       "approvals, sender, nonce, chain_id) VALUES (now(), 1, 1, 'ethereum', 'ETH', 1, '0x', '0xw', 1, :s, 42, :ci)"),
                  {"s": hot, "ci": CHAIN_ID})
    refused(RefusalCode.already_signed, fund, another, deposit_index=log_index, chain_id=CHAIN_ID, nonce=42, value=need, **fees)
    assert_equal(decoded(fund(another, deposit_index=log_index, chain_id=CHAIN_ID, nonce=43, value=need, **fees).raw)["to"],
                 log_address)
