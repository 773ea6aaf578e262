"""reserves: an operator's request is built by the worker's job (a proof is refused while the
reports build); one publish commits every customer account of BTC, ETH and USDT (one verified ledger
snapshot) at the scanners' blocks of the real bitcoind and anvil; each report and a customer's proof
pass the standalone verifier; the BIP-322 signatures also pass rust-bitcoin's verifier and the
EIP-191 ones recover to the address; the listed holdings are what the nodes say at those blocks;
and each report says it is not a proof of solvency."""
from __future__ import annotations

import bip322 as rust_bip322
from sqlalchemy import text

from custody.errors import CustodyErrorCode
from custody.reserves import check_proof, check_report
from regtest.util import assert_equal, assert_raises_code
from signer import eip191
from tests.e2e.custody.conftest import BTC_FINALITY, ETH_FINALITY


def test_reports_commit_to_liabilities_and_prove_control(custody, customer, bitcoind, anvil, usdt, engine, ledger, log):
    acct = customer("BTC")
    eth_acct, usdt_acct = customer("ETH"), customer("USDT")
    log.info("deposits: BTC, ether and USDT, each to an address of its own, taken to finality")
    bitcoind.fund(custody.wallets.issue_address(f"addr:{acct}", acct).address, 1_234_567)
    anvil.fund(custody.wallets.issue_address(f"addr:{eth_acct}", eth_acct).address, 3 * 10**18 + 7)
    usdt.mint(custody.wallets.issue_address(f"addr:{usdt_acct}", usdt_acct).address, 250_000_001)
    bitcoind.mine(BTC_FINALITY)
    anvil.mine(ETH_FINALITY)
    custody.deposits.run_once(["bitcoin", "ethereum"])
    log.info("an operator requests the reports: building; a proof is refused until the worker's job publishes them")
    jobs, created = custody.reserves.request(f"e2e:{acct}", "e2e")
    assert created and all(j.state == "building" for j in jobs)
    btc_job = next(j for j in jobs if j.asset == "BTC")
    assert_raises_code(CustodyErrorCode.reserves_report_building, custody.reserves.proof, btc_job.report_id, acct)
    assert_equal(sorted(custody.reserves.run_once()), sorted(j.report_id for j in jobs))
    assert_equal({custody.reserves.job(j.report_id).state for j in jobs}, {"published"})
    reports = {j.asset: custody.reserves.report(j.report_id) for j in jobs}
    for r in reports.values():
        log.info("report %d %s at %s height %d: liabilities %s over %d accounts (%d leaves), holdings %s over %d addresses",
                 r["report_id"], r["asset"], r["chain"], r["height"], r["liabilities"]["total"], r["liabilities"]["accounts"],
                 r["liabilities"]["leaves"], r["holdings"]["total"], len(r["holdings"]["addresses"]))
        assert_equal(check_report(r), [])
        assert "not a proof of solvency" in r["disclaimer"]
    assert {"BTC", "ETH", "USDT"} <= set(reports)
    for asset, account in (("ETH", eth_acct), ("USDT", usdt_acct)):
        assert_equal(check_proof(reports[asset], custody.reserves.proof(reports[asset]["report_id"], account)), [])
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
