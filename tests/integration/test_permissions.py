"""The README's permission tables are the truth, and the service obeys them.

- "route | roles": every /v1 route of the app is listed once, and called with every role (and with
  no key) it answers 403 `forbidden` exactly for the roles not listed (admin passes every route but
  those marked "not admin").
  Calls carry an empty body or an id that does not exist, so an admitted caller changes nothing.
- "Who may move money": the table equals `custody.money_rules.PERMITTED`, and every role that can
  reach the ledger's command routes is tried against an account of every kind for each action
  (open, debit, credit, hold on, capture to): what the table admits goes through, the rest is
  `kind_not_permitted` and moves nothing.
"""
from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from custody.api.app import create_app
from custody.auth import Role, create_api_key
from custody.container import Container
from custody.money_rules import PERMITTED, MoneyAction
from custody.settings import Settings
from ledger.model import AccountKind

README = Path(__file__).resolve().parents[2] / "README.md"
ROUTE_ROW = re.compile(r"^\| `(GET|POST|PUT|PATCH|DELETE) (/v1/[^`]*)` \| ([^|]+) \|$")
MONEY_ROW = re.compile(r"^\| (backend|admin|operator|auditor) \| ([^|]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$")
ROLES = list(Role)
MONEY_COLUMNS = (MoneyAction.open, MoneyAction.debit, MoneyAction.credit, MoneyAction.hold)


def readme_routes() -> dict[tuple[str, str], frozenset[Role]]:
    rows: dict[tuple[str, str], frozenset[Role]] = {}
    for line in README.read_text().splitlines():
        m = ROUTE_ROW.match(line.strip())
        if m:
            method, path, roles = m.groups()
            assert (method, path) not in rows, f"{method} {path} is listed twice in the README"
            admitted = {r for r in Role if re.search(rf"\b{r.value}\b", roles)}
            if "not admin" not in roles:
                admitted.add(Role.admin)  # admin passes every route but those marked "not admin"
            else:
                admitted.discard(Role.admin)
            rows[(method, path)] = frozenset(admitted)
    return rows


def readme_money_table() -> dict[Role, dict[MoneyAction, frozenset[AccountKind]]]:
    table = {}
    for line in README.read_text().splitlines():
        m = MONEY_ROW.match(line.strip())
        if m:
            role, *cells = m.groups()
            table[Role(role)] = {
                action: frozenset(k for k in AccountKind if re.search(rf"\b{k.value}\b", cell))
                for action, cell in zip(MONEY_COLUMNS, cells)
            }
    return table


ROUTES = readme_routes()


@pytest.fixture(scope="module")
def api(engine):
    from ledger.service import Ledger

    settings = Settings(environment="test")
    container = Container(settings=settings, engine=engine, ledger=Ledger(engine))
    run = uuid.uuid4().hex[:8]
    keys = {role: create_api_key(engine, f"perm-{role.value}-{run}", role, settings.api_key_pepper) for role in Role}
    app = create_app(container)
    return TestClient(app, raise_server_exceptions=False), keys, app


def call(api, role, method, path, **kw):
    client, keys, _ = api
    headers = {"X-API-Key": keys[role]} if role else {}
    return client.request(method, path, headers=headers, **kw)


def code_of(response) -> str | None:
    try:
        return response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def test_the_readme_lists_every_route_exactly_once(api):
    _, _, app = api
    app_routes = {(method.upper(), path) for path, ops in app.openapi()["paths"].items() if path.startswith("/v1/")
                  for method in ops}
    assert set(ROUTES) == app_routes, (
        f"missing from the README: {sorted(app_routes - set(ROUTES))}; not in the app: {sorted(set(ROUTES) - app_routes)}")


@pytest.mark.parametrize("method, path", sorted(ROUTES), ids=lambda v: v)
def test_every_route_admits_exactly_its_roles(api, ledger, method, path):
    concrete = re.sub(r"\{symbol\}", "NOPE-NONE", re.sub(r"\{[a-z_]*id\}", "987654321", path))
    kw = {"json": {}} if method in ("POST", "PUT", "PATCH") else {}
    anonymous = call(api, None, method, concrete, **kw)
    assert anonymous.status_code == 401 and code_of(anonymous) == "unauthorized", anonymous.text
    for role in ROLES:
        r = call(api, role, method, concrete, **kw)
        admitted = role in ROUTES[(method, path)]
        forbidden = r.status_code == 403 and code_of(r) == "forbidden"
        assert forbidden != admitted, f"{role.value} {method} {path}: {r.status_code} {r.text[:200]}"
        assert r.status_code < 500 or code_of(r) == "chains_not_configured", (  # no chains in this app
            f"{role.value} {method} {path}: {r.status_code} {r.text[:200]}")


def test_the_money_table_is_the_code():
    assert readme_money_table() == PERMITTED


# ---- every role x every account kind ----------------------------------------------------------

@pytest.fixture(scope="module")
def kinds(api, engine):
    """One BTC account of every kind (firm kinds opened as the service opens them), and a funded
    customer account to move money from."""
    from ledger.service import Ledger

    ledger = Ledger(engine)
    ledger.create_asset("BTC", 8)
    run = uuid.uuid4().hex[:8]
    accounts = {kind: ledger.open_account("BTC", kind, f"perm:{run}:{kind.value}").id
                for kind in AccountKind if kind is not AccountKind.customer}
    accounts[AccountKind.customer] = ledger.open_account(
        "BTC", AccountKind.customer, f"customer:{run}-target:BTC", owner=f"{run}-target").id
    source = ledger.open_account("BTC", AccountKind.customer, f"customer:{run}-source:BTC", owner=f"{run}-source").id
    ledger.transfer(f"perm:{run}:fund-source", accounts[AccountKind.equity], source, 10**9, kind="test_funding")
    ledger.transfer(f"perm:{run}:fund-target", accounts[AccountKind.equity], accounts[AccountKind.customer], 10**9,
                    kind="test_funding")
    return accounts, source, run


MONEY_ROLES = [Role.backend, Role.admin]  # operators and auditors never reach these routes (above)


def _balances(ledger, accounts, source):
    return {a: ledger.balance(a) for a in (*accounts.values(), source)}


@pytest.mark.parametrize("role", MONEY_ROLES, ids=lambda r: r.value)
@pytest.mark.parametrize("kind", list(AccountKind), ids=lambda k: k.value)
def test_open_an_account_of_each_kind(api, ledger, role, kind):
    owner = f"{uuid.uuid4().hex[:8]}-{role.value}"
    name = f"customer:{owner}:BTC" if kind is AccountKind.customer else f"{kind.value}:{owner}:BTC"
    ledger.create_asset("BTC", 8)
    r = call(api, role, "POST", "/v1/accounts", json={"asset": "BTC", "kind": kind.value, "name": name, "owner": owner})
    if kind in PERMITTED[role][MoneyAction.open]:
        assert r.status_code == 201, r.text
    else:
        assert (r.status_code, code_of(r)) == (403, "kind_not_permitted"), r.text


@pytest.mark.parametrize("role", MONEY_ROLES, ids=lambda r: r.value)
@pytest.mark.parametrize("kind", list(AccountKind), ids=lambda k: k.value)
def test_debit_credit_hold_and_capture_on_each_kind(api, ledger, kinds, role, kind):
    accounts, source, run = kinds
    target = accounts[kind]
    key = f"{run}:{role.value}:{kind.value}"
    before = _balances(ledger, accounts, source)
    delta = 0  # what the target's posted balance should have moved by, in satoshi

    debit = call(api, role, "POST", "/v1/transactions", json={
        "idempotency_key": f"{key}:debit", "transfers": [{"debit_account_id": target, "credit_account_id": source, "amount": "0.00000001"}]})
    if kind in PERMITTED[role][MoneyAction.debit]:
        assert debit.status_code == 201, debit.text
        delta -= 1
    else:
        assert (debit.status_code, code_of(debit)) == (403, "kind_not_permitted"), debit.text

    credit = call(api, role, "POST", "/v1/transactions", json={
        "idempotency_key": f"{key}:credit", "transfers": [{"debit_account_id": source, "credit_account_id": target, "amount": "0.00000002"}]})
    if kind in PERMITTED[role][MoneyAction.credit]:
        assert credit.status_code == 201, credit.text
        delta += 2
    else:
        assert (credit.status_code, code_of(credit)) == (403, "kind_not_permitted"), credit.text

    hold = call(api, role, "POST", "/v1/holds", json={
        "idempotency_key": f"{key}:hold", "account_id": target, "amount": "0.00000003", "reference": "perm"})
    if kind in PERMITTED[role][MoneyAction.hold]:
        assert hold.status_code == 201, hold.text
        release = call(api, role, "POST", f"/v1/holds/{hold.json()['id']}/release")
        assert release.status_code == 200 and release.json()["state"] == "released", release.text
    else:
        assert (hold.status_code, code_of(hold)) == (403, "kind_not_permitted"), hold.text

    source_hold = call(api, role, "POST", "/v1/holds", json={
        "idempotency_key": f"{key}:source-hold", "account_id": source, "amount": "0.00000004", "reference": "perm"})
    assert source_hold.status_code == 201, source_hold.text
    capture = call(api, role, "POST", f"/v1/holds/{source_hold.json()['id']}/capture", json={
        "idempotency_key": f"{key}:capture", "final": True, "transfers": [{"credit_account_id": target, "amount": "0.00000004"}]})
    if kind in PERMITTED[role][MoneyAction.credit]:
        assert capture.status_code == 201, capture.text
        delta += 4
    else:
        assert (capture.status_code, code_of(capture)) == (403, "kind_not_permitted"), capture.text
        call(api, role, "POST", f"/v1/holds/{source_hold.json()['id']}/release")

    after = _balances(ledger, accounts, source)
    assert after[target].posted - before[target].posted == delta
    assert after[source].posted - before[source].posted == -delta
    assert after[target].held == before[target].held and after[source].held == before[source].held
    others = set(after) - {target, source}
    assert {a: after[a].posted for a in others} == {a: before[a].posted for a in others}
