"""Withdrawal policy as versioned, immutable data.

A `PolicySet` is one version of every rule; changing any rule (including flipping the kill
switch) means building a new `PolicySet` with a new version string, so every decision can name
exactly the rules it was made under. All amounts are ints in the asset's minor unit.

Guarantees checked at construction:
- amount tiers are non-empty, strictly ascending, unbounded only in the last tier, and never
  need fewer approvals for a larger amount;
- every limit, ceiling and approval count is a non-negative int (never a float or a bool);
- allowlist and denylist addresses are stored normalised (see `normalise_address`).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from types import MappingProxyType

from policies._checks import normalise_address, require_aware, require_int


@dataclass(frozen=True)
class AmountTier:
    """Amounts up to and including `up_to` need `approvals` distinct operators (0 = automatic).

    `up_to=None` means unbounded; only the last tier of an asset may be unbounded.
    """

    up_to: int | None
    approvals: int

    def __post_init__(self) -> None:
        if self.up_to is not None:
            require_int("AmountTier.up_to", self.up_to, minimum=1)
        require_int("AmountTier.approvals", self.approvals, minimum=0)


@dataclass(frozen=True)
class VelocityLimit:
    """At most `max_amount` withdrawn per account within any `window`; beyond it, `approvals`."""

    window: timedelta
    max_amount: int
    approvals: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.window, timedelta) or self.window <= timedelta(0):
            raise ValueError("VelocityLimit.window must be a positive timedelta")
        require_int("VelocityLimit.max_amount", self.max_amount, minimum=0)
        require_int("VelocityLimit.approvals", self.approvals, minimum=1)


@dataclass(frozen=True)
class AssetPolicy:
    """Rules for one asset: amount tiers, minimum, fee ceiling and the default velocity limit."""

    tiers: tuple[AmountTier, ...]
    fee_ceiling: int
    min_amount: int = 1
    velocity: VelocityLimit | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tiers", tuple(self.tiers))
        require_int("AssetPolicy.fee_ceiling", self.fee_ceiling, minimum=0)
        require_int("AssetPolicy.min_amount", self.min_amount, minimum=1)
        if not self.tiers:
            raise ValueError("AssetPolicy.tiers must not be empty")
        for lower, upper in zip(self.tiers, self.tiers[1:]):
            if lower.up_to is None:
                raise ValueError("only the last amount tier may be unbounded")
            if upper.up_to is not None and upper.up_to <= lower.up_to:
                raise ValueError("amount tiers must be strictly ascending")
            if upper.approvals < lower.approvals:
                raise ValueError("a larger amount tier may not need fewer approvals")

    def tier_for(self, amount: int) -> AmountTier | None:
        """The first tier whose bound covers `amount`; None when above every tier."""
        for tier in self.tiers:
            if tier.up_to is None or amount <= tier.up_to:
                return tier
        return None


class AllowlistMode(StrEnum):
    ENFORCE = "enforce"  # a destination not on the list is rejected
    REVIEW = "review"  # a destination not on the list needs operator approval


@dataclass(frozen=True)
class AllowlistEntry:
    """One allowed destination; `added_at` starts its cooling-off (None: predates the rule)."""

    address: str
    added_at: datetime | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", normalise_address(self.address))
        if self.added_at is not None:
            require_aware("AllowlistEntry.added_at", self.added_at)


@dataclass(frozen=True)
class Allowlist:
    """An account's destination allowlist.

    A destination added less than `cooling_off` ago needs `approvals` operators, as does (in
    REVIEW mode) a destination not on the list; in ENFORCE mode the latter is rejected.
    """

    entries: tuple[AllowlistEntry, ...]
    mode: AllowlistMode = AllowlistMode.ENFORCE
    cooling_off: timedelta = timedelta(0)
    approvals: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "entries", tuple(self.entries))
        object.__setattr__(self, "mode", AllowlistMode(self.mode))
        if not isinstance(self.cooling_off, timedelta) or self.cooling_off < timedelta(0):
            raise ValueError("Allowlist.cooling_off must be a non-negative timedelta")
        require_int("Allowlist.approvals", self.approvals, minimum=1)

    def entry_for(self, address: str) -> AllowlistEntry | None:
        wanted = normalise_address(address)
        # Lists are short (a customer's own addresses); a scan keeps the type trivially frozen.
        for entry in self.entries:
            if entry.address == wanted:
                return entry
        return None


def _frozen_mapping(value: Mapping) -> Mapping:
    return MappingProxyType(dict(value))


@dataclass(frozen=True)
class PolicySet:
    """One immutable version of every withdrawal rule.

    - `assets`: rules per asset code; a withdrawal of an asset not listed is rejected.
    - `denylist`: sanctioned addresses, rejected for every account.
    - `allowlists`: per account id, optional; accounts without one may send anywhere not denied.
    - `velocity_overrides`: per (account id, asset), replacing the asset's default limit.
    - `kill_switch`: when on, every withdrawal is rejected.
    - `decision_ttl`: how long a decision (and the approvals gathered for it) stays valid.
    """

    version: str
    assets: Mapping[str, AssetPolicy]
    denylist: frozenset[str] = frozenset()
    allowlists: Mapping[str, Allowlist] = field(default_factory=dict)
    velocity_overrides: Mapping[tuple[str, str], VelocityLimit] = field(default_factory=dict)
    kill_switch: bool = False
    decision_ttl: timedelta = timedelta(minutes=30)

    def __post_init__(self) -> None:
        if not isinstance(self.version, str) or not self.version.strip():
            raise ValueError("PolicySet.version must be a non-empty string")
        if type(self.kill_switch) is not bool:
            raise TypeError("PolicySet.kill_switch must be a bool")
        if not isinstance(self.decision_ttl, timedelta) or self.decision_ttl <= timedelta(0):
            raise ValueError("PolicySet.decision_ttl must be a positive timedelta")
        object.__setattr__(self, "assets", _frozen_mapping(self.assets))
        object.__setattr__(self, "allowlists", _frozen_mapping(self.allowlists))
        object.__setattr__(self, "velocity_overrides", _frozen_mapping(self.velocity_overrides))
        object.__setattr__(self, "denylist", _normalised_set(self.denylist))

    def velocity_for(self, account_id: str, asset: str) -> VelocityLimit | None:
        override = self.velocity_overrides.get((account_id, asset))
        if override is not None:
            return override
        asset_policy = self.assets.get(asset)
        return asset_policy.velocity if asset_policy else None

    def is_denied(self, address: str) -> bool:
        return normalise_address(address) in self.denylist


def _normalised_set(addresses: Iterable[str]) -> frozenset[str]:
    if isinstance(addresses, str):
        # A bare string would silently become a set of its characters.
        raise TypeError("denylist must be a collection of addresses, not one string")
    return frozenset(normalise_address(a) for a in addresses)
