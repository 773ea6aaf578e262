"""An operator resolves an incident: with a comment, audited, once.

Guarantees:
- an incident is resolved exactly once (`resolved_at`, `resolved_by`, `resolution`); a second
  resolution is refused with `invalid_state`;
- an incident that froze money (a hold recorded in its detail, e.g. the reorged-out credit of
  `custody.deposits`) needs a decision: `release` gives the held amount back to the customer,
  `capture` moves it to the account the incident names (suspense), so the books recover the
  shortfall; the ledger effect commits with the resolution, or neither does;
- `capture` is refused when the shortfall is no longer booked (the deposit was re-mined and its
  compensation reversed): custody never takes a customer's money for a loss that did not happen;
- an incident without a hold takes no decision;
- resolving does not release the kill switch: that stays an admin's separate act.

Which decision applies is decided by `resolution_plan`, a pure function of the incident's record.
"""
from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, text

from custody.controls import audit
from custody.errors import CustodyError, CustodyErrorCode
from ledger.errors import ErrorCode, LedgerError
from ledger.model import Transfer
from ledger.service import Ledger

DECISIONS = ("release", "capture")


@dataclass(frozen=True)
class IncidentView:
    id: int
    kind: str
    severity: str
    detail: dict[str, Any]
    opened_at: dt.datetime
    resolved_at: dt.datetime | None
    resolved_by: str | None
    resolution: dict[str, Any] | None


def resolution_plan(detail: dict[str, Any], decision: str | None, *, shortfall_reversed: bool) -> str | None:
    """The ledger action a resolution takes (`release`, `capture` or None), or raise
    incident_decision_invalid when `decision` does not fit the incident."""
    hold = detail.get("hold") or {}
    if hold.get("id") is None:
        if decision is not None:
            raise CustodyError(CustodyErrorCode.incident_decision_invalid, "this incident holds nothing: resolve it without a decision")
        return None
    if decision not in DECISIONS:
        raise CustodyError(CustodyErrorCode.incident_decision_invalid,
                           "this incident holds money: decide release (to the customer) or capture (to suspense)")
    if decision == "capture" and shortfall_reversed:
        raise CustodyError(CustodyErrorCode.incident_decision_invalid,
                           "the shortfall was reversed (the deposit was re-mined): release the hold instead")
    return decision


class Incidents:
    def __init__(self, engine: Engine, ledger: Ledger) -> None:
        self.engine = engine
        self.ledger = ledger

    def resolve(self, incident_id: int, *, operator: str, comment: str, decision: str | None = None) -> IncidentView:
        if not operator or not comment or not comment.strip():
            raise LedgerError(ErrorCode.invalid_request, "an operator and a comment are required")
        with self.engine.begin() as c:
            row = c.execute(text(f"{_INCIDENT_SQL} WHERE id = :i FOR UPDATE"), {"i": incident_id}).first()
            if row is None:
                raise CustodyError(CustodyErrorCode.incident_not_found, f"no incident {incident_id}")
            incident = _view(row)
            if incident.resolved_at is not None:
                raise CustodyError(CustodyErrorCode.invalid_state, f"incident {incident_id} was resolved by {incident.resolved_by}",
                                   state="resolved")
            action = resolution_plan(incident.detail, decision, shortfall_reversed=_reversed(c, incident.detail))
            effect = self._apply(c, incident, action) if action else {}
            resolution = {"decision": action, "comment": comment, **effect}
            c.execute(text("UPDATE incident SET resolved_at = now(), resolved_by = :o, resolution = CAST(:r AS jsonb) WHERE id = :i"),
                      {"o": operator, "r": json.dumps(resolution), "i": incident_id})
            audit(c, operator, "incident.resolve", f"incident:{incident_id}", {"kind": incident.kind, **resolution})
            return _view(c.execute(text(f"{_INCIDENT_SQL} WHERE id = :i"), {"i": incident_id}).one())

    def _apply(self, c: Connection, incident: IncidentView, action: str) -> dict[str, Any]:
        hold_record = incident.detail["hold"]
        hold = self.ledger.get_hold(int(hold_record["id"]), conn=c)
        if action == "release":
            self.ledger.release_hold(hold.id, owner=hold_record["owner"], conn=c)
            return {"released": str(hold.remaining)}
        remaining = hold.remaining
        tx = self.ledger.capture_hold(f"incident:{incident.id}:capture", hold.id,
                                      [Transfer(hold.account_id, int(hold_record["capture_to"]), remaining)],
                                      owner=hold_record["owner"], final=True, kind="incident_recovery",
                                      metadata={"incident_id": incident.id}, conn=c)
        return {"captured": str(remaining), "transaction_id": tx.transaction_id}


_INCIDENT_SQL = "SELECT id, kind, severity, detail, opened_at, resolved_at, resolved_by, resolution FROM incident"


def _reversed(c: Connection, detail: dict[str, Any]) -> bool:
    """Was the shortfall this incident booked reversed since (the deposit re-mined)?"""
    booked = detail.get("suspense_transaction_id")
    if booked is None:
        return False
    return c.execute(text("SELECT 1 FROM journal_transaction WHERE reverses_id = :t"), {"t": int(booked)}).first() is not None


def _view(row) -> IncidentView:
    return IncidentView(row.id, row.kind, row.severity, dict(row.detail or {}), row.opened_at, row.resolved_at, row.resolved_by,
                        dict(row.resolution) if row.resolution is not None else None)
