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

from itertools import chain

from .book import Book
from .order import Order
from matching.fees import PPM, FeeSchedule, ceil_div
from matching.model import Market, OrderType, Side
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


def plan_match(taker: Order, book: Book, market: Market, fees: FeeSchedule) -> Plan:
    """The match `taker` would make now, from its current remaining quantity or budget."""
    plan = Plan()
    steps = plan.steps
    rem = taker.remaining  # None for a market bid, which is limited by budget instead
    policy = effective_policy(taker.stp_policy, rem is not None)
    budget = _Budget(taker, market, fees) if rem is None else None
    group, account = taker.stp_group, taker.account
    limit = taker.price if taker.order_type is _LIMIT else None
    is_bid = taker.side is _BUY
    side = book.asks if is_bid else book.bids
    keys, queues, sign = side.keys, side.queues, side.sign
    for i in range(len(keys) - 1, -1, -1):  # levels from the best (empty ones are skipped)
        price = keys[i] * sign
        if limit is not None and (price > limit if is_bid else price < limit):
            break
        # Makers in the order execution meets them: the queue, then the slices of icebergs
        # refilled on this walk (`tail`), each met with the open and displayed lots of its
        # next slice (`refills`; a maker is met from the queue before any refill of its own).
        tail: list[Order] = []
        refills: dict[Order, tuple[int, int]] = {}
        for maker in chain(queues[price].values(), tail):
            if refills and maker in refills:
                m_rem, m_vis = refills[maker]
            else:
                m_rem, m_vis = maker.remaining, maker.visible
            if maker.stp_group == group or maker.account == account:  # stp.prevented
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
                qty = budget.take(price, qty)
                if qty == 0:
                    plan.budget_exhausted = True
                    return plan
            steps.append((FILL, maker, qty))
            plan.filled += qty
            if rem is not None:
                rem -= qty
            if qty == m_vis and m_rem > qty:
                left = m_rem - qty
                refills[maker] = (left, min(maker.display_qty or left, left))
                tail.append(maker)
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
