"""Policy engine: pure decisions over a withdrawal (or batch) and its context. No I/O in the rules.

- `rules`: the versioned policy data (`PolicySet` and its parts).
- `model`: the engine's inputs and outputs (`WithdrawalRequest`, `PolicyContext`, `Decision`, ...).
- `reasons`: outcomes and reason codes, each with a one-line meaning.
- `engine.evaluate(request, context, policy) -> Decision`.
- `quorum.quorum_met(decision, approvals, requester) -> bool`.
- `rules.plan_allowlist_change(current, requested) -> AllowlistPlan`: tighten now, loosen on approval.

Standard library only; amounts are ints in minor units; time is passed in, never read.
"""
from policies.engine import evaluate
from policies.model import Approval, Decision, PolicyContext, PriorWithdrawal, QuarantineReturn, WithdrawalRequest
from policies.quorum import eligible_approvers, quorum_met
from policies.reasons import Effect, Outcome, ReasonCode
from policies.rules import (
    Allowlist,
    AllowlistEntry,
    AllowlistMode,
    AllowlistPlan,
    AllowlistRule,
    AmountTier,
    AssetPolicy,
    PolicySet,
    VelocityLimit,
    plan_allowlist_change,
)
from policies._checks import normalise_address

__all__ = [
    "Allowlist",
    "AllowlistEntry",
    "AllowlistMode",
    "AllowlistPlan",
    "AllowlistRule",
    "AmountTier",
    "Approval",
    "AssetPolicy",
    "Decision",
    "Effect",
    "Outcome",
    "PolicyContext",
    "PolicySet",
    "PriorWithdrawal",
    "QuarantineReturn",
    "ReasonCode",
    "VelocityLimit",
    "WithdrawalRequest",
    "eligible_approvers",
    "evaluate",
    "normalise_address",
    "plan_allowlist_change",
    "quorum_met",
]
