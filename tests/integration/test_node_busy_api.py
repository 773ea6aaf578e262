"""Issue 13: a route that meets a busy node answers 503 `temporarily_unavailable` with
`Retry-After`, never 500.

Before the fix `POST /v1/reconciliation` answered 500 while an operator's `scantxoutset` ran
(`rpc -8: Scan already in progress`). The node here is a stand-in that answers what bitcoind
answers then (its error reply, mapped by the adapter's own `bitcoind_error`); the e2e test
`tests/e2e/test_bitcoin_node_busy.py` does the same against a real, busy bitcoind.
"""
from __future__ import annotations

from fastapi.testclient import TestClient

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
    """A bitcoind that runs a UTXO-set scan: the calls that scan are refused as bitcoind does."""

    def unspent(self, addresses):  # noqa: ANN001, ANN201
        raise bitcoind_error(-8, 'Scan already in progress, use action "abort" or "status"')


def test_reconciliation_over_the_api_on_a_busy_node_answers_503_temporarily_unavailable(database_url):
    with own_database(database_url, "node_busy_api") as eng:
        settings = Settings(environment="test")
        c = Container(settings=settings, engine=eng, ledger=Ledger(eng)).with_chains(
            {"bitcoin": ScanningNode()}, signer_keys=KEYS, approvers=registry())
        c.wallets.configure_asset("BTC", 8, "bitcoin", finality=3, dust_minimum=1_000, min_withdrawal=10_000,
                                  withdrawal_fee=5_000)
        for tier in ("deposit", "hot"):
            c.wallets.register_wallet("bitcoin", tier, "regtest", KEYS.account_xpub("bitcoin", tier))
        client = TestClient(create_app(c), raise_server_exceptions=False)
        client.headers["X-API-Key"] = create_api_key(eng, "busy-operator", Role.operator, settings.api_key_pepper)
        r = client.post("/v1/reconciliation")
        c.ledger.assert_verified()
    assert_equal(r.status_code, 503)
    assert_equal(r.json()["error"]["code"], "temporarily_unavailable")
    assert r.headers.get("Retry-After"), r.headers
