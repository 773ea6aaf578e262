"""Self-trade prevention: what happens when an incoming order meets a resting order of its own group.

Accounts under common control share an `stp_group` (an order without one is in a group of its own
account, so an account never trades with itself). The check runs while the matcher plans a match,
before any fill exists, so no trade print ever has to be recalled.

Published policies (the incoming order's `stp_policy`, else the engine default):

- `cancel_newest` (the DEFAULT): the incoming order's remainder is removed; the resting order keeps
  its place. Chosen as default because the resting order's queue position is the valuable thing
  and the incoming order is the one its owner can still correct. The incoming order is `rejected`
  (`self_trade_prevented`) if nothing traded, else `cancelled`.
- `cancel_oldest`: the resting order is cancelled and matching continues past it.
- `decrement_both`: both lose the smaller of the two open quantities without a trade; an order
  brought to zero this way is cancelled (or rejected, for an incoming order that never traded). A
  market bid has a budget, not a quantity, so for it `decrement_both` acts as `cancel_newest`.
"""
from __future__ import annotations

import enum


class StpPolicy(str, enum.Enum):
    """What self-trade prevention does on a conflict."""

    cancel_newest = "cancel_newest"
    cancel_oldest = "cancel_oldest"
    decrement_both = "decrement_both"


DEFAULT_POLICY = StpPolicy.cancel_newest
_CANCEL_NEWEST, _DECREMENT_BOTH = StpPolicy.cancel_newest, StpPolicy.decrement_both


def same_group(taker_group: str, maker_group: str) -> bool:
    """True when the two orders' owners are under common control and must not trade."""
    return taker_group == maker_group


def effective_policy(policy: StpPolicy, taker_has_quantity: bool) -> StpPolicy:
    """The policy actually applied: `decrement_both` needs a quantity on the incoming order."""
    if policy is _DECREMENT_BOTH and not taker_has_quantity:
        return _CANCEL_NEWEST
    return policy
