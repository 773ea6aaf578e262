"""Helpers for the treasury scenarios (rebalances, tiers, PSBTs, fee bumps) on the custody suite's nodes.

- `rebalances`   (fixture) the container's Rebalances, its thresholds restored after the test
- `spendable(custody, engine)`  the hot wallet's spendable satoshis after a hot-wallet sync
- `reconciled(custody, tiers)`  a bitcoin reconciliation pass at the tip: `tiers` among its lines,
                                every line's difference zero; the lines by tier
"""
from __future__ import annotations

import pytest

from custody.payouts import spendable_coins
from regtest.util import assert_equal


@pytest.fixture
def rebalances(custody):
    r = custody.rebalances
    saved = r.config
    yield r
    r.config = saved


def spendable(custody, engine) -> int:
    custody.payouts.sync_hot_wallet()
    with engine.begin() as c:
        return sum(k.amount for k in spendable_coins(c))


def reconciled(custody, tiers: tuple[str, ...] = ("deposit", "hot")) -> dict:
    custody.deposits.run_once(["bitcoin"])  # the scanner at the tip, so every line is compared
    by_tier = {line.tier: line for line in custody.reconciliation.run(chains=["bitcoin"])}
    assert set(tiers) <= set(by_tier), (tiers, sorted(by_tier))
    assert_equal({t: line.difference for t, line in by_tier.items()}, {t: 0 for t in by_tier})
    return by_tier
