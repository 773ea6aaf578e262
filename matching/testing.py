"""A test harness: an engine behind a sequencer plus an in-memory model of the money layer.

`MoneyModel` is the settlement contract in executable form, for tests and for whoever wires the
real ledger: it places a hold before a command is sequenced, captures from holds on each `Fill`,
and on every terminal event releases exactly `hold placed - captured`. It refuses (AssertionError)
anything the real ledger would refuse: a capture beyond the hold, a negative balance, a terminal
release that disagrees with the event, a fill between an account and itself. Per asset, customer balances plus fee income never change.
"""
from __future__ import annotations

from collections import defaultdict
from itertools import count

from matching.engine import Engine
from matching.events import Event, Fill, OrderAmended, OrderClosed, OrderRejected, Triggered
from matching.fees import FeeSchedule, FeeTier
from matching.holds import hold_requirement
from matching.model import (ActivateTriggered, Command, Market, OrderType, Place,
                            RejectTriggered, Side)
from matching.sequencer import MemoryJournal, Sequencer
from matching.stp import DEFAULT_POLICY, StpPolicy

# BTC/USDT with satoshis and micro-USDT: 1 lot = 0.0001 BTC, 1 tick = 0.01 USDT, 1 tick*lot = 1 µUSDT.
BTC_USDT = Market("BTC-USDT", "BTC", "USDT", lot_size=10_000, quote_per_tick_lot=1,
                  min_notional=1_000_000)
FEES = FeeSchedule({"default": FeeTier(maker_ppm=1_000, taker_ppm=2_000),
                    "vip": FeeTier(maker_ppm=0, taker_ppm=500)})
FEE_ACCOUNT = "fees"
LOTS_PER_BTC = 10_000
TICKS_PER_USDT = 100
USDT = 1_000_000  # micro-units per USDT


class MoneyModel:
    """Balances (posted) and per-order holds, changed only as the engine's events say."""

    def __init__(self, market: Market, fees: FeeSchedule) -> None:
        self.market, self.fees = market, fees
        self.posted: dict[tuple[str, str], int] = defaultdict(int)
        self.placed: dict[str, int] = {}    # order id -> total held for it
        self.captured: dict[str, int] = defaultdict(int)
        self.owner: dict[str, tuple[str, str]] = {}  # order id -> (account, asset)
        self.released: dict[str, int] = {}

    def deposit(self, account: str, asset: str, amount: int) -> None:
        self.posted[(account, asset)] += amount

    def held(self, account: str, asset: str) -> int:
        return sum(self.placed[o] - self.captured[o] for o, key in self.owner.items()
                   if key == (account, asset) and o not in self.released)

    def available(self, account: str, asset: str) -> int:
        return self.posted[(account, asset)] - self.held(account, asset)

    def hold(self, order_id: str, account: str, asset: str, amount: int) -> bool:
        """Place a hold; False (nothing held) if available is short."""
        if self.available(account, asset) < amount:
            return False
        self.placed[order_id] = amount
        self.owner[order_id] = (account, asset)
        return True

    def on_event(self, event: Event) -> None:
        if isinstance(event, Fill):
            self._settle(event)
        elif isinstance(event, OrderClosed):
            assert self.captured[event.order_id] == event.hold_captured, event
            self._release(event.order_id)
        elif isinstance(event, OrderRejected):
            self._release(event.order_id)
        elif isinstance(event, OrderAmended) and event.order_id in self.placed:
            assert event.hold_required >= self.captured[event.order_id], event
            self.placed[event.order_id] = event.hold_required

    def _capture(self, order_id: str, amount: int) -> None:
        self.captured[order_id] += amount
        assert self.captured[order_id] <= self.placed[order_id], (order_id, "capture > hold")
        account, asset = self.owner[order_id]
        self.posted[(account, asset)] -= amount
        assert self.posted[(account, asset)] >= 0, (account, asset, "overdraft")

    def _settle(self, fill: Fill) -> None:
        # the ledger refuses a transfer between one account and itself (accounts_must_be_different)
        assert fill.buyer_account != fill.seller_account, (fill, "self-trade")
        base, quote = self.market.base_asset, self.market.quote_asset
        self._capture(fill.buyer_order_id, fill.buyer_pays)
        self._capture(fill.seller_order_id, fill.base_amount)
        self.posted[(fill.buyer_account, base)] += fill.base_amount
        self.posted[(fill.seller_account, quote)] += fill.seller_receives
        self.posted[(FEE_ACCOUNT, quote)] += fill.maker_fee + fill.taker_fee

    def _release(self, order_id: str) -> None:
        if order_id not in self.placed:  # a stop that never held anything
            return
        assert order_id not in self.released, (order_id, "released twice")
        self.released[order_id] = self.placed[order_id] - self.captured[order_id]
        assert self.released[order_id] >= 0

    def total(self, asset: str) -> int:
        return sum(v for (_, a), v in self.posted.items() if a == asset)

    def open_holds(self) -> dict[str, int]:
        return {o: self.placed[o] - self.captured[o] for o in self.placed if o not in self.released}


class Harness:
    """Gateway-in-miniature: dedupe, hold, submit, settle, and answer triggered stops."""

    def __init__(self, market: Market = BTC_USDT, fees: FeeSchedule = FEES,
                 default_stp: StpPolicy = DEFAULT_POLICY) -> None:
        self.market, self.fees = market, fees
        self.engine = Engine(market, fees, default_stp)
        self.journal = MemoryJournal()
        self.sequencer = Sequencer(self.engine, self.journal)
        self.money = MoneyModel(market, fees)
        self.events: list[Event] = []
        self._ids = count(1)

    def fund(self, account: str, btc_sat: int = 10**12, usdt: int = 10**15) -> None:
        self.money.deposit(account, self.market.base_asset, btc_sat)
        self.money.deposit(account, self.market.quote_asset, usdt)

    def place(self, account: str, side: Side, qty: int | None = None, price: int | None = None,
              client_order_id: str | None = None, **kw: object) -> list[Event]:
        n = next(self._ids)
        cmd = Place(f"o{n}", account, client_order_id or f"c{n}", side, qty=qty, price=price,
                    **kw)
        return self.submit(cmd)

    def submit(self, cmd: Command) -> list[Event]:
        if isinstance(cmd, Place) and not self._hold_for(cmd):
            return []
        events = self.sequencer.submit(cmd).events
        self.events += events
        for event in events:
            self.money.on_event(event)
        out = list(events)
        for event in events:  # fired stops are answered after the command that fired them
            if isinstance(event, Triggered):
                out += self._answer_trigger(event)
        return out

    def _hold_for(self, cmd: Place) -> bool:
        if self.engine.order_by_client_id(cmd.account, cmd.client_order_id) is not None:
            return True  # a retry: the sequencer answers OrderExists, no new hold
        if cmd.order_type in (OrderType.stop, OrderType.stop_limit):
            return True  # a stop reserves nothing until it fires
        try:
            asset, amount = hold_requirement(cmd, self.market, self.fees)
        except (KeyError, TypeError):
            asset, amount = self.market.quote_asset, 0  # invalid: the engine will reject it
        return self.money.hold(cmd.order_id, cmd.account, asset, amount)

    def _answer_trigger(self, event: Triggered) -> list[Event]:
        ok = self.money.hold(event.order_id, event.account, event.hold_asset, event.hold_amount)
        reply = ActivateTriggered(event.order_id) if ok else RejectTriggered(event.order_id)
        return self.submit(reply)


def lots(btc: str) -> int:
    """Lots in a decimal BTC string, exactly (test convenience)."""
    whole, _, frac = btc.partition(".")
    frac = (frac + "0000")[:4]
    assert btc.partition(".")[2][4:].strip("0") == "", "more precision than a lot"
    return int(whole) * LOTS_PER_BTC + int(frac)


def ticks(usdt: int) -> int:
    """Ticks for a whole-USDT price."""
    return usdt * TICKS_PER_USDT


def of_type(events: list[Event], cls: type) -> list:
    return [e for e in events if isinstance(e, cls)]


__all__ = ["BTC_USDT", "FEES", "FEE_ACCOUNT", "Harness", "MoneyModel", "USDT", "lots", "of_type",
           "ticks"]
