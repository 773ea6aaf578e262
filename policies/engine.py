"""`evaluate`: one withdrawal request + its context + a policy version -> a `Decision`.

Pure: no clock, no I/O, no randomness; the same inputs always give the same decision.

How the outcome is chosen:
- every rule is evaluated and every rule that fires is recorded, so an operator sees all the
  problems at once rather than one per retry;
- any rejecting reason (the kill switch among them) makes the outcome `reject`;
- otherwise the required approvals are the largest k asked for by any approval reason, and the
  outcome is `needs_approval(k)`; with no reasons it is `approve`;
- velocity is counted twice: the account's own withdrawals, and every withdrawal of the asset from
  all accounts of the same owner, so opening a second account never brings a fresh limit;
- a quarantine return always needs operators (`quarantine_return_approvals`); one paying anyone
  but the deposit's original sender carries its own reason instead, which flags it to them.
"""
from __future__ import annotations

from datetime import datetime

from policies.model import Decision, PolicyContext, PriorWithdrawal, WithdrawalRequest
from policies.reasons import Outcome, ReasonCode
from policies.rules import AllowlistMode, PolicySet, VelocityLimit


def evaluate(request: WithdrawalRequest, context: PolicyContext, policy: PolicySet) -> Decision:
    """Decide a withdrawal under `policy` at `context.now`."""
    # code -> approvals it requires (0 for rejecting codes)
    fired: dict[ReasonCode, int] = {}
    window_total: int | None = None
    owner_total: int | None = None

    if policy.kill_switch:
        fired[ReasonCode.KILL_SWITCH_ON] = 0
    if request.amount <= 0:
        fired[ReasonCode.AMOUNT_MUST_BE_POSITIVE] = 0
    if request.fee < 0:
        fired[ReasonCode.FEE_MUST_NOT_BE_NEGATIVE] = 0
    if policy.is_denied(request.destination):
        fired[ReasonCode.DESTINATION_SANCTIONED] = 0
    fired.update(_allowlist(request, context.now, policy))

    asset = policy.assets.get(request.asset)
    if asset is None:
        fired[ReasonCode.ASSET_NOT_CONFIGURED] = 0
    else:
        if request.amount > 0:
            if request.amount < asset.min_amount:
                fired[ReasonCode.AMOUNT_BELOW_MINIMUM] = 0
            tier = asset.tier_for(request.amount)
            if tier is None:
                fired[ReasonCode.AMOUNT_ABOVE_MAXIMUM] = 0
            elif tier.approvals > 0:
                fired[ReasonCode.AMOUNT_TIER_REQUIRES_APPROVAL] = tier.approvals
        if request.fee > asset.fee_ceiling:
            fired[ReasonCode.FEE_ABOVE_CEILING] = 0

    velocity = policy.velocity_for(request.account_id, request.asset)
    if velocity is not None and request.amount > 0:
        window_total = _window_total(context.recent_withdrawals, request, context.now, velocity)
        if window_total > velocity.max_amount:
            fired[ReasonCode.VELOCITY_LIMIT_EXCEEDED] = velocity.approvals
    owner_velocity = policy.owner_velocity_for(request.owner, request.asset) if request.owner is not None else None
    if owner_velocity is not None and request.amount > 0:
        owner_total = _window_total(context.owner_withdrawals, request, context.now, owner_velocity)
        if owner_total > owner_velocity.max_amount:
            fired[ReasonCode.OWNER_VELOCITY_LIMIT_EXCEEDED] = owner_velocity.approvals

    if request.return_of is not None:
        # One reason or the other, never neither: the second also flags the destination.
        code = (ReasonCode.QUARANTINE_RETURN_REQUIRES_APPROVAL if request.pays_original_sender()
                else ReasonCode.RETURN_DESTINATION_NOT_ORIGINAL_SENDER)
        fired[code] = policy.quarantine_return_approvals

    reasons = tuple(code for code in ReasonCode if code in fired)  # precedence order
    if any(code.rejects for code in reasons):
        outcome, required = Outcome.REJECT, 0
    else:
        required = max(fired.values(), default=0)
        outcome = Outcome.NEEDS_APPROVAL if required else Outcome.APPROVE

    return Decision(
        outcome=outcome,
        required_approvals=required,
        reasons=reasons,
        policy_version=policy.version,
        request=request,
        context=context,
        velocity_window_total=window_total,
        decided_at=context.now,
        expires_at=context.now + policy.decision_ttl,
        owner_window_total=owner_total,
    )


def _allowlist(request: WithdrawalRequest, now: datetime, policy: PolicySet) -> dict[ReasonCode, int]:
    allowlist = policy.allowlists.get(request.account_id)
    if allowlist is None:
        return {}
    entry = allowlist.entry_for(request.destination)
    if entry is None:
        if allowlist.mode is AllowlistMode.ENFORCE:
            return {ReasonCode.DESTINATION_NOT_ALLOWLISTED: 0}
        return {ReasonCode.DESTINATION_NOT_YET_ALLOWLISTED: allowlist.approvals}
    # Cooling off ends exactly at added_at + the longer of the entry's and the list's cooling-off.
    usable_from = entry.usable_from(allowlist.cooling_off)
    if usable_from is not None and now < usable_from:
        return {ReasonCode.DESTINATION_COOLING_OFF: allowlist.approvals}
    return {}


def _window_total(
    history: tuple[PriorWithdrawal, ...], request: WithdrawalRequest, now: datetime, limit: VelocityLimit
) -> int:
    """Sum of this asset's withdrawals in `history` in the window (now - window, now], plus this
    request (which `history` never contains).

    A withdrawal exactly `window` old has left the window. One stamped after `now` (clock skew
    between writers) still counts: over-counting can only ask for an approval, under-counting
    could let a burst through.
    """
    start = now - limit.window
    earlier = sum(p.amount for p in history if p.asset == request.asset and p.at > start)
    return earlier + request.amount
