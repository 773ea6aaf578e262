"""eth_refill_routes: operators approve an ethereum warm -> hot refill over HTTP, the api logged in
as custody_api (migration 0044 gives it INSERT on `eth_rebalance_approval`, nothing more).

`GET /v1/eth-rebalances` lists the rows newest first, paged, with their approvals so far (operator
and auditor). `GET /v1/eth-rebalances/{id}/approval-payload` serves the exact bytes to sign (kind
`rebalance-approval`, chain "ethereum"); a row that is not a refill is `rebalance_not_found`.
`POST /v1/eth-rebalances/{id}/approve` takes an operator's own signature over them: an auditor or
an admin is refused (403 `forbidden`), and so is an approval without a signature, over other bytes,
with another operator's key or by an operator twice, each with its code and writing nothing; two
operators' approvals are stored with the signed bytes; a refill no longer open is `invalid_state`.
There is no operator "requester" to exclude: the worker opens a refill (custody.eth_rebalances).

The refill rows are written directly by the owner, as the worker's decision would (no chain here:
the service's payload and approval methods use only the database and the approver registry; the
e2e test rebalance_ethereum signs and books an approved refill on anvil). Own database."""
from __future__ import annotations

import base64
import json

import pytest
from eth_utils import keccak, to_checksum_address
from fastapi.testclient import TestClient
from sqlalchemy import text

from custody.api.app import create_app
from custody.auth import Role, create_api_key
from custody.container import Container
from custody.eth_rebalances import EthRebalances
from custody.settings import Settings
from custody.wallets import Wallets
from ledger.service import Ledger
from regtest.util import assert_equal
from tests.approvers import registry, sign_approval, signature_json
from tests.integration.own_database import own_database
from tests.integration.test_db_roles import as_role

ETHER = 10**18
HOT = to_checksum_address("0x" + keccak(b"eth-refill-routes: hot")[-20:].hex())
WARM = to_checksum_address("0x" + keccak(b"eth-refill-routes: warm")[-20:].hex())


def insert_row(engine, source: str, destination_tier: str, destination: str, amount: int, quorum: int) -> int:
    with engine.begin() as c:
        return c.execute(text(
            "INSERT INTO eth_rebalance (asset, source_tier, destination_tier, destination, amount, spendable, ceiling, target, "
            "floor, gas_limit, max_fee_wei, priority_fee_wei, state, approvals_required) VALUES ('ETH', :s, :t, :d, :m, "
            "0, 3000000000000000000, 1000000000000000000, 500000000000000000, 21000, 2000000000, 1000000000, 'open', :q) "
            "RETURNING id"), {"s": source, "t": destination_tier, "d": destination, "m": amount, "q": quorum}).scalar_one()


@pytest.fixture(scope="module")
def env(database_url):
    with own_database(database_url, "eth_refill_routes") as owner:
        Wallets(owner, Ledger(owner)).configure_asset("ETH", 18, "ethereum", finality=2)
        out_id = insert_row(owner, "hot", "warm", WARM, 2 * ETHER, 0)  # hot -> warm: no approval, not a refill
        refill_id = insert_row(owner, "warm", "hot", HOT, ETHER, 2)
        api_engine = as_role(owner.url.render_as_string(hide_password=False), "custody_api", login=False)
        settings = Settings(environment="test")
        custody = Container(settings=settings, engine=api_engine, ledger=Ledger(api_engine))
        custody.eth_rebalances = EthRebalances(api_engine, custody.ledger, Wallets(api_engine, custody.ledger), None, None,  # type: ignore[arg-type]
                                               hot_address=HOT, warm_address=WARM,
                                               approvers=registry("op-alice", "op-bob", "op-carol"))
        app = create_app(custody)
        clients = {}
        for name, role in (("op-alice", Role.operator), ("op-bob", Role.operator), ("op-carol", Role.operator),
                           ("auditor-1", Role.auditor), ("admin-1", Role.admin)):
            clients[name] = TestClient(app, raise_server_exceptions=False)
            clients[name].headers["X-API-Key"] = create_api_key(owner, name, role, settings.api_key_pepper)
        yield owner, custody, clients, out_id, refill_id
        api_engine.dispose()


def error(r) -> tuple[int, str | None]:
    return r.status_code, (r.json().get("error") or {}).get("code")


def stored(engine, rebalance_id: int) -> list:
    with engine.connect() as c:
        return c.execute(text("SELECT operator, key_id, signed_payload FROM eth_rebalance_approval WHERE rebalance_id = :r "
                              "ORDER BY id"), {"r": rebalance_id}).all()


def test_the_list_is_paged_newest_first_for_operators_and_auditors(env):
    owner, _, clients, out_id, refill_id = env
    first = clients["auditor-1"].get("/v1/eth-rebalances", params={"limit": 1})
    assert_equal(first.status_code, 200)
    [row] = first.json()
    assert_equal((row["id"], row["source_tier"], row["destination_tier"], row["amount_minor"], row["amount"]),
                 (refill_id, "warm", "hot", str(ETHER), "1.000000000000000000"))
    assert_equal((row["approvals_required"], row["floor_minor"], row["txid"], row["nonce"]), (2, str(ETHER // 2), None, None))
    second = clients["op-alice"].get("/v1/eth-rebalances", params={"limit": 1, "cursor": first.headers["X-Next-Cursor"]})
    assert_equal([r["id"] for r in second.json()], [out_id])
    assert "X-Next-Cursor" not in second.headers
    assert_equal([r["id"] for r in clients["op-bob"].get("/v1/eth-rebalances", params={"state": "final"}).json()], [])
    assert_equal(error(clients["op-alice"].get("/v1/eth-rebalances", params={"cursor": "not-a-cursor"})), (422, "invalid_cursor"))


def test_operators_approve_a_refill_with_their_own_signatures_only(env):
    owner, custody, clients, out_id, refill_id = env
    url = f"/v1/eth-rebalances/{refill_id}"
    got = clients["auditor-1"].get(f"{url}/approval-payload")
    assert_equal(got.status_code, 200)
    body = got.json()
    payload = base64.b64decode(body["payload_base64"])
    assert_equal(payload, body["payload"].encode(), custody.eth_rebalances.refill_payload(refill_id))
    fields = json.loads(payload)
    assert_equal((fields["kind"], fields["chain"], fields["asset"], fields["amount"], fields["destination"]),
                 ("rebalance-approval", "ethereum", "ETH", str(ETHER), HOT))
    assert_equal((body["rebalance_id"], body["amount_minor"], body["destination"]), (refill_id, str(ETHER), HOT))
    assert_equal(error(clients["op-alice"].get(f"/v1/eth-rebalances/{out_id}/approval-payload")), (404, "rebalance_not_found"))
    assert_equal(error(clients["op-alice"].get("/v1/eth-rebalances/987654321/approval-payload")), (404, "rebalance_not_found"))

    def approve(who: str, signature: dict | None, rebalance_id: int = refill_id):
        return clients[who].post(f"/v1/eth-rebalances/{rebalance_id}/approve",
                                 json={"comment": "refill checked", **({"signature": signature} if signature else {})})

    alice = signature_json(sign_approval(payload, "op-alice"))
    other_bytes = payload.replace(str(ETHER).encode(), str(ETHER + 1).encode())
    assert other_bytes != payload
    refusals = {
        "an auditor": ("auditor-1", alice, (403, "forbidden")),
        "an admin": ("admin-1", alice, (403, "forbidden")),
        "no signature": ("op-alice", None, (422, "approval_signature_required")),
        "a signature over other bytes": ("op-alice", signature_json(sign_approval(other_bytes, "op-alice")),
                                         (403, "approval_signature_invalid")),
        "a forged signature": ("op-alice", {**alice, "signature": base64.b64encode(b"\x00" * 64).decode()},
                               (403, "approval_signature_invalid")),
        "a key custody does not know": ("op-alice", signature_json(sign_approval(payload, "op-zed")), (403, "approver_unknown")),
        "another operator's key": ("op-alice", signature_json(sign_approval(payload, "op-bob")), (403, "approver_not_caller")),
    }
    for case, (who, signature, expected) in refusals.items():
        assert_equal((case, error(approve(who, signature))), (case, expected))
    assert_equal(error(approve("op-alice", alice, out_id)), (404, "rebalance_not_found"))
    assert_equal(stored(owner, refill_id), [])  # every refusal wrote nothing

    first = approve("op-alice", alice)
    assert_equal((first.status_code, first.json()["approvals"], first.json()["rebalance"]["approvals"]), (200, 1, 1))
    assert_equal(error(approve("op-alice", alice)), (409, "already_acted"))
    second = approve("op-bob", signature_json(sign_approval(payload, "op-bob")))
    assert_equal((second.status_code, second.json()["approvals"], second.json()["rebalance"]["state"]), (200, 2, "open"))
    assert_equal([(r.operator, r.key_id, bytes(r.signed_payload)) for r in stored(owner, refill_id)],
                 [("api:op-alice", "test-ed25519:op-alice", payload), ("api:op-bob", "test-ed25519:op-bob", payload)])
    listed = {r["id"]: r["approvals"] for r in clients["op-carol"].get("/v1/eth-rebalances").json()}
    assert_equal(listed, {refill_id: 2, out_id: 0})

    with owner.begin() as c:  # the worker signed it meanwhile
        c.execute(text("UPDATE eth_rebalance SET state = 'signed', txid = '0x' || repeat('ab', 32), raw = '\\x00', nonce = 0 "
                       "WHERE id = :r"), {"r": refill_id})
    assert_equal(error(approve("op-carol", signature_json(sign_approval(payload, "op-carol")))), (409, "invalid_state"))
    assert_equal(len(stored(owner, refill_id)), 2)
