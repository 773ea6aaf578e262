"""bootstrap(): the one place where settings, database, ledger and (later) the other subsystems are
wired together. The HTTP app, the CLI, the scheduler and the tests all get their services here."""
from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine

from custody.database import make_engine, migrate, server_url
from custody.settings import Settings, get_settings
from ledger.service import Ledger


@dataclass
class Container:
    settings: Settings
    engine: Engine
    ledger: Ledger


def bootstrap(settings: Settings | None = None, *, url: str | None = None, run_migrations: bool = True) -> Container:
    settings = settings or get_settings()
    url = url or server_url(settings)
    if run_migrations:
        migrate(url)
    engine = make_engine(url)
    return Container(settings=settings, engine=engine, ledger=Ledger(engine))
