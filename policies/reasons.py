"""Outcomes and reason codes of a policy decision, with a one-line meaning each.

Reason codes are listed in order of precedence (a decision lists its reasons in this order) and
each has a fixed effect: it either rejects the withdrawal or requires operator approvals. A
decision that auto-approves carries no reasons: reasons explain why a withdrawal was NOT simply
approved.

| code | effect | meaning |
| --- | --- | --- |
| kill_switch_on | reject | withdrawals are halted by the kill switch |
| asset_not_configured | reject | the policy set has no rules for this asset |
| amount_must_be_positive | reject | the amount is zero or negative |
| fee_must_not_be_negative | reject | the fee is negative |
| destination_sanctioned | reject | the destination is on the sanctions denylist |
| destination_not_allowlisted | reject | the account enforces an allowlist and the destination is not on it |
| amount_below_minimum | reject | the amount is below the asset's minimum withdrawal |
| amount_above_maximum | reject | the amount is above the asset's highest amount tier |
| fee_above_ceiling | reject | the fee is above the asset's fee ceiling |
| amount_tier_requires_approval | approval | the amount falls in a tier that needs operator approvals |
| velocity_limit_exceeded | approval | with this one, the account's withdrawals in the rolling window exceed the limit |
| owner_velocity_limit_exceeded | approval | with this one, the owner's withdrawals of this asset from all their accounts in the rolling window exceed the limit |
| destination_not_yet_allowlisted | approval | the account reviews new destinations and this one is not on its allowlist |
| destination_cooling_off | approval | the destination was added to the allowlist less than the cooling-off period ago |
| quarantine_return_requires_approval | approval | the withdrawal returns a quarantined deposit to its original sender: operators other than the requester approve it, whatever the amount |
| return_destination_not_original_sender | approval | the withdrawal returns a quarantined deposit to an address other than its original sender (flagged): operators other than the requester approve it, whatever the amount |
"""
from __future__ import annotations

from enum import Enum, StrEnum


class Outcome(StrEnum):
    APPROVE = "approve"
    NEEDS_APPROVAL = "needs_approval"
    REJECT = "reject"


class Effect(Enum):
    REJECT = "reject"
    APPROVAL = "approval"


class ReasonCode(StrEnum):
    """Why a decision is not a plain approval. Definition order is precedence order."""

    KILL_SWITCH_ON = "kill_switch_on"
    ASSET_NOT_CONFIGURED = "asset_not_configured"
    AMOUNT_MUST_BE_POSITIVE = "amount_must_be_positive"
    FEE_MUST_NOT_BE_NEGATIVE = "fee_must_not_be_negative"
    DESTINATION_SANCTIONED = "destination_sanctioned"
    DESTINATION_NOT_ALLOWLISTED = "destination_not_allowlisted"
    AMOUNT_BELOW_MINIMUM = "amount_below_minimum"
    AMOUNT_ABOVE_MAXIMUM = "amount_above_maximum"
    FEE_ABOVE_CEILING = "fee_above_ceiling"
    AMOUNT_TIER_REQUIRES_APPROVAL = "amount_tier_requires_approval"
    VELOCITY_LIMIT_EXCEEDED = "velocity_limit_exceeded"
    OWNER_VELOCITY_LIMIT_EXCEEDED = "owner_velocity_limit_exceeded"
    DESTINATION_NOT_YET_ALLOWLISTED = "destination_not_yet_allowlisted"
    DESTINATION_COOLING_OFF = "destination_cooling_off"
    QUARANTINE_RETURN_REQUIRES_APPROVAL = "quarantine_return_requires_approval"
    RETURN_DESTINATION_NOT_ORIGINAL_SENDER = "return_destination_not_original_sender"

    @property
    def meaning(self) -> str:
        return _TABLE[self][1]

    @property
    def effect(self) -> Effect:
        return _TABLE[self][0]

    @property
    def rejects(self) -> bool:
        return self.effect is Effect.REJECT


_R, _A = Effect.REJECT, Effect.APPROVAL
_TABLE: dict[ReasonCode, tuple[Effect, str]] = {
    ReasonCode.KILL_SWITCH_ON: (_R, "withdrawals are halted by the kill switch"),
    ReasonCode.ASSET_NOT_CONFIGURED: (_R, "the policy set has no rules for this asset"),
    ReasonCode.AMOUNT_MUST_BE_POSITIVE: (_R, "the amount is zero or negative"),
    ReasonCode.FEE_MUST_NOT_BE_NEGATIVE: (_R, "the fee is negative"),
    ReasonCode.DESTINATION_SANCTIONED: (_R, "the destination is on the sanctions denylist"),
    ReasonCode.DESTINATION_NOT_ALLOWLISTED: (
        _R,
        "the account enforces an allowlist and the destination is not on it",
    ),
    ReasonCode.AMOUNT_BELOW_MINIMUM: (_R, "the amount is below the asset's minimum withdrawal"),
    ReasonCode.AMOUNT_ABOVE_MAXIMUM: (_R, "the amount is above the asset's highest amount tier"),
    ReasonCode.FEE_ABOVE_CEILING: (_R, "the fee is above the asset's fee ceiling"),
    ReasonCode.AMOUNT_TIER_REQUIRES_APPROVAL: (
        _A,
        "the amount falls in a tier that needs operator approvals",
    ),
    ReasonCode.VELOCITY_LIMIT_EXCEEDED: (
        _A,
        "with this one, the account's withdrawals in the rolling window exceed the limit",
    ),
    ReasonCode.OWNER_VELOCITY_LIMIT_EXCEEDED: (
        _A,
        "with this one, the owner's withdrawals of this asset from all their accounts in the rolling window exceed the limit",
    ),
    ReasonCode.DESTINATION_NOT_YET_ALLOWLISTED: (
        _A,
        "the account reviews new destinations and this one is not on its allowlist",
    ),
    ReasonCode.DESTINATION_COOLING_OFF: (
        _A,
        "the destination was added to the allowlist less than the cooling-off period ago",
    ),
    ReasonCode.QUARANTINE_RETURN_REQUIRES_APPROVAL: (
        _A,
        "the withdrawal returns a quarantined deposit to its original sender: operators other than the requester approve it, whatever the amount",
    ),
    ReasonCode.RETURN_DESTINATION_NOT_ORIGINAL_SENDER: (
        _A,
        "the withdrawal returns a quarantined deposit to an address other than its original sender (flagged): operators other than the requester approve it, whatever the amount",
    ),
}
