"""Shared fixtures and helpers for the matching integration tests (no tests of its own).

Each test gets its own market symbol and owners (a fresh run id), because the session database is
shared. Amounts: BTC in satoshi, USDT in micro-units; prices in ticks of 0.01 USDT, quantities in
lots of 0.0001 BTC (`matching.testing.BTC_USDT`).
"""
from __future__ import annotations

import dataclasses
import uuid

import pytest
from sqlalchemy import text

from ledger.model import AccountKind, Balance, HoldState
from ledger.service import Ledger
from matching.fees import FeeSchedule
from matching.model import Market
from matching.service import Trading
from matching.settlement import customer_account_name
from matching.testing import BTC_USDT, FEES, USDT

BTC = 100_000_000  # satoshi per BTC


@dataclasses.dataclass
class Env:
    ledger: Ledger
    trading: Trading
    run: str
    symbol: str

    def owner(self, name: str) -> str:
        return f"{self.run}-{name}"

    def fund(self, name: str, *, usdt: int = 0, btc: int = 0) -> str:
        owner = self.owner(name)
        for asset, amount in (("USDT", usdt), ("BTC", btc)):
            if amount:
                fund(self.ledger, self.run, owner, asset, amount)
        return owner

    def balance(self, owner: str, asset: str) -> Balance:
        account = self.ledger.account_by_name(customer_account_name(owner, asset))
        return self.ledger.balance(account.id)

    def fee_income(self) -> int:
        return self.ledger.balance(self.trading.market(self.symbol).fee_account_id).posted

    def restart(self) -> Trading:
        """A fresh service on the same database, as after a process restart."""
        self.trading = Trading(self.ledger.engine, self.ledger)
        self.trading.load()
        return self.trading


def new_market(ledger: Ledger, trading: Trading, run: str, *, fees: FeeSchedule = FEES,
               **market_fields) -> str:
    ledger.create_asset("BTC", 8)
    ledger.create_asset("USDT", 6)
    symbol = f"BTC-USDT-{run}"
    market = dataclasses.replace(BTC_USDT, symbol=symbol, **market_fields)
    trading.create_market(market, fees, **({}))
    return symbol


def fund(ledger: Ledger, run: str, owner: str, asset: str, amount: int) -> int:
    equity = ledger.open_account(asset, AccountKind.equity, f"mtest:{run}:equity:{asset}")
    account = ledger.open_account(asset, AccountKind.customer, customer_account_name(owner, asset),
                                  owner=owner)
    ledger.transfer(f"mtest:{run}:fund:{owner}:{asset}:{uuid.uuid4().hex[:8]}", equity.id,
                    account.id, amount)
    return account.id


def holds_of(ledger: Ledger, order_id: str) -> list:
    """Every ledger hold placed for an order (a swap on amend makes more than one)."""
    with ledger.engine.connect() as conn:
        ids = conn.execute(text("SELECT id FROM hold WHERE reference = :r ORDER BY id"),
                           {"r": order_id}).scalars().all()
    return [ledger.get_hold(i) for i in ids]


def pending_holds(ledger: Ledger, owner_prefix: str) -> list:
    with ledger.engine.connect() as conn:
        return conn.execute(text("SELECT h.id, h.reference FROM hold h JOIN account a ON a.id = h.account_id "
                                 "WHERE a.owner LIKE :p AND h.state = 'pending'"),
                            {"p": owner_prefix + "%"}).all()


@pytest.fixture()
def env(ledger: Ledger) -> Env:
    run = uuid.uuid4().hex[:10]
    trading = Trading(ledger.engine, ledger)
    symbol = new_market(ledger, trading, run)
    return Env(ledger, trading, run, symbol)


__all__ = ["BTC", "USDT", "Env", "HoldState", "env", "fund", "holds_of", "new_market",
           "pending_holds", "Market"]


TERMINAL = {"rejected", "filled", "cancelled", "expired"}


def check_holds(env: Env) -> None:
    """Every order's holds agree with the engine: captures = what its fills took; a terminal order
    holds nothing; an open order's live hold covers what it may still need."""
    from matching.holds import hold_captured, hold_requirement

    engine = env.trading.engine(env.symbol)
    with env.ledger.engine.connect() as conn:
        rows = conn.execute(text("SELECT id, state, hold_id FROM trade_order WHERE market = :m"),
                            {"m": env.symbol}).all()
    for row in rows:
        holds = holds_of(env.ledger, row.id)
        order = engine.order(row.id)
        if order is None:  # refused before sequencing: never held
            assert row.state == "rejected" and not holds, row
            continue
        assert order.state.value == row.state, (row, order)
        captured = sum(h.captured for h in holds)
        assert captured == (hold_captured(order, engine.market)[1] if holds else 0), (row, holds)
        pending = [h for h in holds if h.state is HoldState.pending]
        if row.state in TERMINAL or row.state in ("untriggered", "received"):
            assert not pending, (row, holds)
            for h in holds:
                assert h.captured + h.released == h.amount
        else:
            assert len(pending) == 1 and pending[0].id == row.hold_id, (row, holds)
            _, need = hold_requirement(order, engine.market, engine.fees)
            assert sum(h.captured for h in holds) + pending[0].remaining >= need, (row, holds)
