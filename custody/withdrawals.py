"""Withdrawal requests, policy decisions and operator approvals (the part before any batch).

A request is idempotent per (account, client withdrawal id). In ONE database transaction it writes
the `withdrawal_request` row, places a ledger hold for amount + quoted fee (refused with
`insufficient_funds` if the customer's available balance does not cover it, in which case nothing
is written), evaluates the versioned policy (`policies.evaluate`) and stores the `policy_decision`.
The outcome moves the row to `approved`, `pending_approval` (k distinct operators, never the
requester, only while the decision is live) or `rejected` (hold released, reasons returned).

The kill switch refuses new requests at the door (`withdrawals_halted`); batching and signing check
it again, so a switch engaged after approval still stops the money.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Callable

from sqlalchemy import Connection, Engine, text

from custody.controls import audit, emit, kill_switch
from custody.errors import CustodyError, CustodyErrorCode
from custody.policy_config import PolicyProvider
from custody.states import advance
from custody.wallets import Wallets
from ledger.errors import ErrorCode, LedgerError
from ledger.model import AccountKind
from ledger.service import Ledger
from policies import Approval, Decision, Outcome, PolicyContext, PriorWithdrawal, ReasonCode, WithdrawalRequest
from policies import evaluate, quorum_met
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


def validate_destination(chain: str, network: str, destination: str) -> tuple[str, bytes | None]:
    """Return the destination in canonical form (and its output script on bitcoin), or raise
    invalid_destination."""
    try:
        if chain == "bitcoin":
            return destination, address_to_script(destination, network)
        return validate_eth_address(destination), None
    except SignerError as exc:
        raise CustodyError(CustodyErrorCode.invalid_destination, str(exc.detail or exc), destination=destination) from None


class Withdrawals:
    def __init__(self, engine: Engine, ledger: Ledger, wallets: Wallets, policies: PolicyProvider,
                 *, networks: dict[str, str], clock: Callable[[], dt.datetime] | None = None) -> None:
        self.engine = engine
        self.ledger = ledger
        self.wallets = wallets
        self.policies = policies
        self.networks = networks  # chain -> network name
        self.clock = clock or (lambda: dt.datetime.now(dt.timezone.utc))

    # ---- request --------------------------------------------------------------------------

    def request(self, *, client_withdrawal_id: str, account_id: int, amount: int, destination: str,
                requested_by: str, priority: str = "normal", _from_quarantine: bool = False) -> WithdrawalView:
        if kill_switch(self.engine).engaged:
            raise CustodyError(CustodyErrorCode.withdrawals_halted, "withdrawals are halted by the kill switch")
        if priority not in ("normal", "fast"):
            raise LedgerError(ErrorCode.invalid_request, "priority must be normal or fast")
        if not isinstance(client_withdrawal_id, str) or not 1 <= len(client_withdrawal_id) <= 200:
            raise LedgerError(ErrorCode.invalid_request, "client_withdrawal_id must be 1-200 characters")
        account = self.ledger.get_account(account_id)
        allowed = (AccountKind.quarantine,) if _from_quarantine else (AccountKind.customer,)
        if account.kind not in allowed:  # the quarantine account only through Deposits.return_quarantined
            raise LedgerError(ErrorCode.invalid_request, "withdrawals are made from customer accounts")
        try:
            ca = self.wallets.chain_asset(account.asset)
        except LedgerError:
            raise CustodyError(CustodyErrorCode.asset_not_withdrawable, f"{account.asset} cannot be withdrawn") from None
        destination, script = validate_destination(ca.chain, self.networks.get(ca.chain, "regtest"), destination)
        fee = ca.withdrawal_fee_fast if priority == "fast" else ca.withdrawal_fee
        digest = hashlib.sha256(json.dumps([account_id, str(amount), destination, priority]).encode()).hexdigest()

        with self.engine.begin() as c:
            row = c.execute(
                text("INSERT INTO withdrawal_request (client_withdrawal_id, account_id, asset, chain, amount, fee_quoted, "
                     "destination, destination_script, priority, requested_by, content_hash, state) VALUES (:cw, :a, :asset, "
                     ":chain, :amt, :fee, :dest, :script, :prio, :by, :h, 'requested') "
                     "ON CONFLICT (account_id, client_withdrawal_id) DO NOTHING RETURNING id"),
                {"cw": client_withdrawal_id, "a": account_id, "asset": account.asset, "chain": ca.chain, "amt": amount,
                 "fee": fee, "dest": destination, "script": script, "prio": priority, "by": requested_by, "h": digest},
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
        emit(c, "withdrawal.requested", f"withdrawal.requested:{wid}",
             {"withdrawal_id": wid, "account_id": account_id, "outcome": decision.outcome.value})
        return _view(c.execute(text(f"{_W_SQL} WHERE id = :i"), {"i": wid}).one())

    def _evaluate(self, c: Connection, w: WithdrawalView) -> Decision:
        now = self.clock()
        policy = self.policies.current(c, w.account_id)
        window = self.policies.velocity_window()
        prior = c.execute(
            text("SELECT asset, amount, created_at FROM withdrawal_request WHERE account_id = :a AND id <> :i "
                 "AND state = ANY(:s) AND created_at > :since"),
            {"a": w.account_id, "i": w.id, "s": list(COUNTING_STATES), "since": now - window},
        ).all()
        request = WithdrawalRequest(str(w.id), str(w.account_id), w.asset, w.amount, w.fee_quoted, w.destination, w.requested_by)
        context = PolicyContext(now, tuple(PriorWithdrawal(p.asset, int(p.amount), p.created_at) for p in prior))
        return evaluate(request, context, policy)

    @staticmethod
    def _store_decision(c: Connection, wid: int, d: Decision) -> int:
        return c.execute(
            text("INSERT INTO policy_decision (withdrawal_id, outcome, required_approvals, reasons, policy_version, record, "
                 "decided_at, expires_at) VALUES (:w, :o, :k, :r, :v, CAST(:rec AS jsonb), :at, :exp) RETURNING id"),
            {"w": wid, "o": d.outcome.value, "k": d.required_approvals, "r": [x.value for x in d.reasons],
             "v": d.policy_version, "rec": json.dumps(d.to_record()), "at": d.decided_at, "exp": d.expires_at},
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
        emit(c, "withdrawal.rejected", f"withdrawal.rejected:{wid}:{decision_id}", {"withdrawal_id": wid})
        return "rejected"

    # ---- operator decisions ---------------------------------------------------------------

    def approve(self, withdrawal_id: int, *, operator: str, comment: str) -> WithdrawalView:
        return self._act(withdrawal_id, operator, comment, "approve")

    def reject(self, withdrawal_id: int, *, operator: str, comment: str) -> WithdrawalView:
        return self._act(withdrawal_id, operator, comment, "reject")

    def _act(self, wid: int, operator: str, comment: str, action: str) -> WithdrawalView:
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
            if action == "approve":
                if operator.strip().casefold() == w.requested_by.strip().casefold():
                    raise CustodyError(CustodyErrorCode.requester_cannot_approve, "the requester may not approve their own withdrawal")
                if not decision.is_live(now):
                    raise CustodyError(CustodyErrorCode.decision_expired, f"the decision expired at {decision.expires_at.isoformat()}")
            inserted = c.execute(
                text("INSERT INTO approval (withdrawal_id, decision_id, operator, action, comment, at) VALUES (:w, :d, :o, :a, :c, :t) "
                     "ON CONFLICT (decision_id, operator) DO NOTHING RETURNING id"),
                {"w": wid, "d": w.decision_id, "o": operator, "a": action, "c": comment, "t": now},
            ).first()
            if inserted is None:
                raise CustodyError(CustodyErrorCode.already_acted, f"{operator} already acted on this decision")
            audit(c, operator, f"withdrawal.{action}", f"withdrawal:{wid}", {"comment": comment, "decision_id": w.decision_id})
            if action == "reject":
                self.ledger.release_hold(w.hold_id, owner=HOLD_OWNER, conn=c)
                advance(c, "withdrawal", wid, w.state, "rejected", reject_reasons=["operator_rejected"])
                emit(c, "withdrawal.rejected", f"withdrawal.rejected:{wid}", {"withdrawal_id": wid, "by": operator})
            else:
                approvals = c.execute(text("SELECT operator, at FROM approval WHERE decision_id = :d AND action = 'approve'"),
                                      {"d": w.decision_id}).all()
                if quorum_met(decision, [Approval(a.operator, a.at) for a in approvals], w.requested_by):
                    advance(c, "withdrawal", wid, "pending_approval", "approved")
                    emit(c, "withdrawal.approved", f"withdrawal.approved:{wid}", {"withdrawal_id": wid})
            return _view(c.execute(text(f"{_W_SQL} WHERE id = :i"), {"i": wid}).one())

    @staticmethod
    def _load_decision(c: Connection, w: WithdrawalView) -> Decision:
        d = c.execute(text("SELECT outcome, required_approvals, reasons, policy_version, decided_at, expires_at "
                           "FROM policy_decision WHERE id = :i"), {"i": w.decision_id}).one()
        request = WithdrawalRequest(str(w.id), str(w.account_id), w.asset, w.amount, w.fee_quoted, w.destination, w.requested_by)
        return Decision(Outcome(d.outcome), d.required_approvals, tuple(ReasonCode(r) for r in d.reasons), d.policy_version,
                        request, PolicyContext(d.decided_at), None, d.decided_at, d.expires_at)

    # ---- destination allowlists -----------------------------------------------------------

    def set_allowlist(self, account_id: int, *, mode: str, cooling_off: dt.timedelta = dt.timedelta(0), approvals: int = 1,
                      by: str) -> None:
        """Turn on (or change) an account's allowlist: `enforce` rejects other destinations, `review`
        sends them to operators; a newly added destination needs `approvals` during `cooling_off`."""
        if mode not in ("enforce", "review") or approvals < 1 or cooling_off < dt.timedelta(0):
            raise LedgerError(ErrorCode.invalid_request, "mode is enforce or review, approvals >= 1, cooling_off >= 0")
        self.ledger.get_account(account_id)  # account_not_found (404), not a foreign-key violation
        with self.engine.begin() as c:
            c.execute(text("INSERT INTO allowlist_policy (account_id, mode, cooling_off_secs, approvals) VALUES (:a, :m, :s, :k) "
                           "ON CONFLICT (account_id) DO UPDATE SET mode = :m, cooling_off_secs = :s, approvals = :k, updated_at = now()"),
                      {"a": account_id, "m": mode, "s": int(cooling_off.total_seconds()), "k": approvals})
            audit(c, by, "allowlist.policy", f"account:{account_id}", {"mode": mode, "cooling_off_secs": int(cooling_off.total_seconds()),
                                                                      "approvals": approvals})

    def allow_destination(self, account_id: int, destination: str, *, by: str) -> str:
        """Add a destination to an account's allowlist (validated for the account's chain); idempotent."""
        account = self.ledger.get_account(account_id)
        chain = self.wallets.chain_asset(account.asset).chain
        destination, _ = validate_destination(chain, self.networks.get(chain, "regtest"), destination)
        with self.engine.begin() as c:
            added = c.execute(text("INSERT INTO allowlist_entry (account_id, address, added_by) VALUES (:a, :d, :b) "
                                   "ON CONFLICT DO NOTHING RETURNING added_at"), {"a": account_id, "d": destination, "b": by}).first()
            if added is not None:
                audit(c, by, "allowlist.add", f"account:{account_id}", {"address": destination})
        return destination

    # ---- reads ----------------------------------------------------------------------------

    def get(self, wid: int) -> WithdrawalView:
        with self.engine.connect() as c:
            row = c.execute(text(f"{_W_SQL} WHERE id = :i"), {"i": wid}).first()
        if row is None:
            raise CustodyError(CustodyErrorCode.withdrawal_not_found, f"no withdrawal {wid}")
        return _view(row)

    def list(self, *, state: str | None = None, account_id: int | None = None, limit: int = 200) -> list[WithdrawalView]:
        with self.engine.connect() as c:
            rows = c.execute(
                text(f"{_W_SQL} WHERE (CAST(:s AS text) IS NULL OR state = :s) AND (CAST(:a AS bigint) IS NULL OR account_id = :a) "
                     "ORDER BY id LIMIT :l"), {"s": state, "a": account_id, "l": limit}).all()
        return [_view(r) for r in rows]


_W_SQL = ("SELECT id, client_withdrawal_id, account_id, asset, chain, amount, fee_quoted, destination, priority, requested_by, "
          "state, hold_id, decision_id, batch_id, reject_reasons, content_hash FROM withdrawal_request")


def _view(row, *, created: bool = True) -> WithdrawalView:
    return WithdrawalView(row.id, row.client_withdrawal_id, row.account_id, row.asset, row.chain, int(row.amount),
                          int(row.fee_quoted), row.destination, row.priority, row.requested_by, row.state, row.hold_id,
                          row.decision_id, row.batch_id, tuple(row.reject_reasons), created)
