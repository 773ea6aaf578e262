"""Self-trade prevention: what happens when an incoming order meets a resting order it must not
trade with.

Who must not trade (`prevented`): two orders of the SAME account never trade, whatever `stp_group`
each carries; two orders of different accounts do not trade when they carry the same group
(accounts under common control). A group therefore only WIDENS prevention: a caller cannot choose
groups that let an account trade with itself (issue 11: such a fill, buyer and seller the same
ledger account, was refused by the ledger after the engine had matched, and the market had to be
rebuilt). An order without a group is in the group named by its account. The check runs while
the matcher plans a match, before any fill exists, so no trade print ever has to be recalled.
Journals written before the same-account rule replay unchanged: the ledger refused every fill
between an account and itself, so no committed command ever made one.

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


def prevented(taker_account: str, taker_group: str, maker_account: str, maker_group: str) -> bool:
    """True when the two orders must not trade: one account, or owners under common control.
    (`matcher.plan_match` inlines this test on its hot path.)"""
    return taker_account == maker_account or taker_group == maker_group


def effective_policy(policy: StpPolicy, taker_has_quantity: bool) -> StpPolicy:
    """The policy actually applied: `decrement_both` needs a quantity on the incoming order."""
    if policy is _DECREMENT_BOTH and not taker_has_quantity:
        return _CANCEL_NEWEST
    return policy
