"""Treasury adjustments: the one way a person moves firm money in the books (maker-checker).

Firm accounts (equity, asset locations, in-flight, suspense, quarantine, fee income, ...) are
debited only by the subsystem that owns them or by an adjustment: a journal entry proposed by one
operator with a written reason, and posted only when `quorum` OTHER operators approved exactly that
content. It is also how a subsystem's transaction is corrected (never reversed over the API).

Guarantees:
- the proposal is stored with its exact legs (accounts, minor-unit amounts) before anyone votes;
  what is posted is exactly that, under the key `treasury-adjustment:<id>`, kind
  `treasury_adjustment`, with the reason, proposer and approvers in its metadata;
- the proposer never approves; each operator votes once; the quorum is fixed at proposal time;
  operators are compared as one identity across forms and letter case
  (signer.approvals.operator_identity: `api:Anna`, `anna` and `ANNA` are one person), so a second
  API key or console enrolment under a case variant of a name neither approves its own proposal
  nor votes twice;
- the posting happens in the same database transaction as the vote that completes the quorum: if
  the ledger refuses it (insufficient funds, a limit, a closed account), nothing is written and the
  approver gets the ledger's code; one rejection by any operator (the proposer included, to
  withdraw it) ends it;
- an adjustment that touches an asset-location or in-flight account (books of money on chain)
  opens a critical incident when posted, which halts withdrawals until reconciliation confirms the
  books and an admin lifts the kill switch;
- every step is in the audit log; a posted adjustment emits `treasury.adjustment_posted`.

Codes, in the order they are checked: `invalid_request` (no reason, no legs), the ledger's
`invalid_amount` / `accounts_must_be_different` / `account_not_found` / `asset_mismatch` /
`transaction_not_found`, `idempotency_conflict` (the key was used for other content),
`adjustment_not_found`, `invalid_state` (already posted or rejected), `proposer_cannot_approve`,
`already_acted`, then whatever the ledger answers when posting.
"""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sqlalchemy import Connection, Engine, text

from custody.controls import audit, emit, open_incident
from custody.errors import CustodyError, CustodyErrorCode
from custody.states import advance
from ledger.errors import ErrorCode, LedgerError
from ledger.model import AccountKind, Transfer, validate_transfers
from ledger.service import Ledger
from signer.approvals import operator_identity

MAX_LEGS = 100
# Kinds whose balance mirrors coins on chain: adjusting them changes what reconciliation expects.
ON_CHAIN_KINDS = frozenset({AccountKind.asset_location, AccountKind.in_flight})


@dataclass(frozen=True)
class AdjustmentView:
    id: int
    state: str
    proposed_by: str
    reason: str
    legs: tuple[Transfer, ...]
    corrects_transaction_id: int | None
    quorum: int
    approved_by: tuple[str, ...]
    rejected_by: str | None
    transaction_id: int | None
    created_at: dt.datetime
    created: bool = True  # False: the proposal was made before under the same key


class TreasuryAdjustments:
    def __init__(self, engine: Engine, ledger: Ledger, *, quorum: int) -> None:
        if quorum < 1:
            raise ValueError("a treasury adjustment needs at least one approver besides its proposer")
        self.engine = engine
        self.ledger = ledger
        self.quorum = quorum

    def propose(self, key: str, *, by: str, reason: str, legs: Sequence[Transfer],
                corrects_transaction_id: int | None = None) -> AdjustmentView:
        """Store a proposal (idempotent per `key`); nothing moves until the quorum approves."""
        if not reason.strip():
            raise LedgerError(ErrorCode.invalid_request, "an adjustment needs a reason")
        if len(legs) > MAX_LEGS:
            raise LedgerError(ErrorCode.invalid_request, f"at most {MAX_LEGS} legs per adjustment")
        validate_transfers(legs)
        for i, leg in enumerate(legs):
            debit, credit = self.ledger.get_account(leg.debit_account_id), self.ledger.get_account(leg.credit_account_id)
            if debit.asset != credit.asset:
                raise LedgerError(ErrorCode.asset_mismatch, index=i)
        if corrects_transaction_id is not None:
            self.ledger.transaction_key(corrects_transaction_id)  # exists, or transaction_not_found
        content = _legs_json(legs)
        with self.engine.begin() as c:
            row = c.execute(
                text("INSERT INTO treasury_adjustment (idempotency_key, proposed_by, reason, transfers, "
                     "corrects_transaction_id, quorum, state) "
                     "VALUES (:k, :by, :r, CAST(:t AS jsonb), :corr, :q, 'proposed') "
                     "ON CONFLICT (idempotency_key) DO NOTHING RETURNING id"),
                {"k": key, "by": by, "r": reason, "t": content, "corr": corrects_transaction_id, "q": self.quorum},
            ).first()
            if row is None:
                existing = self._load(c, key=key)
                if (existing.proposed_by, existing.reason, existing.legs, existing.corrects_transaction_id) != (
                        by, reason, tuple(legs), corrects_transaction_id):
                    raise LedgerError(ErrorCode.idempotency_conflict, "the key was used for another adjustment")
                return replace(existing, created=False)
            audit(c, by, "adjustment.propose", f"adjustment:{row.id}",
                  {"reason": reason, "legs": json.loads(content), "corrects": corrects_transaction_id})
            return self._load(c, adjustment_id=row.id)

    def approve(self, adjustment_id: int, *, by: str, comment: str) -> AdjustmentView:
        """Record `by`'s approval; the approval that completes the quorum posts the adjustment."""
        with self.engine.begin() as c:
            current = self._lock(c, adjustment_id)
            if operator_identity(current.proposed_by) == operator_identity(by):
                raise CustodyError(CustodyErrorCode.proposer_cannot_approve,
                                   "the operator who proposed an adjustment may not approve it")
            self._vote(c, current, by, "approve", comment)
            approvers = (*current.approved_by, by)
            if len(approvers) >= current.quorum:
                self._post(c, current, approvers)
            return self._load(c, adjustment_id=adjustment_id)

    def reject(self, adjustment_id: int, *, by: str, comment: str) -> AdjustmentView:
        """End a proposal unposted (any operator, the proposer included)."""
        with self.engine.begin() as c:
            current = self._lock(c, adjustment_id)
            self._vote(c, current, by, "reject", comment)
            advance(c, "adjustment", adjustment_id, "proposed", "rejected")
            return self._load(c, adjustment_id=adjustment_id)

    def get(self, adjustment_id: int) -> AdjustmentView:
        with self.engine.connect() as c:
            return self._load(c, adjustment_id=adjustment_id)

    def list(self, *, state: str | None = None, before_id: int | None = None, limit: int = 200) -> list[AdjustmentView]:
        """Adjustments newest first, below `before_id` when given (the next page of a walk)."""
        with self.engine.connect() as c:
            ids = c.execute(
                text("SELECT id FROM treasury_adjustment WHERE (CAST(:s AS text) IS NULL OR state = :s) "
                     "AND (CAST(:b AS bigint) IS NULL OR id < :b) "
                     "ORDER BY id DESC LIMIT :l"),
                {"s": state, "b": before_id, "l": limit},
            ).scalars().all()
            return [self._load(c, adjustment_id=i) for i in ids]

    # ---- steps ----------------------------------------------------------------------------

    def _lock(self, c: Connection, adjustment_id: int) -> AdjustmentView:
        found = c.execute(text("SELECT id FROM treasury_adjustment WHERE id = :i FOR UPDATE"), {"i": adjustment_id}).first()
        if found is None:
            raise CustodyError(CustodyErrorCode.adjustment_not_found, f"no treasury adjustment {adjustment_id}")
        current = self._load(c, adjustment_id=adjustment_id)
        if current.state != "proposed":
            raise CustodyError(CustodyErrorCode.invalid_state, f"adjustment {adjustment_id} is {current.state}")
        return current

    @staticmethod
    def _vote(c: Connection, current: AdjustmentView, by: str, decision: str, comment: str) -> None:
        if not comment.strip():
            raise LedgerError(ErrorCode.invalid_request, "a vote needs a comment")
        voters = c.execute(text("SELECT operator FROM treasury_adjustment_vote WHERE adjustment_id = :i"),
                           {"i": current.id}).scalars().all()
        if operator_identity(by) in {operator_identity(v) for v in voters}:
            raise CustodyError(CustodyErrorCode.already_acted, f"{by} already voted on adjustment {current.id}")
        inserted = c.execute(
            text("INSERT INTO treasury_adjustment_vote (adjustment_id, operator, decision, comment) "
                 "VALUES (:i, :o, :d, :c) ON CONFLICT DO NOTHING"),
            {"i": current.id, "o": by, "d": decision, "c": comment},
        ).rowcount
        if not inserted:
            raise CustodyError(CustodyErrorCode.already_acted, f"{by} already voted on adjustment {current.id}")
        audit(c, by, f"adjustment.{decision}", f"adjustment:{current.id}", {"comment": comment})

    def _post(self, c: Connection, current: AdjustmentView, approvers: tuple[str, ...]) -> None:
        metadata = {"adjustment_id": current.id, "reason": current.reason, "proposed_by": current.proposed_by,
                    "approved_by": list(approvers), "corrects_transaction_id": current.corrects_transaction_id}
        result = self.ledger.post(f"treasury-adjustment:{current.id}", current.legs, kind="treasury_adjustment",
                                  metadata=metadata, conn=c)
        advance(c, "adjustment", current.id, "proposed", "posted", transaction_id=result.transaction_id)
        audit(c, "custody", "adjustment.post", f"adjustment:{current.id}", {"transaction_id": result.transaction_id})
        emit(c, "treasury.adjustment_posted", f"adjustment:{current.id}",
             {"adjustment_id": current.id, "transaction_id": result.transaction_id},
             aggregate=f"adjustment:{current.id}")
        touched = {self.ledger.get_account(i, conn=c) for leg in current.legs
                   for i in (leg.debit_account_id, leg.credit_account_id)}
        on_chain = sorted(a.name for a in touched if a.kind in ON_CHAIN_KINDS)
        if on_chain:
            open_incident(c, "treasury_adjustment_on_chain_books", f"adjustment:{current.id}",
                          {"adjustment_id": current.id, "accounts": on_chain, "reason": current.reason})

    @staticmethod
    def _load(c: Connection, *, adjustment_id: int | None = None, key: str | None = None) -> AdjustmentView:
        row = c.execute(
            text("SELECT a.*, "
                 "coalesce(array_agg(v.operator ORDER BY v.created_at, v.operator) "
                 "         FILTER (WHERE v.decision = 'approve'), '{}') AS approvers, "
                 "max(v.operator) FILTER (WHERE v.decision = 'reject') AS rejecter "
                 "FROM treasury_adjustment a LEFT JOIN treasury_adjustment_vote v ON v.adjustment_id = a.id "
                 "WHERE a.id = :i OR a.idempotency_key = :k GROUP BY a.id"),
            {"i": adjustment_id, "k": key},
        ).first()
        if row is None:
            raise CustodyError(CustodyErrorCode.adjustment_not_found, f"no treasury adjustment {adjustment_id}")
        legs = tuple(Transfer(int(t["debit_account_id"]), int(t["credit_account_id"]), int(t["amount"]))
                     for t in row.transfers)
        return AdjustmentView(row.id, row.state, row.proposed_by, row.reason, legs, row.corrects_transaction_id,
                              row.quorum, tuple(row.approvers), row.rejecter, row.transaction_id, row.created_at)


def _legs_json(legs: Sequence[Transfer]) -> str:
    return json.dumps([{"debit_account_id": t.debit_account_id, "credit_account_id": t.credit_account_id,
                        "amount": str(t.amount)} for t in legs])
