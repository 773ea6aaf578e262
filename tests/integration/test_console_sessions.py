"""console sessions (issue 15, must show 3): session security of the operator console.

- A state change made with a console session but without its CSRF token (or with another
  session's) is refused and changes nothing; with it, it goes through.
- An expired session (idle longer than CONSOLE_IDLE_SECONDS, or past CONSOLE_SESSION_MAX_SECONDS)
  is refused on the console's routes and on /v1, and stays ended.
- A replayed WebAuthn sign-in assertion (or enrolment) is refused: its challenge was used once;
  an expired challenge, an assertion without user verification or from another origin too.
- Enrolment waits for an admin (a pending credential cannot sign in; nobody approves their own);
  a revoked credential's sessions end; the cookie is HttpOnly, SameSite=Strict, Secure on https;
  an auditor's session changes nothing; the page carries no API key field and forbids framing.
"""
from __future__ import annotations

import pytest
from sqlalchemy import text

from custody.console.auth import ConsoleAuth
from custody.container import Container
from custody.errors import CustodyError
from custody.settings import Settings
from ledger.service import Ledger
from regtest.util import assert_equal
from tests.console_passkey import SoftPasskey
from tests.integration.console_helpers import ORIGIN, Console, code


@pytest.fixture(scope="module")
def console(engine) -> Console:
    return Console(Container(settings=Settings(environment="test"), engine=engine, ledger=Ledger(engine)))


def kill_switch_engaged(console: Console) -> bool:
    return console.admin_key.get("/v1/kill-switch").json()["engaged"]


def release_kill_switch(console: Console) -> None:
    r = console.admin_key.post("/v1/kill-switch", json={"engaged": False, "reason": "test over"})
    assert r.status_code == 200, r.text


def test_a_state_change_without_the_csrf_token_is_refused(console):
    client, _, session = console.person("csrf-op", "operator")
    body = {"engaged": True, "reason": "csrf test"}
    assert not kill_switch_engaged(console)

    r = client.post("/v1/kill-switch", json=body)
    assert_equal((r.status_code, code(r)), (403, "forbidden"))
    assert "console_csrf_invalid" in r.json()["error"]["message"]
    other, _, other_session = console.person("csrf-other", "operator")
    r = client.post("/v1/kill-switch", json=body, headers={"X-CSRF-Token": other_session["csrf_token"]})
    assert_equal((r.status_code, code(r)), (403, "forbidden"))
    r = client.post("/console/sign-out")
    assert_equal((r.status_code, code(r)), (403, "console_csrf_invalid"))
    assert not kill_switch_engaged(console), "a refused request engaged the kill switch"

    r = client.post("/v1/kill-switch", json=body, headers={"X-CSRF-Token": session["csrf_token"]})
    assert_equal((r.status_code, r.json()["engaged"], r.json()["changed_by"]), (200, True, f"api:{session['username']}"))
    release_kill_switch(console)
    assert client.get("/console/session").status_code == 200, "reads need no CSRF token"


def test_an_expired_session_is_refused(console, engine):
    client, _, session = console.person("idle-op", "operator")
    assert_equal(client.get("/console/api/queue").status_code, 200)
    with engine.begin() as c:
        c.execute(text("UPDATE console_session SET last_seen_at = now() - make_interval(secs => :s) WHERE username = :u"),
                  {"s": console.container.settings.console_idle_seconds + 5, "u": session["username"]})
    r = client.get("/console/session")
    assert_equal((r.status_code, code(r)), (401, "console_session_expired"))
    r = client.get("/v1/kill-switch")
    assert_equal((r.status_code, code(r)), (401, "unauthorized"))
    with engine.connect() as c:
        ended = c.execute(text("SELECT ended_at IS NOT NULL, ended_reason FROM console_session WHERE username = :u"),
                          {"u": session["username"]}).one()
    assert_equal(tuple(ended), (True, "idle timeout"))
    with engine.begin() as c:  # activity after the end does not revive it
        c.execute(text("UPDATE console_session SET last_seen_at = now() WHERE username = :u"), {"u": session["username"]})
    assert_equal(code(client.get("/console/session")), "console_session_expired")

    client, _, session = console.person("old-op", "operator")
    with engine.begin() as c:
        c.execute(text("UPDATE console_session SET expires_at = now() - interval '1 second' WHERE username = :u"),
                  {"u": session["username"]})
    r = client.post("/v1/kill-switch", json={"engaged": True, "reason": "x"}, headers={"X-CSRF-Token": session["csrf_token"]})
    assert_equal((r.status_code, code(r)), (401, "unauthorized"))
    assert not kill_switch_engaged(console)

    client, _, session = console.person("out-op", "operator")
    assert_equal(client.post("/console/sign-out", headers={"X-CSRF-Token": session["csrf_token"]}).status_code, 200)
    assert_equal(code(client.get("/console/api/queue")), "unauthorized")  # the cookie is cleared
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT ended_reason FROM console_session WHERE username = :u"),
                               {"u": session["username"]}).scalar_one(), "signed out")


def test_a_replayed_sign_in_assertion_is_refused(console, engine):
    _, passkey, session = console.person("replay-op", "operator")
    username = session["username"]
    client = console.client()
    options = client.post("/console/sign-in/options", json={"username": username}).json()
    assertion = passkey.sign_in(options)
    first = client.post("/console/sign-in", json={"credential": assertion})
    assert_equal(first.status_code, 200)
    again = console.client().post("/console/sign-in", json={"credential": assertion})
    assert_equal((again.status_code, code(again)), (401, "console_challenge_invalid"))
    assert "set-cookie" not in again.headers
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT count(*) FROM console_session WHERE username = :u"), {"u": username}).scalar_one(),
                     2)  # person()'s and the first of the two above: the replay opened none

    options = client.post("/console/sign-in/options", json={"username": username}).json()
    with engine.begin() as c:
        c.execute(text("UPDATE console_challenge SET expires_at = now() - interval '1 second' WHERE used_at IS NULL "
                       "AND username = :u"), {"u": username})
    r = client.post("/console/sign-in", json={"credential": passkey.sign_in(options)})
    assert_equal((r.status_code, code(r)), (401, "console_challenge_invalid"))

    for bad in ({"user_verified": False}, {"origin": "http://evil.example"}):
        options = client.post("/console/sign-in/options", json={"username": username}).json()
        r = client.post("/console/sign-in", json={"credential": passkey.sign_in(options, **bad)})
        assert_equal((r.status_code, code(r)), (401, "console_assertion_invalid"))
    options = client.post("/console/sign-in/options", json={"username": username}).json()
    r = client.post("/console/sign-in", json={"credential": passkey.sign_in(options, challenge=b"\x01" * 32)})
    assert_equal((r.status_code, code(r)), (401, "console_challenge_invalid"))  # a challenge never handed out


def test_a_replayed_enrolment_is_refused(console):
    username = console.name("enrol-replay")
    passkey = SoftPasskey(username, origin=ORIGIN)
    client = console.client()
    registration = passkey.registration(client.post("/console/enrol/options", json={"username": username}).json())
    assert_equal(client.post("/console/enrol", json={"credential": registration}).status_code, 201)
    r = client.post("/console/enrol", json={"credential": registration})
    assert_equal((r.status_code, code(r)), (401, "console_challenge_invalid"))


def test_enrolment_waits_for_an_admin_and_revocation_ends_sessions(console, engine):
    username = console.name("pending-op")
    passkey = SoftPasskey(username, origin=ORIGIN)
    client = console.client()
    credential = console.enrol(client, username, passkey)
    assert_equal((credential["state"], credential["role"]), ("pending", None))
    assert len(credential["fingerprint"]) == 19  # four groups of four hex digits, read out to the admin
    r = console.sign_in(client, username, passkey)
    assert_equal((r.status_code, code(r)), (401, "console_credential_unknown"))

    auth = ConsoleAuth(engine, console.container.settings)
    with pytest.raises(CustodyError) as refused:
        auth.decide_enrolment(credential["id"], decision="approve", role="admin", by=username)
    assert_equal(refused.value.code.value, "console_self_approval")
    with pytest.raises(Exception) as by_sql:  # the table's guard refuses it too
        with engine.begin() as c:
            c.execute(text("UPDATE console_credential SET state = 'active', role = 'admin', decided_by = username WHERE id = :i"),
                      {"i": credential["id"]})
    assert "approves their own enrolment" in str(by_sql.value)
    operator, _, operator_session = console.person("not-admin", "operator")
    r = operator.post(f"/console/api/credentials/{credential['id']}/approve", json={"role": "admin"},
                      headers={"X-CSRF-Token": operator_session["csrf_token"]})
    assert_equal((r.status_code, code(r)), (403, "forbidden"))

    console.approve_enrolment(credential["id"], "operator")
    r = console.sign_in(client, username, passkey)
    assert_equal(r.status_code, 200)
    assert_equal((r.json()["username"], r.json()["role"]), (username, "operator"))
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie and "secure" not in cookie

    assert_equal(console.admin_key.get(f"/console/api/credentials/{credential['id']}/approver-entry").json()["entry"]["operator"], username)
    _, _, auditor = console.person("entry-auditor", "auditor")
    r = console.admin_key.get(f"/console/api/credentials/{auditor['credential_id']}/approver-entry")
    assert_equal((r.status_code, code(r)), (409, "invalid_state"))  # only an operator's key approves payments
    r = console.admin_key.post(f"/console/api/credentials/{credential['id']}/revoke")
    assert_equal((r.status_code, r.json()["state"]), (200, "revoked"))
    assert_equal(code(client.get("/console/session")), "console_session_expired")
    assert_equal(code(console.sign_in(client, username, passkey)), "console_credential_unknown")
    r = console.admin_key.get(f"/console/api/credentials/{credential['id']}/approver-entry")
    assert_equal((r.status_code, code(r)), (409, "invalid_state"))


def test_the_cookie_is_secure_on_https(engine):
    settings = Settings(environment="test", console_origin="https://console.example", console_rp_id="console.example")
    console = Console(Container(settings=settings, engine=engine, ledger=Ledger(engine)))
    username = console.name("https-op")
    passkey = SoftPasskey(username, origin="https://console.example", rp_id="console.example")
    client = console.client()
    console.approve_enrolment(console.enrol(client, username, passkey)["id"], "auditor")
    r = console.sign_in(client, username, passkey)
    assert_equal(r.status_code, 200)
    assert "secure" in r.headers["set-cookie"].lower()


def test_an_auditor_session_changes_nothing(console):
    client, _, session = console.person("auditor", "auditor")
    csrf = {"X-CSRF-Token": session["csrf_token"]}
    assert_equal(client.get("/console/api/queue").status_code, 200)
    assert_equal(client.get("/console/api/audit").status_code, 200)
    for method, path, body in (("POST", "/v1/kill-switch", {"engaged": True, "reason": "auditor"}),
                               ("POST", "/console/api/incidents/1/ack", {"note": "mine"}),
                               ("POST", "/v1/withdrawals/1/reject", {"comment": "no"})):
        r = client.request(method, path, json=body, headers=csrf)
        assert_equal((path, r.status_code, code(r)), (path, 403, "forbidden"))
    assert not kill_switch_engaged(console)


def test_the_page_has_no_api_key_and_forbids_framing(console):
    r = console.client().get("/console")
    assert_equal(r.status_code, 200)
    assert "x-api-key" not in r.text.lower() and "api key" not in r.text.lower()
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    assert_equal(r.headers["x-frame-options"], "DENY")
    script = console.client().get("/console/assets/console.js")
    assert_equal(script.status_code, 200)
    assert "X-API-Key" not in script.text and "localStorage" not in script.text
    assert_equal(console.client().get("/console/assets/../auth.py").status_code, 404)
