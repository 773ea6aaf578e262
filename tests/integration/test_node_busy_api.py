"""Issue 13: a route that meets a busy node answers 503 `temporarily_unavailable` with
`Retry-After`, never 500.

Before the fix `POST /v1/reconciliation` answered 500 while an operator's `scantxoutset` ran
(`rpc -8: Scan already in progress`). Reconciliation no longer scans the UTXO set (it reads the
wallet index), but it still asks the node's watch-only wallet (custody.node_view), which refuses
while it rescans. The node here is a stand-in whose wallet answers with bitcoind's refusal (its error
reply, mapped by the adapter's own `bitcoind_error`).
"""
from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import text

from chain_adapters.bitcoin import bitcoind_error
from custody.api.app import create_app
from custody.auth import Role, create_api_key
from custody.container import Container
from custody.settings import Settings
from ledger.service import Ledger
from regtest.util import assert_equal
from tests.approvers import registry
from tests.integration.own_database import own_database
from tests.integration.test_review12w_lost_lock import KEYS, StandInBitcoin


class ScanningNode(StandInBitcoin):
    """A bitcoind whose watch-only wallet is rescanning: its reads are refused as bitcoind does."""

    def watch_loaded(self, name):  # noqa: ANN001, ANN201
        return True

    def watch_status(self, name):  # noqa: ANN001, ANN201
        raise bitcoind_error(-4, "Wallet is currently rescanning. Abort existing rescan or wait.")


def test_reconciliation_over_the_api_on_a_busy_node_answers_503_temporarily_unavailable(database_url):
    with own_database(database_url, "node_busy_api") as eng:
        settings = Settings(environment="test")
        c = Container(settings=settings, engine=eng, ledger=Ledger(eng)).with_chains(
            {"bitcoin": ScanningNode()}, signer_keys=KEYS, approvers=registry(), node_view=True)
        c.wallets.configure_asset("BTC", 8, "bitcoin", finality=3, dust_minimum=1_000, min_withdrawal=10_000,
                                  withdrawal_fee=5_000)
        for tier in ("deposit", "hot"):
            c.wallets.register_wallet("bitcoin", tier, "regtest", KEYS.account_xpub("bitcoin", tier))
        tip = c.adapters["bitcoin"].tip()
        with eng.begin() as conn:  # the worker's scanner is at the tip, so the lines are read and cross-checked
            conn.execute(text("INSERT INTO chain_cursor (chain, height, hash) VALUES ('bitcoin', :h, :x)"),
                         {"h": tip.height, "x": tip.hash})
        client = TestClient(create_app(c), raise_server_exceptions=False)
        client.headers["X-API-Key"] = create_api_key(eng, "busy-operator", Role.operator, settings.api_key_pepper)
        r = client.post("/v1/reconciliation")
        c.ledger.assert_verified()
    assert_equal(r.status_code, 503)
    assert_equal(r.json()["error"]["code"], "temporarily_unavailable")
    assert r.headers.get("Retry-After"), r.headers
