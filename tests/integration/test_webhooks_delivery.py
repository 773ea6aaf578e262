"""Must show 2 (issue 14): signed webhooks to a real local HTTP receiver.

An admin registers two endpoints over the API on a receiver running in a thread: `/flaky`
answers 500 to its first two requests, then checks each delivery's signature with
`custody.webhooks.verify_signature` and processes each event id once; `/down` answers 500 until it
is "fixed". The worker's job (`Webhooks.run_once`, run here by hand) delivers three events:
/flaky gets them after two retries, /down's deliveries end dead-lettered. A tampered body is
refused by the receiver's check; a replay of a delivered event is de-duplicated by the receiver;
the operator's replay of /down's dead letters delivers them. Then the secret is rotated: during
the grace period both the old and the new secret verify a delivery; after it only the new one.

The admin routes' errors are checked against the served OpenAPI document too (each status and code
documented for its operation), including those of a deleted endpoint, which the fuzzer never meets.
"""
from __future__ import annotations

import datetime as dt
import logging
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from custody.api.app import create_app
from custody.auth import Role, create_api_key
from custody.container import Container
from custody.controls import emit
from custody.settings import Settings
from custody.webhooks import WebhookSignatureError, verify_signature
from tests.integration.own_database import own_database
from ledger.service import Ledger
from regtest.util import assert_equal, wait_until

log = logging.getLogger(__name__)


class Receiver:
    """A tiny webhook receiver: what a backend would run, with its failures programmable."""

    def __init__(self) -> None:
        self.secrets: dict[str, list[str]] = {}  # path -> the secrets the receiver accepts
        self.fail_first = {"/flaky": 2}
        self.down = {"/down"}
        self.requests: list[tuple[str, dict[str, str], bytes, int]] = []  # path, headers, body, answer
        self.processed: dict[str, dict[str, bytes]] = {"/flaky": {}, "/down": {}}
        self.duplicates: dict[str, int] = {"/flaky": 0, "/down": 0}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(receiver.answer(self.path, dict(self.headers), body))
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_port}{path}"

    def answer(self, path: str, headers: dict[str, str], body: bytes) -> int:
        with self.lock:
            status = self._answer(path, headers, body)
            self.requests.append((path, headers, body, status))
            return status

    def _answer(self, path: str, headers: dict[str, str], body: bytes) -> int:
        if self.fail_first.get(path, 0) > 0:
            self.fail_first[path] -= 1
            return 500
        if path in self.down:
            return 500
        try:
            event_id = verify_signature(self.secrets[path], headers, body)
        except WebhookSignatureError:
            return 400
        if event_id in self.processed[path]:
            self.duplicates[path] += 1  # already processed: acknowledge, do nothing
        else:
            self.processed[path][event_id] = body
        return 200

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def engine(database_url):
    """A database of the module's own: the outbox events of other tests (never fanned out there)
    must not reach these endpoints."""
    with own_database(database_url, "webhooks") as e:
        yield e


@pytest.fixture()
def world(engine):
    settings = Settings(environment="test", webhook_backoff_seconds=0.05, webhook_backoff_max_seconds=0.2,
                        webhook_max_attempts=4, webhook_timeout_seconds=2,
                        webhook_allow_private_hosts="127.0.0.1")  # the receivers run on this host
    container = Container(settings=settings, engine=engine, ledger=Ledger(engine))
    run = uuid.uuid4().hex[:8]
    admin = create_api_key(engine, f"webhooks-admin-{run}", Role.admin, settings.api_key_pepper)
    client = TestClient(create_app(container), raise_server_exceptions=False, headers={"X-API-Key": admin})
    receiver = Receiver()
    yield container, client, receiver, "treasury.adjustment_posted"  # a catalogue type nothing else emits here
    receiver.stop()


def emit_events(engine, topic: str, *names: str) -> list[str]:
    with engine.begin() as c:
        for name in names:
            emit(c, topic, f"{topic}:{name}", {"name": name, "amount_minor": "50000000"}, aggregate=f"test:{name}")
    return [f"{topic}:{n}" for n in names]


def deliveries(client, endpoint_id: int) -> list[dict]:
    r = client.get(f"/v1/webhook-endpoints/{endpoint_id}/deliveries")
    assert r.status_code == 200, r.text
    return r.json()


def run_until(container, predicate) -> None:
    def step() -> bool:
        container.webhooks.run_once()
        return predicate()
    wait_until(step, timeout=30, interval=0.05)


def test_signed_webhooks_retry_dead_letter_replay_and_rotation(world, engine):
    container, client, receiver, topic = world

    log.info("An admin registers two endpoints; each secret is shown once and stored encrypted")
    made = {}
    for path in ("/flaky", "/down"):
        r = client.post("/v1/webhook-endpoints", json={"url": receiver.url(path), "event_types": [topic],
                                                       "description": f"receiver {path}"})
        assert r.status_code == 201, r.text
        made[path] = r.json()
        receiver.secrets[path] = [r.json()["secret"]]
        assert r.json()["secret"].startswith("whsec_")
        assert "secret" not in client.get(f"/v1/webhook-endpoints/{r.json()['endpoint']['id']}").json()
    flaky, down = made["/flaky"]["endpoint"]["id"], made["/down"]["endpoint"]["id"]
    with engine.connect() as c:
        stored = c.execute(text("SELECT secret_enc FROM webhook_endpoint WHERE id = :i"), {"i": flaky}).scalar_one()
    assert made["/flaky"]["secret"].encode() not in bytes(stored)

    log.info("Three events; /flaky fails twice, then verifies and processes each once")
    ids = emit_events(engine, topic, "a", "b", "c")
    run_until(container, lambda: len(receiver.processed["/flaky"]) == 3)
    assert_equal(sorted(receiver.processed["/flaky"]), sorted(ids))
    flaky_rows = deliveries(client, flaky)
    assert_equal([(d["event_id"], d["state"], d["attempts"]) for d in flaky_rows],
                 [(ids[0], "delivered", 3), (ids[1], "delivered", 1), (ids[2], "delivered", 1)])
    assert_equal([s for p, _, _, s in receiver.requests if p == "/flaky"], [500, 500, 200, 200, 200])
    walked, url = [], f"/v1/webhook-endpoints/{flaky}/deliveries?limit=2"  # paged like every list
    while url:
        r = client.get(url)
        assert r.status_code == 200, r.text
        walked += [d["id"] for d in r.json()]
        url = f"/v1/webhook-endpoints/{flaky}/deliveries?limit=2&cursor={r.headers['X-Next-Cursor']}" \
            if "X-Next-Cursor" in r.headers else None
    assert_equal(walked, [d["id"] for d in flaky_rows])

    log.info("/down never answers 2xx: each delivery is dead after WEBHOOK_MAX_ATTEMPTS (4)")
    run_until(container, lambda: all(d["state"] == "dead" for d in deliveries(client, down)))
    assert_equal([(d["event_id"], d["attempts"], d["last_status"]) for d in deliveries(client, down)],
                 [(i, 4, 500) for i in ids])
    assert_equal(receiver.processed["/down"], {})

    log.info("A tampered body is refused by the receiver's check")
    _, headers, body, _ = next(r for r in receiver.requests if r[0] == "/flaky" and r[3] == 200)
    tampered = body.replace(b"50000000", b"99000000")
    assert tampered != body
    with pytest.raises(WebhookSignatureError) as refused:
        verify_signature(receiver.secrets["/flaky"], headers, tampered)
    assert_equal(refused.value.code, "signature_mismatch")
    sent = httpx.post(receiver.url("/flaky"), content=tampered, headers={k: v for k, v in headers.items()
                                                                          if k.lower() != "content-length"})
    assert_equal(sent.status_code, 400)
    assert_equal(len(receiver.processed["/flaky"]), 3)

    log.info("Replaying a delivered event: the receiver de-duplicates it by its id")
    r = client.post(f"/v1/webhook-deliveries/{flaky_rows[1]['id']}/replay")
    assert (r.status_code, r.json()["state"], r.json()["attempts"]) == (200, "pending", 0), r.text
    run_until(container, lambda: receiver.duplicates["/flaky"] == 1)
    assert_equal(len(receiver.processed["/flaky"]), 3)
    assert_equal(deliveries(client, flaky)[1]["state"], "delivered")

    log.info("The receiver is fixed; the operator replays /down's dead letters and they are delivered")
    receiver.down.clear()
    r = client.post(f"/v1/webhook-endpoints/{down}/replay-dead")
    assert_equal((r.status_code, r.json()), (200, {"replayed": 3}))
    run_until(container, lambda: len(receiver.processed["/down"]) == 3)
    assert_equal({d["state"] for d in deliveries(client, down)}, {"delivered"})
    assert_equal(receiver.processed["/down"], receiver.processed["/flaky"])  # the same bytes to every endpoint

    log.info("Rotation: during the grace period the old and the new secret both verify")
    old = receiver.secrets["/flaky"][0]
    r = client.post(f"/v1/webhook-endpoints/{flaky}/rotate-secret", json={"grace_seconds": 2})
    assert r.status_code == 200, r.text
    new = r.json()["secret"]
    assert new != old and r.json()["endpoint"]["previous_secret_expires_at"] is not None
    (during,) = emit_events(engine, topic, "during-grace")
    run_until(container, lambda: during in receiver.processed["/flaky"])  # the receiver still has only the old one
    _, headers, body, _ = next(r for r in reversed(receiver.requests) if r[0] == "/flaky" and r[3] == 200)
    assert_equal(headers["Custody-Signature"].count("v1="), 2)
    assert_equal(verify_signature(old, headers, body), during)
    assert_equal(verify_signature(new, headers, body), during)

    log.info("After the grace period only the new secret verifies")
    expires = r.json()["endpoint"]["previous_secret_expires_at"]
    wait_until(lambda: client.get(f"/v1/webhook-endpoints/{flaky}").json()["previous_secret_expires_at"] is None,
               timeout=10, interval=0.2)
    (after,) = emit_events(engine, topic, "after-grace")
    refusals = sum(1 for p, _, _, s in receiver.requests if (p, s) == ("/flaky", 400))
    run_until(container, lambda: sum(1 for p, _, _, s in receiver.requests if (p, s) == ("/flaky", 400)) > refusals)
    _, headers, body, _ = next(r for r in reversed(receiver.requests) if (r[0], r[3]) == ("/flaky", 400))
    assert_equal(headers["Custody-Signature"].count("v1="), 1)
    assert_equal(verify_signature(new, headers, body), after)
    with pytest.raises(WebhookSignatureError):
        verify_signature(old, headers, body)
    receiver.secrets["/flaky"] = [new]  # the receiver rolls over; the retry is delivered
    run_until(container, lambda: after in receiver.processed["/flaky"])
    assert expires


def documented_codes(client, r) -> list[str]:
    """The codes the served OpenAPI document allows for the request's operation and answer status."""
    for template, item in client.get("/openapi.json").json()["paths"].items():
        operation = item.get(r.request.method.lower())
        if operation is not None and re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", template), r.request.url.path):
            answer = operation["responses"].get(str(r.status_code))
            return answer["content"]["application/json"]["schema"]["properties"]["error"]["properties"]["code"]["enum"] if answer else []
    raise AssertionError(f"{r.request.method} {r.request.url.path} is in no path of the document")


def test_endpoint_admin_errors_and_delete(world, engine):
    container, client, receiver, topic = world

    def answer(r):
        """Status and code, after checking the document states them for this operation (the contract:
        custody.api.errors), including on paths the fuzzer cannot reach (a deleted endpoint)."""
        code = r.json()["error"]["code"]
        assert code in documented_codes(client, r), (r.request.method, r.request.url.path, r.status_code, code)
        return r.status_code, code

    for bad_url in ("ftp://example.com/hook", "https://user:secret@example.com/hook", "https://example.com/#x", "hook"):
        assert_equal(answer(client.post("/v1/webhook-endpoints", json={"url": bad_url, "event_types": [topic]})),
                     (422, "webhook_url_invalid"))
    for bad_types in (["Deposit"], ["deposit."], ["a b"]):
        assert_equal(answer(client.post("/v1/webhook-endpoints", json={"url": receiver.url("/x"), "event_types": bad_types})),
                     (422, "webhook_event_types_invalid"))
    assert_equal(answer(client.post("/v1/webhook-endpoints", json={"url": receiver.url("/x"), "event_types": []})),
                 (422, "invalid_request"))
    assert_equal(answer(client.get("/v1/webhook-endpoints/987654321")), (404, "webhook_endpoint_not_found"))
    assert_equal(answer(client.post("/v1/webhook-deliveries/987654321/replay")), (404, "webhook_delivery_not_found"))
    assert_equal(answer(client.get("/v1/webhook-endpoints/0")), (422, "invalid_request"))

    made = client.post("/v1/webhook-endpoints", json={"url": receiver.url("/flaky"), "event_types": [topic]}).json()
    endpoint = made["endpoint"]["id"]
    assert_equal(answer(client.patch(f"/v1/webhook-endpoints/{endpoint}", json={"url": "https://elsewhere.example"})),
                 (422, "invalid_request"))  # a URL never changes
    r = client.patch(f"/v1/webhook-endpoints/{endpoint}", json={"event_types": [topic, "deposit.credited"], "enabled": False})
    assert_equal((r.status_code, r.json()["event_types"], r.json()["enabled"]), (200, sorted([topic, "deposit.credited"]), False))

    log.info("A disabled endpoint gets no delivery for an event written meanwhile")
    emit_events(engine, topic, "while-disabled")
    container.webhooks.run_once()
    assert_equal(deliveries(client, endpoint), [])

    log.info("A deleted endpoint is gone from the API and gets nothing; the answer states the row as stored")
    r = client.delete(f"/v1/webhook-endpoints/{endpoint}")
    assert_equal((r.status_code, r.json()["enabled"]), (200, False))
    with engine.connect() as c:
        stored = c.execute(text("SELECT updated_at FROM webhook_endpoint WHERE id = :i"), {"i": endpoint}).scalar_one()
    assert_equal(dt.datetime.fromisoformat(r.json()["updated_at"]), stored)
    assert_equal(answer(client.get(f"/v1/webhook-endpoints/{endpoint}")), (404, "webhook_endpoint_not_found"))
    assert endpoint not in [e["id"] for e in client.get("/v1/webhook-endpoints").json()]
    for r in (client.patch(f"/v1/webhook-endpoints/{endpoint}", json={"enabled": True}),
              client.delete(f"/v1/webhook-endpoints/{endpoint}"),
              client.post(f"/v1/webhook-endpoints/{endpoint}/rotate-secret", json={}),
              client.get(f"/v1/webhook-endpoints/{endpoint}/deliveries"),
              client.post(f"/v1/webhook-endpoints/{endpoint}/replay-dead")):
        assert_equal(answer(r), (404, "webhook_endpoint_not_found"))
    with engine.connect() as c:
        actions = c.execute(text("SELECT action FROM audit_event WHERE subject = :s ORDER BY id"),
                            {"s": f"webhook_endpoint:{endpoint}"}).scalars().all()
    assert_equal(actions, ["webhook_endpoint.create", "webhook_endpoint.update", "webhook_endpoint.delete"])


def test_a_hanging_receiver_does_not_hold_up_the_others(world, engine):
    """`/hang` answers after 3 s; with a 0.5 s timeout the same run delivers to `/fast` and
    counts one failed attempt for `/hang`, whose other delivery waits unattempted."""
    container, client, receiver, topic = world
    container.webhooks.settings = container.settings.model_copy(update={"webhook_timeout_seconds": 0.5})
    release = threading.Event()
    hanging = ThreadingHTTPServer(("127.0.0.1", 0), type("Hang", (BaseHTTPRequestHandler,), {
        "do_POST": lambda self: (release.wait(3), self.send_response(200), self.end_headers()),
        "log_message": lambda self, *a: None}))
    threading.Thread(target=hanging.serve_forever, daemon=True).start()
    try:
        fast = client.post("/v1/webhook-endpoints", json={"url": receiver.url("/fast"), "event_types": [topic]}).json()
        receiver.secrets["/fast"], receiver.processed["/fast"] = [fast["secret"]], {}
        hang = client.post("/v1/webhook-endpoints", json={
            "url": f"http://127.0.0.1:{hanging.server_port}/hang", "event_types": [topic]}).json()["endpoint"]["id"]
        ids = emit_events(engine, topic, "one", "two")
        result = container.webhooks.run_once()
        assert_equal(sorted(receiver.processed["/fast"]), sorted(ids))
        assert_equal((result.delivered, result.failed), (2, 1))
        assert_equal([(d["state"], d["attempts"], d["last_error"]) for d in deliveries(client, hang)],
                     [("pending", 1, "timeout"), ("pending", 0, None)])
    finally:
        release.set()
        hanging.shutdown()
        hanging.server_close()


def test_an_unreadable_webhook_key_answers_503_and_writes_nothing(world, engine, tmp_path):
    """A service whose webhook key cannot be read or created (no WEBHOOK_SECRET_KEY, and its state
    directory is a file) answers create and rotate with `webhook_key_unavailable` (503, documented)
    and writes nothing; an endpoint that does not exist is still `webhook_endpoint_not_found`
    first, the order custody.webhooks.endpoints states."""
    container, client, receiver, topic = world
    endpoint = client.post("/v1/webhook-endpoints", json={"url": receiver.url("/x"), "event_types": [topic]}).json()
    endpoint_id = endpoint["endpoint"]["id"]
    blocked = tmp_path / "state-is-a-file"
    blocked.write_text("")
    broken = Container(settings=container.settings.model_copy(update={"state_dir": blocked, "webhook_secret_key": None}),
                       engine=engine, ledger=Ledger(engine))
    keyless = TestClient(create_app(broken), raise_server_exceptions=False, headers=dict(client.headers))

    def stored() -> tuple:
        with engine.connect() as c:
            return (c.execute(text("SELECT id, secret_enc, previous_secret_enc, updated_at FROM webhook_endpoint "
                                   "ORDER BY id")).all(),
                    c.execute(text("SELECT count(*) FROM audit_event WHERE action LIKE 'webhook_%'")).scalar_one())

    before = stored()
    for r in (keyless.post("/v1/webhook-endpoints", json={"url": receiver.url("/y"), "event_types": [topic]}),
              keyless.post(f"/v1/webhook-endpoints/{endpoint_id}/rotate-secret", json={"grace_seconds": 0})):
        code = r.json()["error"]["code"]
        assert_equal((r.status_code, code), (503, "webhook_key_unavailable"))
        assert code in documented_codes(keyless, r)
    r = keyless.post("/v1/webhook-endpoints/987654321/rotate-secret", json={})
    assert_equal((r.status_code, r.json()["error"]["code"]), (404, "webhook_endpoint_not_found"))
    assert_equal(stored(), before)


def test_the_worker_checks_the_address_again_before_each_post(world, engine):
    """An endpoint registered while its address was allowed gets nothing once it is not (the check
    at send time, which also catches a name re-pointed at an internal address after registration):
    the attempt fails with the coarse class `address_refused`, nothing reaches the receiver, and a
    URL naming an internal address is refused at registration without the allow-list."""
    container, client, receiver, topic = world
    made = client.post("/v1/webhook-endpoints", json={"url": receiver.url("/x"), "event_types": [topic]}).json()
    endpoint = made["endpoint"]["id"]
    receiver.secrets["/x"], receiver.processed["/x"] = [made["secret"]], {}
    container.webhooks.settings = container.settings.model_copy(update={"webhook_allow_private_hosts": ""})
    emit_events(engine, topic, "refused")
    result = container.webhooks.run_once()
    assert_equal((result.delivered, result.failed), (0, 1))
    assert_equal([(d["state"], d["attempts"], d["last_status"], d["last_error"]) for d in deliveries(client, endpoint)],
                 [("pending", 1, None, "address_refused")])
    assert_equal(receiver.requests, [])
    for internal in (receiver.url("/y"), "http://localhost:8545/", "http://169.254.169.254/latest/meta-data/"):
        r = client.post("/v1/webhook-endpoints", json={"url": internal, "event_types": [topic]})
        assert_equal((r.status_code, r.json()["error"]["code"]), (422, "webhook_url_invalid"))
