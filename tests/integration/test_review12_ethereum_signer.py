"""Review of issue 12 (R1): ethereum payments the signer signs beyond what approvers signed.

| test | attacker | what is signed today |
| --- | --- | --- |
| token_contract_rewritten_after_approval | a database writer (custody roles may UPDATE chain_asset) | a 50,000 USDT withdrawal approved by a valid signature; `chain_asset.contract_address` is changed to another token's contract; the signer builds the expected call from that column (the payload names the asset, not its contract; the signer has no token list of its own) and signs transfer(dest, amount) on the other token |
| one_withdrawal_signed_under_other_nonces_and_chains | a compromised worker | the same approved withdrawal signed at nonce 0, nonce 1 and for chain id 1: each is a separate payment the chain accepts (the signer keeps no record of what it already signed for a withdrawal, and has no chain id of its own) |

The scenarios run the custody API without an ethereum node, so the destination check (which needs
one to know whether the destination is a contract) is replaced by a stub for the request only; the
signer is the real one. Holds are released at the end and the ledger verifies.
"""
from __future__ import annotations

import logging
import uuid

import pytest
from sqlalchemy import text

from custody.destinations import DestinationGuard
from custody.policy_config import default_policy
from custody.states import advance
from custody.withdrawals import HOLD_OWNER
from ledger.model import Transfer
from regtest.util import assert_equal
from signer.approvals import quorum_table_from_policy
from signer.assets import SignerAsset
from signer.ethereum_tx import erc20_transfer_data
from signer.keys import Secret, SignerKeys, seed_from_text
from signer.protocol import BatchOutput, SigningRefused
from signer.service import Signer
from tests.approvers import registry
from tests.integration.own_database import own_database
from ledger.service import Ledger
from tests.integration.withdrawal_api import WithdrawalApi

log = logging.getLogger(__name__)
KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
USDT_CONTRACT = "0x5FbDB2315678afecb367f032d93F642f64180aa3"  # the token custody registered
OTHER_TOKEN = "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"  # another token the hot wallet holds
DEST = "0x52908400098527886E0F7030069857D2E4169EE7"  # the customer's destination (EIP-55 vector; not ours)
AMOUNT = 50_000 * 10**6  # 50,000 USDT: the one-approval tier of the default policy


class _NoNodeGuard(DestinationGuard):
    def check_request(self, ca, account_id, destination, amount) -> None:  # no node here: the request is let through
        return None


@pytest.fixture(scope="module")
def api(database_url) -> WithdrawalApi:
    """A database of this module's own: it rewrites chain_asset and forges signed ethereum batches,
    which the session database's payout jobs (the e2e suites share it) must never see."""
    with own_database(database_url, "review12_eth") as eng:
        api = WithdrawalApi(eng)
        api.custody.wallets.configure_asset("USDT", 6, "ethereum", finality=2, contract_address=USDT_CONTRACT,
                                            min_withdrawal=1)
        yield api
        Ledger(eng).assert_verified()


@pytest.fixture(scope="module")
def signer(api) -> Signer:
    # the signer's OWN asset table and chain id (its configuration), never chain_asset
    return Signer(api.custody.engine, KEYS, bitcoin_network="regtest", approvers=registry(api.operator_name(1), api.operator_name(2)),
                  quorum=quorum_table_from_policy(default_policy()), assets={"USDT": SignerAsset("ethereum", USDT_CONTRACT, 6)},
                  ethereum_chain_id=31337)


def approved_usdt_withdrawal(api: WithdrawalApi) -> tuple[int, int]:
    """(withdrawal id, batch id): 50,000 USDT to DEST, approved by operator 1's valid signature, batched."""
    owner = f"r12e-{uuid.uuid4().hex[:8]}"
    r = api.backend.post("/v1/accounts", json={"asset": "USDT", "kind": "customer", "owner": owner,
                                               "name": f"customer:{owner}:USDT"})
    assert r.status_code == 201, r.text
    acct = r.json()["id"]
    equity = api.custody.wallets.firm_account("equity", "USDT")
    api.custody.ledger.post(f"test-fund:{uuid.uuid4().hex}", [Transfer(equity, acct, 100_000 * 10**6)], kind="treasury_credit")
    guard, api.custody.withdrawals.destinations = api.custody.withdrawals.destinations, _NoNodeGuard(
        api.custody.engine, api.custody.wallets, {})
    try:
        w = api.withdraw(acct, "50000", DEST)
    finally:
        api.custody.withdrawals.destinations = guard
    assert_equal(w["state"], "pending_approval")
    wid = int(w["id"])
    assert_equal(api.approve(1, wid).json()["state"], "approved")
    with api.custody.engine.begin() as c:
        batch = c.execute(text("INSERT INTO withdrawal_batch (chain, asset, state, fee_rate) "
                               "VALUES ('ethereum', 'USDT', 'open', 1) RETURNING id")).scalar_one()
        advance(c, "withdrawal", wid, "approved", "batched", batch_id=batch)
        c.execute(text("INSERT INTO batch_output (batch_id, withdrawal_id, amount) VALUES (:b, :w, :a)"),
                  {"b": batch, "w": wid, "a": AMOUNT})
    return wid, batch


def pay(signer: Signer, wid: int, batch: int, *, to: str = USDT_CONTRACT, nonce: int = 0, chain_id: int = 31337) -> str:
    try:
        signed = signer.sign_ethereum_payment(batch, BatchOutput(wid, DEST, AMOUNT), hot_index=0, chain_id=chain_id, nonce=nonce,
                                              to=to, value=0, data=erc20_transfer_data(DEST, AMOUNT), gas=100_000,
                                              max_fee_wei=10**9, priority_fee_wei=1)
    except SigningRefused as refused:
        log.info("signer refused: %s", refused)
        return refused.code.value
    log.info("signer signed %s (to %s, nonce %d, chain %d)", signed.txid, to, nonce, chain_id)
    return "signed"


def release(api: WithdrawalApi, wid: int) -> None:
    with api.custody.engine.begin() as c:
        hold = c.execute(text("SELECT hold_id FROM withdrawal_request WHERE id = :w"), {"w": wid}).scalar_one()
        api.custody.ledger.release_hold(hold, owner=HOLD_OWNER, conn=c)
        c.execute(text("UPDATE withdrawal_request SET state = 'rejected', reject_reasons = '{test_cleanup}' WHERE id = :w"), {"w": wid})


def test_token_contract_rewritten_after_approval_is_refused(api, signer, ledger):
    wid, batch = approved_usdt_withdrawal(api)
    log.info("after the approval USDT's contract in chain_asset is rewritten to another token's")
    with api.custody.engine.begin() as c:
        c.execute(text("UPDATE chain_asset SET contract_address = :k WHERE asset = 'USDT'"), {"k": OTHER_TOKEN})
    try:
        code = pay(signer, wid, batch, to=OTHER_TOKEN)
    finally:
        with api.custody.engine.begin() as c:
            c.execute(text("UPDATE chain_asset SET contract_address = :k WHERE asset = 'USDT'"), {"k": USDT_CONTRACT})
        release(api, wid)
    assert code != "signed", "a transfer of another token than the approved asset's was signed"


def test_one_withdrawal_signed_under_other_nonces_and_chains_is_refused(api, signer, ledger):
    wid, batch = approved_usdt_withdrawal(api)
    try:
        assert_equal(pay(signer, wid, batch, nonce=0), "signed")
        log.info("the worker does not record the payment and asks again: next nonce, then another chain id")
        again_next_nonce = pay(signer, wid, batch, nonce=1)
        again_other_chain = pay(signer, wid, batch, nonce=0, chain_id=1)
    finally:
        release(api, wid)
    # the refusal codes are the fix's to choose; what matters is that neither is signed
    assert again_next_nonce != "signed", "the same approved withdrawal was signed again at the next nonce: paid twice"
    assert again_other_chain != "signed", "the same approved withdrawal was signed for another chain id"
