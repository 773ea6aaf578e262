"""wallet_index_paid_before_issue (issue 13, branch lookahead): coins paid to one of our addresses
before custody handed it out, against bitcoind; the wallet index and the node's own view
(custody.node_view) must agree on them, and nobody is credited with them.

- A deposit address paid before it is issued, within the index's window (`WATCH_AHEAD` past the
  deposit wallet's next_index): the index stores the coin but records no deposit observation (no
  `deposit_address` row exists: nobody to credit) and counts it in no tier while the index is not
  issued; the node's view reports it as unissued. Once the address is issued (to a customer who
  never paid it), the coin counts in the deposit tier on both sides (node == index) and the deposit
  line shows it as a surplus warning until an operator books it: it is the firm's coin on chain,
  not that customer's deposit. A payment the customer makes after the issue is credited as usual.
- A hot change address `1/<b>` paid beyond the index's window: the index never sees the coin. When
  batch `b` exists, the node's view widens its range and its import rescans from shortly before
  `b` was created (bitcoind goes two hours further back), so the node DOES find the coin; it reports
  it as `unindexed` (a coin the index does not hold), reconciliation compares the index with the
  node's figure less it, so both agree (0), and a `wallet_index_unindexed` warning names it. Nothing halts: anyone who knows the xpub can cause this.

Each test runs a custody container of its own (own_database, fresh keys), sharing the session's
bitcoind, so its surplus and incidents never reach the session's database.
"""
from __future__ import annotations

import secrets

import pytest
from sqlalchemy import text

from custody.addresses import derive_btc_address
from custody.container import Container
from custody.controls import kill_switch
from custody.devchains import REGTEST_ASSETS
from custody.settings import Settings
from custody.wallet_index import WATCH_AHEAD
from ledger.service import Ledger
from regtest.util import assert_equal
from signer.keys import Secret, SignerKeys, seed_from_text
from tests.approvers import registry
from tests.e2e.custody.conftest import BTC_FINALITY
from tests.integration.own_database import own_database

EARLY = 2_000_000  # paid to the deposit address before it was issued
LATER = 500_000  # paid by the customer after the issue
AHEAD = 3_000_000  # paid to a change address beyond the index's window


@pytest.fixture
def own(database_url, btc_adapter):
    """A custody container on a database of its own, with keys of its own (bitcoin only)."""
    keys = SignerKeys(seed_from_text(Secret(secrets.token_hex(32))), "regtest")
    with own_database(database_url, "lookahead_e2e") as eng:
        container = Container(settings=Settings(environment="test"), engine=eng, ledger=Ledger(eng))
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


def lines(own) -> dict:
    own.deposits.run_once(["bitcoin"])
    return {ln.tier: ln for ln in own.reconciliation.run(chains=["bitcoin"])}


def incidents(own) -> list:
    with own.engine.connect() as c:
        return c.execute(text("SELECT kind, severity, detail FROM incident ORDER BY id")).all()


def test_a_deposit_address_paid_before_it_is_issued_is_not_credited_and_both_views_agree(own, bitcoind, log):
    with own.engine.connect() as c:
        wallet = c.execute(text("SELECT xpub, next_index FROM wallet WHERE chain = 'bitcoin' AND tier = 'deposit'")).one()
    index = wallet.next_index + 3
    early = derive_btc_address(wallet.xpub, "regtest", 0, index)
    log.info("someone who knows the deposit xpub pays %s (0/%d) before custody issues it", early, index)
    bitcoind.fund(early, EARLY)
    bitcoind.mine(BTC_FINALITY)
    before = lines(own)
    held = own.node_view.read(own.adapters["bitcoin"].tip())
    with own.engine.connect() as c:
        stored = c.execute(text("SELECT tier, derivation_change, derivation_index, amount FROM btc_wallet_output "
                                "WHERE address = :a"), {"a": early}).all()
        observed = c.execute(text("SELECT count(*) FROM deposit_observation WHERE address = :a"), {"a": early}).scalar_one()
    assert_equal([tuple(r) for r in stored], [("deposit", 0, index, EARLY)])
    assert_equal(observed, 0)
    assert_equal((before["deposit"].on_chain, before["deposit"].node, before["deposit"].difference), (0, 0, 0))
    assert_equal(held.unissued.get("deposit"), EARLY)

    log.info("custody issues addresses up to 0/%d; the last goes to a customer who never paid it", index)
    customer = own.wallets.customer_account("late-customer", "BTC")
    issued = [own.wallets.issue_address(f"issue:{i}", customer) for i in range(4)]
    assert_equal(issued[-1].address, early)
    after = lines(own)
    dep = after["deposit"]
    log.info("deposit line: chain %d, node %d, books %d, difference %d", dep.on_chain, dep.node, dep.books, dep.difference)
    assert_equal((dep.on_chain, dep.node, dep.books, dep.difference), (EARLY, EARLY, 0, EARLY))
    assert_equal(own.ledger.balance(customer).posted, 0)
    kinds = {(k, s) for k, s, _ in incidents(own)}
    assert ("reconciliation_difference", "warning") in kinds
    assert not any(s == "critical" for _, s, _ in incidents(own)), incidents(own)

    log.info("the customer pays the address after the issue: that deposit is credited as usual")
    bitcoind.fund(early, LATER)
    bitcoind.mine(BTC_FINALITY)
    for _ in range(3):
        own.deposits.run_once(["bitcoin"])
    assert_equal(own.ledger.balance(customer).posted, LATER)
    dep = lines(own)["deposit"]
    assert_equal((dep.on_chain, dep.node, dep.difference), (EARLY + LATER, EARLY + LATER, EARLY))
    assert not kill_switch(own.engine).engaged
    assert all(c.ok for c in own.ledger.verify())


def test_a_change_address_paid_beyond_the_window_is_seen_by_neither_figure(own, bitcoind, log):
    with own.engine.connect() as c:
        hot_xpub = c.execute(text("SELECT xpub FROM wallet WHERE chain = 'bitcoin' AND tier = 'hot'")).scalar_one()
        top = c.execute(text("SELECT coalesce(max(id), 0) FROM withdrawal_batch WHERE chain = 'bitcoin'")).scalar_one()
    lines(own)  # the index's window and the node's ranges are set from what is issued now
    target = top + WATCH_AHEAD + 5
    far = derive_btc_address(hot_xpub, "regtest", 1, target)
    log.info("%s (1/%d) is paid, beyond the index's window (highest batch %d + %d)", far, target, top, WATCH_AHEAD)
    bitcoind.fund(far, AHEAD)
    bitcoind.mine(1)
    assert_equal(lines(own)["hot"].node, 0)

    log.info("batch %d is created (batch ids up to it taken by runs that rolled back, say)", target)
    with own.engine.begin() as c:
        c.execute(text("SELECT setval('withdrawal_batch_id_seq', :v)"), {"v": target - 1})
        made = c.execute(text("INSERT INTO withdrawal_batch (chain, asset, state) VALUES ('bitcoin', 'BTC', 'open') "
                              "RETURNING id")).scalar_one()
    assert_equal(made, target)
    hot = lines(own)["hot"]
    held = own.node_view.read(own.adapters["bitcoin"].tip())
    with own.engine.connect() as c:
        indexed = c.execute(text("SELECT count(*) FROM btc_wallet_output WHERE address = :a"), {"a": far}).scalar_one()
    log.info("hot line: index %d, node %d; node's unindexed %s", hot.on_chain, hot.node, held.unindexed)
    assert_equal((indexed, hot.on_chain, hot.node, hot.difference), (0, 0, 0, 0))
    assert_equal((held.by_tier["hot"], held.unindexed), (AHEAD, {"hot": AHEAD}))  # the node's import rescan found it
    found = [(s, d["tier"], d["amount"]) for k, s, d in incidents(own) if k == "wallet_index_unindexed"]
    assert_equal(found, [("warning", "hot", AHEAD)])
    assert not any(s == "critical" for _, s, _ in incidents(own)), incidents(own)
    assert not kill_switch(own.engine).engaged


def test_an_address_issued_while_a_scan_prepares_is_credited(own, bitcoind, log, monkeypatch):
    """The race the deployed topology met (a fresh worker's first scan derives its windows for
    seconds): the scan refreshes its address map, THEN the address is issued, paid and mined, THEN
    the same scan walks the block. The address is watched ahead (no row when the map was read); the
    scan reads the row issued meanwhile in its own transaction and credits the deposit. Before the
    fix the coin stayed in the index only: the deposit line showed it as a surplus forever and the
    customer was never credited."""
    deposits = own.deposits
    deposits.run_once(["bitcoin"])
    index = deposits.index("bitcoin")
    customer = own.wallets.customer_account("racing-customer", "BTC")
    real, paid = index.prepare, {}

    def prepare(engine, cursor):  # the map is read first; the customer is served and pays meanwhile
        real(engine, cursor)
        if not paid:
            address = own.wallets.issue_address(f"race:{customer}", customer).address
            bitcoind.fund(address, LATER)
            bitcoind.mine(1)
            paid["address"] = address
    monkeypatch.setattr(index, "prepare", prepare)
    deposits.scan("bitcoin")
    monkeypatch.undo()
    with own.engine.connect() as c:
        observed = c.execute(text("SELECT account_id, amount FROM deposit_observation WHERE address = :a"),
                             {"a": paid["address"]}).all()
    assert_equal([(r.account_id, int(r.amount)) for r in observed], [(customer, LATER)])
    bitcoind.mine(BTC_FINALITY)
    for _ in range(3):
        deposits.run_once(["bitcoin"])
    assert_equal(own.ledger.balance(customer).posted, LATER)
    dep = lines(own)["deposit"]
    assert_equal((dep.on_chain, dep.node, dep.difference), (LATER, LATER, 0))
    assert all(c.ok for c in own.ledger.verify())
