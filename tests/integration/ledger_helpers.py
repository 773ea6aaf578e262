"""Small helpers shared by the ledger integration tests.

The session database is shared by every test, so each test works in its own `Book`: accounts and
keys carry a random prefix, and the outside world (an equity account) funds what the test needs.
"""
from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import pytest

from ledger.errors import ErrorCode, LedgerError
from ledger.model import AccountKind, PostResult, Transfer
from ledger.service import Ledger


class Book:
    """One test's private corner of the ledger: unique names, a funding source, key minting."""

    def __init__(self, ledger: Ledger, asset: str = "BTC", decimals: int = 8) -> None:
        ledger.create_asset(asset, decimals)
        self.ledger = ledger
        self.asset = asset
        self.prefix = f"t{uuid.uuid4().hex[:12]}"
        self.world = self.account("world", AccountKind.equity)
        self._keys = 0

    def account(self, name: str, kind: AccountKind = AccountKind.customer, *, asset: str | None = None, **kw: Any) -> int:
        return self.ledger.open_account(asset or self.asset, kind, f"{self.prefix}:{name}", **kw).id

    def key(self, name: str | None = None) -> str:
        if name is None:
            self._keys += 1
            name = f"k{self._keys}"
        return f"{self.prefix}:{name}"

    def fund(self, account_id: int, amount: int, *, source: int | None = None) -> PostResult:
        return self.ledger.post(self.key(), [Transfer(source or self.world, account_id, amount)])

    def posted(self, account_id: int) -> int:
        return self.ledger.balance(account_id).posted


def assert_code(code: ErrorCode, fn: Callable[..., Any], *args: Any, **kw: Any) -> LedgerError:
    """Call `fn` and assert it refuses with ledger error `code`; return the error for more checks."""
    with pytest.raises(LedgerError) as exc:
        fn(*args, **kw)
    assert exc.value.code is code, f"expected {code.value}, got {exc.value.code.value}: {exc.value}"
    return exc.value


def failed_checks(ledger: Ledger) -> set[str]:
    return {c.name for c in ledger.verify() if not c.ok}


def journal_size(ledger: Ledger) -> tuple[int, int]:
    """(journal transactions, journal entries) in the whole database."""
    from sqlalchemy import text

    with ledger.engine.connect() as c:
        return tuple(c.execute(text(
            "SELECT (SELECT count(*) FROM journal_transaction), (SELECT count(*) FROM journal_entry)"
        )).one())


def race(n: int, work: Callable[[int], object]) -> list[object]:
    """Run work(0..n-1) on n threads released together. Returns each result, or the LedgerError it
    raised; any other exception fails the test. Each ledger call takes its own pooled connection,
    so the races happen in PostgreSQL, not in Python."""
    barrier = threading.Barrier(n, timeout=30)

    def run(i: int) -> object:
        barrier.wait()
        try:
            return work(i)
        except LedgerError as err:
            return err

    with ThreadPoolExecutor(max_workers=n) as pool:
        return [f.result(timeout=120) for f in [pool.submit(run, i) for i in range(n)]]
