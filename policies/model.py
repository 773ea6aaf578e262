"""What the policy engine reads and what it returns: request, context, decision, approval.

The engine never reads a clock or a database: `PolicyContext.now` is the time of the decision,
`PolicyContext.recent_withdrawals` is the account's history and `PolicyContext.owner_withdrawals`
the history of all the owner's accounts, which the velocity rules sum.
Custody gathers both, calls `evaluate`, and stores `Decision.to_record()` as the
`policy_decision` row.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from policies._checks import normalise_address, require_aware, require_int
from policies.reasons import Outcome, ReasonCode


@dataclass(frozen=True)
class QuarantineReturn:
    """What a withdrawal returning a quarantined deposit pays back: the deposit and the addresses
    that sent it (its original senders; empty when unknown)."""

    deposit_id: str
    original_senders: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "original_senders", tuple(self.original_senders))


@dataclass(frozen=True)
class WithdrawalRequest:
    """A customer's withdrawal as policy sees it. `fee` is the network fee it may spend.

    `owner` is the account's owner (None: the account has none, so only the account's own velocity
    limit applies); `return_of` is set when the withdrawal returns a quarantined deposit.
    """

    withdrawal_id: str
    account_id: str
    asset: str
    amount: int
    fee: int
    destination: str
    requested_by: str
    owner: str | None = None
    return_of: QuarantineReturn | None = None

    def __post_init__(self) -> None:
        # Types are checked here; values (zero, negative) are the engine's to reject with a code.
        require_int("WithdrawalRequest.amount", self.amount)
        require_int("WithdrawalRequest.fee", self.fee)

    def pays_original_sender(self) -> bool:
        """Does this quarantine return pay one of the deposit's own senders (compared normalised)?"""
        if self.return_of is None:
            return False
        wanted = normalise_address(self.destination)
        return any(normalise_address(s) == wanted for s in self.return_of.original_senders)


@dataclass(frozen=True)
class PriorWithdrawal:
    """One earlier withdrawal (of the same account, or of any account of the same owner) that
    counts towards velocity.

    Custody passes the withdrawals that still count (held, approved, signed, paid), not the
    rejected or released ones.
    """

    asset: str
    amount: int
    at: datetime

    def __post_init__(self) -> None:
        require_int("PriorWithdrawal.amount", self.amount, minimum=0)
        require_aware("PriorWithdrawal.at", self.at)


@dataclass(frozen=True)
class PolicyContext:
    """Everything outside the request that a decision depends on."""

    now: datetime
    recent_withdrawals: tuple[PriorWithdrawal, ...] = ()
    owner_withdrawals: tuple[PriorWithdrawal, ...] = ()  # every account of the owner, this one's included

    def __post_init__(self) -> None:
        require_aware("PolicyContext.now", self.now)
        object.__setattr__(self, "recent_withdrawals", tuple(self.recent_withdrawals))
        object.__setattr__(self, "owner_withdrawals", tuple(self.owner_withdrawals))


@dataclass(frozen=True)
class Approval:
    """One operator's approval of a decision, stamped by the caller's clock."""

    operator_id: str
    approved_at: datetime

    def __post_init__(self) -> None:
        require_aware("Approval.approved_at", self.approved_at)


@dataclass(frozen=True)
class Decision:
    """The engine's answer, with everything needed to explain it later.

    - `outcome`: approve, needs_approval (`required_approvals` operators) or reject.
    - `reasons`: every rule that fired, in precedence order; empty for a plain approval.
    - `policy_version`: the `PolicySet.version` it was made under.
    - `request`, `context`, `velocity_window_total`, `owner_window_total`: the inputs, echoed.
    - valid for `decided_at <= t < expires_at`; approvals outside that interval do not count.
    """

    outcome: Outcome
    required_approvals: int
    reasons: tuple[ReasonCode, ...]
    policy_version: str
    request: WithdrawalRequest
    context: PolicyContext
    velocity_window_total: int | None
    decided_at: datetime
    expires_at: datetime
    owner_window_total: int | None = None

    def is_live(self, at: datetime) -> bool:
        return self.decided_at <= at < self.expires_at

    def to_record(self) -> dict[str, Any]:
        """A JSON-ready dict for the `policy_decision` row (amounts stay exact ints)."""
        r = self.request
        return {
            "outcome": self.outcome.value,
            "required_approvals": self.required_approvals,
            "reasons": [code.value for code in self.reasons],
            "policy_version": self.policy_version,
            "decided_at": self.decided_at.isoformat(),
            "expires_at": self.expires_at.isoformat(),
            "inputs": {
                "withdrawal_id": r.withdrawal_id,
                "account_id": r.account_id,
                "asset": r.asset,
                "amount": r.amount,
                "fee": r.fee,
                "destination": r.destination,
                "requested_by": r.requested_by,
                "now": self.context.now.isoformat(),
                "recent_withdrawals": [
                    {"asset": p.asset, "amount": p.amount, "at": p.at.isoformat()}
                    for p in self.context.recent_withdrawals
                ],
                "velocity_window_total": self.velocity_window_total,
                "owner": r.owner,
                "owner_withdrawals": [
                    {"asset": p.asset, "amount": p.amount, "at": p.at.isoformat()}
                    for p in self.context.owner_withdrawals
                ],
                "owner_window_total": self.owner_window_total,
                "quarantine_return": None if r.return_of is None else {
                    "deposit_id": r.return_of.deposit_id,
                    "original_senders": list(r.return_of.original_senders),
                    "destination_is_original_sender": r.pays_original_sender(),
                },
            },
        }

