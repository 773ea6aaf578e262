"""deposit_reorg_freeze (issue 11, observation 10): a credited deposit was reorged out after
finality (double-spent away); the shortfall went to suspense and the kill switch engaged, but the
customer could still move the credited amount to another account. Now custody holds whatever of the
credit is still available, in the same database transaction that books the shortfall; the
customer's transfers and holds see that much less available, only custody can release the hold,
and an operator resolves the incident over the API: capture to suspense (the books recover what
they can) or release to the customer. Capturing is refused once the deposit is re-mined. The backend
and the operator call the API through the typed custody.client."""
from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from sqlalchemy import text

from custody.controls import set_kill_switch
from regtest.util import assert_equal
from tests.e2e import txbuild
from tests.e2e.custody.api_helpers import answered, refused, role_client
from tests.e2e.custody.conftest import BTC_FINALITY

OTHER = "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080"  # not ours: competing blocks pay here


@pytest.fixture
def clients(custody):
    return {role: role_client(custody, role, role) for role in ("backend", "operator")}


def transfer(api, debit: int, credit: int, amount: str):
    return api.post_transaction(idempotency_key=f"t:{uuid.uuid4().hex}", transfers=[
        {"debit_account_id": debit, "credit_account_id": credit, "amount": Decimal(amount)}])


def reorg_incident(engine, obs_id: int):
    with engine.connect() as c:
        return c.execute(text("SELECT id, detail FROM incident WHERE kind = 'deposit_reorged_after_finality' "
                              "AND detail->>'observation_id' = :i ORDER BY id DESC LIMIT 1"), {"i": str(obs_id)}).one()


def test_double_spent_credit_is_frozen_then_captured_to_suspense(custody, customer, btc, bitcoind, clients, engine, ledger, log):
    backend, operator = clients["backend"], clients["operator"]
    acct, elsewhere = customer("BTC"), customer("BTC")
    addr = custody.wallets.issue_address(f"addr:{acct}", acct).address
    key, utxo = btc.funded_key(8_000_000)
    deposit = txbuild.spend_p2wpkh(key, utxo.txid, utxo.index, utxo.amount, [(addr, 7_000_000), (key.address, utxo.amount - 7_002_000)])
    btc.adapter.broadcast(deposit)
    blocks = bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    [obs] = custody.deposits.list(account_id=acct)
    assert_equal((obs["state"], ledger.balance(acct).posted), ("credited", 7_000_000))
    log.info("the customer moves 0.02 BTC of the credit away before anything happens")
    answered(backend, 201, transfer(backend, acct, elsewhere, "0.02"))
    suspense = custody.wallets.firm_account("suspense", "BTC")
    before = ledger.balance(suspense).posted

    log.info("the sender double-spends the deposit in a longer competing chain")
    bitcoind.rpc("invalidateblock", blocks[0])
    theft = txbuild.spend_p2wpkh(key, utxo.txid, utxo.index, utxo.amount, [(key.address, utxo.amount - 3_000)])
    bitcoind.rpc("generateblock", OTHER, [theft.hex()])
    for _ in range(BTC_FINALITY):
        bitcoind.rpc("generateblock", OTHER, [])
    custody.deposits.run_once(["bitcoin"])
    log.info("the attack: move the rest of the credit to another account")
    assert_equal(refused(lambda: transfer(backend, acct, elsewhere, "0.01")), (409, "insufficient_funds"))
    incident = reorg_incident(engine, obs["id"])
    hold = incident.detail["hold"]
    log.info("incident %s; the hold: %s", incident.id, hold)
    assert_equal((hold["amount"], hold["owner"], hold["account_id"]), ("5000000", "custody:reorg", acct))
    assert_equal(ledger.balance(suspense).posted, before - 7_000_000)
    bal = ledger.balance(acct)
    assert_equal((bal.posted, bal.held, bal.available), (5_000_000, 5_000_000, 0))
    log.info("nor hold it for an order, nor release custody's hold")
    assert_equal(refused(lambda: backend.place_hold(idempotency_key=f"h:{uuid.uuid4().hex}", account_id=acct,
                                                    amount=Decimal("0.01"), reference="order")),
                 (409, "insufficient_funds"))
    assert_equal(refused(lambda: backend.release_hold(hold["id"])), (403, "hold_owner_mismatch"))

    log.info("resolving is an operator's act, with a decision for an incident that holds money")
    assert_equal(refused(lambda: backend.resolve_incident(incident.id, comment="mine", decision="release")),
                 (403, "forbidden"))
    assert_equal(refused(lambda: operator.resolve_incident(incident.id, comment="no decision")),
                 (422, "incident_decision_invalid"))
    resolved = answered(operator, 200, operator.resolve_incident(
        incident.id, comment="double spend confirmed by the sender's block", decision="capture"))
    assert_equal((resolved.resolution["decision"], resolved.resolution["captured"]), ("capture", "5000000"))
    assert_equal(refused(lambda: operator.resolve_incident(incident.id, comment="again", decision="release")),
                 (409, "invalid_state"))
    bal = ledger.balance(acct)
    assert_equal((bal.posted, bal.held), (0, 0))
    assert_equal(ledger.balance(suspense).posted, before - 2_000_000)  # the loss is what left before the reorg
    with engine.connect() as c:
        audited = c.execute(text("SELECT detail->>'decision' FROM audit_event WHERE action = 'incident.resolve' AND subject = :s"),
                            {"s": f"incident:{incident.id}"}).scalars().all()
    assert_equal(audited, ["capture"])
    ledger.assert_verified()
    with engine.begin() as c:
        set_kill_switch(c, False, "test: explained", "op-test")


def test_remined_deposit_cannot_be_captured_and_is_released(custody, customer, bitcoind, clients, engine, ledger, log):
    operator = clients["operator"]
    acct = customer("BTC")
    addr = custody.wallets.issue_address(f"addr:{acct}", acct).address
    bitcoind.fund(addr, 3_000_000)
    blocks = bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    bitcoind.rpc("invalidateblock", blocks[0])
    for _ in range(BTC_FINALITY + 1):
        bitcoind.rpc("generateblock", OTHER, [])
    custody.deposits.run_once(["bitcoin"])
    [obs] = custody.deposits.list(account_id=acct)
    incident = reorg_incident(engine, obs["id"])
    assert_equal(ledger.balance(acct).held, 3_000_000)
    log.info("the transaction is re-mined from the mempool: the shortfall is reversed, the hold stays for the operator")
    bitcoind.mine(1)
    custody.deposits.run_once(["bitcoin"])
    assert_equal(refused(lambda: operator.resolve_incident(incident.id, comment="recover", decision="capture")),
                 (422, "incident_decision_invalid"))
    resolved = operator.resolve_incident(incident.id, comment="re-mined: the customer's coins are there", decision="release")
    assert_equal((operator.last_response.status_code, resolved.resolution["released"]), (200, "3000000"))
    bal = ledger.balance(acct)
    assert_equal((bal.posted, bal.held, bal.available), (3_000_000, 0, 3_000_000))
    ledger.assert_verified()
    with engine.begin() as c:
        set_kill_switch(c, False, "test: explained", "op-test")
