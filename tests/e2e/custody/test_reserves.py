"""reserves: one publish commits every customer account of BTC, ETH and USDT (one verified ledger
snapshot) at the scanners' blocks of the real bitcoind and anvil; each report and a customer's proof
pass the standalone verifier; the BIP-322 signatures also pass rust-bitcoin's verifier and the
EIP-191 ones recover to the address; the listed holdings are what the nodes say at those blocks;
and each report says it is not a proof of solvency."""
from __future__ import annotations

import bip322 as rust_bip322
from sqlalchemy import text

from custody.reserves import check_proof, check_report
from regtest.util import assert_equal
from signer import eip191
from tests.e2e.custody.conftest import BTC_FINALITY


def test_reports_commit_to_liabilities_and_prove_control(custody, customer, bitcoind, engine, ledger, log):
    acct = customer("BTC")
    bitcoind.fund(custody.wallets.issue_address(f"addr:{acct}", acct).address, 1_234_567)
    bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin", "ethereum"])
    reports = {r["asset"]: r for r in custody.reserves.publish()}
    for r in reports.values():
        log.info("report %d %s at %s height %d: liabilities %s over %d accounts (%d leaves), holdings %s over %d addresses",
                 r["report_id"], r["asset"], r["chain"], r["height"], r["liabilities"]["total"], r["liabilities"]["accounts"],
                 r["liabilities"]["leaves"], r["holdings"]["total"], len(r["holdings"]["addresses"]))
        assert_equal(check_report(r), [])
        assert "not a proof of solvency" in r["disclaimer"]
    assert {"BTC", "ETH", "USDT"} <= set(reports)
    with engine.connect() as c:
        for asset, r in reports.items():
            total, count = c.execute(text(
                "SELECT coalesce(sum(b.posted), 0), count(DISTINCT a.id) FROM account a JOIN account_balance b "
                "ON b.account_id = a.id WHERE a.asset = :a AND a.kind = 'customer'"), {"a": asset}).one()
            assert_equal((int(r["liabilities"]["total"]), r["liabilities"]["accounts"]), (int(total), count))
    btc = reports["BTC"]
    proof = custody.reserves.proof(btc["report_id"], acct)
    assert_equal(proof["balance"], "1234567")
    assert_equal(check_proof(btc, proof), [])
    entries = btc["holdings"]["addresses"]
    assert entries
    for e in entries:
        rust_bip322.verify_simple_encoded(e["address"], e["message"], e["signature"].removeprefix("smp"))  # raises if not
    on_chain = sum(u.amount for u in custody.adapters["bitcoin"].unspent([e["address"] for e in entries]))
    assert_equal(int(btc["holdings"]["total"]), on_chain)
    eth = custody.adapters["ethereum"]
    for asset in ("ETH", "USDT"):
        r = reports[asset]
        for e in r["holdings"]["addresses"]:
            assert_equal(eip191.signer_of(e["message"], e["signature"]).lower(), e["address"].lower())
            held = (eth.token_balance(r["contract"], e["address"], block=r["height"]) if r["contract"]
                    else eth.balance(e["address"], block=r["height"]))
            assert_equal(int(e["amount"]), held)
