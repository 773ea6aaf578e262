"""Fixtures for a downstream end-to-end suite: real regtest nodes, the deployed service on them,
API clients per role, funded customers and scripted approvers, one line each.

Enable with `pytest -p custody_regtest` (or `pytest_plugins = ["custody_regtest"]` in the suite's
root conftest.py). Needs the nodes installed once (`python -m regtest install`) and PostgreSQL:
`DATABASE_URL` names a server the plugin may create a database on (it creates a fresh one and drops
it at the end); without it an embedded PostgreSQL is started in the session's temporary directory.

Session fixtures (started once, on first use; everything they start is stopped at session end,
whether tests passed or failed):
- `custody_nodes`     regtest.cluster.Cluster: bitcoind (`.bitcoin`) and anvil (`.anvil`) on free
                      ports with the test ERC-20 (`.token`, USDT, 6 decimals), data in a temp dir
- `custody_chain`     regtest.control.ChainControl on those nodes: mine, mine_until_confirmed,
                      hold_mining, reorg_bitcoin / reorg_ethereum, fee_spike, stop / start / hang, advance_time,
                      deploy_erc20, mint, faucet_bitcoin / faucet_ether
- `custody_database`  the owner URL of a fresh database (dropped at the end on DATABASE_URL's server)
- `custody_service`   Service: signer, worker and api processes (custody.launch.deploy) on those
                      nodes and that database; `.base_url`, `.api_key(role)`, `.deployment`; its
                      bitcoin hot wallet is funded with 50 BTC so payouts can be paid; events go to
                      NATS_URL's broker, else an embedded nats-server this process starts
- `custody_client`    role -> the typed `custody.client.CustodyClient` ("backend", "admin",
                      "operator", "auditor"), one connection pool for all
- `custody_http`      role -> a raw `httpx.Client` on the api with that role's key (`X-API-Key`),
                      for a suite that tests the HTTP answers themselves (malformed bodies, headers)
- `custody_approvers` the scripted approvers (one per key of the deployment's approver quorum):
                      `approver.approve(withdrawal_id, comment)` fetches the payload, checks and
                      signs it with the approver's own Ed25519 key and submits it, as `custody
                      approve` does (custody.approve_cli.approve_with_client); the WithdrawalOut

Function fixture:
- `custody_funded_customer`  (owner=None, asset="BTC", amount=100_000_000) -> FundedCustomer: an
                      account opened over the API (the typed client, as the backend), a deposit
                      address issued, the amount (minor units) paid on chain by the faucet and
                      blocks mined until it is credited

Errors: a missing tool raises regtest.install.InstallError (run `python -m regtest install`); a
process that does not come up raises with the path of its log under the session's directory.
"""
from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from custody.client import CustodyClient
from custody.client.models import WithdrawalOut
from regtest.cluster import Cluster

ROLES = ("backend", "admin", "operator", "auditor")
HOT_WALLET_SAT = 50 * 100_000_000


@dataclass
class Service:
    """The deployed service: its api's base URL, an API key per role and the launch Deployment."""

    base_url: str
    owner_url: str
    deployment: object  # custody.launch.Deployment
    keys: dict[str, str] = field(default_factory=dict)

    def api_key(self, role: str) -> str:
        if role not in self.keys:
            raise KeyError(f"no API key for role {role!r}; roles: {sorted(self.keys)}")
        return self.keys[role]


@dataclass
class FundedCustomer:
    owner: str
    account_id: int
    asset: str
    amount: int  # minor units credited
    address: str
    txid: str


@dataclass
class ScriptedApprover:
    """An operator who approves with their own Ed25519 key, as `custody approve` does."""

    name: str
    client: CustodyClient  # the typed client with the approver's own operator key
    key_file: Path

    def approve(self, withdrawal_id: int, comment: str = "checked by the test suite") -> WithdrawalOut:
        """Fetch the approval payload, check it against its fields, sign it, send the approval; the
        withdrawal as the API answers it (`.state`: still `pending_approval` until the quorum)."""
        from custody.approve_cli import approve_with_client, load_private_key

        return approve_with_client(self.client, withdrawal_id, load_private_key(self.key_file), comment=comment,
                                   show=lambda line: None)


@pytest.fixture(scope="session")
def custody_regtest_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's temporary directory: node data, service config and logs, embedded PostgreSQL."""
    return tmp_path_factory.mktemp("custody-regtest")


@pytest.fixture(scope="session")
def custody_nodes(custody_regtest_dir: Path) -> Iterator[Cluster]:
    """bitcoind -regtest and anvil (with the test USDT) on free ports; stopped at session end."""
    from regtest.cluster import start_cluster
    from regtest.install import find_tools

    cluster = start_cluster(custody_regtest_dir / "chains", tools=find_tools())
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def custody_chain(custody_nodes: Cluster):
    """regtest.control.ChainControl on the session's nodes (mine, reorg, fee spike, hang, ...)."""
    from regtest.control import ChainControl
    from regtest.install import find_tools

    return ChainControl(custody_nodes, find_tools())


@pytest.fixture(scope="session")
def custody_database(custody_regtest_dir: Path) -> Iterator[str]:
    """The owner URL of a fresh database: on DATABASE_URL's server (a shared one: the database is
    dropped at the end), else on an embedded server of the session's own, whose whole data directory
    is the session's temporary directory (the server stops when the session's process exits; nothing
    to drop, so a server already stopping at teardown is no error)."""
    from custody.database import drop_database, embedded_server_url, ensure_database, to_sqlalchemy_url, with_database

    shared = bool(os.environ.get("DATABASE_URL"))
    server = (to_sqlalchemy_url(os.environ["DATABASE_URL"]) if shared
              else embedded_server_url(custody_regtest_dir / "postgres"))
    url = with_database(server, f"custody_regtest_{uuid.uuid4().hex[:12]}")
    ensure_database(url)
    try:
        yield url
    finally:
        if shared:
            drop_database(url)


@pytest.fixture(scope="session")
def custody_service(custody_regtest_dir: Path, custody_nodes: Cluster, custody_database: str) -> Iterator[Service]:
    """Signer, worker and api processes on the nodes and database; API keys per role; hot wallet funded."""
    from sqlalchemy import create_engine

    from custody.addresses import derive_btc_address
    from custody.auth import create_api_key
    from custody.launch import Nodes, deploy
    from custody.settings import get_settings

    from custody.broker import embedded_nats_url

    nodes = Nodes(custody_nodes.bitcoin.rpc_url, custody_nodes.anvil.rpc_url, custody_nodes.token.address)
    # The events broker: NATS_URL's, else one this process starts (stopped when it exits, so a worker
    # a suite kills cannot leave it behind).
    nats_url = os.environ.get("NATS_URL") or embedded_nats_url(custody_regtest_dir / "broker")
    deployment = deploy(custody_regtest_dir / "service", owner_url=custody_database, nodes=nodes, job_scale=0.2,
                        nats_url=nats_url)
    try:
        engine = create_engine(custody_database)
        try:
            pepper = get_settings().api_key_pepper
            keys = {role: create_api_key(engine, f"regtest-{role}", role, pepper) for role in ROLES}
            for name in deployment.approver_keys:  # an approver approves with a key of its own name
                keys[name] = create_api_key(engine, name, "operator", pepper)
        finally:
            engine.dispose()
        hot = derive_btc_address(deployment.xpubs["bitcoin"]["hot"], "regtest", 0, 0)
        custody_nodes.bitcoin.fund(hot, HOT_WALLET_SAT)
        custody_nodes.bitcoin.mine(1)  # the hot wallet spends confirmed coins only
        yield Service(deployment.api_base, custody_database, deployment, keys)
    finally:
        deployment.stop()


@pytest.fixture(scope="session")
def custody_http(custody_service: Service) -> Iterator[Callable[[str], httpx.Client]]:
    """role -> httpx.Client on the api with that role's API key."""
    made: dict[str, httpx.Client] = {}

    def client(role: str) -> httpx.Client:
        if role not in made:
            made[role] = httpx.Client(base_url=custody_service.base_url,
                                      headers={"X-API-Key": custody_service.api_key(role)}, timeout=60)
        return made[role]

    yield client
    for c in made.values():
        c.close()


@pytest.fixture(scope="session")
def custody_client(custody_service: Service) -> Iterator[Callable[[str], CustodyClient]]:
    """role -> the typed custody.client.CustodyClient with that role's key (one connection pool)."""
    with CustodyClient(custody_service.base_url, None, timeout=60) as base:
        made: dict[str, CustodyClient] = {}

        def client(role: str) -> CustodyClient:
            if role not in made:
                made[role] = base.with_key(custody_service.api_key(role))
            return made[role]

        yield client


@pytest.fixture(scope="session")
def custody_approvers(custody_service: Service, custody_client) -> list[ScriptedApprover]:
    """The deployment's scripted approvers: `.approve(withdrawal_id, comment)` signs with their own key."""
    return [ScriptedApprover(name, custody_client(name), key_file)
            for name, key_file in custody_service.deployment.approver_keys.items()]


@pytest.fixture
def custody_funded_customer(custody_client, custody_nodes: Cluster) -> Callable[..., FundedCustomer]:
    """(owner=None, asset="BTC", amount=1 BTC in satoshis, timeout=180) -> a FundedCustomer."""
    backend = custody_client("backend")

    def fund(owner: str | None = None, asset: str = "BTC", amount: int = 100_000_000,
             timeout: float = 180) -> FundedCustomer:
        owner = owner or f"cust-{uuid.uuid4().hex[:8]}"
        acct = backend.open_account(asset=asset, kind="customer", name=f"customer:{owner}:{asset}", owner=owner).id
        address = backend.issue_deposit_address(idempotency_key=f"fund-{acct}-{uuid.uuid4().hex[:6]}",
                                                account_id=acct).address
        if asset == "BTC":
            txid, mine = custody_nodes.bitcoin.fund(address, amount), lambda: custody_nodes.bitcoin.mine(1)
        elif asset == "ETH":
            txid, mine = custody_nodes.anvil.fund(address, amount), lambda: custody_nodes.anvil.mine(1)
        else:  # the test ERC-20 of the nodes
            txid, mine = custody_nodes.token.mint(address, amount), lambda: custody_nodes.anvil.mine(1)
        deadline = time.monotonic() + timeout
        while not any(d.state == "credited" for d in backend.list_account_deposits(acct)):
            if time.monotonic() > deadline:
                raise AssertionError(f"deposit {txid} to {address} not credited after {timeout}s")
            mine()
            time.sleep(0.5)
        return FundedCustomer(owner, acct, asset, amount, address, txid)

    return fund
