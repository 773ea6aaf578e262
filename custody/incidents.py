"""An operator resolves an incident: with a comment, audited, once.

Guarantees:
- an incident is resolved exactly once (`resolved_at`, `resolved_by`, `resolution`); a second
  resolution is refused with `invalid_state`;
- an incident that froze money (a hold recorded in its detail, e.g. the reorged-out credit of
  `custody.deposits`), or that names a remainder of the credit custody could not hold, needs a
  decision: `release` gives the held amount back to the customer, `capture` moves it to the account
  the incident names (suspense), and with it the whole remainder, so the books recover the
  shortfall; the ledger effect commits with the resolution, or neither does;
- a `capture` takes the whole remainder or nothing: first it ends what hides the remainder — the
  resting orders of the account's owner are cancelled (through matching, before the resolution's
  transaction, each audited) and the API callers' pending holds on the account are released (in
  the resolution's transaction, listed in `released_holds`): an API caller could otherwise keep
  the credit out of the operator's reach forever just by never releasing its hold; if the
  remainder is still not available (a hold of another subsystem), the capture is refused
  (`incident_remainder_held`, the holds named in the detail) and the incident stays unresolved, so
  the account stays frozen. A capture "as far as available" would end the freeze with part of the
  credit still hidden, and the backend, keeping its hold until then, would release it and move the
  credit away;
- while such an incident is unresolved and its remainder is above zero, the account is frozen
  (`frozen_accounts`): no API posting debits it, no API hold is placed or captured on it, no
  withdrawal is requested, approved or batched from it, no order of its owner is placed or
  amended (`account_frozen`, `refuse_frozen`), and matching evicts a resting order that would
  debit it before anything trades with it, and does not activate a stop of it that fires
  (`matching.service.Trading.blocked_accounts`), so the part of the credit that an earlier hold
  hid from the freeze cannot be released and moved away; the deposit re-mined lifts this. The
  freeze itself rejects the account's withdrawals not batched yet before it reads what is
  available (`custody.withdrawals.reject_for_reorg`), so their holds hide nothing;
- `capture` is refused when the shortfall is no longer booked (the deposit was re-mined and its
  compensation reversed): custody never takes a customer's money for a loss that did not happen;
  a capture made before the deposit is re-mined is given back when it is (`give_back_captures`);
- an incident without a hold or a remainder takes no decision;
- resolving does not release the kill switch: that stays an admin's separate act.

Which decision applies is decided by `resolution_plan`, a pure function of the incident's record;
whether a capture may take the remainder now by `hidden_remainder`.
"""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Connection, Engine, text

from custody.controls import audit
from custody.errors import CustodyError, CustodyErrorCode
from ledger.errors import ErrorCode, LedgerError
from ledger.model import Transfer
from ledger.service import Ledger, Precheck, StatementPrecheck

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
    if hold.get("id") is None and _remainder(detail) == 0:
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


def hidden_remainder(remainder: int, available: int) -> int:
    """How much of an incident's remainder a capture could not take now (still behind other holds
    on the account). A capture takes the whole remainder or is refused while this is above zero: a
    partial capture would end the freeze with the rest still hidden (see the guarantees above)."""
    return max(0, remainder - max(0, available))


class Incidents:
    def __init__(self, engine: Engine, ledger: Ledger) -> None:
        self.engine = engine
        self.ledger = ledger

    def _cancel_hiding_orders(self, incident_id: int, operator: str, cancel_order: Callable[[str, str, str], object]) -> None:
        """Cancel resting orders (holds owned by `matching:<symbol>`, referenced by order id) on the
        account an unresolved freeze names, newest first and only while the remainder is still
        hidden (the balance may cover it by now), each in matching's own transaction, audited.
        Nothing is cancelled unless a capture is valid now (the account frozen, the shortfall still
        booked). Done before the resolution: cancelling a frozen owner's orders is harmless if the
        capture then fails for another reason."""
        with self.engine.connect() as c:
            row = c.execute(text(f"{_INCIDENT_SQL} WHERE id = :i"), {"i": incident_id}).first()
            if row is None or row.resolved_at is not None:
                return  # resolve() answers not found / already resolved
            detail = _view(row).detail
            hold_record = detail.get("hold") or {}
            remainder = _remainder(detail)
            if not hold_record.get("account_id") or remainder <= 0:
                return
            account = int(hold_record["account_id"])
            try:
                resolution_plan(detail, "capture", shortfall_reversed=_reversed(c, detail))
            except CustodyError:
                return  # resolve() refuses the capture: cancel nothing
            if account not in frozen_accounts(c, [account]):
                return
            available = self.ledger.balance(account, conn=c).available
            orders = [h for h in c.execute(text(_OTHER_HOLDS_SQL), {"a": account, "o": hold_record.get("owner", "")})
                      if h.owner.startswith(MATCHING_HOLD_OWNER_PREFIX)]
        owner = self.ledger.get_account(account).owner or ""
        for h in reversed(orders):  # newest first
            if hidden_remainder(remainder, available) == 0:
                break
            symbol = h.owner[len(MATCHING_HOLD_OWNER_PREFIX):]
            cancel_order(symbol, owner, h.reference)
            available = self.ledger.balance(account).available
            with self.engine.begin() as c:
                audit(c, operator, "incident.cancel_order", f"incident:{incident_id}",
                      {"symbol": symbol, "order_id": h.reference, "hold_id": h.id})

    def resolve(self, incident_id: int, *, operator: str, comment: str, decision: str | None = None,
                cancel_order: Callable[[str, str, str], object] | None = None) -> IncidentView:
        """Resolve an incident. `cancel_order(symbol, owner, order_id)` (the matching service's
        cancel) lets a capture end the resting orders whose holds hide the remainder."""
        if not operator or not comment or not comment.strip():
            raise LedgerError(ErrorCode.invalid_request, "an operator and a comment are required")
        if decision == "capture" and cancel_order is not None:
            self._cancel_hiding_orders(incident_id, operator, cancel_order)
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

    def list(self, *, open_only: bool = True, before_id: int | None = None, limit: int = 500) -> list[IncidentView]:
        """Incidents newest first (only unresolved ones with `open_only`), below `before_id` when
        given (the next page of a walk)."""
        with self.engine.connect() as c:
            rows = c.execute(text(f"{_INCIDENT_SQL} "
                                  "WHERE (NOT :o OR resolved_at IS NULL) "
                                  "AND (CAST(:b AS bigint) IS NULL OR id < :b) "
                                  "ORDER BY id DESC LIMIT :l"),
                             {"o": open_only, "b": before_id, "l": limit}).all()
        return [_view(r) for r in rows]

    def _apply(self, c: Connection, incident: IncidentView, action: str) -> dict[str, Any]:
        hold_record = incident.detail["hold"]
        hold = self.ledger.get_hold(int(hold_record["id"]), conn=c) if hold_record.get("id") is not None else None
        if action == "release":
            if hold is not None:
                self.ledger.release_hold(hold.id, owner=hold_record["owner"], conn=c)
            return {"released": str(hold.remaining if hold is not None else 0)}
        effect: dict[str, Any] = {"captured": "0", "transaction_id": None}
        if hold is not None:
            tx = self.ledger.capture_hold(f"incident:{incident.id}:capture", hold.id,
                                          [Transfer(hold.account_id, int(hold_record["capture_to"]), hold.remaining)],
                                          owner=hold_record["owner"], final=True, kind="incident_recovery",
                                          metadata={"incident_id": incident.id}, conn=c)
            effect = {"captured": str(hold.remaining), "transaction_id": tx.transaction_id}
        remainder = _remainder(incident.detail)
        if remainder > 0:  # what an earlier hold hid from the freeze: all of it, or nothing yet
            account = int(hold_record["account_id"])
            headroom = self.ledger.lock_available([account], conn=c).get(account)
            available = headroom.available if headroom else 0
            released = []
            for h in reversed(c.execute(text(_OTHER_HOLDS_SQL), {"a": account, "o": hold_record["owner"]}).all()):
                if hidden_remainder(remainder, available) == 0:
                    break  # newest first, and only what the remainder needs
                if h.owner.startswith(API_HOLD_OWNER_PREFIX):  # an API caller's: it may never release it
                    self.ledger.release_hold(h.id, owner=h.owner, conn=c)
                    available += int(h.remaining)
                    released.append({"id": h.id, "owner": h.owner, "reference": h.reference, "remaining": str(h.remaining)})
            effect["released_holds"] = released
            if hidden_remainder(remainder, available) > 0:
                holds = [{"id": h.id, "owner": h.owner, "reference": h.reference, "remaining": str(h.remaining)}
                         for h in c.execute(text(_OTHER_HOLDS_SQL), {"a": account, "o": hold_record["owner"]})]
                raise CustodyError(CustodyErrorCode.incident_remainder_held,
                                   f"only {available} of the remainder {remainder} is available on account {account}: "
                                   "the rest is behind other holds; the account stays frozen until they are released",
                                   account_id=account, remainder=str(remainder), available=str(available), holds=holds)
            effect["captured_remainder"] = str(remainder)
            tx = self.ledger.post(f"incident:{incident.id}:capture-remainder",
                                  [Transfer(account, int(hold_record["capture_to"]), remainder)], kind="incident_recovery",
                                  metadata={"incident_id": incident.id, "remainder": True}, conn=c)
            effect["remainder_transaction_id"] = tx.transaction_id
        return effect


def refuse_frozen(conn: Connection | Engine, account_ids: Iterable[int]) -> None:
    """Raise account_frozen if any of `account_ids` is frozen by an unresolved reorg incident with a
    remainder (see the guarantees above). Called before an API debit, hold, capture or withdrawal."""
    ids = sorted({int(a) for a in account_ids})
    if not ids:
        return
    if isinstance(conn, Engine):
        with conn.connect() as c:
            return refuse_frozen(c, ids)
    _refuse(conn.execute(text(_FROZEN_SQL), {"a": ids}).first())  # the oldest incident, for the message


def frozen_precheck(account_ids: Iterable[int]) -> Precheck | None:
    """`refuse_frozen` as a ledger `StatementPrecheck` (ledger.service): read in the posting's (or
    hold's) own statement, just before the ledger's function, which then does not run if an
    account is frozen: one round trip, atomic with the posting. None when there is nothing to
    check."""
    ids = sorted({int(a) for a in account_ids})
    if not ids:
        return None
    return StatementPrecheck(_FROZEN_DRIVER_SQL, {"a": ids}, _refuse_row)


def _refuse_row(frozen: dict) -> None:
    """`_refuse` for a StatementPrecheck's row (a dict)."""
    _refuse(SimpleNamespace(**frozen))


def _refuse(frozen: Any) -> None:
    """Raise account_frozen for the first row of _FROZEN_SQL, if there is one."""
    if frozen is not None:
        raise CustodyError(CustodyErrorCode.account_frozen,
                           f"account {frozen.account_id} is frozen: a credit of it was reorged out after finality "
                           f"(incident {frozen.incident_id}); an operator must resolve the incident first",
                           account_id=frozen.account_id, incident_id=frozen.incident_id)


def frozen_accounts(conn: Connection, account_ids: Sequence[int]) -> set[int]:
    """Which of `account_ids` are frozen (see `refuse_frozen`): for the paths that do not raise but
    skip or evict (matching's `blocked_accounts`, the batcher)."""
    ids = sorted({int(a) for a in account_ids})
    if not ids:
        return set()
    return {row.account_id for row in conn.execute(text(_FROZEN_SQL), {"a": ids})}


def give_back_captures(c: Connection, ledger: Ledger, suspense_transaction_id: int, key: str) -> list[int]:
    """The deposit whose shortfall `suspense_transaction_id` booked is on chain again: reverse what
    the resolution of its incident captured from the customer (to suspense), so the customer does
    not pay for a loss that did not happen. Returns the reversals' transaction ids (none when
    nothing was captured); each reversal is posted once (`key` names it)."""
    incident = c.execute(text(_INCIDENT_OF_SHORTFALL_SQL), {"t": suspense_transaction_id}).first()
    if incident is None:
        return []
    given = []
    for suffix in ("capture", "capture-remainder"):
        captured = c.execute(text(_CAPTURE_SQL), {"k": f"incident:{incident.id}:{suffix}"}).first()
        if captured is not None and not captured.reversed:
            given.append(ledger.reverse(captured.id, f"{key}:{suffix}", conn=c).transaction_id)
    return given


_INCIDENT_SQL = "SELECT id, kind, severity, detail, opened_at, resolved_at, resolved_by, resolution FROM incident"

# An unresolved reorg incident with a remainder freezes its account, until the deposit is re-mined
# (its shortfall booking reversed).
_FROZEN_TEMPLATE = """
SELECT i.id AS incident_id,
       (i.detail->'hold'->>'account_id')::bigint AS account_id
FROM incident i
WHERE i.kind = 'deposit_reorged_after_finality'
  AND i.resolved_at IS NULL
  AND (i.detail->'hold'->>'account_id')::bigint = ANY(CAST({ids} AS bigint[]))
  AND coalesce((i.detail->'hold'->>'remainder')::numeric, 0) > 0
  AND NOT EXISTS (SELECT 1 FROM journal_transaction t WHERE t.reverses_id = (i.detail->>'suspense_transaction_id')::bigint)
ORDER BY i.id
"""
_FROZEN_SQL = _FROZEN_TEMPLATE.format(ids=":a")  # SQLAlchemy's parameter style
_FROZEN_DRIVER_SQL = _FROZEN_TEMPLATE.format(ids="%(a)s")  # psycopg's, for frozen_precheck

# The holds on an account other than custody's own freeze (what hides a remainder from a capture).
API_HOLD_OWNER_PREFIX = "api:"  # custody.ledger_access: holds placed over the API
MATCHING_HOLD_OWNER_PREFIX = "matching:"  # matching's order holds: `matching:<symbol>`, reference = order id

_OTHER_HOLDS_SQL = """
SELECT id, owner, reference, amount - captured - released AS remaining
FROM hold
WHERE account_id = :a
  AND state = 'pending'
  AND owner <> :o
ORDER BY id
"""

_INCIDENT_OF_SHORTFALL_SQL = """
SELECT id
FROM incident
WHERE kind = 'deposit_reorged_after_finality'
  AND (detail->>'suspense_transaction_id')::bigint = :t
"""

_CAPTURE_SQL = """
SELECT t.id,
       EXISTS (SELECT 1 FROM journal_transaction r WHERE r.reverses_id = t.id) AS reversed
FROM journal_transaction t
WHERE t.idempotency_key = :k
"""


def _reversed(c: Connection, detail: dict[str, Any]) -> bool:
    """Was the shortfall this incident booked reversed since (the deposit re-mined)?"""
    booked = detail.get("suspense_transaction_id")
    if booked is None:
        return False
    return c.execute(text("SELECT 1 FROM journal_transaction WHERE reverses_id = :t"), {"t": int(booked)}).first() is not None


def _remainder(detail: dict[str, Any]) -> int:
    """The part of a reorged-out credit that custody could not hold (hidden by an earlier hold)."""
    return int((detail.get("hold") or {}).get("remainder") or 0)


def _view(row) -> IncidentView:
    return IncidentView(row.id, row.kind, row.severity, dict(row.detail or {}), row.opened_at, row.resolved_at, row.resolved_by,
                        dict(row.resolution) if row.resolution is not None else None)
