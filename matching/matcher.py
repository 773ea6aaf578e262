"""Plan an incoming order's match against the book without changing anything.

The engine first PLANS (this module, read-only), then EXECUTES the plan. Planning first is what
makes FOK exact: the decision "all or nothing" is taken on the very walk the execution will
follow, including self-trade prevention and iceberg refills, so "would fill 4.9 of 5" kills the
order before any fill, STP action or refill happens.

The walk visits makers in price-time priority: best level first, FIFO inside a level. An iceberg
whose displayed slice is taken refills and goes to the back of its level, so the walk keeps a
per-level tail of refilled slices and visits it after the level's queue, as execution will.
Trades are at the maker's price.
"""
from __future__ import annotations

from collections import deque
from typing import Iterator

from matching.book import Book, Level
from matching.fees import PPM, FeeSchedule, ceil_div
from matching.model import Market, Order, OrderType, Side
from matching.stp import StpPolicy, effective_policy

# Plan steps are small tuples: (FILL, maker, qty), (STP_CANCEL_MAKER, maker),
# (STP_DECREMENT, maker, qty). A plan that ends with the taker removed by STP says so in `stp_kill`.
FILL, STP_CANCEL_MAKER, STP_DECREMENT = 0, 1, 2

# Enum members bound once: a class attribute lookup on an Enum costs several times a global's.
_LIMIT, _BUY = OrderType.limit, Side.buy
_CANCEL_NEWEST, _CANCEL_OLDEST = StpPolicy.cancel_newest, StpPolicy.cancel_oldest


class Plan:
    """What executing the match would do: steps in order, lots traded, and why it stopped."""

    __slots__ = ("steps", "filled", "stp_kill", "budget_exhausted")

    def __init__(self) -> None:
        self.steps: list = []
        self.filled = 0
        self.stp_kill = False          # cancel_newest hit: the taker's remainder is removed
        self.budget_exhausted = False  # a market bid could not afford the next lot


def crosses(taker: Order, price: int) -> bool:
    """True if a limit taker may trade at `price` (market orders trade at any price)."""
    if taker.order_type is not _LIMIT:
        return True
    return price <= taker.price if taker.side is _BUY else price >= taker.price


def _walk(level: Level, tail: deque) -> Iterator[tuple[Order, int, int]]:
    """(maker, open lots, displayed lots) in the order execution will meet them."""
    for maker in level.queue.values():
        yield maker, maker.remaining, maker.visible
    while tail:
        yield tail.popleft()


def plan_match(taker: Order, book: Book, market: Market, fees: FeeSchedule) -> Plan:
    """The match `taker` would make now, from its current remaining quantity or budget."""
    plan = Plan()
    steps = plan.steps
    rem = taker.remaining  # None for a market bid, which is limited by budget instead
    policy = effective_policy(taker.stp_policy, rem is not None)
    budget = _Budget(taker, market, fees) if rem is None else None
    group = taker.stp_group
    limit = taker.price if taker.order_type is _LIMIT else None
    is_bid = taker.side is _BUY
    for level in book.opposite(taker.side).levels_from_best():
        if limit is not None and (level.price > limit if is_bid else level.price < limit):
            break
        tail: deque = deque()
        for maker, m_rem, m_vis in _walk(level, tail):
            if maker.stp_group == group:
                if policy is _CANCEL_NEWEST:
                    plan.stp_kill = True
                    return plan
                if policy is _CANCEL_OLDEST:
                    steps.append((STP_CANCEL_MAKER, maker))
                    continue
                cut = min(rem, m_rem)
                steps.append((STP_DECREMENT, maker, cut))
                rem -= cut
                if rem == 0:
                    return plan
                continue
            qty = m_vis if rem is None else min(rem, m_vis)
            if budget is not None:
                qty = budget.take(level.price, qty)
                if qty == 0:
                    plan.budget_exhausted = True
                    return plan
            steps.append((FILL, maker, qty))
            plan.filled += qty
            if rem is not None:
                rem -= qty
            if qty == m_vis and m_rem > qty:
                left = m_rem - qty
                tail.append((maker, left, min(maker.display_qty or left, left)))
            if rem == 0 or qty < m_vis:
                plan.budget_exhausted = budget is not None and rem is None
                return plan
    return plan


class _Budget:
    """A market bid's remaining quote budget, fees included, tracked through the plan."""

    __slots__ = ("left", "fee_num", "rate", "unit")

    def __init__(self, taker: Order, market: Market, fees: FeeSchedule) -> None:
        self.fee_num = taker.fee_num
        self.left = taker.budget - taker.quote_traded - ceil_div(taker.fee_num, PPM)
        self.rate = fees.tier(taker.fee_tier).taker_ppm
        self.unit = market.quote_per_tick_lot

    def _cost(self, price: int, qty: int) -> int:
        quote = price * qty * self.unit
        return quote + ceil_div(self.fee_num + quote * self.rate, PPM) - ceil_div(self.fee_num, PPM)

    def take(self, price: int, cap: int) -> int:
        """The most lots, up to `cap`, affordable at `price`; spends them from the budget."""
        if self._cost(price, cap) <= self.left:
            qty = cap
        else:  # cost is monotonic in qty: binary search the largest affordable
            lo, hi = 0, cap
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if self._cost(price, mid) <= self.left:
                    lo = mid
                else:
                    hi = mid
            qty = lo
        self.left -= self._cost(price, qty)
        self.fee_num += price * qty * self.unit * self.rate
        return qty
