"""The api and worker composition roots built from a config file only, against the real regtest
nodes and the session database:

- reference data from the file lands once (wallets, assets, cursors) and a restart writes nothing;
  a file whose wallet key differs from the registered one stops the start, naming the key;
- the HTTP app (`create_app`) serves the api root (called through the typed custody.client): a
  deposit address comes from the configured deposit xpub;
- the scheduler (`build_scheduler`) takes the worker root with every job, the matching snapshot job
  on the journal (no second sequencer), sweeps and rebalances paying the configured hot address;
- a BTC deposit to that address is credited by the worker root's deposit pipeline at finality.

No signer process runs here (the topology suite signs through one); the roots get a stand-in that
answers `xpubs` for the test seed (what each root compares [wallets] with at start) and fails the
test if anything signs. Each root connects as its own role (custody_worker, custody_api); the
worker is built first, since only it writes the reference data the api then finds.
"""
from __future__ import annotations

import logging
import uuid

import pytest
from sqlalchemy import text

from custody.addresses import derive_btc_address
from custody.auth import Role, create_api_key
from custody.config import DeploymentConfig
from custody.database import with_user
from custody.jobs import build_scheduler
from custody.roots.api import ApiRoot, build_api_root
from custody.roots.common import StartupError, apply_reference_data
from custody.roots.guards import NetworkGate
from custody.roots.worker import JournalSnapshots, WorkerRoot, build_worker_root
from signer.wire import Xpubs
from tests.e2e.custody.api_helpers import answered, in_process
from tests.e2e.deployment import custody_config, regtest_keys

log = logging.getLogger(__name__)


class NoSigning:
    """Stands in for the signer client: `xpubs` as the signer holding the test seed answers it; any
    other call fails the test."""

    def xpubs(self) -> Xpubs:
        keys = regtest_keys()
        return Xpubs(network="regtest", master_fingerprint="00000000", accounts={
            chain: {t: keys.account_xpub(chain, t) for t in ("deposit", "hot", "cold")} for chain in ("bitcoin", "ethereum")})

    def __getattr__(self, name: str):
        raise AssertionError(f"nothing in this test signs, yet {name} was called")


def _signer(config: DeploymentConfig) -> NoSigning:
    return NoSigning()


def role_config(directory, cluster, database_url, role: str) -> DeploymentConfig:
    directory.mkdir(exist_ok=True)
    return DeploymentConfig.load(custody_config(directory, cluster, with_user(database_url, role)))


@pytest.fixture
def config(tmp_path, cluster, database_url) -> DeploymentConfig:
    return role_config(tmp_path / "worker", cluster, database_url, "custody_worker")


@pytest.fixture
def worker_root(config) -> WorkerRoot:
    root = build_worker_root(config, signer=_signer(config))
    yield root
    root.close()


@pytest.fixture
def api_root(worker_root, tmp_path, cluster, database_url) -> ApiRoot:
    api_config = role_config(tmp_path / "api", cluster, database_url, "custody_api")
    root = build_api_root(api_config, signer=_signer(api_config))
    yield root
    root.close()


def test_reference_data_is_applied_once_and_a_changed_key_stops_the_start(api_root, worker_root, config, tmp_path,
                                                                            cluster, database_url):
    with api_root.engine.connect() as c:
        wallets = {(r.chain, r.tier): r.xpub for r in c.execute(text("SELECT chain, tier, xpub FROM wallet"))}
        cursors = set(c.execute(text("SELECT chain FROM chain_cursor")).scalars())
    keys = regtest_keys()
    assert wallets[("bitcoin", "hot")] == keys.account_xpub("bitcoin", "hot")
    assert wallets[("bitcoin", "cold")] == keys.account_xpub("bitcoin", "cold")
    assert wallets[("ethereum", "deposit")] == keys.account_xpub("ethereum", "deposit")
    assert cursors >= {"bitcoin", "ethereum"}
    usdt = api_root.wallets.chain_asset("USDT")
    assert (usdt.chain, usdt.contract_address.lower(), usdt.finality_confirmations) == \
        ("ethereum", cluster.token.address.lower(), 12)
    assert api_root.wallets.chain_asset("BTC").withdrawal_fee_fast == 20_000

    log.info("A restart with the same file writes nothing")
    assert apply_reference_data(config, worker_root.wallets, worker_root.deposits) == []

    log.info("A file with another hot key is refused at start, naming the key")
    other = tmp_path / "other"
    other.mkdir()
    path = custody_config(other, cluster, with_user(database_url, "custody_worker"))
    path.write_text(path.read_text().replace(keys.account_xpub("bitcoin", "hot"), keys.account_xpub("bitcoin", "deposit"), 1)
                    .replace(f'deposit = "{keys.account_xpub("bitcoin", "deposit")}"',
                             f'deposit = "{keys.account_xpub("bitcoin", "hot")}"', 1))
    swapped = DeploymentConfig.load(path)
    with pytest.raises(StartupError, match=r"wallets\.bitcoin\.deposit: the database has another key"):
        build_worker_root(swapped, signer=NoSigning())
    with api_root.engine.connect() as c:
        assert c.execute(text("SELECT xpub FROM wallet WHERE chain = 'bitcoin' AND tier = 'hot'")).scalar_one() == \
            keys.account_xpub("bitcoin", "hot")


def test_the_http_app_serves_the_api_root(api_root, config, engine):
    run = uuid.uuid4().hex[:8]
    # keys are the owner's to make (`create-api-key`): the api's role may not (migration 0022)
    backend = create_api_key(engine, f"roots-{run}", Role.backend, api_root.settings.api_key_pepper)
    api = in_process(api_root, backend)  # type: ignore[arg-type]
    assert api.health().status == "ok" and api.last_response.json() == {"status": "ok"}
    account = answered(api, 201, api.open_account(asset="BTC", kind="customer", name=f"customer:roots-{run}:BTC",
                                                  owner=f"roots-{run}"))
    address = answered(api, 201, api.issue_deposit_address(account_id=account.id, idempotency_key=f"roots-{run}"))
    assert address.address == derive_btc_address(config.wallets["bitcoin"].deposit, "regtest", 0, address.derivation_index)
    assert api_root.trading is not None  # the sequencer lives in the api
    assert sorted(k.operator for k in api_root.approvers.keys()) == ["op-alice", "op-bob"]
    assert api_root.withdrawals.approvers is api_root.approvers
    log.info("The ethereum adapter is behind its network gate, and the destination checks still use it")
    assert isinstance(api_root.adapters["ethereum"], NetworkGate)
    assert api_root.withdrawals.destinations.ethereum is api_root.adapters["ethereum"]


def test_only_the_workers_reconciliation_records_hot_coins(api_root, worker_root):
    """The hot-wallet sync records coins (wallet_utxo), which custody_api may not write (migration
    0022): the worker's passes run it first, the api's on-demand pass does not."""
    assert worker_root.reconciliation.before == worker_root.payouts.sync_hot_wallet
    assert api_root.reconciliation.before is None


def test_the_scheduler_takes_the_worker_root_and_a_deposit_is_credited(worker_root, config, cluster):
    jobs = {j.id for j in build_scheduler(worker_root).get_jobs()}  # type: ignore[arg-type]
    assert jobs >= {"deposits:bitcoin", "deposits:ethereum", "payouts", "sweeps", "rebalances", "expire-holds", "outbox",
                    "verify", "reconcile", "matching-snapshots", "reserves"}
    assert isinstance(worker_root.trading, JournalSnapshots)
    hot = derive_btc_address(config.wallets["bitcoin"].hot, "regtest", 0, 0)
    assert worker_root.sweeps.hot_address == hot and worker_root.rebalances.hot_address == hot

    log.info("A BTC deposit to an address of the configured deposit wallet, credited at finality")
    owner = f"roots-{uuid.uuid4().hex[:8]}"
    account = worker_root.wallets.customer_account(owner, "BTC")
    address = worker_root.wallets.issue_address(f"roots:{owner}", account).address
    cluster.bitcoin.fund(address, 123_456)
    cluster.bitcoin.mine(config.assets["BTC"].finality)
    for _ in range(5):
        worker_root.deposits.run_once(["bitcoin"])
    balance = worker_root.ledger.balance(account)
    assert balance.posted == 123_456
    worker_root.ledger.assert_verified()
