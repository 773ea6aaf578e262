"""Bulk payment workloads for e2e tests and benchmarks (deterministic given the rng)."""
from __future__ import annotations

import random
from decimal import Decimal

from regtest.bitcoin_node import BitcoinNode


def pay_many_bitcoin(node: BitcoinNode, addresses: list[str], outputs: int, blocks: int, rng: random.Random,
                     *, min_sat: int = 10_000, max_sat: int = 5_000_000) -> list[tuple[str, int]]:
    """Pay `outputs` outputs spread over `blocks` blocks to `addresses` (sendmany, one block per batch).

    Returns (address, satoshis) per output. Each block carries outputs // blocks outputs, at most one
    per address per transaction (sendmany takes a map), split over several transactions if needed."""
    per_block = outputs // blocks
    paid: list[tuple[str, int]] = []
    for _ in range(blocks):
        remaining = per_block
        while remaining:
            batch = rng.sample(addresses, min(remaining, len(addresses)))
            amounts = {a: rng.randint(min_sat, max_sat) for a in batch}
            node.wallet("sendmany", "", {a: str(Decimal(s) / Decimal(100_000_000)) for a, s in amounts.items()})
            paid.extend(amounts.items())
            remaining -= len(batch)
        node.mine(1)
    return paid
