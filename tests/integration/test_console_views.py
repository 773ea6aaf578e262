"""console read models (custody/console/views.py) over HTTP with an auditor's session: amounts in
units (the issue's raw `-330002820` reconciliation difference reads `-3.30002820`), a line's
history from the differences passes recorded, balances per chain, tier and asset, the audit trail
searched and paged, the kill switch's backlog, batches with their transactions."""
from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy import text

from custody.container import Container
from custody.controls import audit
from custody.settings import Settings
from custody.wallets import Wallets
from ledger.model import Transfer
from ledger.service import Ledger
from regtest.util import assert_equal
from tests.integration.console_helpers import Console
from tests.integration.own_database import own_database


@pytest.fixture(scope="module")
def world(database_url):
    with own_database(database_url, "console_views") as eng:
        ledger = Ledger(eng)
        wallets = Wallets(eng, ledger)
        wallets.configure_asset("BTC", 8, "bitcoin", finality=3, dust_minimum=1_000, min_withdrawal=10_000, withdrawal_fee=5_000)
        console = Console(Container(settings=Settings(environment="test"), engine=eng, ledger=ledger))
        client, _, _ = console.person("viewer", "auditor")
        yield eng, ledger, wallets, client
        ledger.assert_verified()


def test_reconciliation_lines_and_their_history_are_in_units(world):
    eng, _, _, client = world
    with eng.begin() as c:
        c.execute(text("INSERT INTO reconciliation_line (chain, tier, asset, difference, booked_off_chain, observation_mark, height) "
                       "VALUES ('bitcoin', 'hot', 'BTC', -330002820, 1500, 0, 812)"))
        c.execute(text("INSERT INTO incident (kind, severity, dedupe_key, detail) VALUES ('reconciliation_difference', "
                       "'critical', 'rd-1', CAST(:d AS jsonb))"),
                  {"d": json.dumps({"chain": "bitcoin", "tier": "hot", "asset": "BTC", "difference": -330002820,
                                    "previous_difference": 0, "height": 812})})
    [line] = client.get("/console/api/reconciliation").json()
    assert_equal((line["difference"], line["booked_off_chain"], line["height"]), ("-3.30002820", "0.00001500", 812))
    [h] = line["history"]
    assert_equal((h["difference"], h["previous_difference"], h["severity"], h["resolved_at"]),
                 ("-3.30002820", "0.00000000", "critical", None))


def test_balances_per_chain_tier_and_asset(world):
    _, ledger, wallets, client = world
    hot, equity = wallets.location_account("bitcoin", "hot", "BTC"), wallets.firm_account("equity", "BTC")
    ledger.post(f"test:{uuid.uuid4().hex}", [Transfer(hot, equity, 123_456_789)], kind="treasury_credit")
    rows = {(b["chain"], b["tier"], b["asset"]): b for b in client.get("/console/api/balances").json()}
    assert_equal((rows[("bitcoin", "hot", "BTC")]["posted"], rows[("bitcoin", "hot", "BTC")]["posted_minor"]),
                 ("-1.23456789", "-123456789"))


def test_the_audit_trail_is_searched_and_paged(world):
    eng, _, _, client = world
    marker = uuid.uuid4().hex[:10]
    with eng.begin() as c:
        for n in range(3):
            audit(c, f"api:someone-{marker}", "test.thing", f"thing:{n}", {"comment": f"note {n}"})
        audit(c, "api:other", "test.thing", "thing:x", {"comment": f"mentions {marker}"})
    first = client.get("/console/api/audit", params={"q": marker, "limit": 2}).json()
    assert_equal([e["subject"] for e in first["events"]], ["thing:x", "thing:2"])
    second = client.get("/console/api/audit", params={"q": marker, "limit": 2, "before": first["next_before"]}).json()
    assert_equal(([e["subject"] for e in second["events"]], second["next_before"]), (["thing:1", "thing:0"], None))
    assert_equal(second["events"][0]["comment"], "note 1")
    assert_equal(client.get("/console/api/audit", params={"q": "%"}).json()["events"], [])  # a LIKE wildcard is literal


def test_the_kill_switch_backlog_and_batches(world):
    eng, _, _, client = world
    ks = client.get("/console/api/kill-switch").json()
    assert_equal((ks["engaged"], ks["backlog"]), (False, []))
    with eng.begin() as c:
        batch = c.execute(text("INSERT INTO withdrawal_batch (chain, asset, state, fee_rate) VALUES ('bitcoin', 'BTC', 'open', 1000) "
                               "RETURNING id")).scalar_one()
    [b] = client.get("/console/api/payouts").json()["batches"]
    assert_equal((b["id"], b["state"], b["total"], b["txids"], b["transactions"], b["withdrawals"]),
                 (batch, "open", "0.00000000", [], [], []))


def test_an_operator_acknowledges_an_incident_with_a_note(world):
    eng, _, _, auditor = world
    with eng.begin() as c:
        incident = c.execute(text("INSERT INTO incident (kind, severity, dedupe_key) VALUES ('test_kind', 'warning', :k) RETURNING id"),
                             {"k": uuid.uuid4().hex}).scalar_one()
    console = Console(Container(settings=Settings(environment="test"), engine=eng, ledger=Ledger(eng)))
    client, _, session = console.person("acker", "operator")
    csrf = {"X-CSRF-Token": session["csrf_token"]}
    r = client.post(f"/console/api/incidents/{incident}/ack", json={"note": "looking at it"}, headers=csrf)
    assert_equal((r.status_code, r.json()["acknowledged_by"]), (200, f"api:{session['username']}"))
    r = client.post(f"/console/api/incidents/{incident + 1000}/ack", json={"note": "x"}, headers=csrf)
    assert_equal((r.status_code, r.json()["error"]["code"]), (404, "incident_not_found"))
    [event] = auditor.get("/console/api/audit", params={"q": "incident.acknowledge"}).json()["events"]
    assert_equal((event["subject"], event["comment"]), (f"incident:{incident}", "looking at it"))


def test_quarantined_deposits_in_units_with_their_senders(world):
    from signer.keys import Secret, SignerKeys, seed_from_text

    eng, _, wallets, client = world
    keys = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
    wallets.register_wallet("bitcoin", "deposit", "regtest", keys.account_xpub("bitcoin", "deposit"))
    account = wallets.customer_account(f"q-{uuid.uuid4().hex[:6]}", "BTC")
    address = wallets.issue_address(f"q:{uuid.uuid4().hex}", account)
    with eng.begin() as c:
        deposit = c.execute(text(
            "INSERT INTO deposit_observation (chain, asset, txid, output_index, address, senders, amount, block_hash, "
            "block_height, state, deposit_address_id, account_id, screening) SELECT 'bitcoin', 'BTC', :t, 0, address, "
            "ARRAY['bcrt1qsender'], 12345678, 'h', 5, 'quarantined', id, :a, CAST(:s AS jsonb) FROM deposit_address "
            "WHERE address = :addr RETURNING id"),
            {"t": uuid.uuid4().hex * 2, "a": account, "addr": address.address,
             "s": json.dumps({"verdict": "denylisted sender"})}).scalar_one()
    row = next(d for d in client.get("/console/api/quarantine").json() if d["id"] == deposit)
    assert_equal((row["amount"], row["senders"], row["state"], row["return_withdrawal_id"], row["screening"]),
                 ("0.12345678", ["bcrt1qsender"], "quarantined", None, {"verdict": "denylisted sender"}))
