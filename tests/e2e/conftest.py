"""Fixtures for the end-to-end suites: real bitcoind -regtest and anvil, one pair per session.

Fixtures others can use (all session-scoped unless noted):
- `cluster`      regtest.cluster.Cluster: `.bitcoin` (BitcoinNode: rpc(), wallet(), mine(n), fund(addr, sat)),
                 `.anvil` (AnvilNode: w3, call(), mine(n), set_automine(), fund(addr, wei)), `.token`, `.root`
- `bitcoind`     the BitcoinNode;  `anvil`: the AnvilNode;  `usdt`: the deployed TestToken (6 decimals)
- `btc_adapter`  chain_adapters.bitcoin.BitcoinAdapter on the node (network="regtest")
- `eth_adapter`  chain_adapters.ethereum.EthereumAdapter on anvil, token {usdt.address: "USDT"}
- `chain`        (function scope, parametrized "bitcoin"/"ethereum") a ChainHarness: the same test
                 body runs against both nodes (the conformance suite uses it); chain control (mine,
                 pay, hold_mining, reorgs) is regtest.control's on `chain.node`
- `log`          (function scope) a logger named after the test, for narration

The nodes' data directories live under one temporary root; it is deleted after a clean session
and kept (its path printed) when any test failed. Both nodes are stopped by PID at session end,
and die with the test process if it is killed (regtest.process).
"""
from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from chain_adapters.bitcoin import BitcoinAdapter
from chain_adapters.ethereum import EthereumAdapter
from regtest.cluster import Cluster, start_cluster
from regtest.install import find_tools
from tests.e2e.harness import BitcoinHarness, ChainHarness, EthereumHarness

logger = logging.getLogger("e2e")
_E2E_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.failed:  # only e2e failures keep the node data (this conftest's directory)
        item.session.stash[_E2E_FAILED] = True
    return report


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    seed = int(os.environ.get("E2E_SEED", random.randrange(2**32)))
    random.seed(seed)
    root = Path(tempfile.mkdtemp(prefix="custody-e2e-"))
    logger.info("random seed %d; node data under %s", seed, root)
    tools = find_tools()
    cl = start_cluster(root, tools=tools)
    try:
        yield cl
    finally:
        cl.stop()
        if request.session.stash.get(_E2E_FAILED, False):
            print(f"\n[e2e] tests failed: node data directories kept in {root} (seed {seed})")
        else:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def bitcoind(cluster: Cluster):
    return cluster.bitcoin


@pytest.fixture(scope="session")
def anvil(cluster: Cluster):
    return cluster.anvil


@pytest.fixture(scope="session")
def usdt(cluster: Cluster):
    return cluster.token


@pytest.fixture(scope="session")
def btc_adapter(cluster: Cluster) -> Iterator[BitcoinAdapter]:
    adapter = BitcoinAdapter(cluster.bitcoin.rpc_url, network="regtest")
    yield adapter
    adapter.close()


@pytest.fixture(scope="session")
def eth_adapter(cluster: Cluster) -> Iterator[EthereumAdapter]:
    adapter = EthereumAdapter(cluster.anvil.rpc_url, network="regtest", tokens={cluster.token.address: "USDT"})
    yield adapter
    adapter.close()


@pytest.fixture(params=["bitcoin", "ethereum"])
def chain(request: pytest.FixtureRequest, cluster: Cluster) -> ChainHarness:
    if request.param == "bitcoin":
        return BitcoinHarness(cluster.bitcoin, request.getfixturevalue("btc_adapter"))
    return EthereumHarness(cluster.anvil, request.getfixturevalue("eth_adapter"))


@pytest.fixture
def log(request: pytest.FixtureRequest) -> logging.Logger:
    return logging.getLogger(request.node.name)


@pytest.fixture
def btc(cluster: Cluster, btc_adapter: BitcoinAdapter) -> BitcoinHarness:
    """Bitcoin helpers: fresh addresses, Python-held funded keys (see harness.py)."""
    return BitcoinHarness(cluster.bitcoin, btc_adapter)
