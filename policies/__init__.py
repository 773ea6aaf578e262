"""Policy engine: pure decisions over a withdrawal (or batch) and its context. No I/O in the rules.

- `rules`: the versioned policy data (`PolicySet` and its parts).
- `model`: the engine's inputs and outputs (`WithdrawalRequest`, `PolicyContext`, `Decision`, ...).
- `reasons`: outcomes and reason codes, each with a one-line meaning.
- `engine.evaluate(request, context, policy) -> Decision`.
- `quorum.quorum_met(decision, approvals, requester) -> bool`.

Standard library only; amounts are ints in minor units; time is passed in, never read.
"""
from policies.engine import evaluate
from policies.model import Approval, Decision, PolicyContext, PriorWithdrawal, WithdrawalRequest
from policies.quorum import eligible_approvers, quorum_met
from policies.reasons import Effect, Outcome, ReasonCode
from policies.rules import (
    Allowlist,
    AllowlistEntry,
    AllowlistMode,
    AmountTier,
    AssetPolicy,
    PolicySet,
    VelocityLimit,
)
from policies._checks import normalise_address

__all__ = [
    "Allowlist",
    "AllowlistEntry",
    "AllowlistMode",
    "AmountTier",
    "Approval",
    "AssetPolicy",
    "Decision",
    "Effect",
    "Outcome",
    "PolicyContext",
    "PolicySet",
    "PriorWithdrawal",
    "ReasonCode",
    "VelocityLimit",
    "WithdrawalRequest",
    "eligible_approvers",
    "evaluate",
    "normalise_address",
    "quorum_met",
]
