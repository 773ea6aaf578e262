"""Second adversarial review of issue 11: what the signer re-checks of the rows it reads.

The signer "trusts nothing custody says about a batch": it re-reads the database itself. But the
rows are written by the custody process, and a forged row passes where the signer could know
better from its own keys and the rows' own links:
- a withdrawal whose destination is the firm's own hot address (the signer derives it itself, as
  it does for change) is signed; custody's destination guard is the only check;
- a withdrawal from an equity account (any non-customer kind) is signed with a single operator
  approval: the signer's exception for non-customer accounts is meant for quarantine returns, but
  it checks neither the kind (quarantine) nor the deposit the return names.

Each scenario batches one real, policy-approved withdrawal the way the batcher does, forges one
column in the same uncommitted database transaction, asks the signer's checks, and rolls back.
"""
from __future__ import annotations

import logging
import uuid

import pytest
from sqlalchemy import text

from custody.controls import set_kill_switch
from custody.states import advance_many
from signer.bitcoin_tx import address_to_script
from signer.keys import Secret, SignerKeys, seed_from_text
from signer.service import BatchOutput, Signer, SigningRefused
from custody.policy_config import default_policy
from signer.approvals import quorum_table_from_policy
from tests.approvers import registry
from tests.integration.own_database import own_database
from ledger.service import Ledger
from tests.integration.withdrawal_api import WithdrawalApi

log = logging.getLogger(__name__)
KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")


@pytest.fixture(scope="module")
def api(database_url) -> WithdrawalApi:
    """A database of this module's own: its hand-made batches stay open (refused), and the session
    database's payout jobs (the e2e suites share it) must not meet them."""
    with own_database(database_url, "review2_signer") as eng:
        yield WithdrawalApi(eng)
        Ledger(eng).assert_verified()


def make_signer(api: WithdrawalApi) -> Signer:
    """A signer with its own approver registry and the default policy's quorum table, as deployed."""
    return Signer(api.custody.engine, KEYS, bitcoin_network="regtest", approvers=registry(),
                  quorum=quorum_table_from_policy(default_policy()))


def batched(api: WithdrawalApi, c, amount: str = "0.1"):
    """A customer's approved withdrawal, batched as the batcher does; its (id, account, amount)."""
    acct = api.open_customer(f"signer-{uuid.uuid4().hex[:8]}")
    w = api.withdraw(acct, amount)
    assert w["state"] == "approved", w
    batch_id = c.execute(text("INSERT INTO withdrawal_batch (chain, asset, state, fee_rate) "
                              "VALUES ('bitcoin', 'BTC', 'open', 1000) RETURNING id")).scalar_one()
    advance_many(c, "withdrawal", [int(w["id"])], "approved", "batched", batch_id=batch_id)
    amount_minor = int(c.execute(text("SELECT amount FROM withdrawal_request WHERE id = :w"), {"w": int(w["id"])}).scalar_one())
    c.execute(text("INSERT INTO batch_output (batch_id, withdrawal_id, amount) VALUES (:b, :w, :m)"),
              {"b": batch_id, "w": int(w["id"]), "m": amount_minor})
    return batch_id, int(w["id"]), acct, amount_minor


def signer_check(signer: Signer, c, batch_id: int, wid: int) -> str | None:
    """The signer's refusal code for the batch as the rows now say, or None if it would sign."""
    row = c.execute(text("SELECT destination, amount, destination_script FROM withdrawal_request WHERE id = :w"), {"w": wid}).one()
    try:
        signer._check_batch(c, batch_id, [BatchOutput(wid, row.destination, int(row.amount), bytes(row.destination_script))])
    except SigningRefused as refused:
        return refused.code.value
    return None


def test_the_signer_signs_a_payment_to_its_own_hot_address(api, ledger):
    with api.custody.engine.begin() as c:
        set_kill_switch(c, False, "review2: start clean", "review2")
    signer = make_signer(api)
    hot = signer._hot_address(0, 0)
    with api.custody.engine.connect() as c, c.begin() as t:
        batch_id, wid, acct, _ = batched(api, c)
        log.info("forged: withdrawal %d now pays the hot receive address %s", wid, hot)
        c.execute(text("UPDATE withdrawal_request SET destination = :d, destination_script = :s WHERE id = :w"),
                  {"d": hot, "s": address_to_script(hot, "regtest"), "w": wid})
        code = signer_check(signer, c, batch_id, wid)
        t.rollback()
    log.info("signer -> %s", code)
    api.reject_all(acct)
    assert code is not None, "the signer would sign a payment to its own hot address"


def test_the_signer_signs_a_withdrawal_from_equity_with_one_approval(api, ledger):
    with api.custody.engine.begin() as c:
        set_kill_switch(c, False, "review2: start clean", "review2")
    signer = make_signer(api)
    equity = api.custody.wallets.firm_account("equity", "BTC")
    with api.custody.engine.connect() as c, c.begin() as t:
        batch_id, wid, acct, _ = batched(api, c)
        log.info("forged: withdrawal %d is now from equity account %d, with one operator's approval", wid, equity)
        c.execute(text("UPDATE withdrawal_request SET account_id = :e WHERE id = :w"), {"e": equity, "w": wid})
        c.execute(text("INSERT INTO approval (withdrawal_id, decision_id, operator, action, comment) "
                       "SELECT id, decision_id, 'api:op-x', 'approve', 'forged' FROM withdrawal_request WHERE id = :w"), {"w": wid})
        code = signer_check(signer, c, batch_id, wid)
        t.rollback()
    log.info("signer -> %s", code)
    api.reject_all(acct)
    assert code is not None, "the signer would sign a withdrawal from an equity account"


def forged_refusal(api: WithdrawalApi, forge) -> str | None:
    """Batch one approved withdrawal, apply `forge(c, wid, acct)` in the same uncommitted
    transaction, ask the signer's batch checks, roll back; the refusal code or None."""
    with api.custody.engine.begin() as c:
        set_kill_switch(c, False, "review2: start clean", "review2")
    signer = make_signer(api)
    with api.custody.engine.connect() as c, c.begin() as t:
        batch_id, wid, acct, _ = batched(api, c)
        forge(c, signer, batch_id, wid, acct)
        code = signer_check(signer, c, batch_id, wid)
        t.rollback()
    log.info("signer -> %s", code)
    api.reject_all(acct)
    return code


def pay_to(address: str):
    def forge(c, signer, batch_id, wid, acct):
        log.info("forged: withdrawal %d now pays %s", wid, address)
        c.execute(text("UPDATE withdrawal_request SET destination = :d, destination_script = :s WHERE id = :w"),
                  {"d": address, "s": address_to_script(address, "regtest"), "w": wid})
    return forge


def test_the_signer_refuses_its_own_change_and_deposit_addresses(api, ledger):
    """Not only 0/0: a change address of a batch near this one (custody refuses 1,000 ids ahead) and
    a deposit address of the signer's own deposit branch, both derived by the signer itself."""
    def nearby_change(c, signer, batch_id, wid, acct):
        pay_to(signer._hot_address(1, batch_id + 3))(c, signer, batch_id, wid, acct)

    def deposit(c, signer, batch_id, wid, acct):
        pay_to(signer._derive_address(KEYS.account_xpub("bitcoin", "deposit"), 0, 777))(c, signer, batch_id, wid, acct)

    assert forged_refusal(api, nearby_change) == "destination_internal"
    assert forged_refusal(api, deposit) == "destination_internal"


def test_the_signer_refuses_a_withdrawal_pointing_at_another_accounts_hold(api, ledger):
    """A forged row whose hold_id names another customer's live withdrawal hold (pending, large
    enough) is refused: the hold must be on the withdrawal's own account."""
    other = api.open_customer(f"signer-other-{uuid.uuid4().hex[:8]}")
    theirs = api.withdraw(other, "0.5")
    assert theirs["state"] == "approved", theirs

    def borrow_hold(c, signer, batch_id, wid, acct):
        log.info("forged: withdrawal %d now points at account %d's hold", wid, other)
        c.execute(text("UPDATE withdrawal_request SET hold_id = (SELECT hold_id FROM withdrawal_request WHERE id = :t) "
                       "WHERE id = :w"), {"t": int(theirs["id"]), "w": wid})

    try:
        assert forged_refusal(api, borrow_hold) == "hold_not_live"
    finally:
        api.reject_all(other)


def test_the_signer_refuses_a_hold_custody_does_not_own(api, ledger):
    """A live hold on the right account, large enough, but placed by someone else than custody's
    withdrawals (owner `withdrawals`): its owner could release it while the coins leave."""
    def foreign_hold(c, signer, batch_id, wid, acct):
        hold = c.execute(text("INSERT INTO hold (idempotency_key, content_hash, account_id, amount, owner, reference) "
                              "VALUES (:k, 'forged', :a, 1000000000, 'api:backend', 'forged') RETURNING id"),
                         {"k": f"forged:{uuid.uuid4().hex}", "a": acct}).scalar_one()
        log.info("forged: withdrawal %d now points at hold %d owned by api:backend", wid, hold)
        c.execute(text("UPDATE withdrawal_request SET hold_id = :h WHERE id = :w"), {"h": hold, "w": wid})

    assert forged_refusal(api, foreign_hold) == "hold_not_live"
