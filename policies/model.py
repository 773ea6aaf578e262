"""What the policy engine reads and what it returns: request, context, decision, approval.

The engine never reads a clock or a database: `PolicyContext.now` is the time of the decision
and `PolicyContext.recent_withdrawals` is the account's history that the velocity rule sums.
Custody gathers both, calls `evaluate`, and stores `Decision.to_record()` as the
`policy_decision` row.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from policies._checks import require_aware, require_int
from policies.reasons import Outcome, ReasonCode


@dataclass(frozen=True)
class WithdrawalRequest:
    """A customer's withdrawal as policy sees it. `fee` is the network fee it may spend."""

    withdrawal_id: str
    account_id: str
    asset: str
    amount: int
    fee: int
    destination: str
    requested_by: str

    def __post_init__(self) -> None:
        # Types are checked here; values (zero, negative) are the engine's to reject with a code.
        require_int("WithdrawalRequest.amount", self.amount)
        require_int("WithdrawalRequest.fee", self.fee)


@dataclass(frozen=True)
class PriorWithdrawal:
    """One earlier withdrawal of the same account that counts towards velocity.

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

    def __post_init__(self) -> None:
        require_aware("PolicyContext.now", self.now)
        object.__setattr__(self, "recent_withdrawals", tuple(self.recent_withdrawals))


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
    - `request`, `context`, `velocity_window_total`: the inputs, echoed.
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
            },
        }
