"""The console over HTTP for the integration tests: an app on a container, an admin API key (the
bootstrap admin: approves the first enrolments), a root console admin (`root`: a software passkey
approved by that key, whose entry is put in the container's CONSOLE_ADMINS as operations would put
it in the configuration, and whose assertion signs every activation `approve_enrolment` makes), and
people who enrol a software passkey (tests/console_passkey.py), have it approved with a role, and
sign in with it, each in a client of their own (its own cookie jar, as a browser tab would have)."""
from __future__ import annotations

import base64
import uuid

from fastapi.testclient import TestClient

from custody.api.app import create_app
from custody.auth import create_api_key
from tests.approvers import signature_json
from tests.console_passkey import SoftPasskey

ORIGIN = "http://localhost:8000"


class Console:
    def __init__(self, container) -> None:
        self.container = container
        self.app = create_app(container)
        self.run = uuid.uuid4().hex[:6]
        self.admin_key = self.client()
        self.admin_key.headers["X-API-Key"] = create_api_key(container.engine, f"console-admin-{self.run}", "admin",
                                                             container.settings.api_key_pepper)
        self.root = self.configure_admin(self.passkey(self.name("console-root")))

    def passkey(self, username: str, label: str = "console") -> SoftPasskey:
        settings = self.container.settings
        return SoftPasskey(username, origin=settings.console_origin, rp_id=settings.console_rp_id, label=label)

    def configure_admin(self, passkey: SoftPasskey | None, credential_id: int | None = None) -> SoftPasskey | None:
        """An admin's key as operations would make it a root of trust: enrolled and approved by the
        admin API key (unless `credential_id`, an active admin's, is given), its exported entry
        added to the container's CONSOLE_ADMINS."""
        if credential_id is None:
            assert passkey is not None
            credential_id = self.enrol(self.client(), passkey.operator, passkey)["id"]
            self.approve_enrolment(credential_id, "admin", signed=False)
        r = self.admin_key.get(f"/console/api/credentials/{credential_id}/approver-entry")
        assert r.status_code == 200 and r.json()["config"] == "CONSOLE_ADMINS", r.text
        settings = self.container.settings
        self.container.settings = settings.model_copy(update={"console_admins": [*settings.console_admins, r.json()["entry"]]})
        return passkey

    def client(self) -> TestClient:
        return TestClient(self.app, base_url="http://localhost:8000", raise_server_exceptions=False)

    def name(self, who: str) -> str:
        return f"{who}-{self.run}"

    def enrol(self, client: TestClient, username: str, passkey: SoftPasskey) -> dict:
        options = client.post("/console/enrol/options", json={"username": username})
        assert options.status_code == 200, options.text
        r = client.post("/console/enrol", json={"credential": passkey.registration(options.json())})
        assert r.status_code == 201, r.text
        return r.json()

    def activation(self, credential_id: int, role: str, admin: SoftPasskey | None = None) -> dict:
        """`admin`'s (default: the root's) signed activation of a pending credential as `role`."""
        shown = self.admin_key.get(f"/console/api/credentials/{credential_id}/activation-payload", params={"role": role})
        assert shown.status_code == 200, shown.text
        return signature_json((admin or self.root).approval(base64.b64decode(shown.json()["payload_base64"])))

    def approve_enrolment(self, credential_id: int, role: str, *, signed: bool = True) -> dict:
        """Approved by the admin API key, with the root's signed activation unless `signed` is False."""
        body = {"role": role, **({"activation": self.activation(credential_id, role)} if signed else {})}
        r = self.admin_key.post(f"/console/api/credentials/{credential_id}/approve", json=body)
        assert r.status_code == 200, r.text
        return r.json()

    def sign_in(self, client: TestClient, username: str, passkey: SoftPasskey, **overrides):
        options = client.post("/console/sign-in/options", json={"username": username})
        assert options.status_code == 200, options.text
        return client.post("/console/sign-in", json={"credential": passkey.sign_in(options.json(), **overrides)})

    def person(self, who: str, role: str) -> tuple[TestClient, SoftPasskey, dict]:
        """A person enrolled, approved as `role` and signed in: (their client, passkey, session)."""
        username = self.name(who)
        passkey = SoftPasskey(username, origin=ORIGIN)
        client = self.client()
        credential = self.enrol(client, username, passkey)
        self.approve_enrolment(credential["id"], role)
        r = self.sign_in(client, username, passkey)
        assert r.status_code == 200, r.text
        session = r.json()
        session["credential_id"] = credential["id"]
        return client, passkey, session


def code(r) -> str | None:
    try:
        return r.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
