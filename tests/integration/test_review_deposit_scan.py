"""Adversarial review of issue 11 (observation 2: "a job stops for everyone"): the deposit scanner
finds a customer's account by a name the backend can squat, outside any containment.

A token sent to an address issued for another asset of the same chain (USDT to an ether deposit
address) is credited to the owner's account of that token, found or opened by name
(`Wallets.customer_account`: `customer:<owner>:<asset>`, idempotent by name). The backend may open
any `customer:<owner>:...` name with any asset, so it first opens `customer:<mallory>:<token>` as an
*ether* account; then mallory sends one token unit to her ether deposit address. `Deposits._record`
raises `idempotency_conflict` inside the scan's one database transaction: the cursor never moves,
and no deposit of anyone on that chain is recorded again (every run fails the same way).

The chain is one of the test's own (a scripted adapter), its assets are named for the run and exist
in the ledger only, so nothing of it is seen by the e2e suites' jobs later in the session.
"""
from __future__ import annotations

import logging
import uuid

from sqlalchemy import text

from chain_adapters.base import BlockRef, Observation, ScannedBlock, ScanResult
from custody.deposits import Deposits
from regtest.util import assert_equal
from signer.keys import Secret, SignerKeys, seed_from_text
from tests.integration.withdrawal_api import WithdrawalApi

log = logging.getLogger(__name__)
TOKEN_CONTRACT = "0x" + "ab" * 20


class ScriptedChain:
    """An adapter whose next scan returns one block with the given observations."""

    def __init__(self, observations: list[Observation]) -> None:
        self.observations = observations

    def tip(self) -> BlockRef:
        return BlockRef(0, "genesis")

    def scan(self, cursor, watch, *, max_blocks: int = 100) -> ScanResult:
        block = BlockRef(cursor.height + 1, f"block-{cursor.height + 1}")
        return ScanResult(None, (ScannedBlock(block, cursor.hash, tuple(self.observations)),), block)


def test_a_token_to_an_ether_address_with_a_squatted_account_name_does_not_stop_the_scanner(engine, ledger):
    api = WithdrawalApi(engine)
    run = uuid.uuid4().hex[:6].upper()
    chain, ether, token = f"test{run.lower()}", f"E{run}", f"U{run}"
    ledger.create_asset(ether, 18)
    ledger.create_asset(token, 6)
    keys = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
    wallet_id = api.custody.wallets.register_wallet("ethereum", "deposit", "regtest", keys.account_xpub("ethereum", "deposit"))

    def account(owner: str, asset: str, name: str) -> int:
        r = api.backend.post("/v1/accounts", json={"asset": asset, "kind": "customer", "owner": owner, "name": name})
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def address(account_id: int, owner: str) -> str:
        """A deposit address of the test's chain (as `Wallets.issue_address` records one), at a negative
        index: never one the e2e suites issue from the same wallet, never counted by its gap monitor."""
        address = "0x" + uuid.uuid4().hex + uuid.uuid4().hex[:8]
        with engine.begin() as c:
            row = c.execute(text("INSERT INTO deposit_address (wallet_id, chain, address, derivation_index, account_id, "
                                 "owner, idempotency_key) VALUES (:w, :c, :a, :i, :acc, :o, :k) RETURNING id"),
                            {"w": wallet_id, "c": chain, "a": address, "i": -1 - int(uuid.uuid4().int % 10**9),
                             "acc": account_id, "o": owner, "k": f"review:{address}"}).scalar_one()
            # as the worker's index records a row it derived and found right (custody.wallet_index):
            # this scenario is about the scan, not the address check, which refuses an underived row
            c.execute(text("INSERT INTO deposit_address_check (deposit_address_id, derived) VALUES (:i, true)"), {"i": row})
        return address

    mallory, alice = f"mallory-{run}", f"alice-{run}"
    log.info("the attack: open mallory's future token account name as an ether account -- refused now")
    squat = api.backend.post("/v1/accounts", json={"asset": ether, "kind": "customer", "owner": mallory,
                                                   "name": f"customer:{mallory}:{token}"})
    assert_equal((squat.status_code, squat.json()["error"]["code"]), (422, "account_name_reserved"))
    mallory_address = address(account(mallory, ether, f"customer:{mallory}:{ether}"), mallory)
    alice_account = account(alice, ether, f"customer:{alice}:{ether}")
    alice_address = address(alice_account, alice)

    log.info("one block: one token unit to mallory's ether address, and alice's ether deposit")
    block = [Observation(token, "0x" + "11" * 32, 0, mallory_address, 1, BlockRef(1, "block-1")),
             Observation(ether, "0x" + "22" * 32, 0, alice_address, 5 * 10**18, BlockRef(1, "block-1"))]
    deposits = Deposits(engine, ledger, api.custody.wallets, {chain: ScriptedChain(block)})
    deposits.start_cursor(chain)
    for run_no in (1, 2):
        try:
            log.info("scan %d -> %s", run_no, deposits.scan(chain))
        except Exception as exc:  # noqa: BLE001 - the finding: the scan raises, for everyone
            log.info("scan %d raised %r; the cursor stays at %s", run_no, exc, deposits.cursor(chain))
    with engine.connect() as c:
        recorded = c.execute(text("SELECT account_id, amount FROM deposit_observation WHERE chain = :c AND asset = :a"),
                             {"c": chain, "a": ether}).all()
    assert_equal([(r.account_id, int(r.amount)) for r in recorded], [(alice_account, 5 * 10**18)])
