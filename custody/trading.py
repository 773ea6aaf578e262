"""Wiring of the matching service into the container: `attach(container)` builds `Trading` from the
container's database engine and ledger (a reorg freeze, `custody.incidents.frozen_accounts`, blocks
the accounts it freezes: matching evicts their resting orders before anything trades with them),
rebuilds every configured market from its journal
(snapshot + replay), and sets `container.trading`. With no market configured it is simply empty.
Matching refuses a new order or amend while a reorg freeze blocks its owner's account in either
asset of the market (`account_frozen`, decided inside the unit of work after the accounts are
locked: `Trading.blocked_code`)."""
from __future__ import annotations

import threading

from custody.container import Container
from custody.errors import CustodyErrorCode
from custody.incidents import frozen_accounts
from matching.service import Trading

_attach_lock = threading.Lock()


def attach(container: Container, *, owner_url: str | None = None) -> Trading:
    """Build (once) and return the container's trading service. With `owner_url` (the api process:
    this process's own base URL) the markets are shared with any other api process on the database
    (custody.api.market_owners): this one loads only the books it takes the ownership of; without,
    it loads every market and serves them all (tests, tools)."""
    with _attach_lock:
        if container.trading is None:
            trading = Trading(container.engine, container.ledger, blocked_accounts=frozen_accounts,
                              blocked_code=CustodyErrorCode.account_frozen.value, autoload=owner_url is None)
            if owner_url is None:
                trading.load()
            else:
                from custody.api.market_owners import attach_owners

                attach_owners(trading, container.engine.url, owner_url)
            container.trading = trading
        return container.trading
