"""Wiring of the matching service into the container: `attach(container)` builds `Trading` from the
container's database engine and ledger, rebuilds every configured market from its journal
(snapshot + replay), and sets `container.trading`. With no market configured it is simply empty."""
from __future__ import annotations

import threading

from custody.container import Container
from matching.service import Trading

_attach_lock = threading.Lock()


def attach(container: Container) -> Trading:
    """Build (once) and return the container's trading service."""
    with _attach_lock:
        if container.trading is None:
            trading = Trading(container.engine, container.ledger)
            trading.load()
            container.trading = trading
        return container.trading
