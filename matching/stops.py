"""Untriggered stop and stop-limit orders, ordered by the price at which they fire.

A buy stop fires when the last trade price rises to its stop price or above; a sell stop when it
falls to its stop price or below. Orders that fire on the same trade fire in stop-price order
(nearest first) and then by the sequence number that placed them. Each list keeps the next order
to fire at its END so firing is a pop: buys keyed (-stop, -seq), sells keyed (stop, -seq).
"""
from __future__ import annotations

from bisect import bisect_left, insort

from matching.model import Side

from .order import Order


class StopBook:
    """The untriggered stops of one market."""

    __slots__ = ("buys", "sells", "keys")

    def __init__(self) -> None:
        self.buys: list[tuple[int, int, str]] = []
        self.sells: list[tuple[int, int, str]] = []
        self.keys: dict[str, tuple[int, int, str]] = {}

    def _list(self, side: Side) -> list[tuple[int, int, str]]:
        return self.buys if side is Side.buy else self.sells

    def add(self, order: Order) -> None:
        stop = -order.stop_price if order.side is Side.buy else order.stop_price
        key = (stop, -order.seq, order.order_id)
        insort(self._list(order.side), key)
        self.keys[order.order_id] = key

    def remove(self, order: Order) -> None:
        key = self.keys.pop(order.order_id)
        lst = self._list(order.side)
        del lst[bisect_left(lst, key)]

    def pop_triggered(self, last_price: int) -> list[str]:
        """Ids of the stops that `last_price` fires, removed from the book, in firing order."""
        fired: list[str] = []
        buys, sells = self.buys, self.sells
        while buys and -buys[-1][0] <= last_price:
            fired.append(buys.pop()[2])
        while sells and sells[-1][0] >= last_price:
            fired.append(sells.pop()[2])
        for order_id in fired:
            del self.keys[order_id]
        return fired

    def in_firing_order(self) -> list[str]:
        """All ids, buys then sells, each in firing order (for snapshots)."""
        return [k[2] for k in reversed(self.buys)] + [k[2] for k in reversed(self.sells)]
