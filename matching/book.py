"""The order book of one market: two sides of price levels, a FIFO queue per level, an id index.

Each side keeps its prices in a sorted list of keys (bisect) with the BEST price at the end, so the
best level is `keys[-1]` and removing it is a pop from the end: bids are keyed by price, asks by
-price. A level's queue is a dict from order id to order: a dict keeps insertion order, so it is
the FIFO queue itself, and removing an order from anywhere in it is one O(1) `del` (cancel and
amend never search). Re-queueing (an iceberg refill) deletes the entry and inserts it again at the
back; an amend that loses priority leaves the book and re-enters it, at the back of its new level.

Only `Book` changes the book (it also keeps the id index). A moved order usually lands on a price
nobody else quotes, so levels come and go all the time: a side stores bare queues, and `Level` is
a read-only view made when a query asks for one.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from typing import Iterator

from matching.model import Order, Side

_BUY = Side.buy


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
    """All levels of one side, best price last. `sign` turns a price into its key (+1 / -1);
    `queues` maps a key to its level's queue (order id -> order, in time priority)."""

    __slots__ = ("side", "sign", "keys", "queues")

    def __init__(self, side: Side) -> None:
        self.side = side
        self.sign = 1 if side is _BUY else -1
        self.keys: list[int] = []
        self.queues: dict[int, dict[str, Order]] = {}

    def best(self) -> Level | None:
        keys = self.keys
        return Level(keys[-1] * self.sign, self.queues[keys[-1]]) if keys else None

    def best_price(self) -> int | None:
        keys = self.keys
        return keys[-1] * self.sign if keys else None

    def levels_from_best(self) -> Iterator[Level]:
        """Levels in priority order. The caller must not change the side while iterating."""
        keys, queues, sign = self.keys, self.queues, self.sign
        for i in range(len(keys) - 1, -1, -1):
            key = keys[i]
            yield Level(key * sign, queues[key])

    def depth(self, levels: int | None = None) -> list[tuple[int, int]]:
        """[(price, displayed lots)] from the best price; iceberg reserves are not shown."""
        out = []
        for level in self.levels_from_best():
            if levels is not None and len(out) >= levels:
                break
            out.append((level.price, sum(o.visible for o in level.queue.values())))
        return out


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
        key = order.price * side.sign
        queue = side.queues.get(key)
        if queue is None:
            side.queues[key] = {order.order_id: order}
            keys = side.keys
            if not keys or key > keys[-1]:  # a new best price: common, and no search needed
                keys.append(key)
            else:
                insort(keys, key)
        else:
            queue[order.order_id] = order

    def remove(self, order: Order, resting_price: int | None = None) -> None:
        """Take `order` off the book; drop its level if that was the level's last order.
        `resting_price` is where it rests when its `price` has already been changed."""
        side = self.bids if order.side is _BUY else self.asks
        key = (order.price if resting_price is None else resting_price) * side.sign
        queues = side.queues
        queue = queues[key]
        del queue[order.order_id]
        if not queue:
            del queues[key]
            keys = side.keys
            if keys[-1] == key:
                keys.pop()
            else:
                del keys[bisect_left(keys, key)]

    def move(self, order: Order, old_price: int) -> None:
        """`order`, resting at `old_price`, now has its new price: take it off its old level and
        append it at the back of the new one (the same level too loses its place)."""
        side = self.bids if order.side is _BUY else self.asks
        sign, queues, order_id = side.sign, side.queues, order.order_id
        key = old_price * sign
        queue = queues[key]
        del queue[order_id]
        new_key = order.price * sign
        if new_key == key:
            queue[order_id] = order
            return
        keys = side.keys
        if not queue:
            del queues[key]
            if keys[-1] == key:
                keys.pop()
            else:
                del keys[bisect_left(keys, key)]
        queue = queues.get(new_key)
        if queue is None:
            queues[new_key] = {order_id: order}
            if not keys or new_key > keys[-1]:
                keys.append(new_key)
            else:
                insort(keys, new_key)
        else:
            queue[order_id] = order

    def reprice(self, order: Order, old_price: int) -> bool:
        """Move `order` (resting at `old_price`, its `price` already changed) to the back of its
        new level, unless at the new price it would meet the opposite side: then change nothing
        and return False (the caller matches it)."""
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
        sign, queues, order_id = side.sign, side.queues, order.order_id
        key = old_price * sign
        queue = queues[key]
        del queue[order_id]
        new_key = price * sign
        if new_key == key:
            queue[order_id] = order
            return True
        keys = side.keys
        if not queue:
            del queues[key]
            if keys[-1] == key:
                keys.pop()
            else:
                del keys[bisect_left(keys, key)]
        queue = queues.get(new_key)
        if queue is None:
            queues[new_key] = {order_id: order}
            if not keys or new_key > keys[-1]:
                keys.append(new_key)
            else:
                insort(keys, new_key)
        else:
            queue[order_id] = order
        return True

    def requeue(self, order: Order) -> None:
        """Move `order` to the back of its level (it loses time priority)."""
        side = self.bids if order.side is _BUY else self.asks
        queue = side.queues[order.price * side.sign]
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
