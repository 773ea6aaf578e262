"""Where the withdrawal policy comes from: a versioned `PolicySet` (data, see policies/rules.py)
plus live inputs read from the database at every evaluation: the denylist (`denylist_address`), the
kill switch and the account's allowlist. The version string of the base set is recorded in every
decision, with `+allowlist.<account>.v<n>` when the account's allowlist rule (changed n times)
took part.

A policy version is shown to approvers and signed in every approval payload (signer.approvals), so
it is held to `POLICY_VERSION_PATTERN` (`check_policy_version`): printable ASCII letters, digits and
`. _ + -`, starting with a letter or digit, at most 128 characters, e.g.
`regtest-2026-11-29.1+allowlist.17.v2`. A base set with another version is refused when the
provider is built (ValueError: at start), and every version is checked again where a decision is
written (custody.withdrawals), so custody never writes a version that could carry terminal control
sequences or look like something else (issue 12, review R3). The signer refuses a payload holding
control or format characters on its own (`payload_unprintable`), whoever wrote the row.

`default_policy()` is the development/regtest policy; production configures its own set.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import re

from sqlalchemy import Connection, text

from custody.controls import kill_switch
from policies import Allowlist, AllowlistEntry, AllowlistMode, AmountTier, AssetPolicy, PolicySet, VelocityLimit


POLICY_VERSION_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")


def check_policy_version(version: object) -> str:
    """`version` if it fullmatches POLICY_VERSION_PATTERN, else ValueError (module docstring)."""
    if not isinstance(version, str) or POLICY_VERSION_PATTERN.fullmatch(version) is None:
        raise ValueError(f"policy version {str(version)[:40]!r} is not letters, digits and . _ + - (at most 128, "
                         "starting with a letter or digit)")
    return version


def default_policy() -> PolicySet:
    """Regtest defaults: BTC auto-approved up to 0.5, one operator up to 2, two operators up to
    1,000; ETH and USDT likewise in their units. Velocity: 5 BTC / 100 ETH / 1M USDT per day.
    Ethereum deposits are swept once more than 1 ETH / 1,000 USDT waits on deposit addresses, from
    each address holding at least 0.01 ETH / 10 USDT (`sweep_min_per_address`, here the default:
    1% of the threshold). A warm -> hot refill waits at most 24 hours for its operator quorum
    (`refill_ttl`)."""
    day = dt.timedelta(days=1)
    return PolicySet(
        version="regtest-2026-11-29.1",
        assets={
            "BTC": AssetPolicy(tiers=(AmountTier(50_000_000, 0), AmountTier(200_000_000, 1), AmountTier(100_000_000_000, 2)),
                               fee_ceiling=1_000_000, min_amount=10_000, velocity=VelocityLimit(day, 500_000_000, 1)),
            "ETH": AssetPolicy(tiers=(AmountTier(10 * 10**18, 0), AmountTier(50 * 10**18, 1), AmountTier(10_000 * 10**18, 2)),
                               fee_ceiling=10**17, min_amount=10**15, velocity=VelocityLimit(day, 100 * 10**18, 1),
                               sweep_threshold=10**18),
            "USDT": AssetPolicy(tiers=(AmountTier(10_000 * 10**6, 0), AmountTier(100_000 * 10**6, 1), AmountTier(10**13, 2)),
                                fee_ceiling=50 * 10**6, min_amount=10**6, velocity=VelocityLimit(day, 10**12, 1),
                                sweep_threshold=1_000 * 10**6),
        },
        decision_ttl=dt.timedelta(hours=24),
        refill_ttl=dt.timedelta(hours=24),
    )


def sweep_minimums(policy: PolicySet) -> dict[str, int]:
    """asset -> `sweep_min_per_address` of the assets whose policy names one (custody.eth_sweeps
    `min_per_address`; an asset absent here gets `EthSweeps.minimum`'s default)."""
    return {a: p.sweep_min_per_address for a, p in policy.assets.items() if p.sweep_min_per_address is not None}


class PolicyProvider:
    def __init__(self, base: PolicySet | None = None) -> None:
        self.base = base or default_policy()
        check_policy_version(self.base.version)

    def current(self, conn: Connection, account_id: int | None = None) -> PolicySet:
        """The base set plus the live denylist, kill switch and (for `account_id`) its allowlist."""
        denied = conn.execute(text("SELECT address FROM denylist_address")).scalars().all()
        allowlists = dict(self.base.allowlists)
        version = self.base.version
        if account_id is not None:
            rule = conn.execute(text("SELECT mode, cooling_off_secs, approvals, version FROM allowlist_policy WHERE account_id = :a"),
                                {"a": account_id}).first()
            if rule is not None:
                entries = conn.execute(text("SELECT address, added_at, cooling_off_secs FROM allowlist_entry WHERE account_id = :a"),
                                       {"a": account_id}).all()
                allowlists[str(account_id)] = Allowlist(
                    tuple(AllowlistEntry(e.address, e.added_at, _seconds(e.cooling_off_secs)) for e in entries),
                    AllowlistMode(rule.mode), dt.timedelta(seconds=rule.cooling_off_secs), rule.approvals)
                version = f"{version}+allowlist.{account_id}.v{rule.version}"
        return dataclasses.replace(self.base, version=check_policy_version(version), denylist=frozenset(self.base.denylist) | frozenset(denied),
                                   allowlists=allowlists, kill_switch=self.base.kill_switch or kill_switch(conn).engaged)

    def velocity_window(self) -> dt.timedelta:
        """The longest velocity window of any limit: how far back a decision's history is read."""
        windows = [a.velocity.window for a in self.base.assets.values() if a.velocity]
        windows += [a.owner_velocity.window for a in self.base.assets.values() if a.owner_velocity]
        windows += [v.window for v in self.base.velocity_overrides.values()]
        windows += [v.window for v in self.base.owner_velocity_overrides.values()]
        return max(windows, default=dt.timedelta(days=1))


def _seconds(secs: int | None) -> dt.timedelta | None:
    return None if secs is None else dt.timedelta(seconds=secs)
