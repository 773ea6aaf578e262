"""The signer's checks of a same-nonce replacement (fee bump) of an ethereum rebalance, sweep and gas
funding (signer.service, "Fee bumps of those"): it compares the request with ITS OWN record of the
version replaced, never with custody's row. A row rewritten by a database writer (another
destination, amount or nonce) and a request to match are refused; so are fees not raised by 10%,
fees over the cap, a txid it never signed for the row, and a second, different replacement of one
version. The same replacement asked twice (a crash after the signer answered) is the same
transaction, recorded once. Rows are written directly, as a database writer could. Runs on a
database of its own."""
from __future__ import annotations

import logging
import uuid

import pytest
from eth_account import Account
from eth_account.typed_transactions import TypedTransaction
from eth_utils import keccak, to_checksum_address
from hexbytes import HexBytes
from sqlalchemy import text

from custody.eth_moves import HOT_NONCE_RECORDED_SQL
from custody.wallets import Wallets
from ledger.service import Ledger
from regtest.util import assert_equal
from signer.assets import SignerAsset
from signer.keys import Secret, SignerKeys, seed_from_text
from signer.protocol import RefusalCode, SigningRefused
from signer.service import Signer
from tests.integration.own_database import own_database

KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
USDT = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
CHAIN_ID = 31337
COLD = to_checksum_address("0x" + keccak(b"signer-eth-replacements: pinned cold")[-20:].hex())
ASSETS = {"ETH": SignerAsset("ethereum", None, 18), "USDT": SignerAsset("ethereum", USDT, 6)}
GAS = 60_000
FEES = {"gas": GAS, "max_fee_wei": 2 * 10**9, "priority_fee_wei": 10**9}
log = logging.getLogger(__name__)
BUMPED = {"gas": GAS, "max_fee_wei": 3 * 10**9, "priority_fee_wei": 2 * 10**9}


def eth_address(tier: str, index: int = 0) -> str:
    return Account.from_key(KEYS.private_key_for("ethereum", tier, 0, index)).address


@pytest.fixture(scope="module")
def env(database_url):
    with own_database(database_url, "eth_replacement_signer") as engine:
        wallets = Wallets(engine, Ledger(engine))
        wallets.register_wallet("ethereum", "deposit", "regtest", KEYS.account_xpub("ethereum", "deposit"))
        wallets.configure_asset("ETH", 18, "ethereum", finality=2)
        wallets.configure_asset("USDT", 6, "ethereum", finality=2, contract_address=USDT)
        signer = Signer(engine, KEYS, bitcoin_network="regtest", ethereum_chain_id=CHAIN_ID, assets=ASSETS,
                        cold_addresses={"ethereum": COLD}, max_eth_fee_wei=GAS * 100 * 10**9)
        yield engine, wallets, signer


def decoded(raw: bytes) -> dict:
    tx = TypedTransaction.from_bytes(HexBytes(raw)).as_dict()
    return {"from": Account.recover_transaction(raw), "to": to_checksum_address(tx["to"]), "value": tx["value"],
            "data": bytes(tx["data"]), "nonce": tx["nonce"], "chain_id": tx["chainId"], "gas": tx["gas"]}


def refused(code: RefusalCode, call) -> None:
    with pytest.raises(SigningRefused) as exc:
        call()
    assert_equal(exc.value.code, code)


def sql(engine, statement: str, **params) -> None:
    with engine.begin() as c:
        c.execute(text(statement), params)


def next_hot_nonce(engine) -> int:
    """The next hot nonce by the signer's record (another test of this file may have used some)."""
    with engine.connect() as c:
        highest = c.execute(HOT_NONCE_RECORDED_SQL, {"a": eth_address("hot"), "ci": CHAIN_ID}).scalar()
    return 0 if highest is None else int(highest) + 1


def records(engine, table: str, column: str, row_id: int) -> int:
    with engine.connect() as c:
        return c.execute(text(f"SELECT count(*) FROM {table} WHERE {column} = :i"), {"i": row_id}).scalar_one()


def test_a_rebalance_replacement_repeats_the_recorded_transaction_at_higher_fees_or_is_refused(env):
    engine, _wallets, signer = env
    warm = eth_address("warm")
    with engine.begin() as c:
        rid = c.execute(text(
            "INSERT INTO eth_rebalance (asset, source_tier, destination_tier, destination, amount, spendable, ceiling, target, "
            "gas_limit, max_fee_wei, priority_fee_wei, state, approvals_required) VALUES ('ETH', 'hot', 'warm', :d, :m, 0, 0, 0, "
            ":g, 2000000000, 1000000000, 'open', 0) RETURNING id"), {"d": warm, "m": 10**18, "g": GAS}).scalar_one()
    move = {"asset": "ETH", "amount": 10**18, "destination_tier": "warm", "chain_id": CHAIN_ID}
    n = next_hot_nonce(engine)
    first = signer.sign_ethereum_rebalance(rid, nonce=n, **move, **FEES)
    sql(engine, "UPDATE eth_rebalance SET state = 'broadcast', txid = :t, raw = :r, nonce = :n WHERE id = :i",
        t=first.txid, r=first.raw, n=n, i=rid)

    def bump(**changes):
        return lambda: signer.sign_ethereum_rebalance(rid, **{**move, "nonce": n, **BUMPED, "replaces_txid": first.txid,
                                                              **changes})

    refused(RefusalCode.replacement_unknown, bump(replaces_txid="0x" + "ee" * 32))  # no version it signed for the row
    refused(RefusalCode.replacement_unknown, bump(nonce=n + 1))  # another nonce: both could be mined
    refused(RefusalCode.replacement_unknown, bump(gas=GAS + 1))
    refused(RefusalCode.replacement_unknown, bump(max_fee_wei=2 * 10**9 + 10**8))  # +5%: the node would refuse it
    refused(RefusalCode.replacement_unknown, bump(priority_fee_wei=10**9))
    refused(RefusalCode.fee_above_ceiling, bump(max_fee_wei=101 * 10**9))
    refused(RefusalCode.rebalance_not_open, bump(amount=2 * 10**18))  # the row says otherwise

    log.info("a database writer redirects the row to cold; the request matches the row")
    sql(engine, "UPDATE eth_rebalance SET destination_tier = 'cold', destination = :d WHERE id = :i", d=COLD, i=rid)
    refused(RefusalCode.output_mismatch, bump(destination_tier="cold"))
    log.info("a database writer doubles the row's amount; the request matches the row")
    sql(engine, "UPDATE eth_rebalance SET destination_tier = 'warm', destination = :d, amount = :m WHERE id = :i",
        d=warm, m=2 * 10**18, i=rid)
    refused(RefusalCode.output_mismatch, bump(amount=2 * 10**18))
    sql(engine, "UPDATE eth_rebalance SET amount = :m WHERE id = :i", m=10**18, i=rid)
    assert_equal(records(engine, "signer_eth_rebalance", "rebalance_id", rid), 1)

    second = bump()()
    assert_equal(decoded(second.raw), decoded(first.raw))  # the same transaction but for its fees
    assert second.txid != first.txid
    assert_equal(bump()().txid, second.txid)  # asked again after a lost answer: the same replacement
    assert_equal(records(engine, "signer_eth_rebalance", "rebalance_id", rid), 2)
    refused(RefusalCode.already_signed, bump(max_fee_wei=4 * 10**9))  # one replacement per version
    third = signer.sign_ethereum_rebalance(rid, **move, nonce=n, gas=GAS, max_fee_wei=4 * 10**9, priority_fee_wei=3 * 10**9,
                                           replaces_txid=second.txid)
    assert_equal(decoded(third.raw)["nonce"], n)


def test_a_sweep_and_a_gas_funding_replacement_are_checked_against_the_signers_record(env):
    engine, wallets, signer = env
    acct = wallets.customer_account(f"replacement-{uuid.uuid4().hex[:8]}", "USDT")
    issued = wallets.issue_address(f"addr:{acct}", acct)
    address, index = issued.address, issued.derivation_index
    with engine.begin() as c:
        sweep = c.execute(text(
            "INSERT INTO eth_sweep (asset, address, deposit_index, nonce, amount, gas_limit, max_fee_wei, priority_fee_wei, "
            "max_fee_cap_wei, state) VALUES ('USDT', :a, :i, 0, 500, :g, 2000000000, 1000000000, 4000000000, 'open') RETURNING id"),
            {"a": address, "i": index, "g": GAS}).scalar_one()
        c.execute(text(
            "INSERT INTO deposit_observation (chain, asset, txid, output_index, address, amount, block_hash, block_height, "
            "state, deposit_address_id, account_id, eth_swept_by) VALUES ('ethereum', 'USDT', :t, 0, :a, 500, '0x00', 1, "
            "'credited', :d, :acct, :s)"),
            {"t": "0x" + uuid.uuid4().hex * 2, "a": address, "acct": acct, "s": sweep,
             "d": c.execute(text("SELECT id FROM deposit_address WHERE address = :a"), {"a": address}).scalar_one()})
    need = GAS * 4 * 10**9  # gas limit x the sweep's max fee cap: room for its bumps
    funding = {"deposit_index": index, "chain_id": CHAIN_ID, "value": need, "gas": 21_000}
    hot_fees = {"max_fee_wei": 2 * 10**9, "priority_fee_wei": 10**9}
    hot_nonce = next_hot_nonce(engine)
    refused(RefusalCode.output_mismatch, lambda: signer.sign_ethereum_gas_funding(
        sweep, nonce=hot_nonce, **{**funding, "value": need + 1}, **hot_fees))  # beyond gas limit x cap
    fund = signer.sign_ethereum_gas_funding(sweep, nonce=hot_nonce, **funding, **hot_fees)
    assert_equal(decoded(fund.raw)["value"], need)
    bumped_hot = {"max_fee_wei": 3 * 10**9, "priority_fee_wei": 2 * 10**9}
    refused(RefusalCode.output_mismatch, lambda: signer.sign_ethereum_gas_funding(
        sweep, nonce=hot_nonce, **{**funding, "value": need - 1}, **bumped_hot, replaces_txid=fund.txid))  # another value
    refused(RefusalCode.already_signed, lambda: signer.sign_ethereum_gas_funding(
        sweep, nonce=hot_nonce + 1, **funding, **bumped_hot, replaces_txid=fund.txid))  # another hot nonce: not this funding's
    fund2 = signer.sign_ethereum_gas_funding(sweep, nonce=hot_nonce, **funding, **bumped_hot, replaces_txid=fund.txid)
    assert_equal(decoded(fund2.raw), decoded(fund.raw))

    sweep_args = {"deposit_index": index, "asset": "USDT", "amount": 500, "chain_id": CHAIN_ID}
    first = signer.sign_ethereum_sweep(sweep, nonce=0, **sweep_args, **FEES)
    refused(RefusalCode.sweep_not_open, lambda: signer.sign_ethereum_sweep(
        sweep, nonce=0, **sweep_args, **BUMPED, replaces_txid=first.txid))  # still open: nothing to replace
    sql(engine, "UPDATE eth_sweep SET state = 'broadcast', txid = :t, raw = :r WHERE id = :i", t=first.txid, r=first.raw, i=sweep)
    log.info("a database writer moves the row (and the request) to nonce 1")
    sql(engine, "UPDATE eth_sweep SET nonce = 1 WHERE id = :i", i=sweep)
    refused(RefusalCode.replacement_unknown, lambda: signer.sign_ethereum_sweep(
        sweep, nonce=1, **sweep_args, **BUMPED, replaces_txid=first.txid))
    sql(engine, "UPDATE eth_sweep SET nonce = 0 WHERE id = :i", i=sweep)
    refused(RefusalCode.sweep_not_open, lambda: signer.sign_ethereum_sweep(
        sweep, nonce=0, **{**sweep_args, "amount": 400}, **BUMPED, replaces_txid=first.txid))  # not what the row reserves
    second = signer.sign_ethereum_sweep(sweep, nonce=0, **sweep_args, **BUMPED, replaces_txid=first.txid)
    assert_equal(decoded(second.raw), decoded(first.raw))
    assert_equal(signer.sign_ethereum_sweep(sweep, nonce=0, **sweep_args, **BUMPED, replaces_txid=first.txid).txid, second.txid)
    with engine.connect() as c:
        kept = c.execute(text("SELECT kind, max_fee_wei, replaces_txid FROM signer_eth_sweep WHERE sweep_id = :s ORDER BY id"),
                         {"s": sweep}).all()
    assert_equal([(k.kind, int(k.max_fee_wei), k.replaces_txid) for k in kept],
                 [("gas", 2 * 10**9, None), ("gas", 3 * 10**9, fund.txid), ("sweep", 2 * 10**9, None),
                  ("sweep", 3 * 10**9, first.txid)])
