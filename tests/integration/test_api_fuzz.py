"""Fuzzing the whole HTTP API: no input, from any caller, is answered with a server error.

schemathesis reads the app's own OpenAPI document, so every operation the app has is fuzzed (there
is no route list here: a route added on any branch is covered the day it is merged). For every
caller (each API role's key, and no key at all) and every operation it generates requests that fit the schema (positive: strings with NUL and other odd
characters, ids, amounts, nested metadata) and requests that break it (negative: wrong types, out
of range numbers, missing or extra fields), sends them through the ASGI app and records each answer
of 500 or more. The test fails listing each one with a curl command that reproduces it.

The service runs on a database of its own, since the fuzzer's admin and operator create assets and
markets, close accounts and engage the kill switch. It is seeded first (an asset pair, customer
accounts with balances, a market, a hold, a deposit address) so small fuzzed ids hit real rows.
There are no chain adapters: routes that need them answer `chains_not_configured`.

Allowed at or above 500: only 503s that describe the service's state, never a failure:
`chains_not_configured` (this service has no chain adapters) and `withdrawals_halted` (the kill
switch, which the fuzzing operator may have engaged). Nothing else, and never a 500. The same
fuzzer runs against the service with both regtest chains and a signer attached in
`tests/e2e/custody/test_api_fuzz_chains.py`, where it lifts the kill switch before every request
and allows no 5xx at all.

Deterministic: hypothesis is derandomized, so every run sends the same requests. `FUZZ_EXAMPLES`
(default 8) sets the examples per operation, caller and mode; raise it locally for a longer hunt,
e.g. `FUZZ_EXAMPLES=200 scripts/test -m fuzz --timeout=0`. `-m "not fuzz"` deselects it. With
`-o log_cli=true -o log_cli_level=INFO` each operation logs the statuses it answered.
"""
from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core.failures import FailureGroup

from custody.api.app import create_app
from custody.api.params import MAX_ID
from custody.auth import Role, create_api_key
from custody.container import Container
from custody.settings import Settings
from custody.trading import attach
from ledger.model import AccountKind
from ledger.service import Ledger
from matching.fees import FeeSchedule, FeeTier
from matching.model import Market
from matching.stp import StpPolicy
from signer.keys import Secret, SignerKeys, seed_from_text
from tests.integration.own_database import own_database

pytestmark = pytest.mark.fuzz
log = logging.getLogger(__name__)

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "8"))
CALLERS = [None, *Role]  # no key, then every role the service knows
SERVICE_STATE_503 = {"chains_not_configured", "withdrawals_halted"}


@pytest.fixture(scope="module")
def service(database_url):
    """The API on a fresh, seeded database of its own; dropped afterwards."""
    with own_database(database_url, "custody_fuzz") as engine:
        config = Settings(environment="test")
        container = Container(settings=config, engine=engine, ledger=Ledger(engine)).with_chains({})
        seed(container)
        keys = {role: create_api_key(engine, f"fuzz-{role.value}", role, config.api_key_pepper) for role in Role}
        yield create_app(container), keys, container
        container.ledger.assert_verified()


def seed(container: Container) -> None:
    """Real rows with small ids: assets, funded customer accounts, a market, a hold, an address."""
    ledger, wallets = container.ledger, container.wallets
    keys = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
    wallets.register_wallet("bitcoin", "deposit", "regtest", keys.account_xpub("bitcoin", "deposit"))
    wallets.register_wallet("bitcoin", "hot", "regtest", keys.account_xpub("bitcoin", "hot"))
    wallets.configure_asset("BTC", 8, "bitcoin", finality=3, min_withdrawal=10_000, withdrawal_fee=5_000)
    ledger.create_asset("USDT", 6)
    for owner, asset, amount in (("alice", "BTC", 5 * 10**8), ("bob", "USDT", 100_000 * 10**6)):
        equity = ledger.open_account(asset, AccountKind.equity, f"fuzz:equity:{asset}")
        account = wallets.customer_account(owner, asset)
        ledger.transfer(f"fuzz:fund:{owner}", equity.id, account, amount)
    alice = wallets.customer_account("alice", "BTC")
    ledger.place_hold("fuzz:hold", alice, 10**6, owner="api:fuzz-backend", reference="fuzz")
    wallets.issue_address("fuzz:address", alice)
    trading = container.trading or attach(container)
    trading.create_market(Market("BTC-USDT", "BTC", "USDT", 10_000, 1, 0),
                          FeeSchedule({"default": FeeTier(1_000, 2_000)}), StpPolicy.cancel_newest)


def served_schema(app):
    """The OpenAPI document exactly as the app serves it (`GET /openapi.json`), requests sent to the app."""
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def _code(response) -> str | None:
    try:
        return response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def _excused(failure, response, allowed_503: frozenset[str] | set[str]) -> bool:
    """The two findings the checks report that are not contract violations, each for a stated reason:

    - `not_a_server_error` on a 503 whose code describes the service's state (`allowed_503`): the
      answer is documented (status and code are in the document), the service is working as
      configured (no chain adapters; the kill switch engaged by the fuzzing operator).
    - `positive_data_acceptance` on a 422 with a code of a business rule (e.g. `excess_precision`,
      `accounts_must_be_different`, `below_min_notional`, `invalid_destination`): a JSON schema
      cannot state those rules, so schema-valid data may break them. A schema-valid request answered
      `invalid_request` (the code of a malformed request) is still a finding: the schema should
      have said so. One exception, the generator's: it reads the ids' maximum 2^63-1 as a float
      (2^63) and sends integers up to ~1,000 above it as "valid" (e.g. 9223372036854775999); the
      API refuses them as it should, by the documented maximum. And text PostgreSQL cannot store
      (a NUL, a lone surrogate) in any string, refused by `custody.api.text_guard` for every route
      alike (README "Input rules"): JSON Schema has no way to exclude a lone surrogate from every
      string and every object key, so the document states the rule in words, not in each schema."""
    name = type(failure).__name__
    if name == "ServerError":
        return response.status_code == 503 and _code(response) in allowed_503
    if name == "RejectedPositiveData":
        if response.status_code == 422 and f"less than or equal to {MAX_ID}" in response.text:
            return True
        if response.status_code == 422 and "text with a NUL character or a lone surrogate" in response.text:
            return True
        return response.status_code == 422 and _code(response) not in (None, "invalid_request")
    return False


def contract_failures(operation, key: str | None, statuses: Counter, *,
                      allowed_503: frozenset[str] | set[str] = SERVICE_STATE_503,
                      before: Callable[[], None] | None = None) -> list[str]:
    """Fuzz one operation as one caller and run ALL of schemathesis's checks on every answer (server
    errors, status code, content type, response headers and schema conformance, negative data
    rejection, positive data acceptance, missing required header, ignored auth, ...); every failure
    not `_excused`. The X-API-Key header is fixed rather than generated (a made-up key only meets the
    401 path, and made-up header values are mostly unsendable, which wastes the generation budget).
    `before` runs before each request (the chains-attached run lifts the kill switch there)."""
    found: list[str] = []
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

        @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode, headers={"X-API-Key": key or "none"}))
        def send(case) -> None:
            if key is None:
                case.headers.pop("X-API-Key", None)
            if before is not None:
                before()
            response = case.call()
            statuses[response.status_code] += 1
            try:
                case.validate_response(response)
            except FailureGroup as group:
                for failure in group.exceptions:
                    if not _excused(failure, response, allowed_503):
                        found.append(f"{type(failure).__name__}: {failure.title}: {response.status_code} "
                                     f"{response.text[:200]}\n    {str(failure)[:300]}\n    {case.as_curl_command()}")

        try:
            send()
        except Unsatisfiable:  # nothing in this operation can be made invalid (no parameters, no body)
            assert mode is GenerationMode.NEGATIVE
    return found


@pytest.mark.parametrize("caller", CALLERS, ids=lambda r: r.value if r else "no-key")
def test_every_answer_keeps_the_contract(service, caller):
    app, keys, container = service
    schema = served_schema(app)
    failures = []
    operations = [result.ok() for result in schema.get_all_operations()]
    log.info("fuzzing %d operations as %s, %d examples per mode", len(operations), caller or "no key", EXAMPLES)
    for operation in operations:
        statuses: Counter = Counter()
        failures += [f"{operation.label}: {f}" for f in contract_failures(operation, keys[caller] if caller else None,
                                                                           statuses)]
        log.info("%s answered %s", operation.label, dict(sorted(statuses.items())))
    container.ledger.assert_verified()
    assert not failures, f"{len(failures)} contract violations:\n" + "\n".join(failures[:20])
