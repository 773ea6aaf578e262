"""Fuzzing the whole HTTP API of the service as deployed: both regtest chains and a signer attached,
so no route answers `chains_not_configured`, and the kill switch lifted before every request, so
none answers `withdrawals_halted`: every operation, every caller (each role and no key), with all of
schemathesis's checks (as in the integration fuzzer), and not one answer of 500 or more is allowed.

It reuses the integration fuzzer (`tests/integration/test_api_fuzz.py`: schemathesis over the
app's own OpenAPI document, derandomized, `FUZZ_EXAMPLES` examples per operation, caller and mode)
on a database of its own, with wallets from a seed of its own (the BIP39 test vector "legal winner
..."), so nothing it does (reconciliation passes, incidents, the kill switch, withdrawals requested)
reaches the session's other suites. Nothing is broadcast: no payout job runs, and the only signing
routes (reserves, rebalances) sign messages or find no coins.

Raw HTTP on purpose (not custody.client): the fuzzer sends malformed bodies, wrong types and
missing fields, which the typed client would refuse before sending; that is the point.
"""
from __future__ import annotations

import logging
from collections import Counter

import pytest

from custody.api.app import create_app
from custody.auth import Role, create_api_key
from custody.container import Container
from custody.controls import set_kill_switch
from custody.devchains import configure_regtest
from custody.settings import Settings
from ledger.service import Ledger
from signer.keys import Secret, SignerKeys, seed_from_text
from tests.integration.own_database import own_database
from tests.integration.test_api_fuzz import CALLERS, contract_failures, served_schema

pytestmark = pytest.mark.fuzz
log = logging.getLogger(__name__)

FUZZ_MNEMONIC = "legal winner thank year wave sausage worth useful legal winner thank yellow"


@pytest.fixture(scope="module")
def service(database_url, btc_adapter, eth_adapter, usdt):
    with own_database(database_url, "custody_fuzz_chains") as engine:
        config = Settings(environment="test")
        keys = SignerKeys(seed_from_text(Secret(FUZZ_MNEMONIC)), "regtest")
        container = Container(settings=config, engine=engine, ledger=Ledger(engine))
        container.with_chains({"bitcoin": btc_adapter, "ethereum": eth_adapter}, signer_keys=keys)
        configure_regtest(container, keys, usdt.address)
        equity = container.wallets.firm_account("equity", "BTC")
        for owner in ("alice", "bob"):
            container.ledger.transfer(f"fuzz:fund:{owner}", equity, container.wallets.customer_account(owner, "BTC"),
                                      10**8, kind="test_funding")
        api_keys = {role: create_api_key(engine, f"fuzzc-{role.value}", role, config.api_key_pepper) for role in Role}
        yield create_app(container), api_keys, container
        container.ledger.assert_verified()


@pytest.mark.parametrize("caller", CALLERS, ids=lambda r: r.value if r else "no-key")
def test_every_answer_of_the_deployed_service_keeps_the_contract(service, caller):
    app, keys, container = service

    def lift_kill_switch() -> None:
        with container.engine.begin() as c:
            set_kill_switch(c, False, "fuzz: every request meets a running service", "test")

    schema = served_schema(app)
    failures = []
    for operation in (result.ok() for result in schema.get_all_operations()):
        statuses: Counter = Counter()
        failures += [f"{operation.label}: {f}" for f in contract_failures(
            operation, keys[caller] if caller else None, statuses, allowed_503=frozenset(), before=lift_kill_switch)]
        log.info("%s answered %s", operation.label, dict(sorted(statuses.items())))
    container.ledger.assert_verified()
    assert not failures, f"{len(failures)} contract violations:\n" + "\n".join(failures[:20])
