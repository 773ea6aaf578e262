"""Suite-wide pytest wiring.

Tests are layered by speed (STYLE.md 10): the directory a test lives in sets its marker, so
`scripts/test -m unit`, `-m integration` or `-m "not e2e"` select layers without per-test markers.

Every test session has its own state directory, so a test run never touches a developer's running
demo (`scripts/run`: `.state/pgdata`, the `custody_demo` database, `.state/demo-chains`, the nodes
of `python -m regtest up`): `pytest_configure` makes a fresh temporary directory and exports it as
`STATE_DIR` (custody.settings: the embedded PostgreSQL, the demo's chains and keys) and
`REGTEST_STATE_DIR` (regtest.cluster: the CLI's state file) to this process and every subprocess,
whatever the caller's environment said. Without `DATABASE_URL` the session's databases therefore
live on an embedded PostgreSQL of its own (one initdb, ~3 s). The directory is removed when the
process exits, after that server has stopped; `KEEP_TEST_STATE=1` keeps it (its path is printed).
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# In-process API requests run as the api's database role (custody_api), see tests/api_role.py.
pytest_plugins = ["tests.api_role"]

_LAYERS = ("unit", "integration", "e2e")
TEST_STATE_DIR = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    state = Path(tempfile.mkdtemp(prefix="custody-test-state-"))
    config.stash[TEST_STATE_DIR] = state
    os.environ["STATE_DIR"] = str(state)
    os.environ["REGTEST_STATE_DIR"] = str(state / "regtest")
    # atexit runs last-registered first: the embedded PostgreSQL (registered when a test starts it)
    # stops before this removes its data directory.
    if os.environ.get("KEEP_TEST_STATE") != "1":
        atexit.register(shutil.rmtree, state, ignore_errors=True)


def pytest_report_header(config: pytest.Config) -> str:
    return f"test state directory (STATE_DIR): {config.stash[TEST_STATE_DIR]}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for layer in _LAYERS:
            if layer in parts:
                item.add_marker(getattr(pytest.mark, layer))


# ---- database ------------------------------------------------------------------------------
# One fresh database per test session on the configured server (DATABASE_URL, or the embedded
# PostgreSQL when it is unset), migrated to head by Alembic, dropped at the end. Started lazily:
# unit tests never start a server.

import uuid

from sqlalchemy import Engine


@pytest.fixture(scope="session")
def database_url() -> str:
    from custody.database import drop_database, ensure_database, migrate, server_url, with_database
    from custody.settings import Settings

    url = with_database(server_url(Settings()), f"custody_test_{uuid.uuid4().hex[:12]}")
    ensure_database(url)
    migrate(url)
    yield url
    drop_database(url)


@pytest.fixture(scope="session")
def engine(database_url: str) -> Engine:
    from custody.database import make_engine

    eng = make_engine(database_url, pool_size=20)
    yield eng
    eng.dispose()


@pytest.fixture()
def ledger(engine: Engine):
    """The ledger on the session database. Every test that uses it ends with `assert_verified()`."""
    from ledger.service import Ledger

    led = Ledger(engine)
    yield led
    led.assert_verified()
