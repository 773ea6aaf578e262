"""reserves: a proof-of-reserves report at one block height commits to every BTC customer account
(each customer's inclusion proof verifies from its JSON alone), lists every address of ours holding
coins with a signed control message anyone can check, and says it is not a proof of solvency."""
from __future__ import annotations

from sqlalchemy import text

from custody.reserves import verify_control, verify_proof
from regtest.util import assert_equal
from tests.e2e.custody.conftest import BTC_FINALITY


def test_report_commits_to_liabilities_and_proves_control(custody, customer, bitcoind, engine, ledger, log):
    acct = customer("BTC")
    bitcoind.fund(custody.wallets.issue_address(f"addr:{acct}", acct).address, 1_234_567)
    bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    report = custody.reserves.publish("BTC")
    log.info("report %d at height %d: liabilities %s over %d accounts, holdings %s over %d addresses",
             report["report_id"], report["height"], report["liabilities"]["total"], report["liabilities"]["accounts"],
             report["holdings"]["total"], len(report["holdings"]["addresses"]))
    with engine.connect() as c:
        total, count = c.execute(text(
            "SELECT coalesce(sum(b.posted), 0), count(DISTINCT a.id) FROM account a JOIN account_balance b ON b.account_id = a.id "
            "WHERE a.asset = 'BTC' AND a.kind = 'customer'")).one()
    assert_equal((int(report["liabilities"]["total"]), report["liabilities"]["accounts"]), (int(total), count))
    proof = custody.reserves.proof(report["report_id"], acct)
    assert_equal(proof["balance"], "1234567")
    assert verify_proof(proof)
    assert not verify_proof({**proof, "balance": "1234568"})
    entries = report["holdings"]["addresses"]
    assert entries and all(verify_control(e, "regtest") for e in entries)
    forged = {**entries[0], "message": entries[0]["message"].replace("height", "height 1")}
    assert not verify_control(forged, "regtest")
    on_chain = sum(u.amount for u in custody.adapters["bitcoin"].unspent([e["address"] for e in entries]))
    assert_equal(int(report["holdings"]["total"]), on_chain)
    assert "not a proof of solvency" in report["disclaimer"]
