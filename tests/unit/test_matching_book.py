"""The book keeps emptied levels for reuse (see `matching.book`): random adds, removals, moves and
refills against a plain model of price-time priority, with the side's invariants checked after
every step, including the bound on how many levels (empty ones included) it keeps."""
from __future__ import annotations

import random

import pytest

from matching.book import _MIN_LIMIT, Book, BookSide
from matching.model import Order, Side


def check_side(side: BookSide, model: dict[int, list[str]]) -> None:
    keys, queues = side.keys, side.queues
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert {key * side.sign for key in keys} == set(queues)
    if keys:
        assert queues[keys[-1] * side.sign], "the best level is never empty"
    assert _MIN_LIMIT <= side.limit and len(keys) <= side.limit
    expected = sorted(((p, ids) for p, ids in model.items() if ids), reverse=side.sign == 1)
    assert [(lv.price, [o.order_id for o in lv.orders()]) for lv in side.levels_from_best()] \
        == expected
    best = expected[0][0] if expected else None
    assert side.best_price() == best


@pytest.mark.parametrize("seed", range(6))
def test_levels_follow_price_time_priority_and_keep_few_empty_levels(seed, monkeypatch):
    drops = []
    drop = BookSide._drop_empty
    monkeypatch.setattr(BookSide, "_drop_empty", lambda side: drops.append(drop(side)))
    rng = random.Random(seed)
    book = Book()
    models = {Side.buy: {}, Side.sell: {}}
    resting: list[Order] = []
    spread = rng.choice([20, 300])  # few prices (levels reused) or many (slack bound reached)
    for step in range(4000):
        r = rng.random()
        if r < 0.3 or not resting:
            side = rng.choice((Side.buy, Side.sell))
            off = rng.randint(1, spread)
            price = 1000 - off if side is Side.buy else 1000 + off
            order = Order(order_id=f"o{step}", side=side, price=price)
            book.add(order)
            models[side].setdefault(price, []).append(order.order_id)
            resting.append(order)
        elif r < 0.5:
            order = resting.pop(rng.randrange(len(resting)))
            book.remove(order)
            models[order.side][order.price].remove(order.order_id)
        elif r < 0.6:
            order = rng.choice(resting)
            book.requeue(order)
            queue = models[order.side][order.price]
            queue.remove(order.order_id)
            queue.append(order.order_id)
        else:
            order = rng.choice(resting)
            old = order.price
            order.price = (1000 - rng.randint(1, spread) if order.side is Side.buy
                           else 1000 + rng.randint(1, spread))
            assert book.reprice(order, old)  # never crosses: bids below 1000, asks above
            models[order.side][old].remove(order.order_id)
            models[order.side].setdefault(order.price, []).append(order.order_id)
        check_side(book.bids, models[Side.buy])
        check_side(book.asks, models[Side.sell])
        assert not book.is_crossed()
    if spread > _MIN_LIMIT:  # more prices than the minimum limit: empty levels were dropped
        assert drops


def test_a_move_that_would_cross_changes_nothing():
    book = Book()
    bid, ask = Order(order_id="b", side=Side.buy, price=99), Order(order_id="a", side=Side.sell,
                                                                    price=101)
    book.add(bid)
    book.add(ask)
    bid.price = 101
    assert book.reprice(bid, 99) is False
    bid.price = 99
    assert [lv.price for lv in book.bids.levels_from_best()] == [99]
    assert book.index == {"b": bid, "a": ask}
