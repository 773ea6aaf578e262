"""Regressions for issue 11's observations 1, 2, 5 and 9, through the HTTP API as an attacker
would use it, and the treasury adjustment (maker-checker) that replaces raw firm postings.

Each of these succeeded before the permission model (`custody.money_rules`): a backend key opened
an equity account and minted customer money from it, posted from firm accounts, squatted a firm
account's name, posted under a subsystem's idempotency key, held the in-flight account; an admin
reversed a subsystem's transaction; an auditor ran reconciliation and published reserves.
"""
from __future__ import annotations

import json
import logging
import uuid

import pytest
from fastapi.testclient import TestClient

from custody.api.app import create_app
from custody.auth import create_api_key
from custody.container import Container
from custody.settings import Settings
from custody.wallets import Wallets
from ledger.errors import LedgerError
from ledger.model import AccountKind
from ledger.service import Ledger
from tests.approvers import ADJUSTMENTS, approve_over_api, registry, sign_approval, signature_json
from tests.integration.adjustment_helpers import run_adjustments_job

log = logging.getLogger(__name__)


class Api:
    """A TestClient with one key per actor: backend, admin, auditor, and operators ann, ben, cat,
    each operator also an approver (tests/approvers.py's test key of their API key name)."""

    def __init__(self, engine, *, quorum: int = 1, extra_approvers: tuple[dict, ...] = ()) -> None:
        settings = Settings(environment="test", treasury_adjustment_quorum=quorum)
        self.run = uuid.uuid4().hex[:8]
        actors = {"backend": "backend", "admin": "admin", "auditor": "auditor",
                  "ann": "operator", "ben": "operator", "cat": "operator"}
        self.names = {actor: f"{actor}-{self.run}" for actor in actors}
        self.container = Container(settings=settings, engine=engine, ledger=Ledger(engine),
                                   approvers=registry(*(self.names[o] for o in ("ann", "ben", "cat")), extra=extra_approvers))
        self.keys = {actor: create_api_key(engine, self.names[actor], role, settings.api_key_pepper)
                     for actor, role in actors.items()}
        self.client = TestClient(create_app(self.container), raise_server_exceptions=False)

    def __call__(self, actor: str, method: str, path: str, status: int | None = None, code: str | None = None, **kw):
        r = self.client.request(method, path, headers={"X-API-Key": self.keys[actor]}, **kw)
        if status is not None:
            assert r.status_code == status, f"{method} {path}: {r.status_code} {r.text}"
        if code is not None:
            assert r.json()["error"]["code"] == code, r.text
        return r.json()

    def approve(self, actor: str, adjustment_id: int, status: int, code: str | None = None, *, as_key: str | None = None,
                comment: str = "checked") -> dict:
        """`actor` signs adjustment `adjustment_id`'s approval payload with their test key (or
        `as_key`'s: a forgery) and sends it."""
        r = approve_over_api(self.client, adjustment_id, as_key or self.names[actor], comment, resource=ADJUSTMENTS,
                             headers={"X-API-Key": self.keys[actor]})
        assert r.status_code == status, r.text
        if code is not None:
            assert r.json()["error"]["code"] == code, r.text
        return r.json()

    def customer(self, who: str, asset: str = "BTC") -> int:
        owner = f"{who}-{self.run}"
        return self("backend", "POST", "/v1/accounts", 201,
                    json={"asset": asset, "kind": "customer", "name": f"customer:{owner}:{asset}", "owner": owner})["id"]


@pytest.fixture()
def api(engine, ledger):
    api = Api(engine)
    api("admin", "POST", "/v1/assets", 201, json={"code": "BTC", "decimals": 8})
    return api


def firm(api: Api, name: str) -> int:
    return next(a["id"] for a in api("backend", "GET", "/v1/firm-accounts", 200, params={"asset": "BTC"})
                if a["name"] == name)


def credit_deposit(api: Api, ledger: Ledger, account_id: int, sat: int) -> None:
    """What custody's deposit crediting does (a subsystem posting from the deposit location). The
    location is of a chain of this test's own: the real chains' books are reconciled by the e2e
    suites later in the same session."""
    location = api.container.wallets.location_account(f"test{api.run}", "deposit", "BTC")
    ledger.transfer(f"deposit:btc:{uuid.uuid4().hex}:0", location, account_id, sat, kind="deposit")


def test_observation_1_a_backend_key_cannot_mint_customer_money_from_firm_accounts(api, ledger):
    log.info("the backend may not open an account of a firm kind")
    for kind in ("equity", "asset_location", "fee_income", "quarantine", "liquidity"):
        api("backend", "POST", "/v1/accounts", 403, "kind_not_permitted",
            json={"asset": "BTC", "kind": kind, "name": f"customer:x-{api.run}:BTC", "owner": f"x-{api.run}"})
    alice = api.customer("alice")
    log.info("nor post from any firm account into a customer account; nothing moves")
    sources = {name: firm(api, name) for name in ("equity:BTC", "quarantine:BTC", "fees:BTC", "suspense:BTC")}
    sources["location:<chain>:hot:BTC"] = api.container.wallets.location_account(f"test{api.run}", "hot", "BTC")
    for name, source in sources.items():
        api("backend", "POST", "/v1/transactions", 403, "kind_not_permitted", json={
            "idempotency_key": f"mint-from-{name}", "kind": "treasury_credit",
            "transfers": [{"debit_account_id": source, "credit_account_id": alice, "amount": "1"}]})
    assert ledger.balance(alice).posted == 0
    log.info("an admin key is bound by the same money rules")
    api("admin", "POST", "/v1/transactions", 403, "kind_not_permitted", json={
        "idempotency_key": "admin-mint", "transfers": [{"debit_account_id": sources["equity:BTC"],
                                                        "credit_account_id": alice, "amount": "1"}]})
    assert ledger.balance(alice).posted == 0


def test_observation_2_a_backend_key_cannot_squat_names_keys_or_firm_holds(api, ledger):
    log.info("a customer account may not take a firm account's name (nor any name outside customer:<owner>:)")
    api("backend", "POST", "/v1/accounts", 422, "account_name_reserved",
        json={"asset": "BTC", "kind": "customer", "name": "suspense:BTC", "owner": f"x-{api.run}"})
    api("backend", "POST", "/v1/accounts", 422, "account_name_reserved",
        json={"asset": "BTC", "kind": "customer", "name": f"customer:y-{api.run}:BTC", "owner": f"x-{api.run}"})
    log.info("and the database refuses a firm account named in the customer namespace, whoever asks")
    from sqlalchemy.exc import IntegrityError

    with pytest.raises(IntegrityError):
        ledger.open_account("BTC", AccountKind.suspense, f"customer:{api.run}:suspense")
    suspense = Wallets(api.container.engine, ledger).firm_account("suspense", "BTC")
    assert ledger.get_account(suspense).kind is AccountKind.suspense

    log.info("a key a subsystem uses, sent by the backend, lands in the backend's own namespace")
    alice, bob = api.customer("alice"), api.customer("bob")
    credit_deposit(api, ledger, alice, 1_000)
    batch_key = f"batch:{api.run}:capture"
    api("backend", "POST", "/v1/transactions", 201, json={
        "idempotency_key": batch_key, "transfers": [{"debit_account_id": alice, "credit_account_id": bob, "amount": "0.00000100"}]})
    in_flight = api.container.wallets.firm_account("in_flight", "BTC")
    custody_capture = ledger.transfer(batch_key, alice, in_flight, 200, kind="capture")
    assert custody_capture.created, "the subsystem's key was still free"
    statement = api("backend", "GET", f"/v1/accounts/{bob}/statement", 200)
    assert [line["idempotency_key"] for line in statement["lines"]] == [f"api:{api.names['backend']}:{batch_key}"]

    log.info("nor may an admin close a firm account under custody (its bookings would stop)")
    api("admin", "POST", f"/v1/accounts/{in_flight}/close", 403, "kind_not_permitted")
    assert not ledger.get_account(in_flight).closed
    log.info("no hold on a firm account (a hold on in-flight blocked custody's final booking)")
    api("backend", "POST", "/v1/holds", 403, "kind_not_permitted", json={
        "idempotency_key": "freeze-in-flight", "account_id": in_flight, "amount": "0.00000001", "reference": "x"})
    assert ledger.balance(in_flight).held == 0


def test_observation_5_subsystem_transactions_are_not_reversible_over_the_api(api, ledger):
    alice, bob = api.customer("alice"), api.customer("bob")
    credit_deposit(api, ledger, alice, 10_000)
    in_flight = api.container.wallets.firm_account("in_flight", "BTC")
    capture = ledger.transfer(f"batch:{api.run}:capture", alice, in_flight, 4_000, kind="capture")
    log.info("an admin may not reverse a withdrawal's capture (the coins may already be on chain)")
    api("admin", "POST", f"/v1/transactions/{capture.transaction_id}/reverse", 409, "transaction_not_reversible",
        json={"idempotency_key": "undo-capture"})
    assert ledger.balance(alice).posted == 6_000
    log.info("nor a transfer into fee income (its reversal would debit a firm account)")
    fees = firm(api, "fees:BTC")
    fee = api("backend", "POST", "/v1/transactions", 201, json={
        "idempotency_key": "fee-1", "transfers": [{"debit_account_id": alice, "credit_account_id": fees, "amount": "0.00000010"}]})
    api("admin", "POST", f"/v1/transactions/{fee['transaction_id']}/reverse", 409, "transaction_not_reversible",
        json={"idempotency_key": "undo-fee"})
    log.info("a customer-to-customer transfer written over the API may be reversed, once")
    t = api("backend", "POST", "/v1/transactions", 201, json={
        "idempotency_key": "t-1", "transfers": [{"debit_account_id": alice, "credit_account_id": bob, "amount": "0.00000100"}]})
    api("admin", "POST", f"/v1/transactions/{t['transaction_id']}/reverse", 201, json={"idempotency_key": "undo-t-1"})
    api("admin", "POST", f"/v1/transactions/{t['transaction_id']}/reverse", 200, json={"idempotency_key": "undo-t-1"})
    assert (ledger.balance(alice).posted, ledger.balance(bob).posted) == (6_000 - 10, 0)


def test_observation_9_an_auditor_only_reads(api, ledger):
    api("auditor", "POST", "/v1/reconciliation", 403, "forbidden")
    api("auditor", "POST", "/v1/reserves/reports", 403, "forbidden")
    api("auditor", "POST", "/v1/treasury/adjustments", 403, "forbidden", json={})
    api("auditor", "GET", "/v1/treasury/adjustments", 200)


# ---- treasury adjustments --------------------------------------------------------------------

def propose(api: Api, actor: str, key: str, legs: list[tuple[int, int, str]], reason: str = "goodwill", **kw):
    return api(actor, "POST", "/v1/treasury/adjustments", kw.pop("status", 201), kw.pop("code", None), json={
        "idempotency_key": key, "reason": reason,
        "transfers": [{"debit_account_id": d, "credit_account_id": c, "amount": a} for d, c, a in legs], **kw})


def test_a_treasury_adjustment_needs_another_operator_and_posts_exactly_what_was_proposed(api, ledger):
    alice = api.customer("alice")
    equity = firm(api, "equity:BTC")
    log.info("ann proposes a goodwill credit from equity: nothing moves yet")
    a = propose(api, "ann", "goodwill-1", [(equity, alice, "0.001")], reason="compensation for ticket 42")
    assert (a["state"], a["quorum"], a["approved_by"]) == ("proposed", 1, [])
    assert propose(api, "ann", "goodwill-1", [(equity, alice, "0.001")], reason="compensation for ticket 42",
                   status=200)["id"] == a["id"]
    propose(api, "ann", "goodwill-1", [(equity, alice, "0.002")], status=409, code="idempotency_conflict")
    assert ledger.balance(alice).posted == 0
    log.info("ann may not approve her own proposal; the backend may not approve at all")
    api.approve("ann", a["id"], 403, "proposer_cannot_approve")
    api("backend", "POST", f"/v1/treasury/adjustments/{a['id']}/approve", 403, "forbidden", json={"comment": "ok"})
    log.info("an approval is a signature: none, another operator's key, or a signature over something else is refused")
    api("ben", "POST", f"/v1/treasury/adjustments/{a['id']}/approve", 422, "approval_signature_required",
        json={"comment": "ok"})
    api.approve("ben", a["id"], 403, "approver_not_caller", as_key=api.names["cat"])
    wrong = signature_json(sign_approval(b"{}", api.names["ben"]))
    api("ben", "POST", f"/v1/treasury/adjustments/{a['id']}/approve", 403, "approval_signature_invalid",
        json={"comment": "ok", "signature": wrong})
    log.info("ben signs the payload (id, legs, reason, quorum, proposer): approved, not posted yet")
    payload = api("auditor", "GET", f"/v1/treasury/adjustments/{a['id']}/approval-payload", 200)
    assert json.loads(payload["payload"]) == {
        "v": 1, "kind": "adjustment-approval", "adjustment_id": a["id"], "quorum": 1, "proposed_by": f"api:{api.names['ann']}",
        "reason": "compensation for ticket 42",
        "legs": [{"debit_account_id": equity, "credit_account_id": alice, "amount": "100000"}]}
    done = api.approve("ben", a["id"], 200, comment="checked ticket 42")
    assert (done["state"], done["approved_by"], done["transaction_id"]) == ("approved", [f"api:{api.names['ben']}"], None)
    assert ledger.balance(alice).posted == 0
    api.approve("cat", a["id"], 409, "invalid_state")
    log.info("the worker verifies ben's signature again and posts it under treasury-adjustment:<id>")
    assert run_adjustments_job(api.container) == [a["id"]]
    done = api("auditor", "GET", f"/v1/treasury/adjustments/{a['id']}", 200)
    assert done["state"] == "posted"
    assert ledger.balance(alice).posted == 100_000
    assert ledger.transaction_key(done["transaction_id"]) == f"treasury-adjustment:{a['id']}"
    assert run_adjustments_job(api.container) == []
    api.approve("cat", a["id"], 409, "invalid_state")
    api("cat", "POST", f"/v1/treasury/adjustments/{a['id']}/reject", 409, "invalid_state", json={"comment": "late"})
    assert ledger.balance(alice).posted == 100_000


def test_an_adjustment_the_ledger_refuses_records_nothing_and_a_rejection_ends_it(engine, ledger):
    api = Api(engine, quorum=2)
    api("admin", "POST", "/v1/assets", 201, json={"code": "BTC", "decimals": 8})
    alice = api.customer("alice")
    fees = firm(api, "fees:BTC")
    log.info("fee income may not go negative: the approval completing the quorum fails and records nothing")
    a = propose(api, "ann", "refund-fees", [(fees, alice, "1")], reason="refund")
    assert api.approve("ben", a["id"], 200, comment="one of two")["state"] == "proposed"
    api.approve("cat", a["id"], 409, "insufficient_funds", comment="two")
    again = api("auditor", "GET", f"/v1/treasury/adjustments/{a['id']}", 200)
    assert (again["state"], len(again["approved_by"])) == ("proposed", 1)
    log.info("one rejection ends it; a second vote by the same operator is refused")
    api.approve("ben", a["id"], 409, "already_acted", comment="again")
    assert api("cat", "POST", f"/v1/treasury/adjustments/{a['id']}/reject", 200, json={"comment": "no"})["state"] == "rejected"
    assert run_adjustments_job(api.container) == []
    assert ledger.balance(alice).posted == 0


def test_an_approved_adjustment_may_be_rejected_before_the_worker_posts_it(api, ledger):
    alice = api.customer("alice")
    a = propose(api, "ann", "withdrawn", [(firm(api, "equity:BTC"), alice, "1")], reason="bonus")
    assert api.approve("ben", a["id"], 200)["state"] == "approved"
    assert api("ann", "POST", f"/v1/treasury/adjustments/{a['id']}/reject", 200, json={"comment": "withdrawn"})["state"] == "rejected"
    assert run_adjustments_job(api.container) == []
    assert ledger.balance(alice).posted == 0


def test_an_adjustment_of_on_chain_books_opens_a_critical_incident(api, ledger):
    from custody.controls import kill_switch

    hot = api.container.wallets.location_account(f"test{api.run}", "hot", "BTC")
    suspense = firm(api, "suspense:BTC")
    a = propose(api, "ann", "hot-correction", [(hot, suspense, "0.00000500")], reason="unexplained hot shortfall")
    api.approve("ben", a["id"], 200, comment="matches the node")
    assert run_adjustments_job(api.container) == [a["id"]]
    incidents = api("auditor", "GET", "/v1/incidents", 200)
    assert any(i["kind"] == "treasury_adjustment_on_chain_books" and i["severity"] == "critical" for i in incidents)
    assert kill_switch(api.container.engine).engaged
    api("admin", "POST", "/v1/kill-switch", 200, json={"engaged": False, "reason": "adjustment reviewed"})


def test_deposit_address_keys_are_per_caller_and_order_owners_cannot_reach_into_another_namespace(api, ledger):
    """Two backend keys choosing the same idempotency key for a deposit address each get their own
    address (the second was `idempotency_conflict`: keys were global); an order's owner obeys the
    owner rule, so matching never opens `customer:x:BTC:USDT` for an owner `x:BTC`."""
    from signer.keys import Secret, SignerKeys, seed_from_text

    keys = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
    wallets = api.container.wallets
    wallets.register_wallet("bitcoin", "deposit", "regtest", keys.account_xpub("bitcoin", "deposit"))
    wallets.configure_asset("BTC", 8, "bitcoin", finality=3)
    api.keys["backend2"] = create_api_key(api.container.engine, f"backend2-{api.run}", "backend",
                                          api.container.settings.api_key_pepper)
    alice, bob = api.customer("alice"), api.customer("bob")
    first = api("backend", "POST", "/v1/deposit-addresses", 201, json={"idempotency_key": "addr-1", "account_id": alice})
    second = api("backend2", "POST", "/v1/deposit-addresses", 201, json={"idempotency_key": "addr-1", "account_id": bob})
    assert first["address"] != second["address"] and second["account_id"] == bob
    assert api("backend", "POST", "/v1/deposit-addresses", 200,
               json={"idempotency_key": "addr-1", "account_id": alice})["address"] == first["address"]

    ledger.create_asset("USDT", 6)
    symbol = f"BTC-USDT-{api.run}"
    api("admin", "POST", "/v1/markets", 201, json={"symbol": symbol, "base_asset": "BTC", "quote_asset": "USDT",
                                                    "lot_size": 10_000, "quote_per_tick_lot": 1,
                                                    "fees": {"default": {"maker_ppm": 0, "taker_ppm": 0}}})
    api("backend", "POST", f"/v1/markets/{symbol}/orders", 422, "invalid_request", json={
        "account": f"x{api.run}:BTC", "client_order_id": "c1", "side": "buy", "qty": "0.01", "price": "1"})
    with pytest.raises(LedgerError):
        ledger.account_by_name(f"customer:x{api.run}:BTC:USDT")
