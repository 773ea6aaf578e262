"""ops_api_keys: API keys are listed, revoked and rotated, over the admin API and the CLI.

- over the API (every request runs as custody_api, tests/api_role.py): an admin lists keys (never a
  key, only its prefix), revokes one (its next request is 401: the revoking process forgets the
  keys it remembered), rotates one (the new key, shown once, has the same name and role; the old one stops at once,
  or after the grace period); unknown ids, revoked keys, a second rotation and a grace period out
  of range answer their codes; other roles are refused;
- a key revoked by another process (the CLI, another api) is refused 1.1 s later by an api that
  had just authenticated it (custody.auth remembers a live key for at most 0.5 s);
- the api role still may not write api_key itself;
- a name is created once (`api_key_name_taken`), even after its key was revoked;
- the CLI (`python -m custody api-key ...`) does the same against the database DATABASE_URL names,
  printing a key only when it makes one.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from custody.api.app import create_app
from custody.auth import authenticate, create_api_key, list_api_keys
from custody.container import Container
from custody.errors import CustodyError
from custody.settings import Settings
from ledger.service import Ledger
from regtest.util import assert_equal

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
SETTINGS = Settings(environment="test")


@pytest.fixture
def api(engine):
    container = Container(settings=SETTINGS, engine=engine, ledger=Ledger(engine))
    return TestClient(create_app(container), raise_server_exceptions=False)


def new_key(engine, role: str) -> tuple[str, str, int]:
    name = f"ops-{role}-{uuid.uuid4().hex[:8]}"
    key = create_api_key(engine, name, role, SETTINGS.api_key_pepper)
    [view] = [k for k in list_api_keys(engine) if k.name == name]
    return name, key, view.id


def code(r) -> tuple[int, str | None]:
    try:
        return r.status_code, r.json()["error"]["code"]
    except (KeyError, TypeError, ValueError):
        return r.status_code, None


def test_admin_lists_revokes_and_rotates_over_the_api(api, engine):
    _, admin, _ = new_key(engine, "admin")
    name, backend, backend_id = new_key(engine, "backend")
    as_admin = {"X-API-Key": admin}

    log.info("the list shows the key's prefix, never the key")
    r = api.get("/v1/api-keys", headers=as_admin)
    assert_equal(r.status_code, 200)
    [row] = [k for k in r.json()["keys"] if k["id"] == backend_id]
    assert_equal((row["name"], row["role"], row["prefix"], row["live"]), (name, "backend", backend[:10], True))
    assert backend not in r.text and admin not in r.text

    log.info("other roles may not manage keys")
    assert_equal(code(api.get("/v1/api-keys", headers={"X-API-Key": backend})), (403, "forbidden"))
    assert_equal(code(api.post(f"/v1/api-keys/{backend_id}/revoke", headers={"X-API-Key": backend})), (403, "forbidden"))

    log.info("rotate with a grace period: both keys work, then only the new one")
    r = api.post(f"/v1/api-keys/{backend_id}/rotate", json={"grace_seconds": 2}, headers=as_admin)
    assert_equal(r.status_code, 200)
    body = r.json()
    rotated = body["key"]
    assert_equal((body["new"]["name"], body["new"]["role"], body["new"]["replaces"]), (name, "backend", backend_id))
    assert rotated != backend and rotated.startswith(body["new"]["prefix"])
    assert_equal(authenticate(engine, backend, SETTINGS.api_key_pepper).name, name)
    assert_equal(authenticate(engine, rotated, SETTINGS.api_key_pepper).name, name)
    assert rotated not in api.get("/v1/api-keys", headers=as_admin).text
    assert_equal(code(api.post(f"/v1/api-keys/{backend_id}/rotate", json={}, headers=as_admin)),
                 (409, "api_key_not_live"))
    time.sleep(2.2)
    assert authenticate(engine, backend, SETTINGS.api_key_pepper) is None
    assert_equal(code(api.get("/v1/assets", headers={"X-API-Key": backend})), (401, "unauthorized"))
    assert_equal(api.get("/v1/assets", headers={"X-API-Key": rotated}).status_code, 200)

    log.info("revoke: the next request with that key is refused")
    new_id = body["new"]["id"]
    r = api.post(f"/v1/api-keys/{new_id}/revoke", headers=as_admin)
    assert_equal((r.status_code, r.json()["live"], r.json()["revoked_by"]), (200, False, f"api:{r.json()['revoked_by'][4:]}"))
    started = time.monotonic()
    assert_equal(code(api.get("/v1/assets", headers={"X-API-Key": rotated})), (401, "unauthorized"))
    assert time.monotonic() - started < 1.0
    assert_equal(code(api.post(f"/v1/api-keys/{new_id}/revoke", headers=as_admin)), (409, "api_key_not_live"))
    assert_equal(code(api.post(f"/v1/api-keys/{new_id}/rotate", json={}, headers=as_admin)), (409, "api_key_not_live"))

    log.info("bad input: unknown id, id out of range, grace out of range")
    assert_equal(code(api.post("/v1/api-keys/987654321/revoke", headers=as_admin)), (404, "api_key_not_found"))
    assert_equal(code(api.post("/v1/api-keys/987654321/rotate", json={}, headers=as_admin)), (404, "api_key_not_found"))
    assert_equal(code(api.post("/v1/api-keys/0/revoke", headers=as_admin)), (422, "invalid_request"))
    _, _, other_id = new_key(engine, "auditor")
    assert_equal(code(api.post(f"/v1/api-keys/{other_id}/rotate", json={"grace_seconds": -1}, headers=as_admin)),
                 (422, "invalid_request"))
    assert_equal(code(api.post(f"/v1/api-keys/{other_id}/rotate", json={"grace_seconds": 604801}, headers=as_admin)),
                 (422, "invalid_request"))

    log.info("every change is audited")
    with engine.connect() as c:
        actions = c.execute(text("SELECT action FROM audit_event WHERE subject = :n ORDER BY id"), {"n": name}).scalars().all()
    assert_equal(actions, ["api_key.create", "api_key.rotate", "api_key.revoke"])


def test_the_api_role_still_may_not_write_api_keys(engine):
    with engine.connect() as c:
        c.execute(text("SET ROLE custody_api"))
        for statement in ("INSERT INTO api_key (name, role, key_prefix, key_hash) VALUES ('x', 'admin', 'p', 'h')",
                          "UPDATE api_key SET revoked_at = NULL"):
            with pytest.raises(Exception) as err:
                c.execute(text(statement))
            assert "permission denied" in str(err.value)
            c.rollback()
            c.execute(text("SET ROLE custody_api"))


def test_a_name_is_created_once(engine):
    name, _, key_id = new_key(engine, "backend")
    from custody.auth import revoke_api_key

    revoke_api_key(engine, key_id, by="test")
    with pytest.raises(CustodyError) as err:
        create_api_key(engine, name, "admin", SETTINGS.api_key_pepper)
    assert_equal(err.value.code.value, "api_key_name_taken")


def cli(database_url: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": database_url.replace("postgresql+psycopg://", "postgresql://"),
           "ENVIRONMENT": "test", "LOG_FORMAT": "text"}
    return subprocess.run([sys.executable, "-m", "custody", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_cli_lists_revokes_and_rotates(database_url, engine):
    name = f"ops-cli-{uuid.uuid4().hex[:8]}"
    made = cli(database_url, "create-api-key", name, "operator")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert_equal(authenticate(engine, key, SETTINGS.api_key_pepper).name, name)
    again = cli(database_url, "create-api-key", name, "operator")
    assert_equal(again.returncode, 1)
    assert "api_key_name_taken" in again.stderr or "created before" in again.stderr

    listed = cli(database_url, "api-key", "list")
    assert listed.returncode == 0, listed.stderr
    [line] = [ln for ln in listed.stdout.splitlines() if f"\t{name}\t" in ln]
    assert key not in listed.stdout and key[:10] in line and "\tlive\t" in line
    key_id = int(line.split("\t")[0])

    rotated = cli(database_url, "api-key", "rotate", str(key_id))
    assert rotated.returncode == 0, rotated.stderr
    new = rotated.stdout.strip()
    assert new.startswith("csk_") and new != key and new not in rotated.stderr
    assert authenticate(engine, key, SETTINGS.api_key_pepper) is None
    assert_equal(authenticate(engine, new, SETTINGS.api_key_pepper).role.value, "operator")

    [new_view] = [k for k in list_api_keys(engine) if k.replaces == key_id]
    revoked = cli(database_url, "api-key", "revoke", str(new_view.id))
    assert_equal((revoked.returncode, revoked.stdout), (0, ""))
    assert authenticate(engine, new, SETTINGS.api_key_pepper) is None
    live = cli(database_url, "api-key", "list", "--live")
    assert name not in live.stdout
    missing = cli(database_url, "api-key", "revoke", "987654321")
    assert_equal(missing.returncode, 1)
    assert "no API key" in missing.stderr


def test_a_key_revoked_elsewhere_is_refused_within_a_second(api, engine, database_url):
    from custody.auth import revoke_api_key
    from custody.database import make_engine

    _, key, key_id = new_key(engine, "backend")
    headers = {"X-API-Key": key}
    assert_equal(api.get("/v1/assets", headers=headers).status_code, 200)  # remembered by this api now
    other = make_engine(database_url, pool_size=1)  # another process's engine: this api's memory is not told
    try:
        revoke_api_key(other, key_id, by="cli")
    finally:
        other.dispose()
    log.info("revoked through another engine; this api may serve the key for at most 0.5 s more")
    time.sleep(1.1)
    assert_equal(code(api.get("/v1/assets", headers=headers)), (401, "unauthorized"))
