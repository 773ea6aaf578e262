"""The ethereum sweep's per-address minimum is policy data (`AssetPolicy.sweep_min_per_address`,
beside `sweep_threshold`): the composition root hands each asset's value to custody.eth_sweeps
(`min_per_address`), and an asset whose policy names none keeps the default (1% of its threshold,
at least 1). A minimum that cannot be right refuses the policy when it is built (at start)."""
from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy import create_engine

from custody.container import Container
from custody.policy_config import default_policy, sweep_minimums
from custody.settings import Settings
from ledger.service import Ledger
from policies import AmountTier, AssetPolicy
from regtest.util import assert_equal
from signer.keys import Secret, SignerKeys, seed_from_text

KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
TIERS = (AmountTier(None, 0),)


def test_a_minimum_that_cannot_be_right_is_refused_when_the_policy_is_built():
    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises((ValueError, TypeError)):
            AssetPolicy(tiers=TIERS, fee_ceiling=0, sweep_threshold=100, sweep_min_per_address=bad)
    with pytest.raises(ValueError, match="needs a sweep_threshold"):
        AssetPolicy(tiers=TIERS, fee_ceiling=0, sweep_min_per_address=10)
    assert_equal(AssetPolicy(tiers=TIERS, fee_ceiling=0, sweep_threshold=100, sweep_min_per_address=7).sweep_min_per_address, 7)


def test_the_policy_minimum_reaches_the_sweeps_and_an_absent_one_keeps_the_default():
    policy = default_policy()
    assert_equal(sweep_minimums(policy), {})  # the regtest policy names none: the default applies
    usdt = dataclasses.replace(policy.assets["USDT"], sweep_min_per_address=5 * 10**6)
    policy = dataclasses.replace(policy, assets={**policy.assets, "USDT": usdt})
    assert_equal(sweep_minimums(policy), {"USDT": 5 * 10**6})
    engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/never-connected")  # building connects to nothing
    custody = Container(settings=Settings(environment="test"), engine=engine, ledger=Ledger(engine))
    custody.with_chains({"ethereum": object()}, signer_keys=KEYS, policy=policy)  # type: ignore[dict-item]
    assert custody.eth_sweeps is not None
    assert_equal(custody.eth_sweeps.minimum("USDT"), 5 * 10**6)
    assert_equal(custody.eth_sweeps.minimum("ETH"), policy.assets["ETH"].sweep_threshold // 100)  # 1% of 1 ETH
