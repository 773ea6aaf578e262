"""Convert's operator prices: proposed over the API, signed by an operator, set by the worker.

An operator price is what every convert quote is bounded by (custody.convert.service; migration
0056: a book quote too). So it is set like money is moved: the api process records a proposal and an
operator's signature over it, and only the WORKER makes it count, after verifying the signature
against its own approver keys (the database role custody_api may not call `convert_price_set`).

Flow: `propose` (the api, `POST /v1/convert/prices`) stores a change `proposed`, expiring
`EXPIRY` later; `sign` (the api, `POST /v1/convert/prices/changes/{id}/approve`) verifies an
operator's signature over `payload(change)` (signer.approvals.convert_price_payload) at the door
and stores it (`signed`); `apply_signed` (the worker's `convert-prices` job, as custody_worker)
verifies it again, with the key the signer's own and live, and calls `convert_price_set` in the
signer's name (`applied`), or refuses it (`refused`, with the reason).

Guarantees:
- a price counts only once the worker verified, against its own registry, a signature over the
  change's id, pair, price, proposer and expiry by a live operator's own key; the signature names
  one change, applied at most once and never after its expiry;
- changes of one pair are applied in id order: a signed change older than one already applied for
  the pair is refused (`superseded`), so a withheld signature cannot put an old price back;
- the database makes every inserted change a fresh unsigned proposal expiring within 15 minutes and
  allows the api only `proposed -> signed`, the worker only `signed -> applied | refused` and
  `proposed -> refused` (migration 0056).

States: proposed -> signed -> applied; proposed | signed -> refused (custody.states).

Codes, in the order they are checked. Proposing: `invalid_request` (one asset twice), the ledger's
`invalid_amount` / `asset_not_found`, `idempotency_conflict` (the key proposed another change).
Signing: `price_change_not_found`, `invalid_state` (not `proposed`), `price_change_expired`, then
`approval_signature_required`, `approver_unknown` (also a revoked console key),
`approval_scheme_mismatch`, `approval_signature_invalid`, `approver_not_caller`.
"""
from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, replace

from sqlalchemy import Connection, Engine, text

from custody.controls import audit
from custody.convert.service import check_price
from custody.errors import CustodyError, CustodyErrorCode
from custody.states import advance
from custody.withdrawals import live_approvers, verify_operator_approval
from ledger.errors import ErrorCode, LedgerError
from ledger.service import Ledger
from signer.approvals import (ApprovalInvalid, ApprovalSignature, ApproverRegistry, convert_price_payload,
                              operator_identity, verify_stored_approval)

log = logging.getLogger(__name__)
EXPIRY = dt.timedelta(minutes=10)  # the database caps it at 15 minutes (migration 0056)


@dataclass(frozen=True)
class PriceChangeView:
    id: int
    base_asset: str
    quote_asset: str
    quote_minor_per_base_unit: int
    proposed_by: str
    expires_at: dt.datetime
    state: str
    signed_by: str | None
    refusal: str | None
    created_at: dt.datetime
    created: bool = True  # False: proposed before under the same key


def payload(change: PriceChangeView) -> bytes:
    """The bytes an operator signs for `change` (signer.approvals.convert_price_payload)."""
    return convert_price_payload(change_id=change.id, base_asset=change.base_asset, quote_asset=change.quote_asset,
                                 price_minor=change.quote_minor_per_base_unit, proposed_by=change.proposed_by,
                                 expires_at=change.expires_at)


class PriceChanges:
    def __init__(self, engine: Engine, ledger: Ledger, *, approvers: ApproverRegistry | None = None) -> None:
        self.engine = engine
        self.ledger = ledger
        self.approvers = approvers  # the keys a signature must verify against (None: none counts)

    # ---- the api ---------------------------------------------------------------------------

    def propose(self, key: str, *, by: str, base: str, quote: str, price_minor: int) -> PriceChangeView:
        """Store a proposed price of a pair (idempotent per `key`); it counts once signed and applied."""
        check_price(self.ledger, base, quote, price_minor)
        with self.engine.begin() as c:
            row = c.execute(text(_PROPOSE_SQL), {"k": key, "b": base, "q": quote, "p": price_minor, "by": by,
                                                 "e": EXPIRY.total_seconds()}).first()
            if row is None:
                existing = self._load(c, key=key)
                if (existing.base_asset, existing.quote_asset, existing.quote_minor_per_base_unit,
                        existing.proposed_by) != (base, quote, price_minor, by):
                    raise LedgerError(ErrorCode.idempotency_conflict, "the key proposed another price change")
                return replace(existing, created=False)
            audit(c, by, "convert.price_proposed", f"convert-price-change:{row.id}",
                  {"base_asset": base, "quote_asset": quote, "quote_minor_per_base_unit": str(price_minor)})
            return self._load(c, change_id=row.id)

    def sign(self, change_id: int, *, by: str, comment: str, signature: ApprovalSignature | None) -> PriceChangeView:
        """Record `by`'s signature over the change (verified here; the key must be `by`'s own)."""
        with self.engine.begin() as c:
            current = self._lock(c, change_id)
            if current.state != "proposed":
                raise CustodyError(CustodyErrorCode.invalid_state, f"price change {change_id} is {current.state}")
            if current.expires_at <= _now(c):
                raise CustodyError(CustodyErrorCode.price_change_expired, f"price change {change_id} has expired")
            verify_operator_approval(c, self.approvers, by, payload(current), signature)
            assert signature is not None
            advance(c, "price_change", change_id, "proposed", "signed", signed_by=by, key_id=signature.key_id,
                    scheme=signature.scheme, signature=signature.signature,
                    authenticator_data=signature.authenticator_data, client_data_json=signature.client_data_json)
            audit(c, by, "convert.price_signed", f"convert-price-change:{change_id}", {"key_id": signature.key_id, "comment": comment})
            return self._load(c, change_id=change_id)

    def get(self, change_id: int) -> PriceChangeView:
        with self.engine.connect() as c:
            return self._load(c, change_id=change_id)

    # ---- the worker's job ------------------------------------------------------------------

    def apply_signed(self) -> list[int]:
        """The `convert-prices` job (the worker, as custody_worker): apply every signed change whose
        signature verifies against THIS process's registry, in id order; refuse the others and the
        expired proposals. Returns the ids applied."""
        with self.engine.connect() as c:
            ids = c.execute(text("SELECT id FROM convert_price_change WHERE state IN ('proposed', 'signed') "
                                 "ORDER BY id")).scalars().all()
        applied = []
        for change_id in ids:
            try:
                if self._apply_one(change_id):
                    applied.append(change_id)
            except Exception:  # noqa: BLE001 - one change that cannot be applied holds up no other
                log.exception("convert price change %d not applied; tried again next run", change_id)
        return applied

    def _apply_one(self, change_id: int) -> bool:
        with self.engine.begin() as c:
            current = self._lock(c, change_id)
            if current.state == "proposed":
                if current.expires_at <= _now(c):
                    self._refuse(c, current, "expired unsigned")
                return False
            if current.state != "signed":
                return False
            reason = self._refusal(c, current)
            if reason is not None:
                self._refuse(c, current, reason)
                log.warning("convert price change %d refused: %s", change_id, reason)
                return False
            assert current.signed_by is not None
            c.execute(text(_SET_PRICE_SQL), {"by": current.signed_by, "b": current.base_asset,
                                             "q": current.quote_asset, "p": current.quote_minor_per_base_unit})
            advance(c, "price_change", change_id, "signed", "applied")
            return True

    def _refusal(self, c: Connection, current: PriceChangeView) -> str | None:
        """Why `current` may not be applied now, or None."""
        if current.expires_at <= _now(c):
            return "expired"
        later = c.execute(text(_LATER_APPLIED_SQL), {"i": current.id, "b": current.base_asset,
                                                     "q": current.quote_asset}).first()
        if later is not None:
            return f"superseded by change {later.id}"
        row = c.execute(text("SELECT signed_by, key_id, scheme, signature, authenticator_data, client_data_json "
                             "FROM convert_price_change WHERE id = :i"), {"i": current.id}).one()
        if row.key_id is None or row.signature is None or row.signed_by is None:
            return "no signature"
        try:
            verify_stored_approval(self.approvers, row, payload(current))
        except ApprovalInvalid as exc:
            return exc.code
        if operator_identity(row.signed_by) not in live_approvers(c, self.approvers, [(row.signed_by, row.key_id)]):
            return "approver_not_live"
        return None

    @staticmethod
    def _refuse(c: Connection, current: PriceChangeView, reason: str) -> None:
        advance(c, "price_change", current.id, current.state, "refused", refusal=reason)
        audit(c, "custody", "convert.price_refused", f"convert-price-change:{current.id}", {"reason": reason})

    # ---- rows ------------------------------------------------------------------------------

    def _lock(self, c: Connection, change_id: int) -> PriceChangeView:
        found = c.execute(text("SELECT id FROM convert_price_change WHERE id = :i FOR UPDATE"), {"i": change_id}).first()
        if found is None:
            raise CustodyError(CustodyErrorCode.price_change_not_found, f"no price change {change_id}")
        return self._load(c, change_id=change_id)

    @staticmethod
    def _load(c: Connection, *, change_id: int | None = None, key: str | None = None) -> PriceChangeView:
        row = c.execute(text(_CHANGE_SQL), {"i": change_id, "k": key}).first()
        if row is None:
            raise CustodyError(CustodyErrorCode.price_change_not_found, f"no price change {change_id}")
        return PriceChangeView(row.id, row.base_asset, row.quote_asset, int(row.quote_minor_per_base_unit),
                               row.proposed_by, row.expires_at, row.state, row.signed_by, row.refusal, row.created_at)


def _now(c: Connection) -> dt.datetime:
    return c.execute(text("SELECT now()")).scalar_one()


_PROPOSE_SQL = """
INSERT INTO convert_price_change (request_key, base_asset, quote_asset, quote_minor_per_base_unit, proposed_by, expires_at)
VALUES (:k, :b, :q, :p, :by, now() + make_interval(secs => :e))
ON CONFLICT (request_key) DO NOTHING
RETURNING id
"""

_CHANGE_SQL = """
SELECT id, base_asset, quote_asset, quote_minor_per_base_unit, proposed_by, expires_at, state, signed_by, refusal,
       created_at
FROM convert_price_change
WHERE id = :i OR request_key = :k
"""

_LATER_APPLIED_SQL = """
SELECT id FROM convert_price_change
WHERE state = 'applied'
  AND id > :i
  AND (base_asset, quote_asset) IN ((:b, :q), (:q, :b))
ORDER BY id DESC
LIMIT 1
"""

_SET_PRICE_SQL = "SELECT 1 FROM convert_price_set(:by, :b, :q, :p)"
