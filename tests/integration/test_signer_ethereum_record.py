"""signer_ethereum_record: what the signer pays on ethereum comes from its own configuration and its
own record, never from custody's rows.

| scenario | expected |
| --- | --- |
| a fee bump of the signer's own version: the same nonce, sender and chain id | signed; recorded as replacing it |
| a "fee bump" at another nonce | `replacement_unknown` |
| a "fee bump" of a txid the signer never signed | `replacement_unknown` |
| a signer whose asset table does not list USDT (chain_asset does) | `asset_unknown` |
| a signer with no ethereum chain id configured | `chain_id_mismatch` |
| an unapproved withdrawal signed at a lowered amount (a worker's UPDATE), its row restored, asked again at the same nonce | `already_signed`: a re-sign pays exactly the amount recorded (R3); the recorded amount again is signed |

Built on the review scenarios' USDT withdrawal (tests/integration/test_review12_ethereum_signer.py:
no node, the destination guard stubbed for the request only); holds are released at the end.
"""
from __future__ import annotations

import logging
import uuid

import pytest
from sqlalchemy import text

from custody.policy_config import default_policy
from custody.states import advance
from ledger.model import Transfer
from regtest.util import assert_equal
from signer.approvals import quorum_table_from_policy
from signer.assets import SignerAsset
from signer.ethereum_tx import erc20_transfer_data
from signer.protocol import BatchOutput, SigningRefused
from signer.service import Signer
from tests.approvers import registry
from tests.integration.test_review12_ethereum_signer import (AMOUNT, DEST, KEYS, USDT_CONTRACT, _NoNodeGuard, api,  # noqa: F401
                                                            approved_usdt_withdrawal, release)

log = logging.getLogger(__name__)


def signer_for(api, **kw) -> Signer:  # noqa: F811 - the imported fixture's name
    return Signer(api.custody.engine, KEYS, bitcoin_network="regtest", approvers=registry(api.operator_name(1), api.operator_name(2)),
                  quorum=quorum_table_from_policy(default_policy()), **kw)


@pytest.fixture(scope="module")
def signer(api) -> Signer:  # noqa: F811
    return signer_for(api, assets={"USDT": SignerAsset("ethereum", USDT_CONTRACT, 6)}, ethereum_chain_id=31337)


def pay(signer: Signer, wid: int, batch: int, *, nonce: int = 0, max_fee: int = 10**9, replaces: str | None = None):
    try:
        signed = signer.sign_ethereum_payment(batch, BatchOutput(wid, DEST, AMOUNT), hot_index=0, chain_id=31337, nonce=nonce,
                                              to=USDT_CONTRACT, value=0, data=erc20_transfer_data(DEST, AMOUNT), gas=100_000,
                                              max_fee_wei=max_fee, priority_fee_wei=1, replaces_txid=replaces)
    except SigningRefused as refused:
        log.info("signer refused: %s", refused)
        return refused.code.value, None
    log.info("signer signed %s (nonce %d, max fee %d)", signed.txid, nonce, max_fee)
    return "signed", signed


def mark_signed(api, wid: int, batch: int) -> None:  # noqa: F811
    """The rows as custody leaves them once signed (the hold, released here so the ledger stays as
    it was, is no longer pending, as after a capture)."""
    with api.custody.engine.begin() as c:
        c.execute(text("UPDATE withdrawal_request SET state = 'signed' WHERE id = :w"), {"w": wid})
        c.execute(text("UPDATE withdrawal_batch SET state = 'signed' WHERE id = :b"), {"b": batch})


def test_replacements_reuse_exactly_the_recorded_nonce_sender_and_chain(api, signer, ledger):  # noqa: F811
    wid, batch = approved_usdt_withdrawal(api)
    code, first = pay(signer, wid, batch, nonce=7)
    assert_equal(code, "signed")
    release(api, wid)
    mark_signed(api, wid, batch)
    try:
        assert_equal(pay(signer, wid, batch, nonce=8, max_fee=2 * 10**9, replaces=first.txid)[0], "replacement_unknown")
        assert_equal(pay(signer, wid, batch, nonce=7, max_fee=2 * 10**9, replaces="0x" + "ab" * 32)[0], "replacement_unknown")
        code, bumped = pay(signer, wid, batch, nonce=7, max_fee=2 * 10**9, replaces=first.txid)
        assert_equal(code, "signed")
        with api.custody.engine.connect() as c:
            rows = c.execute(text("SELECT txid, replaces_txid, nonce, sender, chain_id FROM signer_signature "
                                  "WHERE withdrawal_id = :w ORDER BY id"), {"w": wid}).all()
        assert_equal([(r.txid, r.replaces_txid, int(r.nonce), r.chain_id) for r in rows],
                     [(first.txid, None, 7, 31337), (bumped.txid, first.txid, 7, 31337)])
        assert_equal({r.sender for r in rows}, {first.sender})
    finally:
        with api.custody.engine.begin() as c:
            c.execute(text("UPDATE withdrawal_request SET state = 'rejected' WHERE id = :w"), {"w": wid})


def test_an_asset_or_chain_the_signer_is_not_configured_with_is_refused(api, ledger):  # noqa: F811
    wid, batch = approved_usdt_withdrawal(api)
    try:
        log.info("custody's chain_asset lists USDT with its contract; this signer's own table does not")
        assert_equal(pay(signer_for(api, ethereum_chain_id=31337), wid, batch)[0], "asset_unknown")
        assert_equal(pay(signer_for(api, assets={"USDT": SignerAsset("ethereum", USDT_CONTRACT)}), wid, batch)[0],
                     "chain_id_mismatch")
        assert_equal(pay(signer_for(api, assets={"USDT": SignerAsset("bitcoin")}, ethereum_chain_id=31337), wid, batch)[0],
                     "asset_unknown")
    finally:
        release(api, wid)


def unapproved_usdt_withdrawal(api, units: int) -> tuple[int, int]:  # noqa: F811
    """(withdrawal id, batch id): `units` USDT to DEST, below the default policy's first tier (no approval), batched."""
    owner = f"r3-{uuid.uuid4().hex[:8]}"
    r = api.backend.post("/v1/accounts", json={"asset": "USDT", "kind": "customer", "owner": owner, "name": f"customer:{owner}:USDT"})
    assert r.status_code == 201, r.text
    acct = r.json()["id"]
    equity = api.custody.wallets.firm_account("equity", "USDT")
    api.custody.ledger.post(f"test-fund:{uuid.uuid4().hex}", [Transfer(equity, acct, 10_000 * 10**6)], kind="treasury_credit")
    guard, api.custody.withdrawals.destinations = api.custody.withdrawals.destinations, _NoNodeGuard(
        api.custody.engine, api.custody.wallets, {})
    try:
        w = api.withdraw(acct, str(units), DEST)
    finally:
        api.custody.withdrawals.destinations = guard
    assert_equal(w["state"], "approved")
    wid = int(w["id"])
    with api.custody.engine.begin() as c:
        batch = c.execute(text("INSERT INTO withdrawal_batch (chain, asset, state, fee_rate) "
                               "VALUES ('ethereum', 'USDT', 'open', 1) RETURNING id")).scalar_one()
        advance(c, "withdrawal", wid, "approved", "batched", batch_id=batch)
        c.execute(text("INSERT INTO batch_output (batch_id, withdrawal_id, amount) VALUES (:b, :w, :a)"),
                  {"b": batch, "w": wid, "a": units * 10**6})
    return wid, batch


def test_a_re_sign_at_the_same_nonce_pays_exactly_the_amount_recorded(api, signer, ledger):  # noqa: F811
    wid, batch = unapproved_usdt_withdrawal(api, 100)

    def pay_amount(amount: int) -> str:
        try:
            signer.sign_ethereum_payment(batch, BatchOutput(wid, DEST, amount), hot_index=0, chain_id=31337, nonce=7,
                                         to=USDT_CONTRACT, value=0, data=erc20_transfer_data(DEST, amount), gas=100_000,
                                         max_fee_wei=10**9, priority_fee_wei=1)
        except SigningRefused as refused:
            log.info("signer refused: %s", refused)
            return refused.code.value
        return "signed"

    def set_amount(amount: int) -> None:  # as a compromised worker
        with api.custody.engine.begin() as c:
            c.execute(text("SET LOCAL ROLE custody_worker"))
            c.execute(text("UPDATE withdrawal_request SET amount = :a WHERE id = :w"), {"a": amount, "w": wid})
            c.execute(text("UPDATE batch_output SET amount = :a WHERE withdrawal_id = :w"), {"a": amount, "w": wid})

    try:
        log.info("the worker lowers the row to 1 USDT: signed at nonce 7, recorded as 1 USDT")
        set_amount(10**6)
        assert_equal(pay_amount(10**6), "signed")
        log.info("... restores 100 USDT and asks again at nonce 7 (the same slot, so it 'conflicts')")
        set_amount(100 * 10**6)
        raised = pay_amount(100 * 10**6)
        log.info("the recorded 1 USDT at nonce 7 again (a re-sign after a crash) is still signed")
        set_amount(10**6)
        again = pay_amount(10**6)
    finally:
        release(api, wid)
    assert_equal((raised, again), ("already_signed", "signed"))
