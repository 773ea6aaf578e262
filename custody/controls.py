"""Incidents, the kill switch and the outbox: the operational side effects other jobs share.

- `open_incident` records something an operator must explain; a critical one engages the kill
  switch (`withdrawals_halted`), which every withdrawal path checks first.
- `emit` writes an outbox event in the caller's database transaction, so the event exists exactly
  when the change that caused it committed; the dispatcher delivers it at least once.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, text

from custody.events import event_type

log = logging.getLogger(__name__)
KILL_SWITCH = "withdrawals_halted"
KILL_SWITCH_AGGREGATE = f"control:{KILL_SWITCH}"
DRAIN = "withdrawal_drain"  # engaged when the kill switch is released: the backlog leaves slowly


@dataclass(frozen=True)
class KillSwitch:
    engaged: bool
    reason: str
    changed_by: str


def open_incident(conn: Connection, kind: str, dedupe_key: str, detail: dict, *, severity: str = "critical") -> int:
    """Open an incident once per `dedupe_key`; a critical one engages the kill switch."""
    row = conn.execute(
        text("INSERT INTO incident (kind, severity, dedupe_key, detail) VALUES (:k, :s, :d, CAST(:j AS jsonb)) "
             "ON CONFLICT (dedupe_key) DO NOTHING RETURNING id"),
        {"k": kind, "s": severity, "d": dedupe_key, "j": json.dumps(detail, default=str)},
    ).first()
    incident_id = row.id if row else conn.execute(
        text("SELECT id FROM incident WHERE dedupe_key = :d"), {"d": dedupe_key}).scalar_one()
    if row:
        log.log(logging.ERROR if severity == "critical" else logging.WARNING, "incident %s opened: %s %s", incident_id, kind, detail)
        emit(conn, "incident.opened", f"incident:{incident_id}", {"incident_id": incident_id, "kind": kind, "severity": severity},
             aggregate=f"incident:{incident_id}")
    if severity == "critical":
        set_kill_switch(conn, True, f"incident {incident_id}: {kind}", "system")
    return incident_id


def set_kill_switch(conn: Connection, engaged: bool, reason: str, by: str) -> None:
    """Engage or release the kill switch. Releasing it with approved withdrawals waiting starts the
    outage drain (see custody.payouts). A change of state emits kill_switch.engaged / .released."""
    was = kill_switch(conn).engaged
    drain = False
    if not engaged and was:
        backlog = conn.execute(text("SELECT count(*) FROM withdrawal_request WHERE state = 'approved'")).scalar_one()
        if backlog:
            drain = True
            set_flag(conn, DRAIN, True, f"kill switch released with {backlog} approved withdrawal(s) waiting: {reason}", by)
    conn.execute(
        text("INSERT INTO control_flag (name, engaged, reason, changed_by) VALUES (:n, :e, :r, :b) "
             "ON CONFLICT (name) DO UPDATE SET engaged = :e, reason = :r, changed_by = :b, changed_at = now()"),
        {"n": KILL_SWITCH, "e": engaged, "r": reason, "b": by},
    )
    conn.execute(
        text("INSERT INTO audit_event (actor, action, subject, detail) VALUES (:b, :a, :n, CAST(:j AS jsonb))"),
        {"b": by, "a": "kill_switch.engage" if engaged else "kill_switch.release", "n": KILL_SWITCH,
         "j": json.dumps({"reason": reason})},
    )
    if engaged != was:
        data = {"reason": reason, "changed_by": by, **({} if engaged else {"drain": drain})}
        emit(conn, "kill_switch.engaged" if engaged else "kill_switch.released", None, data, aggregate=KILL_SWITCH_AGGREGATE)


def set_flag(conn: Connection, name: str, engaged: bool, reason: str, by: str) -> None:
    conn.execute(
        text("INSERT INTO control_flag (name, engaged, reason, changed_by) VALUES (:n, :e, :r, :b) "
             "ON CONFLICT (name) DO UPDATE SET engaged = :e, reason = :r, changed_by = :b, changed_at = now()"),
        {"n": name, "e": engaged, "r": reason, "b": by},
    )


def flag(conn: Connection, name: str) -> bool:
    return bool(conn.execute(text("SELECT engaged FROM control_flag WHERE name = :n"), {"n": name}).scalar())


def kill_switch(engine_or_conn: Engine | Connection) -> KillSwitch:
    sql = text("SELECT engaged, reason, changed_by FROM control_flag WHERE name = :n")
    if isinstance(engine_or_conn, Engine):
        with engine_or_conn.connect() as conn:
            row = conn.execute(sql, {"n": KILL_SWITCH}).first()
    else:
        row = engine_or_conn.execute(sql, {"n": KILL_SWITCH}).first()
    return KillSwitch(row.engaged, row.reason, row.changed_by) if row else KillSwitch(False, "", "")


def emit(conn: Connection, topic: str, event_key: str | None, payload: dict, *, aggregate: str) -> bool:
    """Write an outbox event in the caller's transaction (the database function `custody_emit`,
    migration 0026: numbered per `aggregate` in commit order); the same key twice is written once
    (False). No key: `<aggregate>#<its sequence number>`, for state changes with no business id
    of their own. ValueError for a type that is not in custody.events.EVENT_TYPES."""
    version = event_type(topic).version
    return bool(conn.execute(
        text("SELECT custody_emit(:t, :k, :a, :v, CAST(:p AS jsonb))"),
        {"t": topic, "k": event_key, "a": aggregate, "v": version, "p": json.dumps(payload, default=str)},
    ).scalar_one())


def audit(conn: Connection, actor: str, action: str, subject: str, detail: dict) -> None:
    conn.execute(
        text("INSERT INTO audit_event (actor, action, subject, detail) VALUES (:a, :c, :s, CAST(:d AS jsonb))"),
        {"a": actor, "c": action, "s": subject, "d": json.dumps(detail, default=str)},
    )
