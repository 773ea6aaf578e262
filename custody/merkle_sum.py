"""Merkle sum tree for proofs of liabilities (pure, standard library only).

Each leaf commits to one customer account's balance with a per-report random salt, so a proof
reveals a customer's own balance to them and nothing about anyone else's. Each node commits to
its children's hashes AND sums, and its own sum is theirs added, so the root's sum is the total
liability and no subtree can hide a negative amount:

    leaf = H(0x00 || salt || account_id || balance)          sum = balance (>= 0, refused otherwise)
    node = H(0x01 || left.hash || left.sum || right.hash || right.sum)    sum = left.sum + right.sum

H is SHA-256; sums are 32-byte big-endian unsigned integers. An odd node at a level is paired with
a zero-sum padding leaf, so every account is a real leaf. `proof(i)` lists the sibling of each
level from the leaf up; `verify(leaf, proof, root)` recomputes the root hash and sum.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

_PAD = hashlib.sha256(b"\x02custody-merkle-sum-padding").digest()


def _sum_bytes(value: int) -> bytes:
    return value.to_bytes(32, "big")


@dataclass(frozen=True)
class Node:
    hash: bytes
    sum: int


@dataclass(frozen=True)
class Step:
    """One level of a proof: the sibling and whether it sits on the left."""

    sibling: Node
    sibling_is_left: bool


def leaf(account_id: int, balance: int, salt: bytes) -> Node:
    if isinstance(balance, bool) or not isinstance(balance, int) or balance < 0:
        raise ValueError("a liability leaf must be a non-negative integer of minor units")
    return Node(hashlib.sha256(b"\x00" + salt + account_id.to_bytes(8, "big") + _sum_bytes(balance)).digest(), balance)


def parent(left: Node, right: Node) -> Node:
    return Node(hashlib.sha256(b"\x01" + left.hash + _sum_bytes(left.sum) + right.hash + _sum_bytes(right.sum)).digest(),
                left.sum + right.sum)


class MerkleSumTree:
    def __init__(self, leaves: list[Node]) -> None:
        if not leaves:
            raise ValueError("a tree needs at least one leaf")
        self.levels: list[list[Node]] = [list(leaves)]
        while len(self.levels[-1]) > 1:
            level = self.levels[-1]
            if len(level) % 2:
                level = level + [Node(_PAD, 0)]
                self.levels[-1] = level
            self.levels.append([parent(level[i], level[i + 1]) for i in range(0, len(level), 2)])

    @property
    def root(self) -> Node:
        return self.levels[-1][0]

    def proof(self, index: int) -> list[Step]:
        steps = []
        for level in self.levels[:-1]:
            sibling = index ^ 1
            steps.append(Step(level[sibling], sibling < index))
            index //= 2
        return steps


def verify(node: Node, proof: list[Step], root: Node) -> bool:
    """True when `proof` links `node` to `root` (hash and sum), with no negative sum anywhere."""
    for step in proof:
        if step.sibling.sum < 0:
            return False
        node = parent(step.sibling, node) if step.sibling_is_left else parent(node, step.sibling)
    return node == root
