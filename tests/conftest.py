"""Suite-wide pytest wiring.

Tests are layered by speed (STYLE.md 10): the directory a test lives in sets its marker, so
`scripts/test -m unit`, `-m integration` or `-m "not e2e"` select layers without per-test markers.
"""
from __future__ import annotations

from pathlib import Path

import pytest

_LAYERS = ("unit", "integration", "e2e")


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
