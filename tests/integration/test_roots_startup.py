"""What the api and worker roots (custody.roots) do at start with the reference data, their
database roles and a signer that is not there yet; on a migrated database of the test's own, with
no chain adapters and a stand-in signer that answers `xpubs` as the signer process would for the
BIP84 test seed (or is down):

- only the worker writes wallets and assets; an api started first waits for it (bounded), an api
  whose file differs from what the worker applied refuses to start naming the keys and writes
  nothing; each process connects as its own role only (custody_api / custody_worker);
- a worker started while the signer is down registers no wallet and runs no job that derives or
  pays until the signer answers with the configured xpubs; a signer that comes up with other keys
  stops those jobs for good, with a critical incident (kill switch engaged).
"""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest
import tomli_w
from sqlalchemy import text

from chain_adapters.errors import NodeUnavailable
from custody.config import DeploymentConfig
from custody.controls import kill_switch
from custody.database import with_user
from custody.jobs import build_scheduler
from custody.roots.api import build_api_root
from custody.roots.common import StartupError
from custody.roots.guards import SignerGated, signer_gated
from custody.roots.worker import build_worker_root
from signer.keys import Secret, SignerKeys, seed_from_text
from signer.wire import Xpubs
from tests.integration.own_database import own_database

log = logging.getLogger(__name__)
KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
OTHER = SignerKeys(seed_from_text(Secret("legal winner thank year wave sausage worth useful legal winner thank yellow")),
                   "regtest")


class SignerStandIn:
    """`xpubs` as the signer process answers it for `keys`; down (SignerUnavailable is a
    NodeUnavailable) while `keys` is None. Signs nothing."""

    def __init__(self, keys: SignerKeys | None = KEYS) -> None:
        self.keys = keys

    def xpubs(self) -> Xpubs:
        if self.keys is None:
            raise NodeUnavailable("signer at unix:/nowhere.sock: No such file or directory")
        return Xpubs(network="regtest", master_fingerprint="00000000",
                     accounts={"bitcoin": {t: self.keys.account_xpub("bitcoin", t) for t in ("deposit", "hot", "cold")}})

    def __getattr__(self, name: str):
        raise AssertionError(f"nothing here signs, yet {name} was called")


@pytest.fixture()
def database(database_url):
    with own_database(database_url, "roots_start") as eng:
        yield eng


def config(tmp_path: Path, database, role: str, *, finality: int = 3, name: str = "custody.toml") -> DeploymentConfig:
    key = tmp_path / "signer-auth.key"
    if not key.exists():  # written once: a config made in another thread must never read it truncated
        key.write_text("ab" * 32)
        os.chmod(key, 0o600)
    path = tmp_path / name
    path.write_text(tomli_w.dumps({
        "database": {"url": with_user(database.url.render_as_string(hide_password=False), role)},
        "bitcoin": {"rpc_url": "http://127.0.0.1:9", "network": "regtest", "rpc_user": "u", "rpc_password": "p"},
        "assets": {"BTC": {"chain": "bitcoin", "decimals": 8, "finality": finality, "dust_minimum": 1000,
                           "min_withdrawal": 10000, "withdrawal_fee": 5000}},
        "wallets": {"bitcoin": {t: KEYS.account_xpub("bitcoin", t) for t in ("deposit", "hot")}},
        "signer": {"endpoint": f"unix:{tmp_path / 'signer.sock'}", "client": "worker", "auth_key_file": str(key)},
    }))
    return DeploymentConfig.load(path, process="api" if role == "custody_api" else "worker")


def reference_rows(database) -> tuple[int, list]:
    with database.connect() as c:
        wallets = c.execute(text("SELECT count(*) FROM wallet")).scalar_one()
        assets = c.execute(text("SELECT asset, finality_confirmations FROM chain_asset ORDER BY asset")).all()
    return wallets, [tuple(r) for r in assets]


def test_only_the_worker_writes_reference_data_and_the_api_refuses_another_file(tmp_path, database):
    log.info("The api alone: it waits for a worker, writes nothing, and gives up naming what is missing")
    with pytest.raises(StartupError, match=r"wallets\.bitcoin\.deposit: not registered.*assets\.BTC: not in the database"):
        build_api_root(config(tmp_path, database, "custody_api"), adapters={}, signer=SignerStandIn(), reference_wait=0.5)
    assert reference_rows(database) == (0, [])

    log.info("An api started before the worker waits for it, then starts")
    api_done: list[object] = []
    api = threading.Thread(target=lambda: api_done.append(_try(lambda: build_api_root(
        config(tmp_path, database, "custody_api", name="api.toml"), adapters={}, signer=SignerStandIn(),
        reference_wait=60))))
    api.start()
    worker = build_worker_root(config(tmp_path, database, "custody_worker"), adapters={}, signer=SignerStandIn())
    api.join(70)
    assert not api.is_alive() and not isinstance(api_done[0], BaseException), api_done
    api_done[0].close()  # type: ignore[union-attr]
    assert reference_rows(database) == (2, [("BTC", 3)])

    log.info("An api whose file says finality 6 while the worker applied 3: refused, the database unchanged")
    with pytest.raises(StartupError, match=r"assets\.BTC\.finality: the database has 3, the file 6"):
        build_api_root(config(tmp_path, database, "custody_api", finality=6, name="api6.toml"), adapters={},
                       signer=SignerStandIn(), reference_wait=0.5)
    assert reference_rows(database) == (2, [("BTC", 3)])

    log.info("A second worker with finality 6 applies it (the worker is the one that writes)")
    build_worker_root(config(tmp_path, database, "custody_worker", finality=6, name="w6.toml"), adapters={},
                      signer=SignerStandIn()).close()
    assert reference_rows(database) == (2, [("BTC", 6)])
    worker.close()


def _try(fn):  # noqa: ANN001, ANN202 - the result or the exception, for a thread
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001
        return exc


def test_each_process_connects_as_its_own_role_only(tmp_path, database):
    build_worker_root(config(tmp_path, database, "custody_worker"), adapters={}, signer=SignerStandIn()).close()
    with pytest.raises(StartupError, match="connected as custody_worker, not as custody_api"):
        build_api_root(config(tmp_path, database, "custody_worker", name="api-as-worker.toml"),
                       adapters={}, signer=SignerStandIn(), reference_wait=0)
    with pytest.raises(StartupError, match="connected as custody_api, not as custody_worker"):
        build_worker_root(config(tmp_path, database, "custody_api", name="worker-as-api.toml"), adapters={},
                          signer=SignerStandIn())
    owner = database.url.username
    with pytest.raises(StartupError, match=f"connected as {owner}, a superuser"):
        build_api_root(config(tmp_path, database, owner, name="owner.toml"), adapters={}, signer=SignerStandIn(),
                       reference_wait=0)
    build_api_root(config(tmp_path, database, "custody_api", name="api.toml"), adapters={}, signer=SignerStandIn(),
                   reference_wait=0).close()


def test_a_worker_started_while_the_signer_is_down_waits_for_its_keys(tmp_path, database):
    signer = SignerStandIn(None)
    root = build_worker_root(config(tmp_path, database, "custody_worker"), adapters={}, signer=signer)
    try:
        check = root.wallet_check
        check.retry_seconds = 0
        assert check.state == "pending"
        assert reference_rows(database) == (0, [("BTC", 3)]), "wallets registered before the signer confirmed them"
        view = signer_gated(root, check)
        assert all(isinstance(getattr(view, s), SignerGated) for s in ("deposits", "payouts", "reconciliation"))
        assert root.sweeps is None and view.sweeps is None  # no bitcoin adapter here: nothing to gate
        assert {"payouts", "reconcile", "verify"} <= {j.id for j in build_scheduler(view).get_jobs()}  # type: ignore[arg-type]
        log.info("The signer is down: a payouts run does nothing (it would fail on this root: no bitcoin adapter)")
        assert view.payouts.batch_bitcoin() is None and view.deposits.run_once(["bitcoin"]) is None

        log.info("The signer comes up with the configured keys: the wallets are registered, the jobs run")
        signer.keys = KEYS
        assert check.attempt() and reference_rows(database)[0] == 2
        assert signer_gated(root, check) is root
    finally:
        root.close()


def test_a_signer_that_comes_up_with_other_keys_stops_the_jobs_with_an_incident(tmp_path, database):
    signer = SignerStandIn(None)
    root = build_worker_root(config(tmp_path, database, "custody_worker"), adapters={}, signer=signer)
    try:
        root.wallet_check.retry_seconds = 0
        signer.keys = OTHER
        view = signer_gated(root, root.wallet_check)
        assert view.reconciliation.run() is None
        assert root.wallet_check.state == "failed"
        assert reference_rows(database)[0] == 0
        with database.connect() as c:
            kinds = c.execute(text("SELECT kind, severity FROM incident")).all()
        assert [tuple(k) for k in kinds] == [("wallet_keys_not_the_signers", "critical")]
        assert kill_switch(database).engaged
        signer.keys = KEYS
        assert view.reconciliation.run() is None and not root.wallet_check.attempt()
    finally:
        root.close()

    log.info("Restarted against that signer, the worker does not start")
    with pytest.raises(StartupError, match=r"wallets\.bitcoin\.deposit, wallets\.bitcoin\.hot: not the signer's xpubs"):
        build_worker_root(config(tmp_path, database, "custody_worker"), adapters={}, signer=SignerStandIn(OTHER))
