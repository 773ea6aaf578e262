"""The order book of one market: two sides of price levels, a FIFO queue per level.

Each side keeps its prices in a sorted list of keys (bisect) with the BEST price at the end, so the
best level is `keys[-1]` and removing it is a pop from the end: bids are keyed by price, asks by
-price. The queues themselves are found by price. A level's queue is a dict from order id to
order: a dict keeps insertion order, so it is the FIFO queue itself, and removing an order from
anywhere in it is one O(1) `del` (cancel and amend never search). Re-queueing (an iceberg refill)
deletes the entry and inserts it again at the back; an amend that loses priority leaves the book
and re-enters it, at the back of its new level.

Empty levels are dropped lazily. Most commands of a busy market move an order to another price,
and most levels hold an order or two, so a level emptied below the best keeps its (empty) queue
and its key: the next order priced there reuses them, without a sorted insert, a sorted delete
(each a binary search comparing scattered int objects) or a new dict. What holds at every moment:

- the best key, `keys[-1]`, has a non-empty queue (an emptied best level is popped at once, with
  any empty ones it uncovers), so the touch and `would_cross` read one key, as before;
- every key in `keys` has a queue in `queues` and the reverse;
- a side never holds more than `limit` keys: a new level that would pass it first drops every
  empty level, and `limit` becomes twice the levels left (at least `_MIN_LIMIT`), so the dead
  prices a drifting market leaves behind stay fewer than its live levels at their last count
  (plus the minimum), and dropping them costs O(1) per new level over time.

Empty levels are not state: every reader (`levels_from_best`, `depth`, snapshots, the matcher)
skips them, so a book rebuilt from a snapshot, which has none, is the same book and hashes alike.
Only `Book` changes the book. `Level` is a read-only view made when a query asks for one.
"""
from __future__ import annotations

from bisect import insort
from typing import Iterator

from matching.model import Side

from .order import Order

_BUY = Side.buy
_MIN_LIMIT = 128  # keys a side may hold before it looks for empty levels to drop


class Level:
    """A view of one price level: its price and its queue of live orders in time priority."""

    __slots__ = ("price", "queue")

    def __init__(self, price: int, queue: dict[str, Order]) -> None:
        self.price = price
        self.queue = queue

    @property
    def count(self) -> int:
        return len(self.queue)

    def orders(self) -> Iterator[Order]:
        """Live orders in time priority."""
        return iter(self.queue.values())


class BookSide:
    """All levels of one side, best price last. `sign` turns a price into its key in `keys`
    (+1 / -1); `queues` maps a price to its level's queue (order id -> order, in time priority),
    empty for a level kept for reuse; `limit` bounds the number of keys (see the module)."""

    __slots__ = ("side", "sign", "keys", "queues", "limit")

    def __init__(self, side: Side) -> None:
        self.side = side
        self.sign = 1 if side is _BUY else -1
        self.keys: list[int] = []
        self.queues: dict[int, dict[str, Order]] = {}
        self.limit = _MIN_LIMIT

    def best(self) -> Level | None:
        keys = self.keys
        if not keys:
            return None
        price = keys[-1] * self.sign
        return Level(price, self.queues[price])

    def best_price(self) -> int | None:
        keys = self.keys
        return keys[-1] * self.sign if keys else None

    def levels_from_best(self) -> Iterator[Level]:
        """Non-empty levels in priority order. The caller must not change the side while
        iterating."""
        keys, queues, sign = self.keys, self.queues, self.sign
        for i in range(len(keys) - 1, -1, -1):
            price = keys[i] * sign
            queue = queues[price]
            if queue:
                yield Level(price, queue)

    def depth(self, levels: int | None = None) -> list[tuple[int, int]]:
        """[(price, displayed lots)] from the best price; iceberg reserves are not shown."""
        out = []
        for level in self.levels_from_best():
            if levels is not None and len(out) >= levels:
                break
            out.append((level.price, sum(o.visible for o in level.queue.values())))
        return out

    # -- changes (through `Book` only) ------------------------------------------------------

    def _new_level(self, price: int, order_id: str, order: Order) -> None:
        """Make the level at `price` (it has no key yet) with `order` in it."""
        keys, key = self.keys, price * self.sign
        if len(keys) >= self.limit:
            self._drop_empty()
        self.queues[price] = {order_id: order}
        if not keys or key > keys[-1]:  # a new best price: common, and no search needed
            keys.append(key)
        else:
            insort(keys, key)

    def _pop_emptied_best(self) -> None:
        """The best level has just lost its last order: pop it, and the empty levels that
        uncovers, so that the best level is never empty."""
        keys, queues, sign = self.keys, self.queues, self.sign
        del queues[keys.pop() * sign]
        while keys and not queues[keys[-1] * sign]:
            del queues[keys.pop() * sign]

    def _drop_empty(self) -> None:
        keys, queues, sign = self.keys, self.queues, self.sign
        for key in keys:
            if not queues[key * sign]:
                del queues[key * sign]
        keys[:] = [key for key in keys if key * sign in queues]
        self.limit = max(_MIN_LIMIT, 2 * len(keys))


class Book:
    """Both sides of one market; `index` lists the resting orders by id."""

    __slots__ = ("bids", "asks")

    def __init__(self) -> None:
        self.bids = BookSide(Side.buy)
        self.asks = BookSide(Side.sell)

    @property
    def index(self) -> dict[str, Order]:
        """Resting orders by id, built on demand (for checks and tools): the engine finds an
        order through its own `orders` map, so the book keeps no second index to update."""
        return {order_id: order for side in (self.bids, self.asks)
                for queue in side.queues.values() for order_id, order in queue.items()}

    def side(self, side: Side) -> BookSide:
        return self.bids if side is _BUY else self.asks

    def opposite(self, side: Side) -> BookSide:
        """The side an order of `side` trades against."""
        return self.asks if side is _BUY else self.bids

    def add(self, order: Order) -> None:
        """Append `order` at the back of its price level, creating the level if needed."""
        side = self.bids if order.side is _BUY else self.asks
        queue = side.queues.get(order.price)
        if queue is None:
            side._new_level(order.price, order.order_id, order)
        else:
            queue[order.order_id] = order

    def remove(self, order: Order, resting_price: int | None = None) -> None:
        """Take `order` off the book. `resting_price` is where it rests when its `price` has
        already been changed."""
        side = self.bids if order.side is _BUY else self.asks
        price = order.price if resting_price is None else resting_price
        queue = side.queues[price]
        del queue[order.order_id]
        if not queue and side.keys[-1] == price * side.sign:
            side._pop_emptied_best()

    def reprice(self, order: Order, old_price: int) -> bool:
        """Move `order` (resting at `old_price`, its `price` already changed) to the back of its
        new level, unless at the new price it would meet the opposite side: then change nothing
        and return False (the caller matches it). The same price too loses its place."""
        price = order.price
        if order.side is _BUY:
            side = self.bids
            keys = self.asks.keys
            if keys and -keys[-1] <= price:
                return False
        else:
            side = self.asks
            keys = self.bids.keys
            if keys and keys[-1] >= price:
                return False
        queues, order_id = side.queues, order.order_id
        queue = queues[old_price]
        del queue[order_id]
        # Into the new level first: if the old one is now empty and was the best, the new one
        # may be the next best, and must not be popped as empty on the way.
        new_queue = queues.get(price)
        if new_queue is None:
            side._new_level(price, order_id, order)
        else:
            new_queue[order_id] = order
        if not queue and side.keys[-1] == old_price * side.sign:
            side._pop_emptied_best()
        return True

    def requeue(self, order: Order) -> None:
        """Move `order` to the back of its level (it loses time priority)."""
        side = self.bids if order.side is _BUY else self.asks
        queue = side.queues[order.price]
        del queue[order.order_id]
        queue[order.order_id] = order

    def would_cross(self, side: Side, price: int) -> bool:
        """True if an order of `side` at `price` meets the best opposite price."""
        if side is _BUY:
            keys = self.asks.keys
            return bool(keys) and -keys[-1] <= price
        keys = self.bids.keys
        return bool(keys) and keys[-1] >= price

    def is_crossed(self) -> bool:
        """True if the best bid meets or passes the best ask (must never be true at rest)."""
        bid, ask = self.bids.best_price(), self.asks.best_price()
        return bid is not None and ask is not None and bid >= ask
