"""Our own bitcoin wallet index, kept by the block walk: every coin of ours, without the UTXO set.

What it is: the table `btc_wallet_output` (migration 0023) holds every output, in a main-chain
block up to the deposit scanner's cursor (`chain_cursor`), that pays an address this service
derived: deposit addresses (tier `deposit`), the hot receive address `<hot>/0/0` and the hot
change addresses `<hot>/1/<batch id>` (tier `hot`), and the cold addresses rebalances were told to
pay (tier `cold`), and on each branch the addresses `WATCH_AHEAD` past those (below, "Watched
ahead"); with the block that created it and, once a block
spends it, the spending transaction and block. It replaces `scantxoutset` (which walks the node's
whole UTXO set: minutes on mainnet, one at a time per node) on every recurring path: the hot
wallet sync, reconciliation and proof of reserves read it (`unspent`, `holdings`).

How it is kept (`WalletIndex`, one per chain per process, owned by custody.deposits.Deposits):
- `Deposits.scan` applies each scan's blocks to the index in the SAME database transaction that
  moves `chain_cursor` by compare-and-set (`apply`), so the index is always exactly "our outputs
  in the chain up to the cursor": per block, in block order, insert the outputs paying our
  addresses, then mark spent the outputs of ours that its inputs spend (outputs created earlier
  in the same block or scan included). A reorg (`ScanResult.reorg.undone`) is undone first, block
  by block: the outputs those blocks created are deleted and the spends they recorded cleared
  (both indexed by block hash); then the new chain's blocks are applied.
- Matching is a set lookup in the adapter: `addresses` (address -> `Ours`) is loaded once per
  process and refreshed incrementally before each scan (`refresh`, in a transaction `prepare`
  commits). The rows of `deposit_address`, `withdrawal_batch` and `rebalance` are followed by id
  (`IdFollower`): every id above the highest seen, and every id skipped below it (taken by a
  transaction that had not committed yet: two payouts workers, a job lock lost mid-run) until it
  appears, or for `GAP_RECHECK_SECONDS` (an hour; a rolled-back transaction's id never comes). An
  id committed later still is not watched: its coins then show as a difference against the
  node's own view and the books (fail-closed, never a silent credit).
- Nothing is watched on a row's word alone (custody_api may INSERT deposit addresses and
  rebalances, and UPDATE `wallet.next_index`; review R1 of issue 13):
  - a deposit address is watched once the deposit key derives its address at its
    `derivation_index` and that index was handed out (below the wallet's `next_index`), and the
    address is not watched in another tier (`deposit_address_refusal`). The verdict is recorded
    once in `deposit_address_check` (migration 0028; custody_api may only read it), so a process
    start derives only the rows that have none: O(new rows), about 0.6 ms each (a database
    upgraded to 0028 with 100,000 addresses derives them once, about a minute, at the first scan).
    A refused row is never watched and opens a critical `deposit_address_not_derived` incident;
  - a cold address is watched once a rebalance was told to pay it and the cold key derives it at
    the rebalance's index, below the cold wallet's `next_index` (`rebalance_refusal`; checked
    once per process, rebalances are few); otherwise a critical
    `rebalance_destination_not_derived` incident. `next_index` may only step by 1 per update
    (migration 0028's trigger), so it drives the window below one derivation at a time.
- Watched ahead (issue 13, branch lookahead): as the node's own view (custody.node_view) watches
  ranged descriptors past what is issued, the index watches each bitcoin branch `WATCH_AHEAD`
  indices past what custody issued: hot change `1/<b>` up to the highest bitcoin batch id +
  WATCH_AHEAD, deposit and cold `0/<i>` up to the wallet's next_index + WATCH_AHEAD (`Ours`
  without a row: `deposit_address_id` None). Each index is derived once per process
  (`derive_btc_addresses`: the branch key once per run; at a process start only from what is issued on, as
  the rows below it are checked one by one, cold from 0) and the per-block walk stays a set
  lookup. What the key derives is ours by construction, so these need no verdict. An output
  paying such an address is stored here like any other, but `Deposits` records no observation
  for it (no deposit_address row: nobody can be credited), and every reader counts a coin in a
  tier only once its index is issued (`Issued`, the same rule the node's view counts by).
  A deposit address issued after it was paid: its earlier coins are the firm's, not the deposit
  of the customer given it later; the deposit line shows them as a surplus warning until an
  operator books them. A change coin whose batch appears later is taken by the hot-wallet sync
  then, booked as `hot_coin_origin` says. A coin paid beyond the window is never here: the node's
  view may find it (its import rescans from shortly before the address was issued) and reports
  it as `unindexed`; reconciliation compares the index with the node's figure less those and
  opens a warning, not a divergence.
- `outpoints`, the index's unspent outpoints, is
  loaded once, kept current from what the walk itself commits, and reloaded whenever the cursor
  in the database is not the one it was valid at (another worker scanned, a reorg, a lost
  compare-and-set).
- An address issued while a scan is running is seen by the next scan's refresh; a block already
  walked is not walked again for it: what was paid before is seen only inside the window above.
  On bitcoin this cannot lose one of our change or cold outputs: a batch or rebalance is
  committed before its transaction is even signed, so its address is watched long before any
  block can pay it.

How it fits with our own broadcasts: the index knows only blocks. A payout, sweep or rebalance of
ours is followed from broadcast to finality by its own record (`chain_transaction` via
`Payouts.track`, `sweep` / `rebalance` via custody.firm_moves `track`, asking the node's
`tx_status`); coins it spends are marked in `wallet_utxo.spent_by` / `deposit_observation.swept_by`
when it is signed, so they are never selected twice while it waits in the mempool. When it is
mined the index records the spend and its outputs (change, the sweep's or rebalance's output to
the hot or cold wallet) in the block's scan; reconciliation counts "mined but not yet booked" from
those records (in transit). The hot wallet sync (`Payouts.sync_hot_wallet`) takes its new coins
from the index (confirmed = in a block up to the cursor) into `wallet_utxo`, where coin selection
happens.

Readers: `unspent(conn, tier, addresses=None)` and `holdings(conn, tier)` read the table as of
the cursor, at issued indices only (`unissued(conn)`: the rest); `cursor(conn)` says where that
is. They never write. Errors: `apply` raises whatever
the database raises (an output recorded twice means the index and the cursor disagree: the scan's
transaction rolls back, the cursor does not move, the job logs the error and the next run retries,
so nothing is half applied).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, TextClause, text

from chain_adapters.base import BlockRef, ScanResult
from custody.addresses import derive_btc_address, derive_btc_addresses, derive_eth_address
from custody.controls import open_incident
from custody.destinations import CHANGE_LOOKAHEAD, HOT_RECEIVE_INDEX

log = logging.getLogger(__name__)
TIERS = ("deposit", "hot", "warm", "cold")


@dataclass(frozen=True, slots=True)
class Ours:
    """What one watched address is: tier, BIP32 tail and (deposit addresses) whose."""

    tier: str
    change: int
    index: int
    deposit_address_id: int | None = None
    account_id: int | None = None
    owner: str | None = None
    wallet_id: int | None = None


@dataclass(frozen=True, slots=True)
class IndexedOutput:
    """One of our confirmed outputs as the index holds it."""

    txid: str
    index: int
    address: str
    amount: int
    height: int
    tier: str
    change: int
    derivation_index: int


GAP_RECHECK_SECONDS = 3600.0  # an id skipped by a commit is looked for this long (module docstring)
# Bitcoin indices watched past what custody issued, on each branch (module docstring, "Watched
# ahead"): twice the change window custody.destinations and the signer refuse, so a payout to a
# change address just past those windows is still seen.
WATCH_AHEAD = 2 * CHANGE_LOOKAHEAD
WINDOWS = (("deposit", 0), ("hot", 1), ("warm", 0), ("cold", 0))  # the branches watched ahead


@dataclass(frozen=True, slots=True)
class Issued:
    """Which bitcoin indices custody has handed out: the ONE rule by which a coin counts in its
    tier, for the index's readers (`unspent`, `holdings`, the hot-wallet sync) and for the node's
    own view (custody.node_view), so both count the same coins. Hot receive: `0/HOT_RECEIVE_INDEX`
    only; hot change `1/<b>`: a bitcoin withdrawal batch `b` exists; deposit and cold `0/<i>`: `i`
    is below the wallet's `next_index`. Anything else was paid before custody handed it out (or
    never will be): on chain, but nobody's yet, and in no tier's figure."""

    next_index: dict[str, int]  # tier -> the bitcoin wallet's next_index (deposit, cold)
    batches: frozenset[int]  # bitcoin batch ids (at least those among the change indices asked about)

    def __call__(self, tier: str, change: int, index: int) -> bool:
        if tier == "hot":
            return index == HOT_RECEIVE_INDEX if change == 0 else change == 1 and index in self.batches
        return change == 0 and 0 <= index < self.next_index.get(tier, 0)


_NEXT_INDEX_SQL = text("""
SELECT tier, next_index
FROM wallet
WHERE chain = 'bitcoin'
""")

_BATCHES_AMONG_SQL = text("""
SELECT id
FROM withdrawal_batch
WHERE chain = 'bitcoin'
AND id = ANY(:ids)
""")


def issued_rule(c: Connection, change_indices: Iterable[int] = ()) -> Issued:
    """`Issued` as the database says now; `change_indices`: the hot change indices to be asked
    about (only those batches are read)."""
    wanted = sorted(set(change_indices))
    batches = frozenset(c.execute(_BATCHES_AMONG_SQL, {"ids": wanted}).scalars().all()) if wanted else frozenset()
    return Issued({r.tier: int(r.next_index) for r in c.execute(_NEXT_INDEX_SQL)}, batches)


def follow(last: int, gaps: list[tuple[int, int, float]], ids: Iterable[int], now: float,
           window: float = GAP_RECHECK_SECONDS) -> tuple[int, list[tuple[int, int, float]], list[tuple[int, int]]]:
    """The id follower's next state after reading `ids` (the rows above `last` and inside `gaps`):
    (new last, gaps still open as (lo, hi, first seen), gaps given up after `window` seconds).
    An id below the highest seen that was not seen yet is a gap: taken by a transaction that has
    not committed (it will be looked for again) or rolled back (it never comes)."""
    seen = sorted(set(ids))
    ranges = list(gaps)
    top = max([last, *seen])
    if top > last + 1:
        ranges.append((last + 1, top - 1, now))
    open_: list[tuple[int, int, float]] = []
    for lo, hi, since in ranges:
        cut = [i for i in seen if lo <= i <= hi]  # few: the rows of one refresh
        start = lo
        for i in cut:
            if i > start:
                open_.append((start, i - 1, since))
            start = i + 1
        if start <= hi:
            open_.append((start, hi, since))
    kept = [g for g in open_ if now - g[2] <= window]
    dropped = [(lo, hi) for lo, hi, since in open_ if now - since > window]
    return top, kept, dropped


class IdFollower:
    """Reads a table's rows by id as they commit, out of order included: every id above the last
    seen, and the ids skipped below it (gaps) until they appear or `GAP_RECHECK_SECONDS` pass."""

    def __init__(self, table: str) -> None:
        self.table = table
        self.last = 0
        self.gaps: list[tuple[int, int, float]] = []

    def fetch(self, c: Connection, sql) -> list:
        rows = c.execute(sql, {"last": self.last, "lo": [g[0] for g in self.gaps], "hi": [g[1] for g in self.gaps]}).all()
        self.last, self.gaps, dropped = follow(self.last, self.gaps, [r.id for r in rows], time.monotonic())
        for lo, hi in dropped:
            log.warning("wallet index: %s ids %d..%d never committed within %d s; no longer looked for", self.table, lo, hi,
                        GAP_RECHECK_SECONDS)
        return rows


def deposit_address_refusal(row, wallet, already: Ours | None) -> str | None:
    """Why a deposit address row must not be watched, or None: it must name the chain's deposit
    wallet, an index that wallet handed out (below its next_index), and the address that wallet's
    key derives there; and the address must not be watched already in another tier."""
    if wallet is None or wallet.tier != "deposit" or wallet.chain != row.chain:
        return "its wallet is not the chain's deposit wallet"
    if not 0 <= row.derivation_index < wallet.next_index:
        return f"index {row.derivation_index} was never handed out (the wallet's next index is {wallet.next_index})"
    derived = derive_btc_address(wallet.xpub, wallet.network, 0, row.derivation_index) if row.chain == "bitcoin" \
        else derive_eth_address(wallet.xpub, row.derivation_index)
    if derived != row.address:
        return f"the deposit key derives {derived} at index {row.derivation_index}"
    if already is not None and already.tier != "deposit":
        return f"the address is watched already in the {already.tier} tier"
    return None


def rebalance_refusal(row, cold, already: Ours | None) -> str | None:
    """Why a rebalance's destination must not be watched as a warm or cold address, or None: that
    wallet's key (`cold`: the wallet row of the rebalance's destination tier) derives it at the
    rebalance's index, an index the wallet handed out."""
    tier = row.destination_tier
    if tier not in ("warm", "cold") or cold is None or cold.tier != tier:
        return f"its destination is not the registered {tier} wallet"
    if not 0 <= row.destination_index < cold.next_index:
        return f"index {row.destination_index} was never handed out (the {tier} wallet's next index is {cold.next_index})"
    derived = derive_btc_address(cold.xpub, cold.network, 0, row.destination_index)
    if derived != row.destination:
        return f"the {tier} key derives {derived} at index {row.destination_index}"
    if already is not None and already.tier != tier:
        return f"the address is watched already in the {already.tier} tier"
    return None


def _followed(columns: str, source: str) -> TextClause:
    """Rows of `source` (a FROM clause aliased `x`) above :last or inside the gaps :lo..:hi."""
    return text(f"""
SELECT {columns} FROM {source} WHERE x.id > :last
UNION ALL
SELECT {columns} FROM unnest(CAST(:lo AS bigint[]), CAST(:hi AS bigint[])) AS g(lo, hi)
JOIN {source} ON x.id BETWEEN g.lo AND g.hi
ORDER BY 1
""")


_WALLETS_SQL = text("""
SELECT id, chain, tier, xpub, network, next_index
FROM wallet
""")

_DEPOSIT_ROWS_SQL = _followed(
    "x.id, x.chain, x.wallet_id, x.address, x.derivation_index, x.account_id, x.owner, k.derived",
    "deposit_address x LEFT JOIN deposit_address_check k ON k.deposit_address_id = x.id")

_RECORD_VERDICT_SQL = text("""
INSERT INTO deposit_address_check (deposit_address_id, derived, reason)
VALUES (:id, :d, :r)
ON CONFLICT (deposit_address_id) DO NOTHING
""")

_REBALANCE_ROWS_SQL = _followed("x.id, x.chain, x.destination_tier, x.destination, x.destination_index", "rebalance x")

_INCIDENT_EXISTS_SQL = text("""
SELECT 1
FROM incident
WHERE dedupe_key = :k
""")

_BATCH_IDS_SQL = _followed("x.id, x.chain", "withdrawal_batch x")


class WalletIndex:
    """Per-process state of one chain's walk: the watched addresses and (bitcoin) the unspent
    outpoints of the index. Not thread-safe: the caller serialises scans (Deposits holds a lock)."""

    def __init__(self, chain: str) -> None:
        self.chain = chain
        self.addresses: dict[str, Ours] = {}
        self.outpoints: set[tuple[str, int]] = set()
        self.valid_at: BlockRef | None = None  # the cursor `outpoints` is exact at; None: reload
        self._deposits = IdFollower("deposit_address")
        self._batches = IdFollower("withdrawal_batch")
        self._rebalances = IdFollower("rebalance")
        self._keys: dict[str, tuple[str, str]] = {}  # tier -> (xpub, network)
        self._ahead: dict[tuple[str, int], int] = {}  # (tier, change) -> indices 0..n-1 watched ahead
        self._max_batch = -1  # the highest bitcoin batch id seen

    # ---- the watched addresses -------------------------------------------------------------

    def refresh(self, c: Connection) -> int:
        """Add what was issued since the last refresh; returns how many addresses were added.

        Nothing is watched on a row's word alone: a deposit address is watched once it is the
        deposit key's derivation at its index (checked once, the verdict kept in
        `deposit_address_check`), a cold address once a rebalance was told to pay it and it is the
        cold key's derivation at the rebalance's index. Refused rows open a critical incident (in
        `c`: the caller commits it, `prepare` does). Run it in a transaction the worker commits."""
        added = 0
        wallets = {r.id: r for r in c.execute(_WALLETS_SQL)}
        if self.chain == "bitcoin":
            added += self._refresh_hot_and_cold_keys(c, wallets)
        added += self._refresh_deposit_addresses(c, wallets)
        if self.chain != "bitcoin":
            return added
        added += self._refresh_cold(c, wallets)
        for b in self._batches.fetch(c, _BATCH_IDS_SQL):
            if b.chain == "bitcoin":
                self._max_batch = max(self._max_batch, b.id)
                if "hot" in self._keys:  # each batch's own change address (the window may have jumped past it)
                    xpub, network = self._keys["hot"]
                    address = derive_btc_address(xpub, network, 1, b.id)
                    added += address not in self.addresses
                    self.addresses[address] = Ours("hot", 1, b.id)
        return added + self._refresh_ahead(wallets)

    def _refresh_ahead(self, wallets: dict) -> int:
        """Watch each bitcoin branch `WATCH_AHEAD` indices past what custody issued on it (hot
        change: the highest bitcoin batch id; deposit and cold: the wallet's next_index), deriving
        only the indices not derived yet. What the key derives is ours by construction, so these
        need no row and no verdict; an address already watched keeps what it is."""
        added = 0
        keys = {w.tier: (w.xpub, w.network, int(w.next_index)) for w in wallets.values()
                if w.chain == "bitcoin" and w.tier in ("deposit", "warm", "cold")}
        if "hot" in self._keys:
            keys["hot"] = (*self._keys["hot"], self._max_batch + 1)
        for tier, change in WINDOWS:
            if tier not in keys:
                continue
            xpub, network, issued_end = keys[tier]
            # Below what is issued, the rows name the addresses (deposit rows, batches; each derived
            # or checked one by one), so neither a process start nor a jump of batch ids derives
            # through them; cold indices are few and rebalances need not name each, so they are.
            done = self._ahead.get((tier, change))
            start = (0 if tier in ("warm", "cold") else issued_end) if done is None else max(done, issued_end)
            stop = issued_end + WATCH_AHEAD
            if stop <= start:
                continue
            for i, address in enumerate(derive_btc_addresses(xpub, network, change, start, stop), start):
                if address not in self.addresses:
                    self.addresses[address] = Ours(tier, change, i)
                    added += 1
            self._ahead[(tier, change)] = stop
        return added

    def _refresh_hot_and_cold_keys(self, c: Connection, wallets: dict) -> int:
        added = 0
        for w in wallets.values():
            if w.chain != "bitcoin" or w.tier not in ("hot", "cold"):
                continue
            if self._keys.get(w.tier, (w.xpub, w.network)) != (w.xpub, w.network):
                raise RuntimeError(f"the bitcoin {w.tier} wallet's key changed under a running process")
            if w.tier not in self._keys:
                self._keys[w.tier] = (w.xpub, w.network)
                if w.tier == "hot":
                    self.addresses[derive_btc_address(w.xpub, w.network, 0, HOT_RECEIVE_INDEX)] = Ours("hot", 0, HOT_RECEIVE_INDEX)
                    added += 1
        return added

    def _refresh_deposit_addresses(self, c: Connection, wallets: dict) -> int:
        """Deposit address rows committed since the last refresh (ids followed gaps included):
        rows with a verdict are watched or skipped as it says; rows without one are derived now,
        and the verdict recorded."""
        added = 0
        verdicts = []
        reread = False
        for r in self._deposits.fetch(c, _DEPOSIT_ROWS_SQL):
            if r.chain != self.chain:
                continue  # ids are shared by the chains: another chain's index takes it
            if r.derived is None:
                reason = deposit_address_refusal(r, wallets.get(r.wallet_id), self.addresses.get(r.address))
                if reason is not None and not reread:
                    # `wallets` was read by an earlier statement: a row issued (and committed with
                    # the next_index it raised) in between is seen here with the older next_index.
                    # Read the wallets again, once, before refusing (found by bench/soak.py).
                    wallets, reread = {w.id: w for w in c.execute(_WALLETS_SQL)}, True
                    reason = deposit_address_refusal(r, wallets.get(r.wallet_id), self.addresses.get(r.address))
                verdicts.append({"id": r.id, "d": reason is None, "r": reason})
                if reason is not None:
                    log.error("wallet index: deposit address row %d (%s at index %d) refused: %s", r.id, r.address,
                              r.derivation_index, reason)
                    open_incident(c, "deposit_address_not_derived", f"deposit_address_not_derived:{r.id}",
                                  {"deposit_address_id": r.id, "chain": r.chain, "address": r.address,
                                   "derivation_index": r.derivation_index, "account_id": r.account_id, "owner": r.owner,
                                   "reason": reason})
                    continue
            elif not r.derived:
                continue
            self.addresses[r.address] = Ours("deposit", 0, r.derivation_index, r.id, r.account_id, r.owner, r.wallet_id)
            added += 1
        if verdicts:
            c.execute(_RECORD_VERDICT_SQL, verdicts)
        return added

    def _refresh_cold(self, c: Connection, wallets: dict) -> int:
        """The cold addresses rebalances were told to pay (never `0 .. next_index`: custody_api may
        move next_index), each checked against the cold key once per process."""
        added = 0
        tiers = {w.tier: w for w in wallets.values() if w.chain == "bitcoin" and w.tier in ("warm", "cold")}
        for r in self._rebalances.fetch(c, _REBALANCE_ROWS_SQL):
            if r.chain != "bitcoin" or r.destination_tier == "hot":
                continue  # a move into hot pays the hot receive address, watched from the hot key
            reason = rebalance_refusal(r, tiers.get(r.destination_tier), self.addresses.get(r.destination))
            if reason is not None:
                log.error("wallet index: rebalance %d's destination %s (index %d) is not watched: %s", r.id, r.destination,
                          r.destination_index, reason)
                key = f"rebalance_destination_not_derived:{r.id}"
                if c.execute(_INCIDENT_EXISTS_SQL, {"k": key}).first() is None:  # once: not again at each process start
                    open_incident(c, "rebalance_destination_not_derived", key,
                                  {"rebalance_id": r.id, "destination": r.destination,
                                   "destination_index": r.destination_index, "reason": reason})
                continue
            if r.destination not in self.addresses:
                self.addresses[r.destination] = Ours(r.destination_tier, 0, r.destination_index)
                added += 1
        return added

    # ---- the unspent outpoints ---------------------------------------------------------------

    def load_outpoints(self, engine: Engine) -> BlockRef | None:
        """(Re)load the unspent outpoints and the cursor they are exact at, in one snapshot."""
        with engine.connect().execution_options(isolation_level="REPEATABLE READ") as c, c.begin():
            row = c.execute(text("SELECT height, hash FROM chain_cursor WHERE chain = :c"), {"c": self.chain}).first()
            self.outpoints = {(r.txid, r.vout) for r in c.execute(text(
                "SELECT txid, vout FROM btc_wallet_output WHERE spent_txid IS NULL"))}
        self.valid_at = BlockRef(row.height, row.hash) if row else None
        return self.valid_at

    def prepare(self, engine: Engine, cursor: BlockRef) -> None:
        """Before a scan from `cursor`: addresses refreshed; outpoints reloaded unless exact at it."""
        with engine.begin() as c:  # the verdicts and incidents of new rows commit
            self.refresh(c)
        if self.chain == "bitcoin" and self.valid_at != cursor:
            self.load_outpoints(engine)

    def invalidate(self) -> None:
        self.valid_at = None

    # ---- applying a scan (in the caller's transaction) ---------------------------------------

    def apply(self, c: Connection, result: ScanResult) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """Undo the reorg's blocks, then apply the new blocks in order, in `c` (the transaction
        that moves the cursor). Returns (created, spent) outpoints for `committed`."""
        if self.chain != "bitcoin":
            return [], []
        if result.reorg is not None and result.reorg.undone:
            undo_blocks(c, [b.hash for b in result.reorg.undone])
        created: list[tuple[str, int]] = []
        spent: list[tuple[str, int]] = []
        for block in result.blocks:
            outs = [o for o in block.observations if o.address in self.addresses]
            if outs:
                c.execute(_INSERT_OUTPUT_SQL, [
                    {"t": o.txid, "v": o.index, "a": o.address, "tier": self.addresses[o.address].tier,
                     "ch": self.addresses[o.address].change, "i": self.addresses[o.address].index, "m": o.amount,
                     "h": block.ref.height, "b": block.ref.hash} for o in outs])
                created += [(o.txid, o.index) for o in outs]
            if block.spends:
                marked = c.execute(_MARK_SPENT_SQL, {
                    "p": [s.prev_txid for s in block.spends], "v": [s.prev_index for s in block.spends],
                    "s": [s.txid for s in block.spends], "h": block.ref.height, "b": block.ref.hash}).all()
                if len(marked) != len(block.spends):
                    missing = {(s.prev_txid, s.prev_index) for s in block.spends} - {(m.txid, m.vout) for m in marked}
                    raise IndexMismatch(f"block {block.ref.height} {block.ref.hash} spends {sorted(missing)}, which the "
                                        "index does not hold unspent: the in-memory outpoints and the table disagree")
                spent += [(m.txid, m.vout) for m in marked]
        return created, spent

    def committed(self, result: ScanResult, created: list[tuple[str, int]], spent: list[tuple[str, int]]) -> None:
        """The scan's transaction committed: the outpoints follow it, exact at the new cursor. A
        reorg makes them reload instead (the undone blocks' spends come back)."""
        if self.chain != "bitcoin":
            return
        if result.reorg is not None:
            self.valid_at = None
            return
        self.outpoints.update(created)
        self.outpoints.difference_update(spent)
        self.valid_at = result.cursor


class IndexMismatch(RuntimeError):
    """A block spends an outpoint the adapter was told is ours and unspent, but the table does not
    hold it unspent: the scan's transaction rolls back (the cursor stays) and the next scan
    reloads the outpoints from the table."""


def undo_blocks(c: Connection, hashes: Iterable[str]) -> tuple[int, int]:
    """Take blocks out of the index: delete the outputs they created, clear the spends they
    recorded. Returns (outputs deleted, spends cleared)."""
    hashes = list(hashes)
    deleted = c.execute(text("DELETE FROM btc_wallet_output WHERE block_hash = ANY(:h)"), {"h": hashes}).rowcount
    cleared = c.execute(text("UPDATE btc_wallet_output SET spent_txid = NULL, spent_height = NULL, spent_block_hash = NULL "
                             "WHERE spent_block_hash = ANY(:h)"), {"h": hashes}).rowcount
    if deleted or cleared:
        log.warning("wallet index: %d block(s) undone: %d output(s) removed, %d spend(s) cleared", len(hashes), deleted, cleared)
    return deleted, cleared


_INSERT_OUTPUT_SQL = text("""
INSERT INTO btc_wallet_output (txid, vout, address, tier, derivation_change, derivation_index, amount, block_height, block_hash)
VALUES (:t, :v, :a, :tier, :ch, :i, :m, :h, :b)
""")

_MARK_SPENT_SQL = text("""
UPDATE btc_wallet_output o
SET spent_txid = s.spender, spent_height = :h, spent_block_hash = :b
FROM unnest(CAST(:p AS text[]), CAST(:v AS int[]), CAST(:s AS text[])) AS s(prev, vout, spender)
WHERE o.txid = s.prev AND o.vout = s.vout AND o.spent_txid IS NULL
RETURNING o.txid, o.vout
""")


# ---- readers --------------------------------------------------------------------------------------

def cursor(conn: Connection, chain: str = "bitcoin") -> BlockRef | None:
    """The block the index is exact at (the deposit scanner's cursor)."""
    row = conn.execute(text("SELECT height, hash FROM chain_cursor WHERE chain = :c"), {"c": chain}).first()
    return BlockRef(row.height, row.hash) if row else None


def unspent(conn: Connection, tier: str, addresses: Iterable[str] | None = None) -> list[IndexedOutput]:
    """Our unspent outputs of `tier` in the chain up to the cursor (optionally only at
    `addresses`), oldest first: those at indices custody has issued (`Issued`, read in `conn`)."""
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}")
    rows = conn.execute(_UNSPENT_SQL, {"t": tier, "a": None if addresses is None else sorted(set(addresses))}).all()
    issued = issued_rule(conn, [r.derivation_index for r in rows if r.derivation_change == 1])
    return [IndexedOutput(r.txid, r.vout, r.address, int(r.amount), int(r.block_height), r.tier, r.derivation_change,
                          r.derivation_index) for r in rows if issued(r.tier, r.derivation_change, r.derivation_index)]


def holdings(conn: Connection, tier: str) -> int:
    """What our unspent outputs of `tier` at issued indices (`Issued`) hold, in satoshis, in the
    chain up to the cursor. Summed per address in the database, judged per address here."""
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}")
    rows = conn.execute(_HOLDINGS_SQL, {"t": tier}).all()
    issued = issued_rule(conn, [r.derivation_index for r in rows if r.derivation_change == 1])
    return sum(int(r.amount) for r in rows if issued(tier, r.derivation_change, r.derivation_index))


def unissued(conn: Connection) -> list[IndexedOutput]:
    """Our unspent outputs at indices custody has not issued (paid ahead of us): in the index,
    in no tier's figure."""
    rows = conn.execute(_UNSPENT_SQL, {"t": None, "a": None}).all()
    issued = issued_rule(conn, [r.derivation_index for r in rows if r.derivation_change == 1])
    return [IndexedOutput(r.txid, r.vout, r.address, int(r.amount), int(r.block_height), r.tier, r.derivation_change,
                          r.derivation_index) for r in rows if not issued(r.tier, r.derivation_change, r.derivation_index)]


_UNSPENT_SQL = text("""
SELECT txid, vout, address, amount, block_height, tier, derivation_change, derivation_index
FROM btc_wallet_output
WHERE spent_txid IS NULL
AND (CAST(:t AS text) IS NULL OR tier = :t)
AND (CAST(:a AS text[]) IS NULL OR address = ANY(:a))
ORDER BY block_height, txid, vout
""")

_HOLDINGS_SQL = text("""
SELECT derivation_change, derivation_index, sum(amount) AS amount
FROM btc_wallet_output
WHERE spent_txid IS NULL
AND tier = :t
GROUP BY derivation_change, derivation_index
""")
