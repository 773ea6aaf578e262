"""Treasury adjustments: the one way a person moves firm money in the books (maker-checker).

Firm accounts (equity, asset locations, in-flight, suspense, quarantine, fee income, liquidity,
...) are debited only by the subsystem that owns them or by an adjustment: a journal entry proposed
by one operator with a written reason, and posted only when `quorum` OTHER operators SIGNED exactly
that content. It is also how a subsystem's transaction is corrected (never reversed over the API).

An approval is a signature, not a row (signer.approvals): the operator signs the adjustment's
canonical payload (`adjustment_approval_payload`: id, legs in order, reason, quorum, proposer) with
their own Ed25519 or console WebAuthn key, the schemes withdrawals use. The api process verifies it
at the door and stores it with the vote; the WORKER posts (`post_approved`, the `adjustments` job),
after verifying every stored signature again against its own approver registry. The api process
never posts an adjustment, and its database role (custody_api) may not debit a liquidity account at
all (migration 0051: the liquidity guard lets only custody_worker post an approved adjustment, with
exactly its stored legs), so rows the api writes (proposals, votes, states) move nothing by
themselves.

Guarantees:
- the proposal is stored with its exact legs (accounts, minor-unit amounts) before anyone votes;
  the api role may afterwards change only its state (migration 0051), and what is posted is exactly
  those legs, under the key `treasury-adjustment:<id>`, kind `treasury_adjustment`, with the
  reason, proposer and counted approvers in its metadata;
- the proposer never approves; each operator votes once; the quorum is fixed at proposal time and
  is at least the process's configured one (`max(row, TREASURY_ADJUSTMENT_QUORUM)`); operators are
  compared as one identity across forms and letter case (signer.approvals.operator_identity:
  `api:Anna`, `anna` and `ANNA` are one person), so a second API key or console enrolment under a
  case variant of a name neither approves its own proposal nor votes twice;
- an approval counts (`counted_approvers`, at the door and again in the worker) only while its
  signature verifies over the payload rebuilt from the row with a key of the process's own registry
  that is the voter's own, and a console key only while its credential is active: a forged vote (a
  bad signature, an unknown key, another operator's key, a revoked console key) never counts;
- the approval that completes the quorum moves the adjustment to `approved` after a dry run of its
  posting (`Ledger.check_post`): if the ledger would refuse it (insufficient funds, a limit, a
  closed account), nothing is written and the approver gets the ledger's code. The worker posts an
  approved adjustment whose counted approvals still make the quorum, in one database transaction
  with `approved -> posted`; one that no longer does (a key taken out of the registry or revoked
  since) goes back to `proposed` to wait for more approvals; a posting the ledger refuses now
  leaves it `approved` and is retried at the next run. One rejection by any operator (the proposer
  included, to withdraw it) ends it while it is not posted;
- an adjustment that touches an asset-location or in-flight account (books of money on chain)
  opens a critical incident when posted, which halts withdrawals until reconciliation confirms the
  books and an admin lifts the kill switch;
- every step is in the audit log; a posted adjustment emits `treasury.adjustment_posted`.

States: proposed -> approved -> posted; proposed | approved -> rejected; approved -> proposed
(custody.states, ADJUSTMENT_TRANSITIONS).

Codes, in the order they are checked. Proposing: `invalid_request` (no reason, too many legs), the
ledger's `invalid_amount` / `accounts_must_be_different` / `account_not_found` / `asset_mismatch` /
`transaction_not_found`, `idempotency_conflict` (the key was used for other content). Voting:
`adjustment_not_found`, `invalid_state` (an approval: not `proposed`; a rejection: already posted
or rejected), `proposer_cannot_approve` (an approval), `invalid_request` (no comment), then for an
approval `approval_signature_required`, `approver_unknown` (also a revoked console key),
`approval_scheme_mismatch`, `approval_signature_invalid`, `approver_not_caller`, then
`already_acted`, then whatever the ledger answers to the dry run of the posting.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sqlalchemy import Connection, Engine, text

from custody.controls import audit, emit, open_incident
from custody.errors import CustodyError, CustodyErrorCode
from custody.states import advance
from custody.withdrawals import live_approvers, verify_operator_approval
from ledger.errors import ErrorCode, LedgerError
from ledger.model import AccountKind, Transfer, validate_transfers
from ledger.service import Ledger
from signer.approvals import (ApprovalInvalid, ApprovalSignature, ApproverRegistry, adjustment_approval_payload,
                              operator_identity, verify_stored_approval)

log = logging.getLogger(__name__)
MAX_LEGS = 100
KIND = "treasury_adjustment"  # the journal transaction's kind
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
    approved_by: tuple[str, ...]  # the operators of the stored approving votes (counted or not)
    rejected_by: str | None
    transaction_id: int | None
    created_at: dt.datetime
    created: bool = True  # False: the proposal was made before under the same key


def approval_payload(view: AdjustmentView) -> bytes:
    """The bytes an approver signs for `view` (signer.approvals.adjustment_approval_payload)."""
    return adjustment_approval_payload(
        adjustment_id=view.id, legs=[(t.debit_account_id, t.credit_account_id, t.amount) for t in view.legs],
        reason=view.reason, quorum=view.quorum, proposed_by=view.proposed_by)


class TreasuryAdjustments:
    def __init__(self, engine: Engine, ledger: Ledger, *, quorum: int, approvers: ApproverRegistry | None = None) -> None:
        if quorum < 1:
            raise ValueError("a treasury adjustment needs at least one approver besides its proposer")
        self.engine = engine
        self.ledger = ledger
        self.quorum = quorum
        self.approvers = approvers  # the keys an approval must verify against (None: no approval counts)

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

    def approve(self, adjustment_id: int, *, by: str, comment: str,
                signature: ApprovalSignature | None = None) -> AdjustmentView:
        """Record `by`'s signed approval (verified here against `approvers`: the key must be `by`'s
        own); the one that completes the quorum makes the adjustment `approved` for the worker to
        post, after the ledger's dry run of the posting (module docstring; codes in order there)."""
        with self.engine.begin() as c:
            current = self._lock(c, adjustment_id, ("proposed",))
            if operator_identity(current.proposed_by) == operator_identity(by):
                raise CustodyError(CustodyErrorCode.proposer_cannot_approve,
                                   "the operator who proposed an adjustment may not approve it")
            _require_comment(comment)
            verify_operator_approval(c, self.approvers, by, approval_payload(current), signature)
            self._vote(c, current, by, "approve", comment, signature)
            counted = self.counted_approvers(c, current)
            if len(counted) >= self.required(current):
                refusal = self.ledger.check_post(_key(current), current.legs, kind=KIND, conn=c)
                if refusal is not None:
                    raise refusal  # nothing is written: the vote rolls back with it
                advance(c, "adjustment", current.id, "proposed", "approved")
                audit(c, "custody", "adjustment.approved", f"adjustment:{current.id}", {"approvers": sorted(counted)})
            return self._load(c, adjustment_id=adjustment_id)

    def reject(self, adjustment_id: int, *, by: str, comment: str) -> AdjustmentView:
        """End a proposal unposted (any operator, the proposer included), also once approved."""
        with self.engine.begin() as c:
            current = self._lock(c, adjustment_id, ("proposed", "approved"))
            _require_comment(comment)
            self._vote(c, current, by, "reject", comment)
            advance(c, "adjustment", adjustment_id, current.state, "rejected")
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

    # ---- the worker's job -----------------------------------------------------------------

    def post_approved(self) -> list[int]:
        """The `adjustments` job (the worker, as custody_worker): post every approved adjustment
        whose stored approvals still make its quorum when verified against THIS process's
        registry; one short of it goes back to `proposed`. Each in a database transaction of its
        own; one the ledger refuses now stays approved (logged) and the others go on. Returns the
        ids posted."""
        with self.engine.connect() as c:
            ids = c.execute(text("SELECT id FROM treasury_adjustment WHERE state = 'approved' ORDER BY id")).scalars().all()
        posted = []
        for adjustment_id in ids:
            try:
                if self._post_one(adjustment_id):
                    posted.append(adjustment_id)
            except LedgerError as exc:
                log.warning("treasury adjustment %d not posted (%s); it stays approved and is tried again next run",
                            adjustment_id, exc)
            except Exception:  # noqa: BLE001 - one row that cannot be read or posted holds up no other
                log.exception("treasury adjustment %d not posted; tried again next run", adjustment_id)
        return posted

    def _post_one(self, adjustment_id: int) -> bool:
        with self.engine.begin() as c:
            try:
                current = self._lock(c, adjustment_id, ("approved",))
            except CustodyError:
                return False  # rejected meanwhile
            counted = self.counted_approvers(c, current)
            required = self.required(current)
            if len(counted) < required:
                advance(c, "adjustment", current.id, "approved", "proposed")
                audit(c, "custody", "adjustment.quorum_short", f"adjustment:{current.id}",
                      {"counted": sorted(counted), "required": required, "votes": list(current.approved_by)})
                log.warning("treasury adjustment %d: %d of %d approvals verify against this process's approver keys; "
                            "back to proposed", current.id, len(counted), required)
                return False
            self._post(c, current, sorted(counted))
            return True

    def counted_approvers(self, c: Connection, current: AdjustmentView) -> set[str]:
        """The distinct operators (operator_identity) whose stored approval of `current` counts
        now: its signature verifies over the payload rebuilt from the row with a key of
        `approvers`, the key is the voter's own and (a console key) its credential is active
        (custody.withdrawals.live_approvers); never the proposer."""
        payload = approval_payload(current)
        verified = []
        for v in c.execute(text("SELECT operator, key_id, scheme, signature, authenticator_data, client_data_json "
                                "FROM treasury_adjustment_vote WHERE adjustment_id = :i AND decision = 'approve' "
                                "AND key_id IS NOT NULL AND signature IS NOT NULL"), {"i": current.id}):
            try:
                verify_stored_approval(self.approvers, v, payload)
            except ApprovalInvalid:
                continue
            verified.append((v.operator, v.key_id))
        return live_approvers(c, self.approvers, verified) - {operator_identity(current.proposed_by)}

    def required(self, current: AdjustmentView) -> int:
        """Approvals `current` needs: its own quorum, never fewer than this process's."""
        return max(current.quorum, self.quorum)

    # ---- steps ----------------------------------------------------------------------------

    def _lock(self, c: Connection, adjustment_id: int, states: tuple[str, ...]) -> AdjustmentView:
        found = c.execute(text("SELECT id FROM treasury_adjustment WHERE id = :i FOR UPDATE"), {"i": adjustment_id}).first()
        if found is None:
            raise CustodyError(CustodyErrorCode.adjustment_not_found, f"no treasury adjustment {adjustment_id}")
        current = self._load(c, adjustment_id=adjustment_id)
        if current.state not in states:
            raise CustodyError(CustodyErrorCode.invalid_state, f"adjustment {adjustment_id} is {current.state}")
        return current

    @staticmethod
    def _vote(c: Connection, current: AdjustmentView, by: str, decision: str, comment: str,
              signature: ApprovalSignature | None = None) -> None:
        voters = c.execute(text("SELECT operator FROM treasury_adjustment_vote WHERE adjustment_id = :i"),
                           {"i": current.id}).scalars().all()
        if operator_identity(by) in {operator_identity(v) for v in voters}:
            raise CustodyError(CustodyErrorCode.already_acted, f"{by} already voted on adjustment {current.id}")
        inserted = c.execute(
            text("INSERT INTO treasury_adjustment_vote (adjustment_id, operator, decision, comment, key_id, scheme, "
                 "signature, authenticator_data, client_data_json) "
                 "VALUES (:i, :o, :d, :c, :k, :s, :sig, :ad, :cd) ON CONFLICT DO NOTHING"),
            {"i": current.id, "o": by, "d": decision, "c": comment, "k": signature and signature.key_id,
             "s": signature and signature.scheme, "sig": signature and signature.signature,
             "ad": signature and signature.authenticator_data, "cd": signature and signature.client_data_json},
        ).rowcount
        if not inserted:
            raise CustodyError(CustodyErrorCode.already_acted, f"{by} already voted on adjustment {current.id}")
        audit(c, by, f"adjustment.{decision}", f"adjustment:{current.id}",
              {"comment": comment, **({"key_id": signature.key_id} if signature else {})})

    def _post(self, c: Connection, current: AdjustmentView, approvers: list[str]) -> None:
        metadata = {"adjustment_id": current.id, "reason": current.reason, "proposed_by": current.proposed_by,
                    "approved_by": approvers, "corrects_transaction_id": current.corrects_transaction_id}
        result = self.ledger.post(_key(current), current.legs, kind=KIND, metadata=metadata, conn=c)
        advance(c, "adjustment", current.id, "approved", "posted", transaction_id=result.transaction_id)
        audit(c, "custody", "adjustment.post", f"adjustment:{current.id}",
              {"transaction_id": result.transaction_id, "approvers": approvers})
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


def _key(view: AdjustmentView) -> str:
    return f"treasury-adjustment:{view.id}"


def _require_comment(comment: str) -> None:
    if not comment.strip():
        raise LedgerError(ErrorCode.invalid_request, "a vote needs a comment")


def _legs_json(legs: Sequence[Transfer]) -> str:
    return json.dumps([{"debit_account_id": t.debit_account_id, "credit_account_id": t.credit_account_id,
                        "amount": str(t.amount)} for t in legs])
