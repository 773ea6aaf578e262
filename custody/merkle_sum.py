"""Merkle sum tree for proofs of liabilities that keep customers private (pure, standard library only).

Construction (what custody.reserves publishes and a customer's verifier recomputes):

    leaf = H(0x00 || nonce || account_id || amount)            sum = amount (>= 0, refused otherwise)
    node = H(0x01 || left.hash || left.sum || right.hash || right.sum)    sum = left.sum + right.sum

H is SHA-256; account_id is 8 bytes and sums 40 bytes (SUM_BYTES), big-endian unsigned; nonce is 16 random
bytes per LEAF (not per account), so no leaf can be linked to an account, or to another leaf, by
guessing. Each customer balance is split (`split`) into `parts` leaves of random amounts that sum
exactly to it: all positive when the balance has at least `parts` minor units, else pieces of 1
and 0. Padding leaves (account 0, amount 0, their own random nonce, indistinguishable from a real
zero piece) fill the leaf count to a multiple of CHUNK (16), and all leaves are shuffled with the
operating system's random source. An odd node on a level above the chunks is paired with a fixed
zero-sum padding node (`PAD`). The root's sum is the total liability; every node commits to its
children's sums, so no subtree can hide a negative amount or a changed one.

What a customer's proof shows them: their own leaves (amounts, nonces, positions), and for each
leaf the sibling (hash, sum) of every node on its path to the root, plus the root. What it shows of
other customers: only sums of random pieces of balances, never which account a piece belongs to.
`place()` refuses a shuffle with an `exposed` node: one that holds every piece of some accounts and
nothing else, or nothing else but pieces of one other account (whose owner, seeing the node on
their own path, would subtract their pieces): its sum would be a sum of whole balances (a single
customer's balance, when it holds one account). Sums of SEVERAL siblings of one customer's paths
added together (`exposed_together`: a customer's frontier falling into two or more groups of whole
accounts) are refused too on trees of up to EXACT_LEAVES leaves, where they happen a few times in a
hundred shuffles; above, they are not checked (quadratic cost) and the README states the bound,
of the order of 5 / M^2 for M accounts at 4 leaves each. Accounts with fewer minor units than `parts` are exempt (their balance may sit whole in
one leaf: a few satoshi or wei, still unlinkable to their owner). The tree does reveal the number of leaves, hence
roughly the number of accounts (at most `parts` leaves each), and the total.

Storage: nodes at level CHUNK_LEVELS (4) and above are kept (`Tree.upper`); a proof recomputes the
lower levels from the 16 leaves of its chunk (`prove`), so a proof costs one chunk and one path.
"""
from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

CHUNK_LEVELS = 4
CHUNK = 1 << CHUNK_LEVELS
NONCE_BYTES = 16
PADDING_ACCOUNT = 0
DEFAULT_PARTS = 4
_PAD_HASH = hashlib.sha256(b"\x02custody-merkle-sum-padding").digest()
# Shuffles drawn before giving up. Past a handful of accounts nearly every shuffle passes; with four
# accounts split in two about one in twelve does (measured), so 20 draws failed ~17% of builds of such
# a tree (found by the property test): 200 leave ~2e-8, and only tiny trees ever need more than one.
_SHUFFLE_ATTEMPTS = 200
EXACT_LEAVES = 1 << 10  # trees up to this many leaves also get the check of sibling sums together (exposed_together)
PROGRESS_LEAVES = 1 << 16  # Tree reports its progress every this many leaves hashed (a multiple of CHUNK)


SUM_BYTES = 40  # 320 bits: a ledger amount is numeric(78,0) (< 10^78 < 2^260), and 2^60 leaves of it still fit


def _sum_bytes(value: int) -> bytes:
    return value.to_bytes(SUM_BYTES, "big")


@dataclass(frozen=True)
class Node:
    hash: bytes
    sum: int


PAD = Node(_PAD_HASH, 0)


@dataclass(frozen=True)
class Step:
    """One level of a proof: the sibling and whether it sits on the left."""

    sibling: Node
    sibling_is_left: bool


def leaf(account_id: int, amount: int, nonce: bytes) -> Node:
    if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
        raise ValueError("a liability leaf must be a non-negative integer of minor units")
    if len(nonce) != NONCE_BYTES or not 0 <= account_id < 2**63:
        raise ValueError(f"a leaf needs a {NONCE_BYTES}-byte nonce and an account id in 0..2^63-1")
    return Node(hashlib.sha256(b"\x00" + nonce + account_id.to_bytes(8, "big") + _sum_bytes(amount)).digest(), amount)


def parent(left: Node, right: Node) -> Node:
    return Node(hashlib.sha256(b"\x01" + left.hash + _sum_bytes(left.sum) + right.hash + _sum_bytes(right.sum)).digest(),
                left.sum + right.sum)


def split(balance: int, parts: int, rng: random.Random) -> list[int]:
    """`parts` random non-negative integers summing exactly to `balance`: a uniformly random
    composition into positive parts when balance >= parts, else `balance` ones among zeros."""
    if isinstance(balance, bool) or not isinstance(balance, int) or balance < 0 or parts < 1:
        raise ValueError("a balance to split is a non-negative integer, into at least one part")
    if balance < parts:
        pieces = [1] * balance + [0] * (parts - balance)
        rng.shuffle(pieces)
        return pieces
    chosen: set[int] = set()
    while len(chosen) < parts - 1:  # distinct cut points in 1..balance-1 (range() cannot hold 10^30)
        chosen.add(rng.randrange(1, balance))
    cuts = sorted(chosen)
    return [b - a for a, b in zip([0, *cuts], [*cuts, balance])]


@dataclass(frozen=True)
class Leaves:
    """The leaves in tree order, as columns: account (PADDING_ACCOUNT for padding), amount, and the
    nonces concatenated (NONCE_BYTES each)."""

    accounts: list[int]
    amounts: list[int]
    nonces: bytes

    def __len__(self) -> int:
        return len(self.amounts)

    def nonce(self, i: int) -> bytes:
        return self.nonces[i * NONCE_BYTES:(i + 1) * NONCE_BYTES]

    def node(self, i: int) -> Node:
        return leaf(self.accounts[i], self.amounts[i], self.nonce(i))


def _climb(level: list[Node]) -> list[Node]:
    if len(level) % 2:
        level = [*level, PAD]
    return [parent(level[i], level[i + 1]) for i in range(0, len(level), 2)]


def chunk_levels(nodes: Sequence[Node]) -> list[list[Node]]:
    """The levels 0..CHUNK_LEVELS of one chunk of CHUNK leaf nodes (the last is [chunk root])."""
    levels = [list(nodes)]
    for _ in range(CHUNK_LEVELS):
        levels.append(_climb(levels[-1]))
    return levels


def upper_positions(index: int, leaf_count: int) -> list[tuple[int, int]]:
    """(level, position) of the stored siblings a proof of leaf `index` needs, from CHUNK_LEVELS up."""
    out, width, level = [], leaf_count >> CHUNK_LEVELS, CHUNK_LEVELS
    while width > 1:
        out.append((level, (index >> level) ^ 1))
        width, level = (width + 1) // 2, level + 1
    return out


def prove(chunk: Sequence[Node], index: int, leaf_count: int, upper: Callable[[int, int], Node]) -> list[Step]:
    """The proof of leaf `index` from the CHUNK leaf nodes of its chunk and `upper(level, position)`,
    the stored nodes above the chunks (PAD where a level has no such position)."""
    steps, at = [], index % CHUNK
    for level in chunk_levels(chunk)[:-1]:
        steps.append(Step(level[at ^ 1], bool(at & 1)))
        at //= 2
    for level, position in upper_positions(index, leaf_count):
        steps.append(Step(upper(level, position), bool(position < (index >> level))))
    return steps


def verify(node: Node, proof: Sequence[Step], root: Node) -> bool:
    """True when `proof` links `node` to `root` (hash and sum), with no negative sum anywhere."""
    for step in proof:
        if step.sibling.sum < 0:
            return False
        node = parent(step.sibling, node) if step.sibling_is_left else parent(node, step.sibling)
    return node == root


class Tree:
    """The nodes above the chunks of `leaves`: `upper[0]` is level CHUNK_LEVELS (the chunk roots),
    `upper[-1]` is [root]."""

    def __init__(self, leaves: Leaves, progress: Callable[[int], None] | None = None) -> None:
        """Hash every chunk of `leaves` and the levels above; `progress(leaves hashed)` is called
        after every PROGRESS_LEAVES leaves (between chunks) and once at the end."""
        n = len(leaves)
        if n == 0 or n % CHUNK:
            raise ValueError(f"a tree needs a positive multiple of {CHUNK} leaves")
        self.leaves = leaves
        roots = []
        for base in range(0, n, CHUNK):
            roots.append(chunk_levels([leaves.node(i) for i in range(base, base + CHUNK)])[-1][0])
            if progress is not None and (base + CHUNK) % PROGRESS_LEAVES == 0 and base + CHUNK < n:
                progress(base + CHUNK)
        self.upper = [roots]
        while len(self.upper[-1]) > 1:
            self.upper.append(_climb(self.upper[-1]))
        if progress is not None:
            progress(n)

    @property
    def root(self) -> Node:
        return self.upper[-1][0]

    def node_at(self, level: int, position: int) -> Node:
        row = self.upper[level - CHUNK_LEVELS]
        return row[position] if position < len(row) else PAD

    def proof(self, index: int) -> list[Step]:
        base = index - index % CHUNK
        return prove([self.leaves.node(i) for i in range(base, base + CHUNK)], index, len(self.leaves), self.node_at)

    def stored_nodes(self) -> Iterable[tuple[int, int, Node]]:
        """(level, position, node) of every node a proof may read (the chunk roots and above; PAD
        where a level was padded), the root included."""
        for offset, row in enumerate(self.upper):
            level = CHUNK_LEVELS + offset
            for position, node in enumerate(row):
                yield level, position, node
            if len(row) % 2 and len(row) > 1:
                yield level, len(row), PAD


def exposed(leaves: Leaves, parts: int) -> list[tuple[int, int]]:
    """(level, position) of every node whose sum would show a sum of whole balances to somebody:
    the node holds every piece of one or more accounts and either nothing else (anyone seeing it as
    a sibling learns their total) or pieces of exactly one other account besides (that account's
    owner, whose path runs through it, learns the rest by subtracting their own). Not counted: the
    node holding everything (the total is public), one whose whole accounts are all accounts but
    that one owner's (the total less one's own balance), and the pieces of accounts below `parts`
    minor units (module docstring). Works on piece counts: W(node) = the pieces of the accounts
    whose every piece lies under it (each account counted at its pieces' lowest common ancestor),
    P(node) = the pieces under it; the leaves are read only for the rare node with fewer than
    `parts` pieces of straddling accounts."""
    n = len(leaves)
    total: dict[int, int] = {}
    for account, amount in zip(leaves.accounts, leaves.amounts):
        if account != PADDING_ACCOUNT:
            total[account] = total.get(account, 0) + amount
    counted = [a != PADDING_ACCOUNT and m > 0 and total[a] >= parts for a, m in zip(leaves.accounts, leaves.amounts)]
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    pieces: dict[int, int] = {}
    for i, (account, c) in enumerate(zip(leaves.accounts, counted)):
        if c:
            first.setdefault(account, i)
            last[account] = i
            pieces[account] = pieces.get(account, 0) + 1
    whole_at: dict[int, dict[int, int]] = {}  # level -> position -> pieces of the accounts whole there
    for account, lo in first.items():
        level = (lo ^ last[account]).bit_length()
        at = whole_at.setdefault(level, {})
        at[lo >> level] = at.get(lo >> level, 0) + pieces[account]
    everything = sum(pieces.values())
    found = []
    p = [int(c) for c in counted]
    w = [0] * n
    for position, count in whole_at.get(0, {}).items():  # an account of one counted piece (parts = 1)
        w[position] += count
    level = 0
    while True:
        for j in [j for j, (pj, wj) in enumerate(zip(p, w)) if wj and pj - wj < parts]:
            straddling = p[j] - w[j]
            if straddling == 0:
                if w[j] < everything:
                    found.append((level, j))
                continue
            start, end = j << level, (j + 1) << level
            owners = {leaves.accounts[i] for i in range(start, min(end, n))
                      if counted[i] and not start <= first[leaves.accounts[i]] <= last[leaves.accounts[i]] < end}
            if len(owners) == 1 and w[j] + pieces[owners.pop()] < everything:
                found.append((level, j))
        if len(p) == 1:
            return found
        if len(p) % 2:
            p, w = p + [0], w + [0]
        level += 1
        p = [p[k] + p[k + 1] for k in range(0, len(p), 2)]
        w = [w[k] + w[k + 1] for k in range(0, len(w), 2)]
        for position, count in whole_at.get(level, {}).items():
            w[position] += count


def exposed_together(leaves: Leaves, parts: int) -> list[int]:
    """The accounts whose proof would show a sum of whole balances as a sum of SEVERAL of its
    siblings added together. A customer's proof shows the sums of its frontier: the sibling
    subtrees that hold none of their own leaves, which partition every other leaf. Any union of
    frontier subtrees is a known sum; it is a sum of whole balances when every account with a
    piece in it has all its pieces in it. Joining the frontier subtrees that share an account, each
    group (a connected component) is such a union; one group is everybody else (the total less
    one's own balance: public), two or more expose each group's total. Counted as in `exposed`
    (pieces of accounts below `parts` minor units and padding are ignored). Costs about
    parts x leaves per account, so `place` runs it on trees of up to EXACT_LEAVES leaves; above,
    see the README for the bound."""
    total: dict[int, int] = {}
    for account, amount in zip(leaves.accounts, leaves.amounts):
        if account != PADDING_ACCOUNT:
            total[account] = total.get(account, 0) + amount
    at: dict[int, list[int]] = {}
    for i, account in enumerate(leaves.accounts):
        if account != PADDING_ACCOUNT:
            at.setdefault(account, []).append(i)
    counted = [(i, a) for i, (a, m) in enumerate(zip(leaves.accounts, leaves.amounts))
               if a != PADDING_ACCOUNT and m > 0 and total[a] >= parts]
    found = []
    for owner, mine in at.items():
        groups: dict[tuple[int, int], tuple[int, int]] = {}  # frontier node -> union-find parent

        def root(x: tuple[int, int]) -> tuple[int, int]:
            while groups[x] != x:
                groups[x] = groups[groups[x]]
                x = groups[x]
            return x

        first: dict[int, tuple[int, int]] = {}
        for i, account in counted:
            if account == owner:
                continue
            level = min((i ^ x).bit_length() for x in mine) - 1
            node = (level, i >> level)
            groups.setdefault(node, node)
            if account in first:
                a, b = root(first[account]), root(node)
                if a != b:
                    groups[a] = b
            else:
                first[account] = node
        if len({root(x) for x in groups}) > 1:
            found.append(owner)
    return found


def leaf_count(accounts: int, parts: int) -> int:
    """The number of leaves `place` makes for `accounts` accounts: `parts` each, padded to CHUNK."""
    return -(-accounts * parts // CHUNK) * CHUNK


def place(balances: Iterable[tuple[int, int]], parts: int = DEFAULT_PARTS,
          rng: random.Random | None = None, progress: Callable[[int], None] | None = None) -> Tree:
    """Split every (account_id, balance) into `parts` leaves, pad, shuffle and build the tree
    (`progress(leaves hashed)` between chunks, see Tree); a shuffle with an `exposed` node, or on
    a tree of up to EXACT_LEAVES leaves one that `exposed_together` refuses, is drawn again (a few times at most: past a handful of accounts
    it essentially never happens), and ValueError if none avoids one (with two or three accounts it
    can be unavoidable)."""
    if parts < 2:
        raise ValueError("a balance must be split into at least 2 leaves: one leaf per account shows it whole")
    rng = rng or random.SystemRandom()
    accounts: list[int] = []
    amounts: list[int] = []
    for account_id, balance in balances:
        if not 0 < account_id < 2**63:
            raise ValueError(f"account id {account_id} is out of range")
        pieces = split(balance, parts, rng)
        accounts.extend([account_id] * parts)
        amounts.extend(pieces)
    if not accounts:
        raise ValueError("a tree needs at least one account")
    padding = -len(accounts) % CHUNK
    accounts.extend([PADDING_ACCOUNT] * padding)
    amounts.extend([0] * padding)
    order = list(range(len(accounts)))
    for _ in range(_SHUFFLE_ATTEMPTS):
        rng.shuffle(order)
        leaves = Leaves([accounts[i] for i in order], [amounts[i] for i in order], os.urandom(NONCE_BYTES * len(order)))
        if not exposed(leaves, parts) and (len(leaves) > EXACT_LEAVES or not exposed_together(leaves, parts)):
            return Tree(leaves, progress)
    raise ValueError(f"no shuffle of {len(accounts)} leaves avoided a node showing a sum of whole balances")
