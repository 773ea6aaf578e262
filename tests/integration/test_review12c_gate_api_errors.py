"""Review of issue 12, third round (R4): a closed NetworkGate turns the API's chain routes into 500s.

The api's adapters are gated too (custody.roots.common), so a node found on another chain closes
the gate for the life of the api process: every call raises `WrongNetwork` (a `NodeUnavailable`).
The jobs log and retry it, but the API has no handler for chain errors, so each route that reads a
node answers 500 `internal_error` until the process is restarted: `POST /v1/reconciliation` (an
operator's action during exactly that incident), an ethereum withdrawal request (its destination's
contract check), `POST /v1/treasury/hot-funding`. The project's rule is no 500s: a stable code.

Fix: map `NodeUnavailable` (and `WrongNetwork`, with its own code) to 503 in custody.api.errors,
with a row in its table and the README's.
"""
from __future__ import annotations

from fastapi.testclient import TestClient

from chain_adapters.errors import WrongNetwork
from custody.api.app import create_app
from custody.auth import Role, create_api_key
from custody.container import Container
from custody.settings import Settings
from ledger.service import Ledger
from regtest.util import assert_equal
from tests.approvers import registry
from tests.integration.own_database import own_database
from tests.integration.test_review12w_lost_lock import KEYS, StandInBitcoin


class ClosedGate(StandInBitcoin):
    """What a gated bitcoin adapter answers once its node was found on another chain."""

    def _closed(self, *a, **kw):  # noqa: ANN002, ANN003, ANN202
        raise WrongNetwork("node is on 'main', adapter configured for 'regtest'")

    tip = unspent = estimate_fee = broadcast = tx_status = _closed


def test_reconciliation_over_the_api_with_a_closed_gate_answers_a_code_not_a_500(database_url):
    with own_database(database_url, "r12c_gate_api") as eng:
        settings = Settings(environment="test")
        c = Container(settings=settings, engine=eng, ledger=Ledger(eng)).with_chains(
            {"bitcoin": ClosedGate()}, signer_keys=KEYS, approvers=registry())
        c.wallets.configure_asset("BTC", 8, "bitcoin", finality=3, dust_minimum=1_000, min_withdrawal=10_000,
                                  withdrawal_fee=5_000)
        for tier in ("deposit", "hot"):
            c.wallets.register_wallet("bitcoin", tier, "regtest", KEYS.account_xpub("bitcoin", tier))
        client = TestClient(create_app(c), raise_server_exceptions=False)
        client.headers["X-API-Key"] = create_api_key(eng, "r12c-operator", Role.operator, settings.api_key_pepper)
        r = client.post("/v1/reconciliation")
        c.ledger.assert_verified()
    assert r.status_code != 500, r.text
    assert_equal(r.status_code, 503)
