"""`quorum_met`: have enough distinct, eligible operators approved a decision?

Guarantees:
- a rejected decision never meets quorum; an automatic approval needs no approvals;
- the requester never counts, whether named by the caller or recorded in the request;
- each operator counts once, however many approvals they submit; operator ids are compared
  trimmed and case-folded, so "Alice" and "alice " are one person (folding can only merge ids,
  never split one person into two);
- only approvals made while the decision was live count: `decided_at <= approved_at <
  expires_at`; one made at or after expiry, or before the decision existed, does not.
"""
from __future__ import annotations

from collections.abc import Iterable

from policies.model import Approval, Decision
from policies.reasons import Outcome


def _identity(operator_id: str) -> str:
    return operator_id.strip().casefold()


def eligible_approvers(decision: Decision, approvals: Iterable[Approval], requester: str) -> frozenset[str]:
    """The distinct operator identities whose approvals count towards `decision`."""
    excluded = {_identity(requester), _identity(decision.request.requested_by)}
    return frozenset(
        who
        for approval in approvals
        if (who := _identity(approval.operator_id))
        and who not in excluded
        and decision.is_live(approval.approved_at)
    )


def quorum_met(decision: Decision, approvals: Iterable[Approval], requester: str) -> bool:
    """True when `decision` may proceed given `approvals` (see the module's guarantees)."""
    if decision.outcome is Outcome.REJECT:
        return False
    if decision.outcome is Outcome.APPROVE:
        return True
    return len(eligible_approvers(decision, approvals, requester)) >= decision.required_approvals
