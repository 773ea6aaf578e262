"""The Merkle sum tree behind proof of liabilities: every leaf provable, sums exact, tampering caught."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from custody.merkle_sum import MerkleSumTree, Node, Step, leaf, verify


def build(balances):
    leaves = [leaf(i + 1, b, bytes([i % 256]) * 16) for i, b in enumerate(balances)]
    return leaves, MerkleSumTree(leaves)


@given(st.lists(st.integers(0, 10**30), min_size=1, max_size=40))
def test_every_leaf_proves_and_the_root_sums_everything(balances):
    leaves, tree = build(balances)
    assert tree.root.sum == sum(balances)
    for i, node in enumerate(leaves):
        assert verify(node, tree.proof(i), tree.root)


def test_a_changed_balance_or_sibling_sum_fails():
    leaves, tree = build([5, 7, 0, 11, 3])
    proof = tree.proof(1)
    assert not verify(leaf(2, 8, bytes([1]) * 16), proof, tree.root)  # claims 8 instead of 7
    step = proof[0]
    shifted = [Step(Node(step.sibling.hash, step.sibling.sum - 1), step.sibling_is_left)] + proof[1:]
    assert not verify(leaves[1], shifted, tree.root)  # a sibling hiding one unit
    negative = [Step(Node(step.sibling.hash, -1), step.sibling_is_left)] + proof[1:]
    assert not verify(leaves[1], negative, tree.root)


def test_negative_leaves_are_refused():
    with pytest.raises(ValueError):
        leaf(1, -1, b"s" * 16)
    with pytest.raises(ValueError):
        MerkleSumTree([])


def test_salts_hide_equal_balances():
    a, b = leaf(1, 100, b"a" * 16), leaf(1, 100, b"b" * 16)
    assert a.sum == b.sum and a.hash != b.hash
    assert dataclasses.replace(a) == a
