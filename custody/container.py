"""bootstrap(): the one place where settings, database, ledger, wallets, chain adapters and jobs are
wired together. The HTTP app, the CLI, the scheduler and the tests all get their services here."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from sqlalchemy import Engine

from chain_adapters.base import ChainAdapter
from custody.database import make_engine, migrate, server_url
from custody.deposits import Deposits, ExternalScreener
from custody.settings import Settings, get_settings
from custody.wallets import Wallets
from ledger.service import Ledger


@dataclass
class Container:
    settings: Settings
    engine: Engine
    ledger: Ledger
    wallets: Wallets | None = None
    adapters: Mapping[str, ChainAdapter] = field(default_factory=dict)
    deposits: Deposits | None = None
    trading: Any = None  # custody.trading.Trading, attached by custody.trading.attach()

    def __post_init__(self) -> None:
        if self.wallets is None:
            self.wallets = Wallets(self.engine, self.ledger)

    def with_chains(self, adapters: Mapping[str, ChainAdapter], *, external_screener: ExternalScreener | None = None) -> "Container":
        """Attach chain adapters and build the pipelines that need them."""
        self.adapters = dict(adapters)
        self.deposits = Deposits(self.engine, self.ledger, self.wallets, self.adapters, external_screener=external_screener)
        return self


def bootstrap(settings: Settings | None = None, *, url: str | None = None, run_migrations: bool = True) -> Container:
    settings = settings or get_settings()
    url = url or server_url(settings)
    if run_migrations:
        migrate(url)
    engine = make_engine(url)
    return Container(settings=settings, engine=engine, ledger=Ledger(engine))
