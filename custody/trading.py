"""Wiring of the matching service into the container: `attach(container)` builds `Trading` from the
container's database engine and ledger (a reorg freeze, `custody.incidents.frozen_accounts`, blocks
the accounts it freezes: matching evicts their resting orders before anything trades with them),
rebuilds every configured market from its journal
(snapshot + replay), and sets `container.trading`. With no market configured it is simply empty."""
from __future__ import annotations

import threading

from sqlalchemy import Engine

from custody.container import Container
from custody.incidents import frozen_accounts, refuse_frozen
from ledger.errors import LedgerError
from matching.service import Trading
from matching.settlement import customer_account_name

_attach_lock = threading.Lock()


def attach(container: Container) -> Trading:
    """Build (once) and return the container's trading service."""
    with _attach_lock:
        if container.trading is None:
            trading = Trading(container.engine, container.ledger, blocked_accounts=frozen_accounts)
            trading.load()
            container.trading = trading
        return container.trading


def refuse_frozen_trader(trading: Trading, engine: Engine, symbol: str, owner: str) -> None:
    """A new or amended order holds from its owner's accounts in the market's two assets, through
    matching's own ledger commands (not `CallerLedger`): refuse it while a reorged-out credit freezes
    either account (`account_frozen`, custody.incidents), as an API debit or hold would be refused."""
    market = trading.market(symbol).market
    ids = []
    for asset in (market.base_asset, market.quote_asset):
        try:
            ids.append(trading.ledger.account_by_name(customer_account_name(owner, asset)).id)
        except LedgerError:
            continue  # not opened yet: nothing of it can be frozen
    refuse_frozen(engine, ids)
