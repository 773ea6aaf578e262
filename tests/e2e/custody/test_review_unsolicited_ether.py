"""Adversarial review of issue 11 (observation 3's consequence: "the next reconciliation reported a
difference, opened a critical incident and engaged the kill switch, halting every customer's
withdrawals. Repeatable."), reached without any withdrawal at all, by anyone, for one wei.

Reconciliation compares what the ethereum hot address and the deposit addresses hold at a pinned
block with the books plus what is legitimately in transit, and any difference is critical. Two
ways to put value there that no book explains:
- the hot address is public (the sender of every payout): an outsider sends it 1 wei; treasury
  funding "mined and not booked is a difference, on purpose" (custody.reconciliation);
- a customer's own deposit address receives 1 wei through a contract's internal call: the scanner
  sees top-level transfers only ("value moved by internal calls is not seen: deposit addresses are
  plain accounts"), so it is never observed, never credited, never in transit.
Either way the kill switch halts every customer's withdrawals, on both chains, until an admin
releases it; and it is repeatable at will. A surplus (the chain holds more than the books) loses
no one's money: it should be reported, not halt withdrawals.

The test books both wei and releases what it engaged afterwards, so later suites see clean books.
"""
from __future__ import annotations

from sqlalchemy import text

from custody.controls import kill_switch, set_kill_switch
from custody.incidents import Incidents
from ledger.model import Transfer
from regtest.anvil_node import FAUCET_ADDRESS
from regtest.util import assert_equal

# Runtime: CALL(gas, calldataload(0), callvalue, 0, 0, 0, 0); STOP. Forwards the ether it is sent.
FORWARDER = bytes.fromhex("6000600060006000346000355af100")


def deploy(w3, runtime: bytes) -> str:
    init = bytes([0x60, len(runtime), 0x60, 0x0C, 0x60, 0x00, 0x39, 0x60, len(runtime), 0x60, 0x00, 0xF3]) + runtime
    tx = w3.eth.send_transaction({"from": FAUCET_ADDRESS, "data": "0x" + init.hex(), "gas": 200_000})
    return w3.eth.wait_for_transaction_receipt(tx)["contractAddress"]


def test_one_unsolicited_wei_does_not_halt_every_withdrawal(custody, customer, anvil, engine, ledger, log):
    p, recon = custody.payouts, custody.reconciliation
    custody.deposits.run_once(["ethereum"])
    before = {(l.tier, l.asset): l.difference for l in recon.run(chains=["ethereum"])}
    log.info("before: %s; kill switch %s", before, kill_switch(engine).engaged)
    assert not any(before.values()) and not kill_switch(engine).engaged

    acct = customer("ETH")
    deposit_address = custody.wallets.issue_address(f"addr:{acct}", acct).address
    hot = p.hot_address("ethereum")
    log.info("an outsider sends 1 wei to the hot address %s", hot)
    anvil.fund(hot, 1)
    log.info("a customer sends 1 wei to their own deposit address %s through a contract", deposit_address)
    forwarder = deploy(anvil.w3, FORWARDER)
    tx = anvil.w3.eth.send_transaction({"from": FAUCET_ADDRESS, "to": forwarder, "value": 1, "gas": 100_000,
                                        "data": "0x" + "00" * 12 + deposit_address[2:].lower()})
    assert anvil.w3.eth.wait_for_transaction_receipt(tx)["status"] == 1
    custody.deposits.run_once(["ethereum"])
    lines = {(l.tier, l.asset): l.difference for l in recon.run(chains=["ethereum"])}
    halted = kill_switch(engine).engaged
    log.info("after: %s; kill switch %s", lines, halted)

    log.info("clean-up: book both wei, resolve the incidents, release the switch")
    equity = custody.wallets.firm_account("equity", "ETH")
    ledger.post(f"review:unsolicited:{tx.hex()}", [
        Transfer(custody.wallets.location_account("ethereum", "deposit", "ETH"), equity, 1),
        Transfer(custody.wallets.location_account("ethereum", "hot", "ETH"), equity, 1)], kind="review_cleanup")
    with engine.connect() as c:
        opened = c.execute(text("SELECT id FROM incident WHERE kind = 'reconciliation_difference' "
                                "AND resolved_at IS NULL")).scalars().all()
    for incident in opened:
        Incidents(engine, ledger).resolve(incident, operator="review-cleanup", comment="unsolicited wei booked")
    with engine.begin() as c:
        set_kill_switch(c, False, "review test cleanup", "review-cleanup")
    assert not any(l.difference for l in recon.run(chains=["ethereum"]))

    assert_equal((lines[("hot", "ETH")], lines[("deposit", "ETH")], halted), (1, 1, False))
