"""Withdrawal policy as versioned, immutable data.

A `PolicySet` is one version of every rule; changing any rule (including flipping the kill
switch) means building a new `PolicySet` with a new version string, so every decision can name
exactly the rules it was made under. All amounts are ints in the asset's minor unit.

Guarantees checked at construction:
- amount tiers are non-empty, strictly ascending, unbounded only in the last tier, and never
  need fewer approvals for a larger amount;
- every limit, ceiling and approval count is a non-negative int (never a float or a bool);
- allowlist and denylist addresses are stored normalised (see `normalise_address`);
- an allowlist entry keeps the cooling-off in force when it was added: a later, shorter cooling-off
  never shortens it, a longer one applies to it at once (the longer of the two counts).

An account's allowlist settings (`AllowlistRule`) change by `plan_allowlist_change`: a tightening
applies at once, a loosening waits for an operator.
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
    """At most `max_amount` withdrawn within any `window` (per account, or per owner across all their
    accounts of the asset); beyond it, `approvals`."""

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
    """Rules for one asset: amount tiers, minimum, fee ceiling and the default velocity limits.

    `sweep_threshold` (ethereum, custody.eth_sweeps): once the booked deposits of the asset not yet
    swept exceed it, every deposit address holding some is swept to the hot address.
    `sweep_min_per_address` (with `sweep_threshold`): what one deposit address must hold of the asset
    (booked, unswept) to be swept, so dust is never paid gas worth more than it; None: 1% of
    `sweep_threshold`, at least 1 (custody.eth_sweeps `EthSweeps.minimum`).
    `velocity` limits each account; `owner_velocity` limits each owner over all their accounts of
    the asset (None: the same figures as `velocity`, so a second account of one owner never brings
    a fresh limit).
    """

    tiers: tuple[AmountTier, ...]
    fee_ceiling: int
    min_amount: int = 1
    velocity: VelocityLimit | None = None
    owner_velocity: VelocityLimit | None = None
    sweep_threshold: int | None = None  # minor units of booked, unswept deposits above which they are swept; None: never
    sweep_min_per_address: int | None = None  # minor units one address must hold to be swept; None: 1% of the threshold

    def __post_init__(self) -> None:
        object.__setattr__(self, "tiers", tuple(self.tiers))
        require_int("AssetPolicy.fee_ceiling", self.fee_ceiling, minimum=0)
        if self.sweep_threshold is not None:
            require_int("AssetPolicy.sweep_threshold", self.sweep_threshold, minimum=0)
        if self.sweep_min_per_address is not None:
            require_int("AssetPolicy.sweep_min_per_address", self.sweep_min_per_address, minimum=1)
            if self.sweep_threshold is None:
                raise ValueError("AssetPolicy.sweep_min_per_address needs a sweep_threshold (the asset is never swept)")
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
    """One allowed destination; `added_at` starts its cooling-off (None: predates the rule).

    `cooling_off` is the allowlist's cooling-off when the entry was added (None: not recorded). The
    entry cools off for the longer of it and the allowlist's current one, so loosening the
    allowlist later never makes an address already added usable sooner.
    """

    address: str
    added_at: datetime | None = None
    cooling_off: timedelta | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", normalise_address(self.address))
        if self.added_at is not None:
            require_aware("AllowlistEntry.added_at", self.added_at)
        if self.cooling_off is not None and (not isinstance(self.cooling_off, timedelta) or self.cooling_off < timedelta(0)):
            raise ValueError("AllowlistEntry.cooling_off must be a non-negative timedelta")

    def usable_from(self, current_cooling_off: timedelta) -> datetime | None:
        """When the entry's cooling-off ends (exactly then it is over); None: no cooling-off."""
        if self.added_at is None:
            return None
        return self.added_at + max(current_cooling_off, self.cooling_off or timedelta(0))


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

    @property
    def rule(self) -> "AllowlistRule":
        return AllowlistRule(self.mode, self.cooling_off, self.approvals)


_MODE_STRICTNESS = {None: 0, AllowlistMode.REVIEW: 1, AllowlistMode.ENFORCE: 2}


@dataclass(frozen=True)
class AllowlistRule:
    """An allowlist's settings without its entries: what a customer asks to change.

    Strictness, per setting: no allowlist < `review` < `enforce`; a longer cooling-off and more
    approvals are stricter.
    """

    mode: AllowlistMode
    cooling_off: timedelta = timedelta(0)
    approvals: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", AllowlistMode(self.mode))
        if not isinstance(self.cooling_off, timedelta) or self.cooling_off < timedelta(0):
            raise ValueError("AllowlistRule.cooling_off must be a non-negative timedelta")
        require_int("AllowlistRule.approvals", self.approvals, minimum=1)

    def loosened_from(self, current: "AllowlistRule | None") -> tuple[str, ...]:
        """The settings (`mode`, `cooling_off`, `approvals`) in which this rule is less strict than
        `current` (None: the account has no allowlist, which nothing is looser than)."""
        if current is None:
            return ()
        loosened = []
        if _MODE_STRICTNESS[self.mode] < _MODE_STRICTNESS[current.mode]:
            loosened.append("mode")
        if self.cooling_off < current.cooling_off:
            loosened.append("cooling_off")
        if self.approvals < current.approvals:
            loosened.append("approvals")
        return tuple(loosened)


@dataclass(frozen=True)
class AllowlistPlan:
    """What `plan_allowlist_change` decided: `apply_now` takes effect at once; `pending` (None when
    nothing loosens) is the requested rule, waiting for an operator; `loosened` names the settings
    that wait."""

    apply_now: AllowlistRule
    pending: AllowlistRule | None
    loosened: tuple[str, ...]


def plan_allowlist_change(current: AllowlistRule | None, requested: AllowlistRule) -> AllowlistPlan:
    """Split a requested allowlist change into what tightens (applied at once) and what loosens
    (held for an operator's approval).

    Each setting at once becomes the stricter of the current and the requested value, so a request
    that tightens one setting and loosens another tightens immediately and loosens only when
    approved; a request that loosens nothing needs no one.
    """
    loosened = requested.loosened_from(current)
    if not loosened:
        return AllowlistPlan(requested, None, ())
    assert current is not None  # nothing is looser than no allowlist
    mode = max(current.mode, requested.mode, key=_MODE_STRICTNESS.__getitem__)
    now = AllowlistRule(mode, max(current.cooling_off, requested.cooling_off), max(current.approvals, requested.approvals))
    return AllowlistPlan(now, requested, loosened)


def _frozen_mapping(value: Mapping) -> Mapping:
    return MappingProxyType(dict(value))


DEFAULT_REFILL_TTL = timedelta(hours=24)  # PolicySet.refill_ttl when a set names none


@dataclass(frozen=True)
class PolicySet:
    """One immutable version of every withdrawal rule.

    - `assets`: rules per asset code; a withdrawal of an asset not listed is rejected.
    - `denylist`: sanctioned addresses, rejected for every account.
    - `allowlists`: per account id, optional; accounts without one may send anywhere not denied.
    - `velocity_overrides`: per (account id, asset), replacing the asset's default limit.
    - `owner_velocity_overrides`: per (owner, asset), replacing the asset's owner limit.
    - `kill_switch`: when on, every withdrawal is rejected.
    - `decision_ttl`: how long a decision (and the approvals gathered for it) stays valid.
    - `quarantine_return_approvals`: operators (never the requester) a quarantine return needs,
      whatever its amount (at least one).
    - `refill_ttl`: how long a refill between the firm's own tiers (warm -> hot, bitcoin and
      ethereum: custody.rebalances, custody.eth_rebalances) may wait for its operator quorum; past
      it the refill expires and approvals of it are refused (`refill_expired`).
    """

    version: str
    assets: Mapping[str, AssetPolicy]
    denylist: frozenset[str] = frozenset()
    allowlists: Mapping[str, Allowlist] = field(default_factory=dict)
    velocity_overrides: Mapping[tuple[str, str], VelocityLimit] = field(default_factory=dict)
    kill_switch: bool = False
    decision_ttl: timedelta = timedelta(minutes=30)
    owner_velocity_overrides: Mapping[tuple[str, str], VelocityLimit] = field(default_factory=dict)
    quarantine_return_approvals: int = 1
    refill_ttl: timedelta = DEFAULT_REFILL_TTL

    def __post_init__(self) -> None:
        if not isinstance(self.version, str) or not self.version.strip():
            raise ValueError("PolicySet.version must be a non-empty string")
        if type(self.kill_switch) is not bool:
            raise TypeError("PolicySet.kill_switch must be a bool")
        if not isinstance(self.decision_ttl, timedelta) or self.decision_ttl <= timedelta(0):
            raise ValueError("PolicySet.decision_ttl must be a positive timedelta")
        if not isinstance(self.refill_ttl, timedelta) or self.refill_ttl <= timedelta(0):
            raise ValueError("PolicySet.refill_ttl must be a positive timedelta")
        object.__setattr__(self, "assets", _frozen_mapping(self.assets))
        object.__setattr__(self, "allowlists", _frozen_mapping(self.allowlists))
        object.__setattr__(self, "velocity_overrides", _frozen_mapping(self.velocity_overrides))
        object.__setattr__(self, "owner_velocity_overrides", _frozen_mapping(self.owner_velocity_overrides))
        require_int("PolicySet.quarantine_return_approvals", self.quarantine_return_approvals, minimum=1)
        object.__setattr__(self, "denylist", _normalised_set(self.denylist))

    def velocity_for(self, account_id: str, asset: str) -> VelocityLimit | None:
        override = self.velocity_overrides.get((account_id, asset))
        if override is not None:
            return override
        asset_policy = self.assets.get(asset)
        return asset_policy.velocity if asset_policy else None

    def owner_velocity_for(self, owner: str, asset: str) -> VelocityLimit | None:
        """The limit over all of `owner`'s accounts of `asset`: an override, else the asset's owner
        limit, else the asset's account limit."""
        override = self.owner_velocity_overrides.get((owner, asset))
        if override is not None:
            return override
        asset_policy = self.assets.get(asset)
        if asset_policy is None:
            return None
        return asset_policy.owner_velocity or asset_policy.velocity

    def is_denied(self, address: str) -> bool:
        return normalise_address(address) in self.denylist


def _normalised_set(addresses: Iterable[str]) -> frozenset[str]:
    if isinstance(addresses, str):
        # A bare string would silently become a set of its characters.
        raise TypeError("denylist must be a collection of addresses, not one string")
    return frozenset(normalise_address(a) for a in addresses)
