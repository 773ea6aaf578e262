"""ops_metrics: after a BTC deposit is credited and a withdrawal paid to finality on regtest,
one scrape of the api's /metrics shows every metric family with the values that flow implies.

The flow runs through the real pipelines (bitcoind, the deposit scanner, the in-process signer,
payouts); the scheduled jobs' forms (`build_scheduler`'s functions, each under its job lock and
counted in job_stat) run the payouts and reconciliation steps once, as the worker would. The scrape
is parsed with prometheus-client's own parser; it is fetched through the typed custody.client
(`metrics()`, an auditor's key).
"""
from __future__ import annotations

import logging

from prometheus_client.parser import text_string_to_metric_families

from custody.client import CustodyClient
from custody.jobs import JobLocks, build_scheduler
from regtest.util import assert_equal
from tests.e2e.custody.api_helpers import role_client
from tests.e2e.custody.conftest import BTC_FINALITY

log = logging.getLogger(__name__)


def auditor(custody) -> CustodyClient:
    """A client with an auditor's key: /metrics shows the firm's holdings, so it needs one."""
    return role_client(custody, "auditor", "metrics")


def scrape(custody) -> dict[str, dict[tuple, float]]:
    text = auditor(custody).metrics()
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def value(metrics, name: str, **labels) -> float:
    wanted = set(labels.items())
    matches = [v for k, v in metrics.get(name, {}).items() if wanted <= set(k)]
    assert matches, f"{name}{labels} not in the scrape ({sorted(metrics.get(name, {}))[:5]})"
    return sum(matches)


def test_metrics_after_a_deposit_and_a_withdrawal(custody, customer, bitcoind, ledger):
    account = customer("BTC")
    address = custody.wallets.issue_address(f"addr:{account}", account).address
    bitcoind.wallet("sendtoaddress", address, "1.5")
    bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    assert_equal(ledger.balance(account).posted, 150_000_000)

    log.info("fund the hot wallet, request a withdrawal and pay it through the scheduled payouts job")
    p = custody.payouts
    bitcoind.fund(p.hot_address("bitcoin"), 10 * 100_000_000)
    bitcoind.mine(1)
    p.sync_hot_wallet()
    w = custody.withdrawals.request(client_withdrawal_id=f"ops-metrics-{account}", account_id=account,
                                    amount=20_000_000, destination=bitcoind.wallet("getnewaddress", "", "bech32"),
                                    requested_by="backend")
    assert_equal(w.state, "approved")
    locks = JobLocks(custody.engine)
    try:
        scheduler = build_scheduler(custody, locks=locks)
        assert scheduler.get_job("payouts").func() is True  # batch, sign, broadcast
        bitcoind.mine(BTC_FINALITY)
        assert scheduler.get_job("payouts").func() is True  # track to final
        assert_equal(custody.withdrawals.get(w.id).state, "final")
        assert scheduler.get_job("reconcile").func() is True
        assert scheduler.get_job("deposits:bitcoin").func() is True
    finally:
        locks.dispose()

    m = scrape(custody)
    log.info("scraped %d sample names", len(m))
    assert value(m, "custody_deposits", chain="bitcoin", state="credited") >= 1
    assert value(m, "custody_withdrawals", asset="BTC", state="final") >= 1
    tip = bitcoind.rpc("getblockcount")
    assert_equal(value(m, "custody_chain_node_height", chain="bitcoin"), tip)
    assert_equal(value(m, "custody_chain_node_up", chain="bitcoin"), 1)
    assert_equal(value(m, "custody_chain_scan_height", chain="bitcoin"), tip)  # the deposits job just scanned
    assert_equal(value(m, "custody_chain_scan_lag_blocks", chain="bitcoin"), 0)
    hot_books = -ledger.balance(custody.wallets.location_account("bitcoin", "hot", "BTC")).posted
    assert_equal(value(m, "custody_location_balance_minor", chain="bitcoin", tier="hot", asset="BTC"), hot_books)
    assert hot_books > 0
    assert_equal(value(m, "custody_reconciliation_difference_minor", chain="bitcoin", tier="hot", asset="BTC"), 0)
    assert_equal(value(m, "custody_kill_switch_engaged"), 0)
    assert value(m, "custody_job_runs_total", job="payouts") >= 2
    assert_equal(value(m, "custody_job_failures_total", job="payouts"), 0)
    assert value(m, "custody_job_duration_seconds_count", job="payouts") >= 2
    assert value(m, "custody_job_duration_seconds_sum", job="payouts") > 0
    assert value(m, "custody_job_runs_total", job="reconcile") >= 1
    assert not m.get("custody_scrape_errors"), m.get("custody_scrape_errors")

    log.info("a second scrape records the first one's latency under the route template")
    client = auditor(custody)
    client.metrics()
    again = {s.name: s for f in text_string_to_metric_families(client.metrics()) for s in f.samples
             if s.name == "custody_http_request_duration_seconds_count" and s.labels.get("route") == "/metrics"}
    assert again and next(iter(again.values())).value >= 1

    assert all(check.ok for check in ledger.verify()), [c.name for c in ledger.verify() if not c.ok]
