"""The node-view cross-check fails closed (issue 13, review R1 finding 4), against bitcoind.

A deployment whose deposit wallet has handed out more indices than one bitcoind descriptor range
can hold (0..999,999: "Range is too large") can no longer keep the node's watch-only wallet
covering what it issued. The state is forged as the database owner (the 999,000 addresses are not
issued one by one; migration 0028's one-step trigger is set aside for that statement, as a
restore would): `NodeView.ensure` refuses the range and a `node_view_refused` warning incident is
open at once; each reconciliation pass then runs without the node's figure (`node` None) and
counts itself in `node_view_health`; with the escalation bounds at zero here, the first blind
pass opens a `node_view_blind` warning, the next one a critical incident (the kill switch), and
/metrics shows the run. Once the wallet is back within the range, a pass reads the node again
and the run ends.

Runs a custody container of its own (own_database, a random seed) on the session's bitcoind.
"""
from __future__ import annotations

import secrets

import pytest
from sqlalchemy import text

from chain_adapters.errors import ChainError
from custody.container import Container
from custody.controls import kill_switch
from custody.devchains import REGTEST_ASSETS
from custody.metrics import StateCollector
from custody.settings import Settings
from ledger.service import Ledger
from regtest.util import assert_equal
from signer.keys import Secret, SignerKeys, seed_from_text
from tests.approvers import registry
from tests.integration.own_database import own_database


@pytest.fixture
def own(database_url, btc_adapter):
    keys = SignerKeys(seed_from_text(Secret(secrets.token_hex(32))), "regtest")
    with own_database(database_url, "nv_blind") as eng:
        container = Container(settings=Settings(environment="test", node_view_warn_after_seconds=0,
                                                node_view_critical_after_seconds=3600), engine=eng, ledger=Ledger(eng))
        container.with_chains({"bitcoin": btc_adapter}, signer_keys=keys, approvers=registry(), node_view=True)
        for tier in ("deposit", "hot"):
            container.wallets.register_wallet("bitcoin", tier, "regtest", keys.account_xpub("bitcoin", tier))
        a = REGTEST_ASSETS["BTC"]
        container.wallets.configure_asset("BTC", a["decimals"], "bitcoin",
                                          **{k: v for k, v in a.items() if k not in ("chain", "decimals")})
        container.deposits.start_cursor("bitcoin")
        try:
            yield container
        finally:
            wallet = container.node_view.name()
            if container.adapters["bitcoin"].watch_loaded(wallet):
                container.adapters["bitcoin"].watch_unload(wallet)


def _forge_deposit_next_index(container, value: int) -> None:
    with container.engine.begin() as c:
        c.execute(text("SET LOCAL session_replication_role = replica"))
        c.execute(text("UPDATE wallet SET next_index = :n WHERE chain = 'bitcoin' AND tier = 'deposit'"), {"n": value})


def _incidents(container) -> list[tuple[str, str]]:
    with container.engine.connect() as c:
        return [tuple(r) for r in c.execute(text("SELECT kind, severity FROM incident ORDER BY id"))]


def _health(container):
    with container.engine.connect() as c:
        return c.execute(text("SELECT missed_passes, blind_since IS NOT NULL AS blind, severity, last_error "
                              "FROM node_view_health WHERE chain = 'bitcoin'")).one()


def _metric(container, name: str) -> float:
    for family in StateCollector(container).collect():
        if family.name == name:
            return next(s.value for s in family.samples if s.labels.get("chain") == "bitcoin")
    raise AssertionError(f"no {name} sample")


def test_a_node_view_that_cannot_cover_the_issued_range_escalates(own, bitcoind, log):
    bitcoind.fund(own.payouts.hot_address("bitcoin"), 1_000_000)
    bitcoind.mine(1)
    lines = own.reconciliation.run(chains=["bitcoin"])
    assert lines and all(ln.difference == 0 and ln.node == ln.on_chain for ln in lines), lines
    assert_equal(_health(own).missed_passes, 0)
    assert_equal(_incidents(own), [])

    log.info("the deposit wallet has handed out 1,200,000 indices: past one descriptor range")
    _forge_deposit_next_index(own, 1_200_000)
    with pytest.raises(ChainError, match="past what one bitcoind descriptor range covers"):
        own.node_view.ensure()
    assert_equal(_incidents(own), [("node_view_refused", "warning")])

    log.info("a pass without the node's figure: node is None, counted, a warning (warn bound 0 s)")
    lines = own.reconciliation.run(chains=["bitcoin"])
    assert lines and all(ln.node is None and ln.difference == 0 for ln in lines), lines
    health = _health(own)
    assert (health.missed_passes, health.blind, health.severity) == (1, True, "warning"), health
    assert "covers up to" in health.last_error
    assert_equal(_incidents(own), [("node_view_refused", "warning"), ("node_view_blind", "warning")])
    assert not kill_switch(own.engine).engaged
    assert_equal(_metric(own, "custody_node_view_missed_passes"), 1.0)

    log.info("still blind past the critical bound: a critical incident halts withdrawals")
    own.reconciliation.blind_critical_after = 0
    own.reconciliation.run(chains=["bitcoin"])
    health = _health(own)
    assert (health.missed_passes, health.severity) == (2, "critical"), health
    assert_equal(_incidents(own)[-1], ("node_view_blind", "critical"))
    assert kill_switch(own.engine).engaged
    own.reconciliation.run(chains=["bitcoin"])  # escalated once per run: no new incident
    assert_equal(len(_incidents(own)), 3)
    assert_equal(_metric(own, "custody_node_view_missed_passes"), 3.0)

    log.info("back within the range: the next pass reads the node and the run ends")
    _forge_deposit_next_index(own, 0)
    lines = own.reconciliation.run(chains=["bitcoin"])
    assert lines and all(ln.node == ln.on_chain and ln.difference == 0 for ln in lines), lines
    health = _health(own)
    assert (health.missed_passes, health.blind, health.severity) == (0, False, None), health
    assert_equal(_metric(own, "custody_node_view_blind_seconds"), 0.0)
    bad = [c.name for c in own.ledger.verify() if not c.ok]
    assert bad == [], bad
