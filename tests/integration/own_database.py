"""A fresh, migrated database of a test module's own, for tests whose state must not leak into
(or depend on) the session database: the API fuzzer engages the kill switch and creates assets,
and "no customer account exists yet" cannot be arranged on a shared database."""
from __future__ import annotations

import uuid
from contextlib import contextmanager
from typing import Iterator

from sqlalchemy import Engine

from custody.database import drop_database, ensure_database, make_engine, migrate, with_database


@contextmanager
def own_database(session_url: str, prefix: str) -> Iterator[Engine]:
    """An engine on a new database beside `session_url`'s, dropped on exit."""
    url = with_database(session_url, f"{prefix}_{uuid.uuid4().hex[:12]}")
    ensure_database(url)
    migrate(url)
    engine = make_engine(url, pool_size=5)
    try:
        yield engine
    finally:
        engine.dispose()
        drop_database(url)
