"""The order book of one market: two sides of price levels, a FIFO queue per level, an id index.

Each side keeps its prices in a sorted list of keys (bisect) with the BEST price at the end, so the
best level is `keys[-1]` and removing it is a pop from the end: bids are keyed by price, asks by
-price. A level is a deque of `(generation, order)` entries. Removing an order from the middle of a
queue bumps the order's `queue_gen` instead of searching the deque, which makes cancel O(1); stale
entries are dropped when they reach the front or when they outnumber live ones. Re-queueing (an
iceberg refill, an amend that loses priority) appends a fresh entry at the back.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from typing import Iterator

from matching.model import Order, Side


class Level:
    """One price: live order count and the FIFO queue of entries (some possibly stale)."""

    __slots__ = ("price", "queue", "count")

    def __init__(self, price: int) -> None:
        self.price = price
        self.queue: deque[tuple[int, Order]] = deque()
        self.count = 0

    def orders(self) -> Iterator[Order]:
        """Live orders in time priority."""
        for gen, order in self.queue:
            if gen == order.queue_gen:
                yield order

    def trim(self) -> None:
        """Drop stale entries at the front; compact when stale entries dominate."""
        queue = self.queue
        while queue and queue[0][0] != queue[0][1].queue_gen:
            queue.popleft()
        if len(queue) > 2 * self.count + 16:
            self.queue = deque(e for e in queue if e[0] == e[1].queue_gen)


class BookSide:
    """All levels of one side, best price last."""

    __slots__ = ("side", "keys", "levels")

    def __init__(self, side: Side) -> None:
        self.side = side
        self.keys: list[int] = []
        self.levels: dict[int, Level] = {}

    def _key(self, price: int) -> int:
        return price if self.side is Side.buy else -price

    def best(self) -> Level | None:
        return self.levels[self.keys[-1]] if self.keys else None

    def best_price(self) -> int | None:
        return self.levels[self.keys[-1]].price if self.keys else None

    def levels_from_best(self) -> Iterator[Level]:
        """Levels in priority order. The caller must not change the side while iterating."""
        keys, levels = self.keys, self.levels
        for i in range(len(keys) - 1, -1, -1):
            yield levels[keys[i]]

    def add(self, order: Order) -> None:
        """Append `order` at the back of its price level, creating the level if needed."""
        key = self._key(order.price)
        level = self.levels.get(key)
        if level is None:
            level = self.levels[key] = Level(order.price)
            insort(self.keys, key)
        order.queue_gen += 1
        level.queue.append((order.queue_gen, order))
        level.count += 1

    def remove(self, order: Order) -> None:
        """Take `order` off the book; drop its level if that was the last live order."""
        key = self._key(order.price)
        level = self.levels[key]
        order.queue_gen += 1
        level.count -= 1
        if level.count == 0:
            del self.levels[key]
            del self.keys[bisect_left(self.keys, key)]
        else:
            level.trim()

    def requeue(self, order: Order) -> None:
        """Move `order` to the back of its level (it loses time priority)."""
        level = self.levels[self._key(order.price)]
        order.queue_gen += 1
        level.queue.append((order.queue_gen, order))
        level.trim()

    def depth(self, levels: int | None = None) -> list[tuple[int, int]]:
        """[(price, displayed lots)] from the best price; iceberg reserves are not shown."""
        out = []
        for level in self.levels_from_best():
            if levels is not None and len(out) >= levels:
                break
            out.append((level.price, sum(o.visible for o in level.orders())))
        return out


class Book:
    """Both sides of one market plus an index of resting orders by id."""

    __slots__ = ("bids", "asks", "index")

    def __init__(self) -> None:
        self.bids = BookSide(Side.buy)
        self.asks = BookSide(Side.sell)
        self.index: dict[str, Order] = {}

    def side(self, side: Side) -> BookSide:
        return self.bids if side is Side.buy else self.asks

    def add(self, order: Order) -> None:
        self.side(order.side).add(order)
        self.index[order.order_id] = order

    def remove(self, order: Order) -> None:
        self.side(order.side).remove(order)
        del self.index[order.order_id]

    def requeue(self, order: Order) -> None:
        self.side(order.side).requeue(order)

    def is_crossed(self) -> bool:
        """True if the best bid meets or passes the best ask (must never be true at rest)."""
        bid, ask = self.bids.best_price(), self.asks.best_price()
        return bid is not None and ask is not None and bid >= ask
