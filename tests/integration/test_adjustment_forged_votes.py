"""A forged approval never makes the worker post a treasury adjustment (review 16, R1).

The api process's database role writes proposals, votes and their states, so a compromised api can
store any vote and mark any adjustment `approved`. What it cannot make is a signature: the worker's
`adjustments` job (run here as custody_worker, tests/integration/adjustment_helpers.py) verifies
every stored vote again over the payload it rebuilds from the row, against its own approver keys,
and counts only live keys of the voters themselves, never the proposer's. Each forgery below is
written as custody_api (`SET LOCAL ROLE`), marked approved, and the job leaves the books alone and
sends the adjustment back to `proposed`: a bad signature, a key no one configured, a real
signature over another adjustment, the proposer's own signature, the legs rewritten under a real
signature (by the owner: the api role may not change them), and a console key revoked after it
approved. A real approval over the API is posted by the same job (the control).
"""
from __future__ import annotations

import base64
import logging
import uuid

import pytest
from sqlalchemy import text

from custody.container import Container
from custody.settings import Settings
from ledger.service import Ledger
from regtest.util import assert_equal
from tests.approvers import ADJUSTMENTS, approve_over_api, key_id, sign_approval, signature_json
from tests.integration.adjustment_helpers import run_adjustments_job
from tests.integration.console_helpers import Console
from tests.integration.test_money_boundaries import Api, firm, propose

log = logging.getLogger(__name__)


@pytest.fixture()
def world(engine, ledger):
    """An Api whose approvers are ann, ben, cat (Ed25519 test keys) and anna's console key."""
    enrolling = Console(Container(settings=Settings(environment="test"), engine=engine, ledger=Ledger(engine)))
    _, passkey, session = enrolling.person("adj-anna", "operator")
    entry = enrolling.admin_key.get(f"/console/api/credentials/{session['credential_id']}/approver-entry")
    assert entry.status_code == 200, entry.text
    api = Api(engine, extra_approvers=(entry.json()["entry"],))
    api("admin", "POST", "/v1/assets", 201, json={"code": "BTC", "decimals": 8})
    return api, enrolling, passkey, session


def proposal(api: Api, alice: int) -> dict:
    """ann proposes 0.001 BTC from equity to alice (the same content each time, its own key)."""
    return propose(api, "ann", uuid.uuid4().hex, [(firm(api, "equity:BTC"), alice, "0.001")], reason="goodwill")


def payload(api: Api, adjustment_id: int) -> bytes:
    answer = api("auditor", "GET", f"/v1/treasury/adjustments/{adjustment_id}/approval-payload", 200)
    return base64.b64decode(answer["payload_base64"])


def forge_vote(api: Api, adjustment_id: int, operator: str, key: str, signature: bytes) -> None:
    """What a compromised api can write: a vote with any bytes as its signature, and the state."""
    with api.container.engine.begin() as c:
        c.execute(text("SET LOCAL ROLE custody_api"))
        c.execute(text("INSERT INTO treasury_adjustment_vote (adjustment_id, operator, decision, comment, key_id, scheme, "
                       "signature) VALUES (:a, :o, 'approve', 'forged', :k, 'ed25519', :s)"),
                  {"a": adjustment_id, "o": operator, "k": key, "s": signature})
        c.execute(text("UPDATE treasury_adjustment SET state = 'approved', updated_at = now() WHERE id = :a"),
                  {"a": adjustment_id})


def state(api: Api, adjustment_id: int) -> str:
    return api("auditor", "GET", f"/v1/treasury/adjustments/{adjustment_id}", 200)["state"]


def test_forged_votes_never_make_the_worker_post(world, ledger):
    api, _, _, _ = world
    alice = api.customer("alice")
    ben, mallory = f"api:{api.names['ben']}", "api:mallory"
    forgeries = {}

    log.info("a bad signature under ben's configured key")
    a = proposal(api, alice)
    forge_vote(api, a["id"], ben, key_id(api.names["ben"]), bytes(64))
    forgeries["bad signature"] = a["id"]

    log.info("a valid signature by a key nobody configured")
    a = proposal(api, alice)
    forge_vote(api, a["id"], mallory, key_id("mallory"), sign_approval(payload(api, a["id"]), "mallory").signature)
    forgeries["unknown key"] = a["id"]

    log.info("ben's real signature over another adjustment of the same content, copied")
    a, other = proposal(api, alice), proposal(api, alice)
    forge_vote(api, a["id"], ben, key_id(api.names["ben"]), sign_approval(payload(api, other["id"]), api.names["ben"]).signature)
    forgeries["signature over another adjustment"] = a["id"]

    log.info("the proposer's own real signature")
    a = proposal(api, alice)
    forge_vote(api, a["id"], "api:someone", key_id(api.names["ann"]),
               sign_approval(payload(api, a["id"]), api.names["ann"]).signature)
    forgeries["the proposer's own key under another name"] = a["id"]

    log.info("ben's real signature, then the legs rewritten to pay mallory (as the owner: the api role may not)")
    a = proposal(api, alice)
    mallory_account = api.customer("mallory")
    approved = api.approve("ben", a["id"], 200)
    assert_equal(approved["state"], "approved")
    with api.container.engine.begin() as c:
        c.execute(text("UPDATE treasury_adjustment SET transfers = jsonb_set(transfers, '{0,credit_account_id}', "
                       "to_jsonb(CAST(:m AS bigint))) WHERE id = :a"), {"a": a["id"], "m": mallory_account})
    forgeries["legs rewritten after the approval"] = a["id"]

    assert_equal(run_adjustments_job(api.container), [])
    assert_equal({what: state(api, i) for what, i in forgeries.items()}, {what: "proposed" for what in forgeries})
    assert_equal((ledger.balance(alice).posted, ledger.balance(mallory_account).posted), (0, 0))

    log.info("the control: ben approves one over the API and the same job posts it")
    a = proposal(api, alice)
    api.approve("ben", a["id"], 200)
    assert_equal(run_adjustments_job(api.container), [a["id"]])
    assert_equal((state(api, a["id"]), ledger.balance(alice).posted), ("posted", 100_000))


def test_a_console_key_revoked_after_it_approved_no_longer_counts(world, ledger):
    api, enrolling, passkey, session = world
    alice = api.customer("alice")
    console = Console(api.container)  # a client of this Api's app, signed in as anna
    client = console.client()
    signed_in = console.sign_in(client, session["username"], passkey)
    assert signed_in.status_code == 200, signed_in.text
    a = proposal(api, alice)
    shown = payload(api, a["id"])
    r = client.post(f"{ADJUSTMENTS}/{a['id']}/approve", headers={"X-CSRF-Token": signed_in.json()["csrf_token"]},
                    json={"comment": "checked in the console", "signature": signature_json(passkey.approval(shown))})
    assert_equal((r.status_code, r.json()["state"]), (200, "approved"))

    log.info("an admin revokes anna's credential before the worker's run: her approval counts no more")
    revoked = enrolling.admin_key.post(f"/console/api/credentials/{session['credential_id']}/revoke")
    assert_equal(revoked.status_code, 200)
    assert_equal(run_adjustments_job(api.container), [])
    assert_equal((state(api, a["id"]), ledger.balance(alice).posted), ("proposed", 0))

    log.info("another operator approves: it is posted")
    assert_equal(api.approve("ben", a["id"], 200)["state"], "approved")
    assert_equal(run_adjustments_job(api.container), [a["id"]])
    assert_equal(ledger.balance(alice).posted, 100_000)


def test_the_door_counts_only_what_the_worker_would(engine, ledger):
    """A forged vote written underneath does not complete a quorum at the door either: with quorum
    2, ben's real approval after a forged one leaves the adjustment proposed."""
    api2 = Api(engine, quorum=2)
    api2("admin", "POST", "/v1/assets", 201, json={"code": "BTC", "decimals": 8})
    alice = api2.customer("alice")
    a = propose(api2, "ann", uuid.uuid4().hex, [(firm(api2, "equity:BTC"), alice, "0.001")], reason="goodwill")
    with api2.container.engine.begin() as c:
        c.execute(text("SET LOCAL ROLE custody_api"))
        c.execute(text("INSERT INTO treasury_adjustment_vote (adjustment_id, operator, decision, comment, key_id, scheme, "
                       "signature) VALUES (:a, :o, 'approve', 'forged', :k, 'ed25519', :s)"),
                  {"a": a["id"], "o": f"api:{api2.names['cat']}", "k": key_id(api2.names["cat"]), "s": bytes(64)})
    assert_equal(api2.approve("ben", a["id"], 200)["state"], "proposed")
    assert_equal(run_adjustments_job(api2.container), [])
    assert_equal(ledger.balance(alice).posted, 0)
