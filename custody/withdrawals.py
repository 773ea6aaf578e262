"""Withdrawal requests, policy decisions and operator approvals (the part before any batch).

A request is idempotent per (account, client withdrawal id). In ONE database transaction it writes
the `withdrawal_request` row, places a ledger hold for amount + quoted fee (refused with
`insufficient_funds` if the customer's available balance does not cover it, in which case nothing
is written), evaluates the versioned policy (`policies.evaluate`) and stores the `policy_decision`.
The outcome moves the row to `approved`, `pending_approval` (k distinct operators, never the
requester, only while the decision is live) or `rejected` (hold released, reasons returned).

An approval is a signature (signer.approvals): the operator signs the withdrawal's approval payload
(`approval_payload`: id, chain, asset, amount, destination, decision id, policy version, expiry) with
their own Ed25519 or WebAuthn key; `approve` verifies it against the approver keys custody is given
(`approvers`), requires the key to be the caller's own, and stores the signature with the exact
bytes signed. The signer verifies the stored signatures again against its own keys; custody's
check is the early, friendly refusal, not the one money depends on. A quorum counts only approvals
whose key still counts when it is counted (`live_approvers`: in `approvers`, the operator's own, a
console credential still active), when an approval completes it and again before an approved
withdrawal is batched and before its batch is signed (custody.payouts: `lapsed_quorum`), so a key
revoked after it approved no longer makes up a quorum: the withdrawal goes back to the operators
under a fresh decision (`return_to_operators`). The signer cannot see a console revocation until the
key's entry leaves its own configuration.

The kill switch refuses new requests at the door (`withdrawals_halted`); batching and signing check
it again, so a switch engaged after approval still stops the money.

Only customer accounts are withdrawn from (`kind_not_permitted` otherwise); the quarantine account
only through `Deposits.return_quarantined`. Before anything is written the destination is checked
(custody.destinations): never one of the service's own addresses, never a reserved or token
contract address on ethereum, a contract only when allowlisted and when the payout would not revert.

Velocity is counted per account and per owner (every account of the ledger account's `owner`, per
asset); requests of one owner are serialised by a transaction-level advisory lock while the owner's
history is read, so two accounts of one owner cannot both pass the limit at once. A withdrawal that
returns a quarantined deposit (`Deposits.return_quarantined`) names the deposit, and policy then
requires operators other than the requester whatever the amount; it is not approved while that
deposit is reorged out after finality (`deposit_reorged_out`), and ending it unpaid (rejected here,
by policy or at payout, or released after a failed transaction) puts the deposit back to
`quarantined` in the same database transaction (`custody.deposits.reopen_returns`). An account
frozen by a reorged-out credit custody could not hold in full requests nothing (`account_frozen`),
and nothing of it is approved or batched; the freeze itself rejects the account's withdrawals not
batched yet (`reject_for_reorg`), so their holds no longer hide the credit from it.

Allowlists: a change that tightens (stricter mode, longer cooling-off, more approvals, an address
removed) applies at once; one that loosens waits as an `allowlist_change` until an operator approves
it (`approve_allowlist_change`); a newer change supersedes a pending one. Each entry keeps the
cooling-off in force when it was added, so a loosening never shortens it.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from dataclasses import dataclass, replace
from typing import Callable

from sqlalchemy import Connection, Engine, text

from custody.console.auth import inactive_console_keys, refuse_inactive_console_key
from custody.controls import audit, emit, kill_switch
from custody.deposits import reopen_returns, return_reorged_out
from custody.destinations import DestinationGuard
from custody.errors import CustodyError, CustodyErrorCode
from custody.incidents import refuse_frozen
from custody.policy_config import PolicyProvider, check_policy_version
from custody.states import advance
from custody.wallets import Wallets
from ledger.errors import ErrorCode, LedgerError
from ledger.model import AccountKind
from ledger.service import Ledger
from policies import Approval, Decision, Outcome, PolicyContext, PriorWithdrawal, ReasonCode, WithdrawalRequest
from policies import AllowlistMode, AllowlistRule, QuarantineReturn, evaluate, normalise_address, plan_allowlist_change, quorum_met
from signer.approvals import (ApprovalInvalid, ApprovalSignature, ApproverRegistry, approval_payload, operator_identity,
                              verify_approval)
from signer.bitcoin_tx import address_to_script
from signer.errors import SignerError
from signer.ethereum_tx import validate_eth_address

log = logging.getLogger(__name__)
HOLD_OWNER = "withdrawals"
# States whose amounts count towards velocity (everything not rejected, cancelled or released).
COUNTING_STATES = ("held", "pending_approval", "approved", "batched", "signed", "broadcast", "confirmed", "final")


@dataclass(frozen=True)
class WithdrawalView:
    id: int
    client_withdrawal_id: str
    account_id: int
    asset: str
    chain: str
    amount: int
    fee_quoted: int
    destination: str
    priority: str
    requested_by: str
    state: str
    hold_id: int | None
    decision_id: int | None
    batch_id: int | None
    reject_reasons: tuple[str, ...]
    created: bool = True
    decision_reasons: tuple[str, ...] = ()  # why the live decision is not a plain approval (what approvers see)


@dataclass(frozen=True)
class ApprovalPayloadView:
    """The approval payload of a withdrawal under its current decision, with the fields it states."""

    withdrawal_id: int
    decision_id: int
    chain: str
    asset: str
    amount: int
    destination: str
    policy_version: str
    expires_at: dt.datetime
    state: str
    payload: bytes


@dataclass(frozen=True)
class AllowlistChangeView:
    """A requested allowlist loosening and what became of it (pending, approved, rejected, superseded)."""

    id: int
    account_id: int
    mode: str
    cooling_off: dt.timedelta
    approvals: int
    loosens: tuple[str, ...]
    requested_by: str
    requested_at: dt.datetime
    state: str
    decided_by: str | None
    decided_at: dt.datetime | None
    comment: str | None


@dataclass(frozen=True)
class AllowlistView:
    """An account's allowlist rule in force now (None: no allowlist) and its pending loosening."""

    account_id: int
    mode: str | None
    cooling_off: dt.timedelta
    approvals: int
    version: int
    pending: AllowlistChangeView | None


def validate_destination(chain: str, network: str, destination: str) -> tuple[str, bytes | None]:
    """Return the destination in canonical form (and its output script on bitcoin), or raise
    invalid_destination."""
    try:
        if chain == "bitcoin":
            return destination, address_to_script(destination, network)
        return validate_eth_address(destination), None
    except SignerError as exc:
        raise CustodyError(CustodyErrorCode.invalid_destination, str(exc.detail or exc), destination=destination) from None



def verify_operator_signature(approvers: ApproverRegistry | None, operator: str, payload: bytes,
                              signature: ApprovalSignature | None) -> None:
    """An operator's signature over `payload`, checked at the door against `approvers` (the signer
    checks again against its own): codes approval_signature_required, approver_unknown,
    approval_scheme_mismatch, approval_signature_invalid, approver_not_caller (the key is not the
    caller's own), in that order. Withdrawals and refills between the firm's tiers use it."""
    if signature is None:
        raise CustodyError(CustodyErrorCode.approval_signature_required,
                           "an approval must be signed with the approver's key over the approval payload")
    try:
        key = verify_approval(approvers, signature.key_id, signature.scheme, payload, signature.signature,
                              signature.authenticator_data, signature.client_data_json)
    except ApprovalInvalid as exc:
        raise CustodyError(CustodyErrorCode(exc.code), exc.message, key_id=signature.key_id) from None
    if operator_identity(key.operator) != operator_identity(operator):
        raise CustodyError(CustodyErrorCode.approver_not_caller, f"key {key.key_id!r} is not the caller's own",
                           key_id=key.key_id)

def verify_operator_approval(c: Connection, approvers: ApproverRegistry | None, operator: str, payload: bytes,
                             signature: ApprovalSignature | None) -> None:
    """THE check of an operator's approval when it is recorded, for withdrawals and for refills
    between the firm's tiers alike: `verify_operator_signature` (its codes, in order), then a
    `console:` key must belong to a console credential that is active now (a revoked one approves
    nothing, even while its entry is still configured: `approver_unknown`)."""
    verify_operator_signature(approvers, operator, payload, signature)
    assert signature is not None  # verify_operator_signature refuses None
    refuse_inactive_console_key(c, signature.key_id)


def live_approvers(c: Connection, approvers: ApproverRegistry | None, approvals) -> set[str]:
    """The distinct operators (operator_identity) of stored approvals, given as (operator, key_id)
    pairs, whose key still counts NOW: it is in `approvers` (an entry removed from the
    configuration, an operator taken off, counts no more), it is that operator's own, and a
    `console:` key's credential is still active (`verify_operator_approval`'s rule, applied again
    when a quorum is counted, so a key revoked after it approved does not count). The signature
    itself was verified when the approval was recorded; the signer verifies it again."""
    approvals = [(operator, key_id) for operator, key_id in approvals]
    inactive = inactive_console_keys(c, [key_id for _, key_id in approvals])
    live = set()
    for operator, key_id in approvals:
        key = approvers.get(key_id) if approvers is not None and key_id else None
        if key is None or key_id in inactive or operator_identity(key.operator) != operator_identity(operator):
            continue
        live.add(operator_identity(operator))
    return live


class Withdrawals:
    def __init__(self, engine: Engine, ledger: Ledger, wallets: Wallets, policies: PolicyProvider,
                 *, networks: dict[str, str], clock: Callable[[], dt.datetime] | None = None,
                 destinations: DestinationGuard | None = None, approvers: ApproverRegistry | None = None) -> None:
        self.engine = engine
        self.approvers = approvers  # the approver keys an approval must verify against (None: no approval is valid)
        self.ledger = ledger
        self.wallets = wallets
        self.policies = policies
        self.networks = networks  # chain -> network name
        self.destinations = destinations or DestinationGuard(engine, wallets, {})  # without a node: ethereum fails closed
        self.clock = clock or (lambda: dt.datetime.now(dt.timezone.utc))

    # ---- request --------------------------------------------------------------------------

    def request(self, *, client_withdrawal_id: str, account_id: int, amount: int, destination: str,
                requested_by: str, priority: str = "normal", _return_of_deposit: int | None = None) -> WithdrawalView:
        if kill_switch(self.engine).engaged:
            raise CustodyError(CustodyErrorCode.withdrawals_halted, "withdrawals are halted by the kill switch")
        if priority not in ("normal", "fast"):
            raise LedgerError(ErrorCode.invalid_request, "priority must be normal or fast")
        if not isinstance(client_withdrawal_id, str) or not 1 <= len(client_withdrawal_id) <= 200:
            raise LedgerError(ErrorCode.invalid_request, "client_withdrawal_id must be 1-200 characters")
        account = self.ledger.get_account(account_id)
        allowed = (AccountKind.quarantine,) if _return_of_deposit is not None else (AccountKind.customer,)
        if account.kind not in allowed:  # the quarantine account only through Deposits.return_quarantined
            raise CustodyError(CustodyErrorCode.kind_not_permitted, "withdrawals are made from customer accounts only",
                               account_id=account_id, kind=account.kind.value)
        try:
            ca = self.wallets.chain_asset(account.asset)
        except LedgerError:
            raise CustodyError(CustodyErrorCode.asset_not_withdrawable, f"{account.asset} cannot be withdrawn") from None
        self.destinations.check_reserved(ca.chain, destination)
        destination, script = validate_destination(ca.chain, self.networks.get(ca.chain, "regtest"), destination)
        if not self._requested(account_id, client_withdrawal_id):  # a replay answers the original below
            refuse_frozen(self.engine, [account_id])  # a reorged-out credit custody could not hold all of
            self.destinations.check_request(ca, account_id, destination, amount)
        fee = ca.withdrawal_fee_fast if priority == "fast" else ca.withdrawal_fee
        digest = hashlib.sha256(json.dumps([account_id, str(amount), destination, priority]).encode()).hexdigest()

        with self.engine.begin() as c:
            row = c.execute(
                text("INSERT INTO withdrawal_request (client_withdrawal_id, account_id, asset, chain, amount, fee_quoted, "
                     "destination, destination_script, priority, requested_by, content_hash, state, return_of_deposit) "
                     "VALUES (:cw, :a, :asset, :chain, :amt, :fee, :dest, :script, :prio, :by, :h, 'requested', :ret) "
                     "ON CONFLICT (account_id, client_withdrawal_id) DO NOTHING RETURNING id"),
                {"cw": client_withdrawal_id, "a": account_id, "asset": account.asset, "chain": ca.chain, "amt": amount,
                 "fee": fee, "dest": destination, "script": script, "prio": priority, "by": requested_by, "h": digest,
                 "ret": _return_of_deposit},
            ).first()
            if row is None:
                existing = c.execute(text(f"{_W_SQL} WHERE account_id = :a AND client_withdrawal_id = :cw"),
                                     {"a": account_id, "cw": client_withdrawal_id}).one()
                if existing.content_hash != digest:
                    raise LedgerError(ErrorCode.idempotency_conflict, "client_withdrawal_id was used for another withdrawal")
                view = _view(existing, created=False)
            else:
                view = self._hold_and_decide(c, row.id, account_id, amount, fee, requested_by)
        if view.state == "rejected":
            raise CustodyError(CustodyErrorCode.withdrawal_rejected, "the withdrawal was rejected by policy: "
                               + ", ".join(view.reject_reasons), withdrawal_id=view.id, reasons=list(view.reject_reasons))
        return view

    def _requested(self, account_id: int, client_withdrawal_id: str) -> bool:
        with self.engine.connect() as c:
            return c.execute(text("SELECT 1 FROM withdrawal_request WHERE account_id = :a AND client_withdrawal_id = :cw"),
                             {"a": account_id, "cw": client_withdrawal_id}).first() is not None

    def _hold_and_decide(self, c: Connection, wid: int, account_id: int, amount: int, fee: int, requested_by: str) -> WithdrawalView:
        hold = self.ledger.place_hold(f"withdrawal:{wid}:hold", account_id, amount + fee, owner=HOLD_OWNER,
                                      reference=f"withdrawal:{wid}", conn=c)
        advance(c, "withdrawal", wid, "requested", "held", hold_id=hold.id)
        w = _view(c.execute(text(f"{_W_SQL} WHERE id = :i"), {"i": wid}).one())
        decision = self._evaluate(c, w)
        decision_id = self._store_decision(c, w.id, decision)
        if decision.outcome is Outcome.APPROVE:
            advance(c, "withdrawal", wid, "held", "approved", decision_id=decision_id)
        elif decision.outcome is Outcome.NEEDS_APPROVAL:
            advance(c, "withdrawal", wid, "held", "pending_approval", decision_id=decision_id)
        else:
            reasons = [r.value for r in decision.reasons]
            self.ledger.release_hold(hold.id, owner=HOLD_OWNER, conn=c)
            advance(c, "withdrawal", wid, "held", "rejected", decision_id=decision_id, reject_reasons=reasons)
            reopen_returns(c, [wid], by="policy", reason=",".join(reasons))
        emit(c, "withdrawal.requested", f"withdrawal.requested:{wid}",
             {"withdrawal_id": wid, "account_id": account_id, "outcome": decision.outcome.value},
             aggregate=f"withdrawal:{wid}")
        return _view(c.execute(text(f"{_W_SQL} WHERE id = :i"), {"i": wid}).one())

    def _evaluate(self, c: Connection, w: WithdrawalView) -> Decision:
        """Gather the decision's inputs (the account's and its owner's velocity history, the deposit a
        return pays back) and let the pure engine decide."""
        now = self.clock()
        policy = self.policies.current(c, w.account_id)
        since = now - self.policies.velocity_window()
        owner = self.ledger.get_account(w.account_id, conn=c).owner
        owner_history = _owner_history(c, owner, w, since) if owner is not None else ()
        request = WithdrawalRequest(str(w.id), str(w.account_id), w.asset, w.amount, w.fee_quoted, w.destination, w.requested_by,
                                    owner=owner, return_of=_quarantine_return(c, w.id))
        context = PolicyContext(now, _account_history(c, w, since), owner_history)
        return evaluate(request, context, policy)

    @staticmethod
    def _store_decision(c: Connection, wid: int, d: Decision) -> int:
        """Write the decision; its version is checked (custody.policy_config.check_policy_version), which
        cannot fail for a decision made by a PolicyProvider (it refused a bad base version at start)."""
        return c.execute(
            text("INSERT INTO policy_decision (withdrawal_id, outcome, required_approvals, reasons, policy_version, record, "
                 "decided_at, expires_at) VALUES (:w, :o, :k, :r, :v, CAST(:rec AS jsonb), :at, :exp) RETURNING id"),
            {"w": wid, "o": d.outcome.value, "k": d.required_approvals, "r": [x.value for x in d.reasons],
             "v": check_policy_version(d.policy_version), "rec": json.dumps(d.to_record()), "at": d.decided_at, "exp": d.expires_at},
        ).scalar_one()

    def reevaluate_expired(self, c: Connection, wid: int) -> str:
        """An approved withdrawal whose decision expired before it was paid gets a fresh decision
        under the current policy (rescreened, velocity recounted). Returns the new state:
        `approved`, `pending_approval` (operators again) or `rejected` (hold released)."""
        w = _view(c.execute(text(f"{_W_SQL} WHERE id = :i FOR UPDATE"), {"i": wid}).one())
        decision = self._evaluate(c, w)
        decision_id = self._store_decision(c, w.id, decision)
        if decision.outcome is Outcome.APPROVE:
            c.execute(text("UPDATE withdrawal_request SET decision_id = :d, updated_at = now() WHERE id = :i AND state = 'approved'"),
                      {"d": decision_id, "i": wid})
            return "approved"
        if decision.outcome is Outcome.NEEDS_APPROVAL:
            advance(c, "withdrawal", wid, "approved", "pending_approval", decision_id=decision_id)
            return "pending_approval"
        self.ledger.release_hold(w.hold_id, owner=HOLD_OWNER, conn=c)
        advance(c, "withdrawal", wid, "approved", "rejected", decision_id=decision_id,
                reject_reasons=[r.value for r in decision.reasons])
        reopen_returns(c, [wid], by="policy", reason=",".join(r.value for r in decision.reasons))
        emit(c, "withdrawal.rejected", f"withdrawal.rejected:{wid}:{decision_id}", {"withdrawal_id": wid},
             aggregate=f"withdrawal:{wid}")
        return "rejected"

    def return_to_operators(self, c: Connection, wid: int) -> str:
        """An `approved` withdrawal the signer refused over its approvals (custody.payouts
        `drop_refused`: an approver the signer no longer knows, a quorum the signer's own table
        raised, an unsigned or altered approval row) goes back to the operators under a fresh
        decision of the current policy: its approvals sign the decision id, so the old ones no
        longer count. A decision that approves or asks fewer becomes `needs_approval` with at
        least one operator (someone must look at it again); one that rejects releases the hold.
        Returns the new state: `pending_approval` or `rejected`. In the caller's transaction."""
        w = _view(c.execute(text(f"{_W_SQL} WHERE id = :i FOR UPDATE"), {"i": wid}).one())
        decision = self._evaluate(c, w)
        if decision.outcome is Outcome.REJECT:
            decision_id = self._store_decision(c, w.id, decision)
            reasons = [r.value for r in decision.reasons]
            self.ledger.release_hold(w.hold_id, owner=HOLD_OWNER, conn=c)
            advance(c, "withdrawal", wid, "approved", "rejected", decision_id=decision_id, reject_reasons=reasons)
            reopen_returns(c, [wid], by="policy", reason=",".join(reasons))
            emit(c, "withdrawal.rejected", f"withdrawal.rejected:{wid}:{decision_id}", {"withdrawal_id": wid},
             aggregate=f"withdrawal:{wid}")
            return "rejected"
        decision = replace(decision, outcome=Outcome.NEEDS_APPROVAL, required_approvals=max(decision.required_approvals, 1))
        advance(c, "withdrawal", wid, "approved", "pending_approval", decision_id=self._store_decision(c, w.id, decision))
        return "pending_approval"

    # ---- operator decisions ---------------------------------------------------------------

    def approval_payload(self, withdrawal_id: int) -> ApprovalPayloadView:
        """What an approver signs for this withdrawal under its current decision (signer.approvals)."""
        with self.engine.connect() as c:
            row = c.execute(text(f"{_W_SQL} WHERE id = :i"), {"i": withdrawal_id}).first()
            if row is None:
                raise CustodyError(CustodyErrorCode.withdrawal_not_found, f"no withdrawal {withdrawal_id}")
            w = _view(row)
            if w.decision_id is None:
                raise CustodyError(CustodyErrorCode.invalid_state, f"withdrawal {withdrawal_id} has no decision yet", state=w.state)
            decision = self._load_decision(c, w)
        return ApprovalPayloadView(w.id, w.decision_id, w.chain, w.asset, w.amount, w.destination, decision.policy_version,
                                   decision.expires_at, w.state, _payload(w, decision))

    def approve(self, withdrawal_id: int, *, operator: str, comment: str,
                signature: ApprovalSignature | None = None) -> WithdrawalView:
        """An operator's approval: `signature` is theirs over `approval_payload(withdrawal_id)`,
        verified here against `approvers` before anything is written; the key must be the
        operator's own (`approver_not_caller`). Codes in the order checked: withdrawal_not_found,
        invalid_state, requester_cannot_approve, approval_signature_required, approver_unknown,
        approval_scheme_mismatch, approval_signature_invalid, approver_not_caller, decision_expired,
        deposit_reorged_out, account_frozen, already_acted."""
        return self._act(withdrawal_id, operator, comment, "approve", signature)

    def reject(self, withdrawal_id: int, *, operator: str, comment: str) -> WithdrawalView:
        """No signature: a rejection only releases the hold; it can never pay anyone."""
        return self._act(withdrawal_id, operator, comment, "reject")

    def _verify_signature(self, c: Connection, operator: str, payload: bytes, signature: ApprovalSignature | None) -> None:
        """The signature verifies against `approvers` and is the caller's own; a `console:` key must
        also belong to a console credential that is active now (a revoked one approves nothing,
        even while its entry is still configured: `approver_unknown`)."""
        verify_operator_approval(c, self.approvers, operator, payload, signature)

    def _act(self, wid: int, operator: str, comment: str, action: str,
             signature: ApprovalSignature | None = None) -> WithdrawalView:
        if not operator or not comment or not comment.strip():
            raise LedgerError(ErrorCode.invalid_request, "an operator and a comment are required")
        now = self.clock()
        with self.engine.begin() as c:
            row = c.execute(text(f"{_W_SQL} WHERE id = :i FOR UPDATE"), {"i": wid}).first()
            if row is None:
                raise CustodyError(CustodyErrorCode.withdrawal_not_found, f"no withdrawal {wid}")
            w = _view(row)
            allowed = ("pending_approval",) if action == "approve" else ("pending_approval", "approved")
            if w.state not in allowed:
                raise CustodyError(CustodyErrorCode.invalid_state, f"withdrawal {wid} is {w.state}", state=w.state)
            decision = self._load_decision(c, w)
            signed: tuple[ApprovalSignature, bytes] | None = None
            if action == "approve":
                if operator.strip().casefold() == w.requested_by.strip().casefold():
                    raise CustodyError(CustodyErrorCode.requester_cannot_approve, "the requester may not approve their own withdrawal")
                payload = _payload(w, decision)
                self._verify_signature(c, operator, payload, signature)
                signed = (signature, payload)
                if not decision.is_live(now):
                    raise CustodyError(CustodyErrorCode.decision_expired, f"the decision expired at {decision.expires_at.isoformat()}")
                if return_reorged_out(c, wid):
                    raise CustodyError(CustodyErrorCode.deposit_reorged_out,
                                       "the deposit this withdrawal returns was reorged out after finality: reject it")
                refuse_frozen(c, [w.account_id])  # the freeze rejected it, or will: nothing to approve
            sig, payload = signed if signed is not None else (None, None)
            inserted = c.execute(text(_INSERT_APPROVAL_SQL), {
                "w": wid, "d": w.decision_id, "o": operator, "a": action, "c": comment, "t": now,
                "k": sig.key_id if sig else None, "s": sig.scheme if sig else None, "p": payload,
                "sig": sig.signature if sig else None, "ad": sig.authenticator_data if sig else None,
                "cd": sig.client_data_json if sig else None}).first()
            if inserted is None:
                raise CustodyError(CustodyErrorCode.already_acted, f"{operator} already acted on this decision")
            audit(c, operator, f"withdrawal.{action}", f"withdrawal:{wid}",
                  {"comment": comment, "decision_id": w.decision_id, **({"key_id": sig.key_id} if sig else {})})
            if action == "reject":
                self.ledger.release_hold(w.hold_id, owner=HOLD_OWNER, conn=c)
                advance(c, "withdrawal", wid, w.state, "rejected", reject_reasons=["operator_rejected"])
                reopen_returns(c, [wid], by=operator, reason="operator_rejected")
                emit(c, "withdrawal.rejected", f"withdrawal.rejected:{wid}", {"withdrawal_id": wid, "by": operator},
                     aggregate=f"withdrawal:{wid}")
            else:
                approvals = c.execute(text(_APPROVALS_SQL), {"d": [w.decision_id]}).all()
                if self._live_quorum_met(c, decision, approvals, w.requested_by):
                    advance(c, "withdrawal", wid, "pending_approval", "approved")
                    emit(c, "withdrawal.approved", f"withdrawal.approved:{wid}", {"withdrawal_id": wid},
                         aggregate=f"withdrawal:{wid}")
            return _view(c.execute(text(f"{_W_SQL} WHERE id = :i"), {"i": wid}).one())

    def _live_quorum_met(self, c: Connection, decision: Decision, approvals, requester: str) -> bool:
        """`quorum_met` over the approvals (rows with operator, key_id, at) whose key still counts
        now (`live_approvers`)."""
        live = live_approvers(c, self.approvers, [(a.operator, a.key_id) for a in approvals])
        counted = [Approval(a.operator, a.at) for a in approvals if operator_identity(a.operator) in live]
        return quorum_met(decision, counted, requester)

    def lapsed_quorum(self, c: Connection, withdrawal_ids: list[int]) -> list[int]:
        """Those of `withdrawal_ids` whose decision needs operators and whose approvals by keys that
        still count NOW (`live_approvers`) no longer make its quorum: an approver's console
        credential revoked, or its entry removed from `approvers`, after it approved. Withdrawals an
        automatic decision approved, and rejected ones, are never in it. Reads only; custody.payouts
        asks before batching and before signing and sends these back (`return_to_operators`)."""
        if not withdrawal_ids:
            return []
        rows = c.execute(text(f"{_W_SQL} WHERE id = ANY(:i) AND EXISTS (SELECT 1 FROM policy_decision d "
                              "WHERE d.id = withdrawal_request.decision_id AND d.outcome = 'needs_approval') ORDER BY id"),
                         {"i": list(withdrawal_ids)}).all()
        if not rows:
            return []
        views = [_view(r) for r in rows]
        by_decision: dict[int, list] = {}
        for a in c.execute(text(_APPROVALS_SQL), {"d": [w.decision_id for w in views]}).all():
            by_decision.setdefault(a.decision_id, []).append(a)
        return [w.id for w in views
                if not self._live_quorum_met(c, self._load_decision(c, w), by_decision.get(w.decision_id, []), w.requested_by)]

    @staticmethod
    def _load_decision(c: Connection, w: WithdrawalView) -> Decision:
        d = c.execute(text("SELECT outcome, required_approvals, reasons, policy_version, decided_at, expires_at "
                           "FROM policy_decision WHERE id = :i"), {"i": w.decision_id}).one()
        request = WithdrawalRequest(str(w.id), str(w.account_id), w.asset, w.amount, w.fee_quoted, w.destination, w.requested_by)
        return Decision(Outcome(d.outcome), d.required_approvals, tuple(ReasonCode(r) for r in d.reasons), d.policy_version,
                        request, PolicyContext(d.decided_at), None, d.decided_at, d.expires_at)

    # ---- destination allowlists -----------------------------------------------------------

    def set_allowlist(self, account_id: int, *, mode: str, cooling_off: dt.timedelta = dt.timedelta(0), approvals: int = 1,
                      by: str) -> AllowlistView:
        """Turn on (or change) an account's allowlist: `enforce` rejects other destinations, `review`
        sends them to operators; a newly added destination needs `approvals` during `cooling_off`.
        What tightens applies at once; what loosens becomes a pending change for an operator
        (`plan_allowlist_change`), superseding any earlier pending change of the account."""
        if mode not in ("enforce", "review") or approvals < 1 or cooling_off < dt.timedelta(0):
            raise LedgerError(ErrorCode.invalid_request, "mode is enforce or review, approvals >= 1, cooling_off >= 0")
        self._allowlist_account(account_id)
        requested = AllowlistRule(AllowlistMode(mode), dt.timedelta(seconds=int(cooling_off.total_seconds())), approvals)
        with self.engine.begin() as c:
            # The rule's row may not exist yet (an account's first rule): FOR UPDATE would lock
            # nothing, so two first PUTs could both read "no rule". Serialise on the account.
            c.execute(text(_OWNER_LOCK_SQL), {"k": f"allowlist-rule:{account_id}"})
            current = _allowlist_rule(c, account_id, lock=True)
            plan = plan_allowlist_change(current, requested)
            superseded = c.execute(text(_SUPERSEDE_CHANGE_SQL), {"a": account_id, "by": by}).scalars().all()
            if plan.apply_now != current:
                _write_allowlist_rule(c, account_id, plan.apply_now)
            pending_id = None
            if plan.pending is not None:
                pending_id = c.execute(text(_INSERT_CHANGE_SQL), {
                    "a": account_id, "m": plan.pending.mode.value, "s": _secs(plan.pending.cooling_off),
                    "k": plan.pending.approvals, "l": list(plan.loosened), "by": by}).scalar_one()
            audit(c, by, "allowlist.policy", f"account:{account_id}", {
                "requested": _rule_record(requested), "applied": _rule_record(plan.apply_now),
                "loosens": list(plan.loosened), "pending_change_id": pending_id, "superseded_change_ids": superseded})
            return _allowlist_view(c, account_id)

    def allowlist(self, account_id: int) -> AllowlistView:
        self.ledger.get_account(account_id)
        with self.engine.connect() as c:
            return _allowlist_view(c, account_id)

    def allow_destination(self, account_id: int, destination: str, *, by: str) -> str:
        """Add a destination to an account's allowlist (validated for the account's chain); idempotent.
        The entry keeps the cooling-off in force now, whatever a later loosening says."""
        account = self._allowlist_account(account_id)
        chain = self.wallets.chain_asset(account.asset).chain
        destination, _ = validate_destination(chain, self.networks.get(chain, "regtest"), destination)
        with self.engine.begin() as c:
            rule = _allowlist_rule(c, account_id, lock=True)  # no change of rule while the entry is written
            cooling = _secs(rule.cooling_off) if rule is not None else 0
            added = c.execute(text("INSERT INTO allowlist_entry (account_id, address, added_by, cooling_off_secs) "
                                   "VALUES (:a, :d, :b, :s) ON CONFLICT DO NOTHING RETURNING added_at"),
                              {"a": account_id, "d": destination, "b": by, "s": cooling}).first()
            if added is not None:
                audit(c, by, "allowlist.add", f"account:{account_id}", {"address": destination, "cooling_off_secs": cooling})
        return destination

    def remove_destination(self, account_id: int, destination: str, *, by: str) -> bool:
        """Take a destination off an account's allowlist (a tightening: at once). Returns whether it
        was there; adding it again starts a fresh cooling-off."""
        self._allowlist_account(account_id)
        wanted = normalise_address(destination)
        with self.engine.begin() as c:
            entries = c.execute(text("SELECT address FROM allowlist_entry WHERE account_id = :a FOR UPDATE"),
                                {"a": account_id}).scalars().all()
            matching = [e for e in entries if normalise_address(e) == wanted]
            for address in matching:
                c.execute(text("DELETE FROM allowlist_entry WHERE account_id = :a AND address = :d"), {"a": account_id, "d": address})
                audit(c, by, "allowlist.remove", f"account:{account_id}", {"address": address})
        return bool(matching)

    def allowlist_changes(self, *, state: str | None = "pending", after_id: int | None = None,
                          limit: int = 200) -> list[AllowlistChangeView]:
        """Allowlist changes oldest first, after `after_id` when given (the next page of a walk)."""
        with self.engine.connect() as c:
            rows = c.execute(text(f"{_CHANGE_SQL} WHERE (CAST(:s AS text) IS NULL OR state = :s) AND id > :after "
                                  "ORDER BY id LIMIT :l"),
                             {"s": state, "after": after_id or 0, "l": limit}).all()
        return [_change_view(r) for r in rows]

    def approve_allowlist_change(self, change_id: int, *, operator: str, comment: str) -> AllowlistChangeView:
        """An operator lets a pending loosening take effect. Entries already added keep their own
        cooling-off. The requester (a backend key) may not approve its own change."""
        return self._decide_allowlist_change(change_id, operator, comment, "approved")

    def reject_allowlist_change(self, change_id: int, *, operator: str, comment: str) -> AllowlistChangeView:
        return self._decide_allowlist_change(change_id, operator, comment, "rejected")

    def _decide_allowlist_change(self, change_id: int, operator: str, comment: str, outcome: str) -> AllowlistChangeView:
        if not operator or not comment or not comment.strip():
            raise LedgerError(ErrorCode.invalid_request, "an operator and a comment are required")
        with self.engine.begin() as c:
            # The account's allowlist lock first, as a rule change takes it (set_allowlist): the
            # change row and the rule row are then locked in one order by both, never a deadlock.
            # A change's account never changes, so reading it unlocked is safe.
            account_id = c.execute(text("SELECT account_id FROM allowlist_change WHERE id = :i"), {"i": change_id}).scalar()
            if account_id is not None:
                c.execute(text(_OWNER_LOCK_SQL), {"k": f"allowlist-rule:{account_id}"})
            row = c.execute(text(f"{_CHANGE_SQL} WHERE id = :i FOR UPDATE"), {"i": change_id}).first()
            if row is None:
                raise CustodyError(CustodyErrorCode.allowlist_change_not_found, f"no allowlist change {change_id}")
            change = _change_view(row)
            if change.state != "pending":
                raise CustodyError(CustodyErrorCode.invalid_state, f"allowlist change {change_id} is {change.state}", state=change.state)
            if outcome == "approved" and operator.strip().casefold() == change.requested_by.strip().casefold():
                raise CustodyError(CustodyErrorCode.requester_cannot_approve, "the requester may not approve its own allowlist change")
            if outcome == "approved":
                _allowlist_rule(c, change.account_id, lock=True)
                _write_allowlist_rule(c, change.account_id, AllowlistRule(AllowlistMode(change.mode), change.cooling_off,
                                                                          change.approvals))
            c.execute(text("UPDATE allowlist_change SET state = :s, decided_by = :o, decided_at = now(), comment = :c WHERE id = :i"),
                      {"s": outcome, "o": operator, "c": comment, "i": change_id})
            action = "approve" if outcome == "approved" else "reject"
            audit(c, operator, f"allowlist.change.{action}", f"account:{change.account_id}",
                  {"change_id": change_id, "comment": comment, "mode": change.mode, "cooling_off_secs": _secs(change.cooling_off),
                   "approvals": change.approvals, "loosens": list(change.loosens)})
            return _change_view(c.execute(text(f"{_CHANGE_SQL} WHERE id = :i"), {"i": change_id}).one())

    def _allowlist_account(self, account_id: int):
        account = self.ledger.get_account(account_id)
        if account.kind is not AccountKind.customer:
            raise CustodyError(CustodyErrorCode.kind_not_permitted, "allowlists belong to customer accounts")
        return account

    # ---- reads ----------------------------------------------------------------------------

    def get(self, wid: int) -> WithdrawalView:
        with self.engine.connect() as c:
            row = c.execute(text(f"{_W_SQL} WHERE id = :i"), {"i": wid}).first()
        if row is None:
            raise CustodyError(CustodyErrorCode.withdrawal_not_found, f"no withdrawal {wid}")
        return _view(row)

    def list(self, *, state: str | None = None, account_id: int | None = None, after_id: int | None = None,
             limit: int = 200) -> list[WithdrawalView]:
        """Withdrawals oldest first, after `after_id` when given (the next page of a walk)."""
        with self.engine.connect() as c:
            rows = c.execute(
                text(f"{_W_SQL} WHERE (CAST(:s AS text) IS NULL OR state = :s) AND (CAST(:a AS bigint) IS NULL OR account_id = :a) "
                     "AND id > :after ORDER BY id LIMIT :l"),
                {"s": state, "a": account_id, "after": after_id or 0, "l": limit}).all()
        return [_view(r) for r in rows]


# The approvals of decisions `:d` (an array), with the key each was signed with (live_approvers).
_APPROVALS_SQL = "SELECT decision_id, operator, key_id, at FROM approval WHERE decision_id = ANY(:d) AND action = 'approve'"


_INSERT_APPROVAL_SQL = """
INSERT INTO approval (withdrawal_id, decision_id, operator, action, comment, at,
                      key_id, scheme, signed_payload, signature, authenticator_data, client_data_json)
VALUES (:w, :d, :o, :a, :c, :t, :k, :s, :p, :sig, :ad, :cd)
ON CONFLICT (decision_id, operator) DO NOTHING
RETURNING id
"""


def _payload(w: WithdrawalView, decision: Decision) -> bytes:
    return approval_payload(withdrawal_id=w.id, chain=w.chain, asset=w.asset, amount=w.amount, destination=w.destination,
                            decision_id=w.decision_id, policy_version=decision.policy_version, expires_at=decision.expires_at)


_W_SQL = ("SELECT id, client_withdrawal_id, account_id, asset, chain, amount, fee_quoted, destination, priority, requested_by, "
          "state, hold_id, decision_id, batch_id, reject_reasons, content_hash, "
          "(SELECT d.reasons FROM policy_decision d WHERE d.id = withdrawal_request.decision_id) AS decision_reasons "
          "FROM withdrawal_request")


def _view(row, *, created: bool = True) -> WithdrawalView:
    return WithdrawalView(row.id, row.client_withdrawal_id, row.account_id, row.asset, row.chain, int(row.amount),
                          int(row.fee_quoted), row.destination, row.priority, row.requested_by, row.state, row.hold_id,
                          row.decision_id, row.batch_id, tuple(row.reject_reasons), created, tuple(row.decision_reasons or ()))


# ---- velocity and returns: the decision's inputs -----------------------------------------------

_ACCOUNT_HISTORY_SQL = """
SELECT asset, amount, created_at
FROM withdrawal_request
WHERE account_id = :a
  AND id <> :i
  AND state = ANY(:s)
  AND created_at > :since
"""

_OWNER_HISTORY_SQL = """
SELECT w.asset, w.amount, w.created_at
FROM withdrawal_request w
JOIN account a ON a.id = w.account_id
WHERE a.owner = :o
  AND w.asset = :asset
  AND w.id <> :i
  AND w.state = ANY(:s)
  AND w.created_at > :since
"""

# One owner's requests decide one at a time (until commit), whichever of their accounts they use.
_OWNER_LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"

_RETURN_OF_SQL = """
SELECT o.id, o.senders
FROM withdrawal_request w
JOIN deposit_observation o ON o.id = w.return_of_deposit
WHERE w.id = :i
"""


def _account_history(c: Connection, w: WithdrawalView, since: dt.datetime) -> tuple[PriorWithdrawal, ...]:
    rows = c.execute(text(_ACCOUNT_HISTORY_SQL), {"a": w.account_id, "i": w.id, "s": list(COUNTING_STATES), "since": since})
    return tuple(PriorWithdrawal(r.asset, int(r.amount), r.created_at) for r in rows)


def _owner_history(c: Connection, owner: str, w: WithdrawalView, since: dt.datetime) -> tuple[PriorWithdrawal, ...]:
    """Every counting withdrawal of `w.asset` from any account of `owner` (this account's included)."""
    c.execute(text(_OWNER_LOCK_SQL), {"k": f"withdrawal-velocity:{owner}:{w.asset}"})
    rows = c.execute(text(_OWNER_HISTORY_SQL), {"o": owner, "asset": w.asset, "i": w.id, "s": list(COUNTING_STATES),
                                                "since": since})
    return tuple(PriorWithdrawal(r.asset, int(r.amount), r.created_at) for r in rows)


def _quarantine_return(c: Connection, wid: int) -> QuarantineReturn | None:
    row = c.execute(text(_RETURN_OF_SQL), {"i": wid}).first()
    return None if row is None else QuarantineReturn(str(row.id), tuple(row.senders or ()))


# ---- allowlists ---------------------------------------------------------------------------------

_CHANGE_SQL = ("SELECT id, account_id, mode, cooling_off_secs, approvals, loosens, requested_by, requested_at, state, "
               "decided_by, decided_at, comment FROM allowlist_change")

_SUPERSEDE_CHANGE_SQL = """
UPDATE allowlist_change
SET state = 'superseded', decided_by = :by, decided_at = now()
WHERE account_id = :a
  AND state = 'pending'
RETURNING id
"""

_INSERT_CHANGE_SQL = """
INSERT INTO allowlist_change (account_id, mode, cooling_off_secs, approvals, loosens, requested_by)
VALUES (:a, :m, :s, :k, :l, :by)
RETURNING id
"""

_WRITE_RULE_SQL = """
INSERT INTO allowlist_policy (account_id, mode, cooling_off_secs, approvals)
VALUES (:a, :m, :s, :k)
ON CONFLICT (account_id) DO UPDATE
SET mode = :m, cooling_off_secs = :s, approvals = :k, version = allowlist_policy.version + 1, updated_at = now()
"""


def _secs(value: dt.timedelta) -> int:
    return int(value.total_seconds())


def _allowlist_rule(c: Connection, account_id: int, *, lock: bool = False) -> AllowlistRule | None:
    row = c.execute(text("SELECT mode, cooling_off_secs, approvals FROM allowlist_policy WHERE account_id = :a"
                         + (" FOR UPDATE" if lock else "")), {"a": account_id}).first()
    if row is None:
        return None
    return AllowlistRule(AllowlistMode(row.mode), dt.timedelta(seconds=row.cooling_off_secs), row.approvals)


def _write_allowlist_rule(c: Connection, account_id: int, rule: AllowlistRule) -> None:
    c.execute(text(_WRITE_RULE_SQL), {"a": account_id, "m": rule.mode.value, "s": _secs(rule.cooling_off), "k": rule.approvals})


def _rule_record(rule: AllowlistRule) -> dict:
    return {"mode": rule.mode.value, "cooling_off_secs": _secs(rule.cooling_off), "approvals": rule.approvals}


def _change_view(row) -> AllowlistChangeView:
    return AllowlistChangeView(row.id, row.account_id, row.mode, dt.timedelta(seconds=row.cooling_off_secs), row.approvals,
                               tuple(row.loosens), row.requested_by, row.requested_at, row.state, row.decided_by,
                               row.decided_at, row.comment)


def _allowlist_view(c: Connection, account_id: int) -> AllowlistView:
    rule = c.execute(text("SELECT mode, cooling_off_secs, approvals, version FROM allowlist_policy WHERE account_id = :a"),
                     {"a": account_id}).first()
    pending = c.execute(text(f"{_CHANGE_SQL} WHERE account_id = :a AND state = 'pending'"), {"a": account_id}).first()
    return AllowlistView(account_id, rule.mode if rule else None, dt.timedelta(seconds=rule.cooling_off_secs if rule else 0),
                         rule.approvals if rule else 1, rule.version if rule else 0,
                         _change_view(pending) if pending else None)


def reject_for_reorg(c: Connection, ledger: Ledger, account_id: int, credit: int, *, by: str) -> list[int]:
    """A credit of `credit` on `account_id` was reorged out after finality (`custody.deposits`, in
    the freeze's transaction, under the account's balance lock, before it reads what is available):
    while what is available does not cover the credit, reject the account's withdrawals not batched
    yet (held, pending approval, approved), newest first, and release their holds, so the credit
    their holds hid is frozen instead of paid out. A withdrawal the balance still covers besides the
    credit is left alone. Rows a batcher is taking are waited for (then batched: gone before the
    freeze, like any earlier debit). Returns the rejected withdrawals' ids."""
    # Rows first, then the balance: the order every other rejection path locks them in.
    rows = c.execute(text(_UNBATCHED_OF_ACCOUNT_SQL), {"a": account_id}).all()
    headroom = ledger.lock_available([account_id], conn=c).get(account_id)
    available = headroom.available if headroom else 0
    rejected: list[int] = []
    for w in rows:
        if available >= credit:
            break
        released = ledger.release_hold(w.hold_id, owner=HOLD_OWNER, conn=c)
        available += released.released
        advance(c, "withdrawal", w.id, w.state, "rejected", reject_reasons=["deposit_reorged_out"])
        reopen_returns(c, [w.id], by=by, reason="deposit_reorged_out")
        emit(c, "withdrawal.rejected", f"withdrawal.rejected:{w.id}", {"withdrawal_id": w.id, "reason": "deposit_reorged_out"},
             aggregate=f"withdrawal:{w.id}")
        rejected.append(w.id)
    return rejected


_UNBATCHED_OF_ACCOUNT_SQL = """
SELECT id, state, hold_id
FROM withdrawal_request
WHERE account_id = :a
  AND state IN ('held', 'pending_approval', 'approved')
ORDER BY id DESC
FOR UPDATE
"""
