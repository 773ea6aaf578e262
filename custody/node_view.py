"""The node's own view of the firm's bitcoin: independent evidence for reconciliation (issue 13).

Reconciliation must not compare the books only with custody's wallet index, which the same code
builds from the same block walk. This module asks bitcoind itself, through a watch-only descriptor
wallet that holds our ranged descriptors, at a pinned tip, at a cost that does not grow with the
node's UTXO set (unlike `scantxoutset`, which walks all of it: minutes on mainnet).

Why a watch-only wallet rather than `scanblocks`: the wallet follows every block as it connects
(and undoes a reorg) inside the node, so a read costs one `listunspent` over our own coins;
`scanblocks` needs the block filter index and then fetching and parsing each matching block on
every pass, a cost that grows with the wallet's history.

How to call it (the lead wires it into custody.reconciliation after issue 13's branches merge):

    view = NodeView(engine, bitcoin_adapter, network="regtest")
    view.ensure()                       # worker start-up and the `node-view` job: wallet + ranges
    tip = bitcoin_adapter.tip()
    try:
        held = view.holdings(tip)       # {"deposit": sat, "hot": sat, "cold": sat} at exactly `tip`
    except NodeViewNotReady as exc:     # not at that tip yet, rescanning, or a range overtaken
        log.info("node view skipped: %s", exc.message)

Guarantees:
- The wallet is named after the deployment (`wallet_name`: network, deposit and hot xpubs and the
  deposit wallet's registration time), so many deployments share one node without sharing a
  wallet, and a worker restart or a node restart finds the same one (`load_on_startup`).
- Descriptors: `wpkh(<deposit>/0/*)`, `wpkh(<hot>/0/*)`, `wpkh(<hot>/1/*)` (change; index = batch
  id), `wpkh(<cold>/0/*)` once a cold wallet is registered; keys in BIP32 form (tpub/xpub,
  `custody.addresses.descriptor_for`), checksums from the node (`getdescriptorinfo`). Each range
  ends `lookahead` past the highest index custody has issued on it (deposit `next_index`, highest
  bitcoin batch id, cold `next_index`); `ensure` widens it once less than half of that remains.
- Rescan point of an import (`rescan_from`): the earliest time custody handed out any index the
  import newly covers (deposit `issued_at`, batch `created_at`, the wallet's registration for the
  hot receive address and for cold addresses), and never later than the moment `ensure` read the
  database. An address cannot be paid before custody handed it out (nobody else knows it), so no
  payment to a newly covered address is older than that point; one handed out after the read is
  paid after the read. bitcoind starts the rescan two hours earlier still (block times may run
  ahead of clocks). In the usual case (the range stays ahead) the rescan covers the last two hours
  only. Starting from the block where the previous range was set would be as safe but needs that
  point stored; starting later (e.g. "now") would hide a deposit to an address issued while the
  range was overtaken.
- bitcoind also tops a ranged descriptor up by itself once an address near its end is used (to
  the last used index + its `-keypool`, 1000 by default): ranges only grow, so that never hides a
  coin; the coverage check below is what guarantees every issued address is watched.
- `read(tip)` answers only when, before and after the reads, the wallet's last processed block and
  the node's tip are both `tip`, no rescan runs and the wallet's ranges did not change (an import
  by another process in between); and when every range covers what custody has issued.
- Holdings count confirmed coins that no block spends (what the UTXO set and reconciliation
  count): a coin an unconfirmed transaction spends (our payout in the mempool) is added back
  (chain_adapters.bitcoin_watch). Coins are classified by the descriptor bitcoind reports
  (`parent_descs`) and their derivation path; coins at indices custody has not issued (someone
  paid ahead of us) are reported apart, in `unissued`, never in a tier's figure; "issued" is
  custody.wallet_index.Issued, the one rule the index's readers count by too.
- Of those, the coins custody's wallet index does not hold are also reported in `unindexed`
  (`by_tier` stays the node's own figure; reconciliation, with the index at the same tip, compares
  the index with `by_tier - unindexed` and opens a `wallet_index_unindexed` warning): the index watches
  only `wallet_index.WATCH_AHEAD` past what is issued and never walks a block again, while an
  import here rescans from shortly before an index was issued (bitcoind two hours earlier
  still) and bitcoind tops a range up by `-keypool` past a used address, so the node finds coins
  paid to an address before custody issued it, beyond the index's window. Such a coin is on
  chain and in no book: a surplus anyone who knows an xpub can cause, so never the kill switch.
  The node still decides, for every coin the index holds, whether it exists and is unspent at
  the tip and its amount: an index that counts a coin the node does not see unspent (a forged or
  missed spend, a wrong amount) differs from the node's figure, which is critical.

Limit of the node: bitcoind refuses a descriptor range 1,000,000 indices wide or wider ("Range is
too large"), and a widened range must still start at 0, so one descriptor watches at most indices
0..999,999 (`MAX_RANGE_END`). `ensure` refuses itself, before asking the node, a range that would
end past it: a deployment that has issued about 999,000 deposit addresses (`999,999 - lookahead`)
can no longer widen the deposit range, and from then on `read` answers NodeViewNotReady (the range
does not cover what custody issued): the cross-check is blind, reconciliation escalates it
(custody.reconciliation: a warning, then a critical incident, which halts withdrawals) and an
operator must act. Going past it needs a second descriptor for the next million (the same key
with its origin written out is another descriptor to bitcoind); that is not built. Migration 0028
keeps custody_api from reaching the wall at will: `next_index` steps by 1 per update.

Health (`node_view_health`, migration 0028, written by the worker only): `ensure` records a
refusal there and opens a `node_view_refused` warning incident at once (once per distinct
error); reconciliation counts its passes without the node's figure there (`record_blind`,
`record_read`).

Errors: `NodeViewNotReady` (custody code `node_view_not_ready`): the view cannot be read now; the
next pass may. `NodeBusy` (chain_adapters.errors) from `ensure` while another rescan runs.
`ChainError` for a wallet the node refuses to create or import into, a range past
`MAX_RANGE_END`, or a coin of a descriptor we did not import (someone else imported into our
wallet: investigate).
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Connection, Engine, text

from chain_adapters.base import BlockRef
from chain_adapters.bitcoin import BitcoinAdapter
from chain_adapters.bitcoin_watch import WatchCoin, WatchImport, WatchedRange, strip_checksum
from chain_adapters.errors import ChainError, NodeBusy
from custody.addresses import descriptor_for
from custody.controls import open_incident
from custody.destinations import HOT_RECEIVE_INDEX
from custody.errors import CustodyError, CustodyErrorCode
from custody.wallet_index import issued_rule

log = logging.getLogger(__name__)

TIERS = ("deposit", "hot", "warm", "cold")
DEFAULT_LOOKAHEAD = 1000
MAX_RANGE_END = 999_999  # bitcoind: a range [0, end] must be less than 1,000,000 indices wide


class NodeViewNotReady(CustodyError):
    """The node's view cannot be read at the pinned tip now (see the module docstring)."""

    def __init__(self, message: str) -> None:
        super().__init__(CustodyErrorCode.node_view_not_ready, message)


@dataclass(frozen=True)
class Branch:
    """One watched descriptor: `<tier's xpub>/<branch>/*`."""

    tier: str
    branch: int
    descriptor: str  # without checksum


@dataclass(frozen=True)
class NodeHoldings:
    tip: BlockRef
    by_tier: dict[str, int]  # satoshis at addresses custody issued, per tier
    unissued: dict[str, int] = field(default_factory=dict)  # satoshis at watched addresses custody has not issued
    coins: tuple[WatchCoin, ...] = ()
    # of by_tier, the satoshis in coins the wallet index does not hold (paid before the index watched
    # the address, see the module docstring; or in blocks the index has not walked yet)
    unindexed: dict[str, int] = field(default_factory=dict)
    unindexed_coins: tuple[WatchCoin, ...] = ()


# ---- pure decisions --------------------------------------------------------------------------

def wallet_name(network: str, deposit_xpub: str, hot_xpub: str, registered_at: str, label: str = "") -> str:
    """The deployment's watch-only wallet name: deterministic, and another deployment (another
    database registering the same keys at another time) gets another name; so does another
    `label` (a second, independent view of one deployment, e.g. a test's own)."""
    parts = (network, deposit_xpub, hot_xpub, registered_at) + ((label,) if label else ())
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    return f"custody-view-{digest[:24]}"


def branches(network: str, xpubs: dict[str, str]) -> list[Branch]:
    """The descriptors watched for the registered tiers (`xpubs`: tier -> account key)."""
    wanted = [("deposit", 0), ("hot", 0), ("hot", 1), ("warm", 0), ("cold", 0)]
    out = [Branch(tier, branch, strip_checksum(descriptor_for(xpubs[tier], network, branch)))
           for tier, branch in wanted if tier in xpubs]
    if len({b.descriptor for b in out}) != len(out):
        raise ValueError("two wallet tiers share an account key: their coins could not be told apart")
    return out


def new_end(current_end: int | None, issued_end: int, lookahead: int) -> int | None:
    """The range end to import, or None to keep the current one: widen to `issued_end + lookahead`
    when nothing is imported yet or at most `lookahead // 2` indices remain ahead of what custody
    issued (`issued_end`: the highest index handed out, -1 for none)."""
    if current_end is None or current_end - issued_end <= max(1, lookahead // 2):
        return issued_end + lookahead
    return None


def rescan_from(first_issued_in_new: datetime | None, read_at: datetime) -> int:
    """Unix time an import rescans from: the earliest hand-out of a newly covered index, never
    later than the database read that decided the import (see the module docstring)."""
    start = read_at if first_issued_in_new is None else min(first_issued_in_new, read_at)
    return int(start.timestamp())


# ---- named queries ---------------------------------------------------------------------------

_WALLETS_SQL = text("""
SELECT tier, xpub, network, next_index, created_at, to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US') AS registered
FROM wallet
WHERE chain = 'bitcoin'
""")

_NOW_SQL = text("SELECT now()")

_MAX_BATCH_SQL = text("""
SELECT coalesce(max(id), -1)
FROM withdrawal_batch
WHERE chain = 'bitcoin'
""")

_FIRST_DEPOSIT_SQL = text("""
SELECT min(a.issued_at)
FROM deposit_address a
JOIN wallet w ON w.id = a.wallet_id
WHERE w.chain = 'bitcoin' AND w.tier = 'deposit'
AND a.derivation_index BETWEEN :lo AND :hi
""")

_FIRST_BATCH_SQL = text("""
SELECT min(created_at)
FROM withdrawal_batch
WHERE chain = 'bitcoin'
AND id BETWEEN :lo AND :hi
""")

_INDEXED_SQL = text("""
SELECT o.txid, o.vout
FROM btc_wallet_output o
JOIN unnest(CAST(:t AS text[]), CAST(:v AS int[])) AS n(txid, vout) ON o.txid = n.txid AND o.vout = n.vout
""")


@dataclass(frozen=True)
class _Wallet:
    xpub: str
    next_index: int
    created_at: datetime
    registered: str


class NodeView:
    """The watch-only wallet of this deployment (see the module docstring)."""

    def __init__(self, engine: Engine, adapter: BitcoinAdapter, *, network: str,
                 lookahead: int = DEFAULT_LOOKAHEAD, label: str = "") -> None:
        if lookahead < 2:
            raise ValueError("lookahead must be at least 2")
        self.engine = engine
        self.adapter = adapter
        self.network = network
        self.lookahead = lookahead
        self.label = label  # wallet_name: another label, another wallet of its own

    # ---- reading the database ------------------------------------------------------------

    @staticmethod
    def _wallets(c: Connection) -> dict[str, _Wallet]:
        return {r.tier: _Wallet(r.xpub, int(r.next_index), r.created_at, r.registered) for r in c.execute(_WALLETS_SQL)}

    def name(self, wallets: dict[str, _Wallet] | None = None) -> str:
        if wallets is None:
            with self.engine.connect() as c:
                wallets = self._wallets(c)
        if "deposit" not in wallets or "hot" not in wallets:
            raise NodeViewNotReady("no bitcoin deposit and hot wallets are registered yet")
        return wallet_name(self.network, wallets["deposit"].xpub, wallets["hot"].xpub, wallets["deposit"].registered,
                           self.label)

    @staticmethod
    def _issued_end(c: Connection, branch: Branch, wallets: dict[str, _Wallet]) -> int:
        """The highest index custody has handed out on `branch` (-1: none)."""
        if branch.tier == "hot":
            return HOT_RECEIVE_INDEX if branch.branch == 0 else int(c.execute(_MAX_BATCH_SQL).scalar_one())
        return wallets[branch.tier].next_index - 1

    @staticmethod
    def _first_issued(c: Connection, branch: Branch, wallets: dict[str, _Wallet], lo: int, hi: int) -> datetime | None:
        """The earliest time custody handed out an index in lo..hi of `branch` (None: none yet)."""
        if branch.tier == "deposit":
            return c.execute(_FIRST_DEPOSIT_SQL, {"lo": lo, "hi": hi}).scalar_one()
        if branch.tier == "hot" and branch.branch == 1:
            return c.execute(_FIRST_BATCH_SQL, {"lo": lo, "hi": hi}).scalar_one()
        # hot receive (known since registration) and cold (paid by rebalances; any index below
        # next_index may have been handed out since the wallet was registered)
        issued_end = NodeView._issued_end(c, branch, wallets)
        return wallets[branch.tier].created_at if lo <= issued_end else None

    # ---- keeping the wallet ---------------------------------------------------------------

    def ensure(self) -> list[WatchImport]:
        """Load or create the wallet and import or widen every range that needs it (one
        `importdescriptors` call, which blocks until its rescan is done). Returns what it imported.
        Idempotent; safe beside another worker doing the same (bitcoind serialises imports and
        answers `NodeBusy` to the second)."""
        with self.engine.connect() as c, c.begin():
            read_at = c.execute(_NOW_SQL).scalar_one()
            wallets = self._wallets(c)
            if "deposit" not in wallets or "hot" not in wallets:
                log.info("node view: no bitcoin deposit and hot wallets are registered yet; nothing to watch")
                return []
            name = self.name(wallets)
            wanted = branches(self.network, {t: w.xpub for t, w in wallets.items() if t in TIERS})
            issued = {b.descriptor: self._issued_end(c, b, wallets) for b in wanted}
        try:
            return self._ensure(name, wanted, wallets, issued, read_at)
        except NodeBusy:
            raise
        except ChainError as exc:  # the node refused (or would refuse) the wallet or a range: say so at once
            with self.engine.begin() as c:
                note_refusal(c, "bitcoin", name, str(exc))
            raise

    def _ensure(self, name: str, wanted: list[Branch], wallets: dict[str, _Wallet], issued: dict[str, int],
                read_at: datetime) -> list[WatchImport]:
        created = self.adapter.watch_open(name)
        if created:
            log.info("node view: created the watch-only wallet %s", name)
        current = {r.descriptor: r.end for r in self.adapter.watch_ranges(name)}
        imports = []
        with self.engine.connect() as c, c.begin():
            for b in wanted:
                end = new_end(current.get(b.descriptor), issued[b.descriptor], self.lookahead)
                if end is None:
                    continue
                if end > MAX_RANGE_END:
                    if issued[b.descriptor] > MAX_RANGE_END:
                        raise ChainError(f"{b.tier}/{b.branch}: custody issued up to index {issued[b.descriptor]}, past what "
                                         f"one bitcoind descriptor range covers (0..{MAX_RANGE_END}): the node's view is blind")
                    end = MAX_RANGE_END  # the last widening bitcoind accepts; read() goes blind past it
                    if current.get(b.descriptor) == end:
                        continue
                lo = 0 if b.descriptor not in current else current[b.descriptor] + 1
                first = self._first_issued(c, b, wallets, lo, end)
                imports.append(WatchImport(b.descriptor, end, rescan_from(first, read_at)))
        if imports:
            log.info("node view: importing %s into %s", ", ".join(f"{i.descriptor[:20]}.. 0..{i.end} (rescan from "
                                                                f"{i.rescan_from})" for i in imports), name)
            self.adapter.watch_import(name, imports)
        return imports

    # ---- reading the view ------------------------------------------------------------------

    def _check_at(self, name: str, tip: BlockRef) -> list[WatchedRange]:
        status = self.adapter.watch_status(name)
        if status.scanning:
            raise NodeViewNotReady(f"wallet {name} is rescanning")
        if status.processed != tip:
            raise NodeViewNotReady(f"wallet {name} has processed up to {status.processed}, not the pinned tip {tip}")
        node_tip = self.adapter.tip()
        if node_tip != tip:
            raise NodeViewNotReady(f"the node's tip is {node_tip}, not the pinned tip {tip}")
        return self.adapter.watch_ranges(name)

    def read(self, tip: BlockRef) -> NodeHoldings:
        """The firm's confirmed, unspent-in-the-chain coins per tier at exactly `tip`, as the node's
        wallet sees them. NodeViewNotReady when that cannot be read now (module docstring)."""
        with self.engine.connect() as c:
            wallets = self._wallets(c)
        name = self.name(wallets)
        if not self.adapter.watch_loaded(name):
            raise NodeViewNotReady(f"wallet {name} is not loaded (the worker's node-view job loads it)")
        before = self._check_at(name, tip)
        coins = self.adapter.watch_coins(name, tip)
        after = self._check_at(name, tip)
        if before != after:
            raise NodeViewNotReady(f"wallet {name}: its descriptors changed during the read")
        ranges = {r.descriptor: r.end for r in after}
        with self.engine.connect() as c:
            wallets = self._wallets(c)  # after the node's reads: every coin paid to an issued address is issued here
            wanted = branches(self.network, {t: w.xpub for t, w in wallets.items() if t in TIERS})
            by_descriptor = {b.descriptor: b for b in wanted}
            for b in wanted:
                issued_end = self._issued_end(c, b, wallets)
                if ranges.get(b.descriptor, -1) < issued_end:
                    raise NodeViewNotReady(f"wallet {name}: {b.tier}/{b.branch} covers up to "
                                           f"{ranges.get(b.descriptor)}, custody issued up to {issued_end}")
            change = [coin.index for coin in coins
                      if coin.descriptor in by_descriptor and (by_descriptor[coin.descriptor].tier, coin.branch) == ("hot", 1)]
            issued = issued_rule(c, change)
            outpoints = [(coin.txid, coin.vout) for coin in coins]
            indexed = {(r.txid, r.vout) for r in c.execute(_INDEXED_SQL, {"t": [o[0] for o in outpoints],
                                                                          "v": [o[1] for o in outpoints]})} if coins else set()
        by_tier = {t: 0 for t in TIERS if t in wallets}
        unissued: dict[str, int] = {}
        unindexed: dict[str, int] = {}
        missed: list[WatchCoin] = []
        for coin in coins:
            b = by_descriptor.get(coin.descriptor)
            if b is None or coin.branch != b.branch:
                raise ChainError(f"wallet {name} holds coin {coin.txid}:{coin.vout} of a descriptor custody did not "
                                 f"import ({coin.descriptor})")
            if not issued(b.tier, coin.branch, coin.index):
                unissued[b.tier] = unissued.get(b.tier, 0) + coin.amount
                continue
            by_tier[b.tier] += coin.amount
            if (coin.txid, coin.vout) not in indexed:
                unindexed[b.tier] = unindexed.get(b.tier, 0) + coin.amount
                missed.append(coin)
        return NodeHoldings(tip, by_tier, unissued, tuple(coins), unindexed, tuple(missed))

    def holdings(self, tip: BlockRef) -> dict[str, int]:
        """`read(tip).by_tier`: satoshis per tier (deposit, hot, cold when registered) at `tip`."""
        return self.read(tip).by_tier


# ---- health (node_view_health, migration 0028; the worker writes it) -------------------------------

_BLIND_SQL = text("""
INSERT INTO node_view_health (chain, missed_passes, blind_since, last_error)
VALUES (:chain, 1, now(), :error)
ON CONFLICT (chain) DO UPDATE
SET missed_passes = node_view_health.missed_passes + 1,
    blind_since = coalesce(node_view_health.blind_since, now()),
    last_error = EXCLUDED.last_error, updated_at = now()
RETURNING missed_passes, blind_since, extract(epoch FROM now() - blind_since) AS blind_seconds, severity
""")

_READ_SQL = text("""
INSERT INTO node_view_health (chain, missed_passes, last_read_at, last_read_height)
VALUES (:chain, 0, now(), :height)
ON CONFLICT (chain) DO UPDATE
SET missed_passes = 0, blind_since = NULL, severity = NULL, last_error = NULL,
    last_read_at = now(), last_read_height = EXCLUDED.last_read_height, updated_at = now()
""")

_ESCALATED_SQL = text("""
UPDATE node_view_health
SET severity = :severity
WHERE chain = :chain
""")

_NOTE_ERROR_SQL = text("""
INSERT INTO node_view_health (chain, last_error)
VALUES (:chain, :error)
ON CONFLICT (chain) DO UPDATE
SET last_error = EXCLUDED.last_error, updated_at = now()
""")


@dataclass(frozen=True)
class Blind:
    """The current run of passes without the node's figure."""

    missed_passes: int
    blind_since: datetime
    blind_seconds: float
    severity: str | None  # the incident already opened for this run


def record_blind(c: Connection, chain: str, error: str) -> Blind:
    """One more pass without the node's figure."""
    r = c.execute(_BLIND_SQL, {"chain": chain, "error": error[:1000]}).one()
    return Blind(int(r.missed_passes), r.blind_since, float(r.blind_seconds), r.severity)


def record_escalation(c: Connection, chain: str, severity: str) -> None:
    c.execute(_ESCALATED_SQL, {"chain": chain, "severity": severity})


def record_read(c: Connection, chain: str, tip: BlockRef) -> None:
    """A pass read the node's figure: the run of blind passes ends."""
    c.execute(_READ_SQL, {"chain": chain, "height": tip.height})


def note_refusal(c: Connection, chain: str, wallet: str, error: str) -> None:
    """The node refused the watch-only wallet or a range (or `ensure` refused a range past
    `MAX_RANGE_END`): recorded, and a warning incident opened at once (once per distinct error)."""
    log.error("node view: %s", error)
    c.execute(_NOTE_ERROR_SQL, {"chain": chain, "error": error[:1000]})
    digest = hashlib.sha256(error.encode()).hexdigest()[:16]
    open_incident(c, "node_view_refused", f"node_view_refused:{chain}:{wallet}:{digest}",
                  {"chain": chain, "wallet": wallet, "error": error[:1000]}, severity="warning")
