"""Broadcast and tracking shared by the firm's internal bitcoin moves: sweeps and rebalances (and
the CPFP children of stuck rebalances into hot, custody.cpfp, machine `cpfp`).

Both are one signed transaction per row of their own table (`sweep`, `rebalance`), stored before
anything is broadcast, followed on chain and booked once at the finality depth. They differ only
in how a row is created and signed and in the journal transaction written at finality, so a
subclass provides `machine` (the state machine and table, custody/states.py) and `_book()`; this
class does the rest:

- `broadcast()`: sends every stored `signed` row (nothing new leaves while the kill switch is on);
  the node answers a transaction it already has as success, so a crash between sending and
  recording only leads to the same bytes being sent again.
- `track()`: `broadcast` -> `confirmed` (and back, if its block is reorged out) -> `final` at the
  asset's finality depth, where `_book()` posts in the same database transaction as the state
  change; an evicted transaction is re-sent as it was.
- `unbooked(c, machine)`: the rows whose transaction may be on chain but is not booked yet;
  reconciliation asks the node which of them are mined.
Failures stay contained (custody.containment): each row is recorded and tracked in its own
database transaction; a row whose booking fails is set aside with a critical incident (its
transaction is on chain), skipped from then on, and booked once when an operator retries it
(`retry`); the other rows go on. A set-aside row is still `unbooked`, so reconciliation explains it.

Fee bumps (RBF), as payouts have them (`bump_fees()`): a row `broadcast` whose transaction is still
in the mempool `BumpConfig.stuck_blocks` blocks after it was sent (`broadcast_height`, reset at each
bump) is signed again by the subclass (`_resign`: the same coins and destination, a higher fee taken
from what the firm keeps: the swept amount or the rebalance's change) at the old rate raised by
`bump_percent`, capped at `max_fee_rate_sat_per_kvb` (reaching the cap opens a warning incident,
`fee_ceiling_reached`). Every signed version is kept in `firm_tx_version` (append-only,
`replaces_id` naming the one it replaces); the row's `txid`, `raw`, `fee` are the version followed
now. The replacement is stored before it is sent (a crash in between: `track()` finds it missing
from the node, beside the lower-fee version it replaces, and sends it). `track()` asks the node
about the row's version; when that one is replaced, conflicted or unknown, it asks about the
others: a mined one, or one of ours in the mempool at a fee as high, becomes the row's version
again (`_follow`, audited `<machine>.version_followed`), so whichever version the miners took is
the one booked, with the fee recorded for it, exactly once; the others never are. Only the chain
decides: a version is never written off on mempool evidence alone.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from types import SimpleNamespace

from sqlalchemy import Connection, Engine, text

from chain_adapters.base import ChainAdapter, TxState
from chain_adapters.bitcoin import txid_of
from chain_adapters.errors import ChainError
from custody.containment import Retried, Step, contained, retry
from custody.controls import audit, kill_switch, open_incident
from custody.states import MACHINES, advance
from custody.wallets import Wallets
from ledger.service import Ledger
from signer.protocol import SigningRefused

log = logging.getLogger(__name__)
UNBOOKED = ("signed", "broadcast", "confirmed")
_VERSION_SQL = text("INSERT INTO firm_tx_version (machine, row_id, txid, raw, fee, fee_rate, replaces_id) "
                    "VALUES (:m, :r, :t, :raw, :f, :fr, :rep) RETURNING id")
_RECORD_VERSION_SQL = text("INSERT INTO firm_tx_version (machine, row_id, txid, raw, fee, fee_rate) "
                           "VALUES (:m, :r, :t, :raw, :f, :fr) ON CONFLICT (txid) DO NOTHING")


@dataclass(frozen=True)
class BumpConfig:
    """When and how far a stuck sweep or rebalance is bumped (integers: blocks, percent, sat/kvB)."""

    stuck_blocks: int = 3
    bump_percent: int = 50
    max_fee_rate_sat_per_kvb: int = 500_000

    def __post_init__(self) -> None:
        for name in ("stuck_blocks", "bump_percent", "max_fee_rate_sat_per_kvb"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")


def bumped_rate(old_rate: int, config: BumpConfig) -> int | None:
    """The next fee rate for a stuck version: old + bump_percent, at most the ceiling; None when the
    ceiling leaves no room for a higher rate (BIP 125 needs a strictly higher fee)."""
    rate = min(old_rate * (100 + config.bump_percent) // 100, config.max_fee_rate_sat_per_kvb)
    if rate <= old_rate:
        return None
    return rate


def is_stuck(tip_height: int, broadcast_height: int | None, config: BumpConfig) -> bool:
    """A version first sent at `broadcast_height` is stuck once `stuck_blocks` blocks passed."""
    return broadcast_height is not None and tip_height - broadcast_height >= config.stuck_blocks


class FirmMoves:
    machine: str  # "sweep" or "rebalance": names the state machine and, through it, the table

    def __init__(self, engine: Engine, ledger: Ledger, wallets: Wallets, bitcoin: ChainAdapter,
                 bump: BumpConfig | None = None) -> None:
        self.engine = engine
        self.ledger = ledger
        self.wallets = wallets
        self.bitcoin = bitcoin
        self.bump = bump or BumpConfig()

    @property
    def table(self) -> str:
        return MACHINES[self.machine][0]

    def _book(self, c: Connection, r) -> None:
        """Post the row's journal transaction at finality (r has id, txid, amount, fee)."""
        raise NotImplementedError

    def _resign(self, c: Connection, row_id: int, rate: int):
        """Sign the row again at fee rate `rate` (same coins, same destination; a higher fee out of
        what the firm keeps): (SignedTx, extra columns to set on the row), or None when it cannot."""
        raise NotImplementedError

    def _sendable(self, c: Connection, r) -> bool:
        """Whether a stored signed row may be sent: its bytes are its txid's and a signed version the
        worker recorded (custody_api may write a rebalance's txid and raw, for an imported PSBT: a
        subclass re-checks such bytes itself, `_checked_import`)."""
        if self._checked_import(c, r):
            return True
        same = txid_of(bytes(r.raw)) == r.txid and c.execute(text(
            "SELECT 1 FROM firm_tx_version WHERE machine = :m AND row_id = :r AND txid = :t AND raw = :raw"),
            {"m": self.machine, "r": r.id, "t": r.txid, "raw": r.raw}).first() is not None
        if not same:
            log.error("%s %d: the stored transaction %s is not a version the worker recorded; not sent", self.machine, r.id,
                      r.txid)
        return same

    def _checked_import(self, c: Connection, r) -> bool:
        """True when the row's bytes came from outside the signer and passed the subclass's own check."""
        return False

    def _store_version(self, c: Connection, row_id: int, from_state: str, signed, rate: int, **columns: object) -> None:
        """Record a first signature: the row `from_state` -> `signed` with its txid, raw and fee, and
        its first version, in the caller's database transaction."""
        advance(c, self.machine, row_id, from_state, "signed", txid=signed.txid, raw=signed.raw, fee=signed.fee, **columns)
        c.execute(_VERSION_SQL, {"m": self.machine, "r": row_id, "t": signed.txid, "raw": signed.raw, "f": signed.fee,
                                 "fr": rate, "rep": None})

    def broadcast(self) -> int:
        if kill_switch(self.engine).engaged:
            return 0
        with self.engine.connect() as c:
            rows = c.execute(text(f"SELECT id, txid, raw, fee, fee_rate FROM {self.table} WHERE state = 'signed' "
                                  "AND containment = 'active' ORDER BY id")).all()
        sent = 0
        for r in rows:
            with self.engine.begin() as c:
                if not self._sendable(c, r):
                    continue
                # a version stored by another process (an imported PSBT) is recorded before it can be on chain
                c.execute(_RECORD_VERSION_SQL, {"m": self.machine, "r": r.id, "t": r.txid, "raw": r.raw, "f": r.fee,
                                                "fr": r.fee_rate})
            try:
                self.bitcoin.broadcast(bytes(r.raw))
            except ChainError as exc:
                log.error("%s %d broadcast refused: %s", self.machine, r.id, exc)
                continue
            sent += bool(contained(self.engine, self.machine, r.id, "signed", Step.broadcast,
                                   lambda r=r: self._record_broadcast(r), describe=lambda r=r: {"txid": r.txid}))
        return sent

    def _record_broadcast(self, r) -> bool:
        height = self.bitcoin.tip().height
        with self.engine.begin() as c:
            advance(c, self.machine, r.id, "signed", "broadcast", broadcast_height=height)
        return True

    def track(self) -> int:
        """Follow broadcast rows; book each once final. Returns how many became final."""
        finality = self.wallets.chain_asset("BTC").finality_confirmations
        with self.engine.connect() as c:
            rows = c.execute(text(f"SELECT id, txid, raw, state, amount, fee FROM {self.table} "
                                  "WHERE state IN ('broadcast', 'confirmed') AND containment = 'active' ORDER BY id")).all()
        finals = 0
        for r in rows:
            finals += contained(self.engine, self.machine, r.id, r.state, Step.track, lambda r=r: self._track_one(r, finality),
                                describe=lambda r=r: {"txid": r.txid, "amount": int(r.amount), "fee": int(r.fee)}) or 0
        return finals

    def _track_one(self, r, finality: int) -> int:
        """One row's step on chain, in one database transaction: 1 when it became final (and booked)."""
        status = self.bitcoin.tx_status(r.txid, raw=bytes(r.raw))
        if status.state in (TxState.REPLACED, TxState.CONFLICTED, TxState.UNKNOWN):
            other, other_state = self._live_version(r)
            # another version of ours is mined, or waits in the mempool at a fee as high: follow it. A
            # higher-fee version the node does not have (stored, never sent: a crash after a bump) is
            # sent below instead, and replaces the stuck one.
            if other is not None and (other_state is TxState.CONFIRMED or int(other.fee) >= int(r.fee)):
                self._follow(r, other)
                return 0
        with self.engine.begin() as c:
            if status.state is TxState.CONFIRMED:
                if r.state == "broadcast":
                    advance(c, self.machine, r.id, "broadcast", "confirmed", confirmations=status.confirmations)
                if status.confirmations >= finality:
                    advance(c, self.machine, r.id, "confirmed", "final", confirmations=status.confirmations)
                    self._book(c, self._as_mined(c, r))
                    return 1
            elif status.state is TxState.MEMPOOL and r.state == "confirmed":
                advance(c, self.machine, r.id, "confirmed", "broadcast", confirmations=0)
            elif status.state in (TxState.UNKNOWN, TxState.REPLACED):
                try:
                    self.bitcoin.broadcast(bytes(r.raw))
                except ChainError as exc:
                    log.warning("%s %d re-broadcast refused: %s", self.machine, r.id, exc)
        return 0

    def _as_mined(self, c: Connection, r) -> SimpleNamespace:
        """The row as booked: its fee is the recorded version's (the worker's own table), never a
        figure custody_api could have written; no recorded version of that txid refuses (the row is
        set aside, custody.containment)."""
        fee = c.execute(text("SELECT fee FROM firm_tx_version WHERE machine = :m AND row_id = :r AND txid = :t"),
                        {"m": self.machine, "r": r.id, "t": r.txid}).scalar()
        if fee is None:
            raise RuntimeError(f"{self.machine} {r.id}: {r.txid} is mined but is no version the worker recorded")
        return SimpleNamespace(**{**r._asdict(), "fee": fee})

    def _live_version(self, r) -> tuple:
        """Another version of the row that the chain holds, with its state: a mined one first, else
        one in the mempool; (None, None) when there is none."""
        with self.engine.connect() as c:
            versions = c.execute(text("SELECT id, txid, raw, fee, fee_rate FROM firm_tx_version WHERE machine = :m "
                                      "AND row_id = :r AND txid <> :t ORDER BY id DESC"),
                                 {"m": self.machine, "r": r.id, "t": r.txid}).all()
        return live_version(versions, self.bitcoin)

    def _follow(self, r, v) -> None:
        """Make version `v` the row's: its txid, raw and fee are what is tracked and booked from now."""
        with self.engine.begin() as c:
            moved = c.execute(text(f"UPDATE {self.table} SET txid = :t, raw = :raw, fee = :f, fee_rate = :fr, "
                                   "updated_at = now() WHERE id = :i AND txid = :old"),
                              {"t": v.txid, "raw": v.raw, "f": v.fee, "fr": v.fee_rate, "i": r.id, "old": r.txid}).rowcount
            if moved:
                self._followed(c, r.id, v)
                audit(c, "custody", f"{self.machine}.version_followed", f"{self.machine}:{r.id}",
                      {"from": r.txid, "to": v.txid, "fee": int(v.fee)})
        log.info("%s %d: following version %s instead of %s", self.machine, r.id, v.txid, r.txid)

    def _followed(self, c: Connection, row_id: int, v) -> None:
        """Columns of the row that depend on the version followed (a rebalance's change), set again."""

    def bump_fees(self) -> list[str]:
        """Replace every row's version stuck in the mempool with one paying a higher fee; returns the
        new txids (stored, then sent)."""
        if kill_switch(self.engine).engaged:
            return []
        with self.engine.connect() as c:
            rows = c.execute(text(f"SELECT id, txid, raw, fee_rate, broadcast_height FROM {self.table} "
                                  "WHERE chain = 'bitcoin' AND state = 'broadcast' AND containment = 'active' ORDER BY id")).all()
        new = []
        for r in rows:
            txid = contained(self.engine, self.machine, r.id, "broadcast", Step.bump, lambda r=r: self._bump_one(r),
                             describe=lambda r=r: {"txid": r.txid})
            if txid is not None:
                new.append(txid)
        return new

    def _bump_one(self, r) -> str | None:
        tip = self.bitcoin.tip().height
        if not is_stuck(tip, r.broadcast_height, self.bump):
            return None
        if self.bitcoin.tx_status(r.txid, raw=bytes(r.raw)).state is not TxState.MEMPOOL:
            return None
        rate = bumped_rate(int(r.fee_rate), self.bump)
        if rate is None:
            with self.engine.begin() as c:
                open_incident(c, "fee_ceiling_reached", f"fee_ceiling:{self.machine}:{r.txid}",
                              {"machine": self.machine, "id": r.id, "txid": r.txid, "rate": int(r.fee_rate)}, severity="warning")
            return None
        with self.engine.begin() as c:
            # the row locked across the signer call: a second worker waits, then finds a new txid and stops
            current = c.execute(text(f"SELECT txid FROM {self.table} WHERE id = :i AND state = 'broadcast' FOR NO KEY UPDATE"),
                                {"i": r.id}).scalar()
            if current != r.txid:
                return None
            try:
                resigned = self._resign(c, r.id, rate)
            except SigningRefused as refused:  # the signer audited it; the version in the mempool stays as it is
                log.warning("%s %d fee bump refused: %s", self.machine, r.id, refused)
                return None
            if resigned is None:
                return None
            signed, columns = resigned
            replaces = c.execute(text("SELECT id FROM firm_tx_version WHERE txid = :t"), {"t": r.txid}).scalar_one()
            c.execute(_VERSION_SQL, {"m": self.machine, "r": r.id, "t": signed.txid, "raw": signed.raw, "f": signed.fee,
                                     "fr": rate, "rep": replaces})
            sets = "".join(f", {name} = :{name}" for name in columns)
            # stuck is counted again from now: the replacement gets its own `stuck_blocks` before the next bump
            c.execute(text(f"UPDATE {self.table} SET txid = :t, raw = :raw, fee = :f, fee_rate = :fr, broadcast_height = :h, "
                           f"updated_at = now(){sets} WHERE id = :i"),
                      {"t": signed.txid, "raw": signed.raw, "f": signed.fee, "fr": rate, "h": tip, "i": r.id, **columns})
            audit(c, "custody", f"{self.machine}.fee_bump", f"{self.machine}:{r.id}",
                  {"replaces": r.txid, "txid": signed.txid, "rate": rate, "fee": signed.fee})
        log.info("%s %d fee bump: %s replaced by %s at %d sat/kvB", self.machine, r.id, r.txid, signed.txid, rate)
        try:
            self.bitcoin.broadcast(signed.raw)
        except ChainError as exc:  # stored: track() sends it again (the node knows neither: UNKNOWN)
            log.warning("%s %d replacement %s not sent yet: %s", self.machine, r.id, signed.txid, exc)
        return signed.txid

    def retry(self, row_id: int, *, by: str, comment: str) -> Retried:
        """An operator retries a set-aside row once the cause is fixed: active again, and the next
        run does the failed step (sign again the same open row, record the broadcast, track and
        book at finality) exactly once (custody.containment)."""
        return retry(self.engine, self.machine, row_id, by=by, comment=comment)


def live_version(versions, chain: ChainAdapter) -> tuple:
    """Of `versions` (rows with txid and raw, newest first), the one the chain holds, with its
    state: a mined one first, else the first in the mempool; (None, None) when there is none.
    Bitcoin moves (`FirmMoves`) and ethereum moves (custody.eth_moves) follow versions alike."""
    pending = None
    for v in versions:
        state = chain.tx_status(v.txid, raw=bytes(v.raw)).state
        if state is TxState.CONFIRMED:
            return v, state
        if state is TxState.MEMPOOL and pending is None:
            pending = v
    return (pending, TxState.MEMPOOL) if pending is not None else (None, None)


def unbooked(c: Connection, machine: str) -> list:
    """Every signed version (txid, raw, its fee) of the bitcoin rows of `machine` signed but not yet
    booked, with the row's amount (and, for a rebalance, its source and destination tiers): once
    mined it is on chain while the books still wait for finality. At most one version of a row can
    be mined (they spend the same coins)."""
    table = MACHINES[machine][0]
    tiers = ", m.source_tier, m.destination_tier" if machine == "rebalance" else ""
    # the row's own transaction too: one stored by the api (an imported PSBT) has no version until the worker sends it
    return c.execute(text(f"SELECT v.txid, v.raw, m.amount, v.fee{tiers} FROM {table} m "
                          "JOIN firm_tx_version v ON v.machine = :machine AND v.row_id = m.id "
                          "WHERE m.chain = 'bitcoin' AND m.state = ANY(:s) "
                          f"UNION SELECT m.txid, m.raw, m.amount, m.fee{tiers} FROM {table} m "
                          "WHERE m.chain = 'bitcoin' AND m.state = ANY(:s) AND m.txid IS NOT NULL"),
                     {"s": list(UNBOOKED), "machine": machine}).all()


def in_transit(rebalances: list, tier: str, mined) -> int:
    """What rebalances mined but not booked moved for `tier` on chain and not yet in the books:
    + amount arriving where it is the destination, - (amount + fee) leaving where it is the source
    (the change stays there). `mined(txid, raw)` asks the node."""
    total = 0
    for rb in rebalances:
        if tier not in (rb.source_tier, rb.destination_tier) or not mined(rb.txid, rb.raw):
            continue
        total += int(rb.amount) if rb.destination_tier == tier else -(int(rb.amount) + int(rb.fee))
    return total
