"""The operator console: its page and assets, WebAuthn enrolment and sign-in, and its read models.

Not part of the /v1 OpenAPI document (the console is the service's own page, not a client API);
the README's "Operator console" section lists every route with its roles. The page calls these and
the /v1 routes with its session cookie (custody.api.deps: a session's state changes need its CSRF
token in `X-CSRF-Token`); no API key is ever in the page. The page is static HTML, CSS and JavaScript
served from `custody/console/` (no build step, nothing from another host).
"""
from __future__ import annotations

import base64
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse, HTMLResponse
from pydantic import BaseModel, ConfigDict, Field

from custody.api.deps import Admin, Auditor, ContainerDep, Operator
from custody.api.errors import ApiError
from custody.api.params import IdPath
from custody.api.withdrawal_routes import ApprovalSignatureIn, signature_of
from custody.console import views
from custody.console.auth import COOKIE, ConsoleAuth, ConsoleSession, CredentialView
from custody.controls import audit, kill_switch
from custody.errors import CustodyError, CustodyErrorCode
from custody.incidents import Incidents
from signer.approvals import b64url, webauthn_challenge

router = APIRouter(prefix="/console", include_in_schema=False)
HERE = Path(__file__).resolve().parents[1] / "console"
ASSETS = {"console.js": "text/javascript", "console.css": "text/css"}
# The page's Content-Security-Policy: only its own scripts, styles and connections; never framed.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
                    "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}


class UsernameIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    username: str = Field(min_length=1, max_length=64)


class CredentialIn(BaseModel):
    """What `navigator.credentials.create()` / `.get()` answered, as JSON (binary fields base64url)."""

    model_config = ConfigDict(extra="forbid")
    credential: dict[str, Any]


Role = Literal["operator", "auditor", "admin"]


class EnrolmentDecisionIn(BaseModel):
    """The role, and the approving admin's WebAuthn assertion over the credential's activation
    payload (`GET .../activation-payload?role=`): required for an operator's key to get an approver
    entry (custody.console.auth)."""

    model_config = ConfigDict(extra="forbid")
    role: Role
    activation: ApprovalSignatureIn | None = None


class NoteIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str = Field(min_length=1, max_length=1000)


def _auth(c) -> ConsoleAuth:
    return ConsoleAuth(c.engine, c.settings)


def _credential_out(v: CredentialView) -> dict:
    return {"id": v.id, "username": v.username, "role": v.role, "state": v.state, "fingerprint": v.fingerprint,
            "key_id": v.key_id, "requested_at": v.requested_at.isoformat(), "decided_by": v.decided_by,
            "decided_at": v.decided_at.isoformat() if v.decided_at else None,
            "last_used_at": v.last_used_at.isoformat() if v.last_used_at else None, "enrolled_by": v.enrolled_by,
            "activated_by_key": v.activated_by_key}


def _session_out(s: ConsoleSession) -> dict:
    return {"username": s.username, "role": s.role.value, "csrf_token": s.csrf, "key_id": s.key_id,
            "expires_at": s.expires_at.isoformat(), "idle_seconds": s.idle_seconds}


@router.get("")
def page() -> HTMLResponse:
    return HTMLResponse((HERE / "index.html").read_text(), headers=SECURITY_HEADERS)


@router.get("/assets/{name}")
def asset(name: str) -> FileResponse:
    if name not in ASSETS:
        raise ApiError(404, "not_found", "no such console asset")
    return FileResponse(HERE / name, media_type=ASSETS[name], headers=SECURITY_HEADERS)


@router.post("/enrol/options")
def enrol_options(body: UsernameIn, c: ContainerDep) -> dict:
    return _auth(c).enrol_options(body.username)


@router.post("/enrol", status_code=201)
def enrol(body: CredentialIn, request: Request, c: ContainerDep) -> dict:
    """A new pending credential; made from a signed-in browser, its session's user is recorded as the
    enroller, who may not approve it (README: R15-3)."""
    auth = _auth(c)
    enrolled_by = None
    if request.cookies.get(COOKIE):
        try:
            enrolled_by = auth.session(request.cookies.get(COOKIE)).username
        except CustodyError:
            enrolled_by = None  # an ended session: nobody is signed in
    return _credential_out(auth.enrol(body.credential, enrolled_by=enrolled_by))


@router.post("/sign-in/options")
def sign_in_options(body: UsernameIn, c: ContainerDep) -> dict:
    return _auth(c).sign_in_options(body.username)


@router.post("/sign-in")
def sign_in(body: CredentialIn, c: ContainerDep, response: Response) -> dict:
    auth = _auth(c)
    token, session = auth.sign_in(body.credential)
    response.set_cookie(COOKIE, token, max_age=c.settings.console_session_max_seconds, path="/", httponly=True,
                        samesite="strict", secure=auth.secure_cookie)
    return _session_out(session)


@router.get("/session")
def session(request: Request, c: ContainerDep) -> dict:
    """Who is signed in, with which role, and the session's CSRF token (for the page's state changes)."""
    return _session_out(_auth(c).session(request.cookies.get(COOKIE)))


@router.post("/sign-out")
def sign_out(request: Request, c: ContainerDep, response: Response) -> dict:
    auth = _auth(c)
    token = request.cookies.get(COOKIE)
    auth.session(token)
    auth.check_csrf(token, request.headers.get("X-CSRF-Token"))
    auth.sign_out(token)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict", secure=auth.secure_cookie)
    return {"signed_out": True}


# ---- read models -----------------------------------------------------------------------------

@router.get("/api/queue")
def queue(c: ContainerDep, who: Auditor) -> list[dict]:
    return views.approval_queue(c.engine, f"api:{who.name}")


@router.get("/api/audit")
def audit_trail(c: ContainerDep, _: Auditor, q: Annotated[str | None, Query(max_length=200)] = None,
                before: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
                limit: Annotated[int, Query(ge=1, le=200)] = 50) -> dict:
    rows, next_before = views.audit_trail(c.engine, q=q, before_id=before, limit=limit)
    return {"events": rows, "next_before": next_before}


@router.get("/api/balances")
def balances(c: ContainerDep, _: Auditor) -> list[dict]:
    return views.balances(c.engine)


@router.get("/api/reconciliation")
def reconciliation(c: ContainerDep, _: Auditor) -> list[dict]:
    return views.reconciliation(c.engine)


@router.get("/api/quarantine")
def quarantine(c: ContainerDep, _: Auditor) -> list[dict]:
    return views.quarantine(c.engine)


@router.get("/api/payouts")
def payouts(c: ContainerDep, _: Auditor) -> dict:
    return views.payouts(c.engine)


@router.get("/api/kill-switch")
def kill_switch_state(c: ContainerDep, _: Auditor) -> dict:
    ks = kill_switch(c.engine)
    return {"engaged": ks.engaged, "reason": ks.reason, "changed_by": ks.changed_by,
            "backlog": views.kill_switch_backlog(c.engine)}


@router.post("/api/incidents/{incident_id}/ack")
def acknowledge_incident(incident_id: IdPath, body: NoteIn, c: ContainerDep, who: Operator) -> dict:
    """An operator takes an open incident (recorded in the audit log as `incident.acknowledge`)."""
    incident = next((i for i in Incidents(c.engine, c.ledger).list(open_only=False, before_id=incident_id + 1, limit=1)
                     if i.id == incident_id), None)
    if incident is None:
        raise CustodyError(CustodyErrorCode.incident_not_found, f"no incident {incident_id}")
    with c.engine.begin() as conn:
        audit(conn, f"api:{who.name}", "incident.acknowledge", f"incident:{incident_id}", {"note": body.note})
    return {"incident_id": incident_id, "acknowledged_by": f"api:{who.name}", "note": body.note}


# ---- enrolments (admins: a console session or an admin API key) -------------------------------

@router.get("/api/credentials")
def credentials(c: ContainerDep, _: Admin, state: Literal["pending", "active", "revoked"] | None = None) -> list[dict]:
    return [_credential_out(v) for v in _auth(c).credentials(state=state)]


@router.get("/api/credentials/{credential_id}/activation-payload")
def activation_payload(credential_id: IdPath, role: Role, c: ContainerDep, _: Admin) -> dict:
    """What the approving admin's authenticator signs (challenge: SHA-256 of the bytes)."""
    payload = _auth(c).activation(credential_id, role)
    return {"payload": payload.decode("utf-8"), "payload_base64": base64.b64encode(payload).decode("ascii"),
            "challenge": b64url(webauthn_challenge(payload))}


@router.post("/api/credentials/{credential_id}/approve")
def approve_enrolment(credential_id: IdPath, body: EnrolmentDecisionIn, c: ContainerDep, who: Admin) -> dict:
    return _credential_out(_auth(c).decide_enrolment(credential_id, decision="approve", role=body.role, by=who.name,
                                                     activation=signature_of(body.activation)))


@router.post("/api/credentials/{credential_id}/revoke")
def revoke_credential(credential_id: IdPath, c: ContainerDep, who: Admin) -> dict:
    """Revoked: its sessions end and custody refuses its approvals; its `[[approvers]]` entry must
    still be removed from the signer's and custody's configuration (the answer's `next_step`)."""
    out = _credential_out(_auth(c).decide_enrolment(credential_id, decision="revoke", role=None, by=who.name))
    return {**out, "next_step": f"remove the [[approvers]] entry key_id = {out['key_id']!r} (and any CONSOLE_ADMINS entry) "
                                "from the signer's and custody's configuration and restart both"}


@router.get("/api/credentials/{credential_id}/approver-entry")
def approver_entry(credential_id: IdPath, c: ContainerDep, _: Admin) -> dict:
    """The credential's entry for configuration, its fingerprint and what vouches for it (custody.console.auth)."""
    return _auth(c).approver_entry(credential_id)
