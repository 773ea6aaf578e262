"""Broadcast, tracking and fee bumps shared by the firm's internal ethereum moves: gas fundings and
sweeps (custody.eth_sweeps) and rebalances (custody.eth_rebalances), as custody.firm_moves serves
the bitcoin ones.

Each move is one signed EIP-1559 transaction per row of its own table (`eth_gas_funding`,
`eth_sweep`, `eth_rebalance`: the machines of custody/states.py), stored before anything is
broadcast, followed on chain and booked once at the ETH finality depth. A subclass names its
`tables`, signs rows (`_store_signed` records the first version), books a row (`_book`) and
re-signs one for a bump (`_resign`); this class does the rest:

- `broadcast()`: sends every stored `signed` row (nothing new leaves while the kill switch is on)
  and records the tip it was sent at (`broadcast_height`); the node answers a transaction it
  already has as success, so a crash between sending and recording re-sends the same bytes.
- `track()`: `broadcast` -> `confirmed` (and back, if its block is reorged out) -> `final` (or
  `reverted`) at the finality depth, where `_book()` posts with the gas the MINED version burnt
  (`mined.fee`), in the same database transaction as the state change; an evicted transaction is
  re-sent as it was.
- `bump_fees()`: same-nonce replacement. A `broadcast` row whose version is still in the mempool
  `EthBumpConfig.stuck_blocks` blocks after it was sent is signed again by the signer: the SAME
  transaction (chain id, sender, nonce, destination, value, calldata, gas limit), both fees raised
  by at least `bump_percent` (>= 10: geth's and anvil's replacement minimum) and at least the
  node's current estimate, capped at `max_fee_wei` (a sweep: also at the row's `max_fee_cap_wei`,
  what its deposit address holds gas money for). No room under the cap: a warning incident
  `fee_ceiling_reached`. Every version is kept in `eth_tx_version` (append-only, `replaces_id`
  naming the one replaced, at most one replacement per version); the row's txid, raw and fees are
  the version followed now. The row is locked across the signer call (a second worker waits, then
  finds the new txid and stops), and before asking, the worker reads the signer's own record for
  a replacement of that version already signed (a crash after the signer answered): it asks again
  with the same fees and gets the same transaction (RFC 6979), never a second one. The
  replacement is stored before it is sent.
- Tracking follows ALL versions: when the followed version is replaced or conflicted, every other
  version is asked; a mined one becomes the row's (`_follow`, audited `<table>.version_followed`)
  and is booked, once, with its own gas; one of ours waiting in the mempool means ours still holds
  the nonce (the followed one, higher-fee, is sent again). Only a nonce that none of our versions
  consumed opens the critical `<prefix>_nonce_conflict` incident: a key outside this service.
- `unsettled_versions(c, table)`: every version of the rows signed and not booked, for
  reconciliation, which counts only the one the node says is mined (one nonce: at most one is).

Failures (`_guard`): a node or database error, or a row another worker moved, is retried next run;
anything else opens `<prefix>_failed` (critical in broadcast, track or bump, where a transaction
may be on chain, else a warning); the other rows go on.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import OperationalError

from chain_adapters.base import TxState
from chain_adapters.errors import ChainError
from chain_adapters.ethereum import EthereumAdapter
from custody.controls import audit, kill_switch, open_incident
from custody.firm_moves import live_version
from custody.states import IllegalTransition, advance
from custody.wallets import Wallets
from ledger.service import Ledger
from signer.ethereum_tx import SignedEthTx
from signer.protocol import SignerPort, SigningRefused

log = logging.getLogger(__name__)
MIN_REPLACEMENT_PERCENT = 10  # geth and anvil replace a pending transaction only with both fees >= +10%

# Every hot-address nonce the signer recorded (its own tables, which custody may read): withdrawals,
# gas fundings and rebalances, on chain id :ci (NULL: on any). The one statement custody's nonce
# allocators (custody.payouts, custody.eth_sweeps, custody.eth_rebalances) read after taking the
# `eth_nonce` row lock.
HOT_NONCE_RECORDED_SQL = text("""
SELECT max(nonce) FROM (
    SELECT nonce, chain_id FROM signer_signature WHERE chain = 'ethereum' AND lower(sender) = lower(:a)
    UNION ALL  -- the gas fundings it signed from the hot address (custody.eth_sweeps): never a withdrawal's nonce
    SELECT nonce, chain_id FROM signer_eth_sweep WHERE kind = 'gas' AND lower(sender) = lower(:a)
    UNION ALL  -- the ethereum rebalances it signed from the hot address (custody.eth_rebalances)
    SELECT nonce, chain_id FROM signer_eth_rebalance WHERE lower(sender) = lower(:a)
) n
WHERE CAST(:ci AS bigint) IS NULL OR n.chain_id = CAST(:ci AS bigint)
""")

_INSERT_VERSION_SQL = text("""
INSERT INTO eth_tx_version (machine, row_id, txid, raw, nonce, gas_limit, max_fee_wei, priority_fee_wei, replaces_id)
VALUES (:m, :r, :t, :raw, :n, :gas, :max_fee, :priority, :rep)
ON CONFLICT (txid) DO NOTHING
""")
_VERSION_ID_SQL = text("SELECT id FROM eth_tx_version WHERE txid = :t")
_OTHER_VERSIONS_SQL = text("""
SELECT id, txid, raw, max_fee_wei, priority_fee_wei FROM eth_tx_version
WHERE machine = :m AND row_id = :r AND txid <> :t
ORDER BY id DESC
""")
# the signer's own record of a replacement of version :t (a crash after it answered): its fees
_RECORDED_REPLACEMENT_SQL = {
    "eth_gas_funding": text("SELECT max_fee_wei, priority_fee_wei FROM signer_eth_sweep WHERE kind = 'gas' AND replaces_txid = :t "
                            "ORDER BY id LIMIT 1"),
    "eth_sweep": text("SELECT max_fee_wei, priority_fee_wei FROM signer_eth_sweep WHERE kind = 'sweep' AND replaces_txid = :t "
                      "ORDER BY id LIMIT 1"),
    "eth_rebalance": text("SELECT max_fee_wei, priority_fee_wei FROM signer_eth_rebalance WHERE replaces_txid = :t "
                          "ORDER BY id LIMIT 1"),
}


@dataclass(frozen=True)
class EthBumpConfig:
    """When and how far a stuck ethereum funding, sweep or rebalance is replaced (integers: blocks,
    percent, wei per gas)."""

    stuck_blocks: int = 3
    bump_percent: int = 25
    max_fee_wei: int = 500 * 10**9  # no bumped version offers more per gas

    def __post_init__(self) -> None:
        for name in ("stuck_blocks", "bump_percent", "max_fee_wei"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.bump_percent < MIN_REPLACEMENT_PERCENT:
            raise ValueError(f"bump_percent must be at least {MIN_REPLACEMENT_PERCENT} (the node's replacement minimum)")


def raised(old: int, percent: int) -> int:
    """`old` raised by `percent`, rounded up, and at least old + 1."""
    return max(old + 1, -(-old * (100 + percent) // 100))


def replacement_fees(old_max_fee: int, old_priority: int, *, estimate_max_fee: int, estimate_priority: int,
                     bump_percent: int, cap: int) -> tuple[int, int] | None:
    """(max fee, priority fee) per gas for the replacement of a version at (old_max_fee,
    old_priority): each raised by `bump_percent` and at least the node's estimate, the max fee at
    most `cap`, the priority at most the max fee; None when the cap leaves less than the node's
    replacement minimum (+10% on both)."""
    max_fee = min(max(raised(old_max_fee, bump_percent), estimate_max_fee), cap)
    priority = min(max(raised(old_priority, bump_percent), estimate_priority), max_fee)
    if max_fee < raised(old_max_fee, MIN_REPLACEMENT_PERCENT) or priority < raised(old_priority, MIN_REPLACEMENT_PERCENT):
        return None
    return max_fee, priority


def is_stuck(tip_height: int, broadcast_height: int | None, stuck_blocks: int) -> bool:
    """A version sent at `broadcast_height` is stuck once `stuck_blocks` blocks passed without it."""
    return broadcast_height is not None and tip_height - broadcast_height >= stuck_blocks


def unsettled_versions(c: Connection, table: str, columns: str, states: tuple[str, ...]) -> list:
    """Every signed version (`txid`) of the rows of `table` in `states`, with the row's `columns`;
    also the row's own txid (a row signed before versions were kept has none)."""
    return c.execute(text(f"SELECT {columns}, v.txid FROM {table} m JOIN eth_tx_version v ON v.machine = :m AND v.row_id = m.id "
                          f"WHERE m.state = ANY(:s) "
                          f"UNION SELECT {columns}, m.txid FROM {table} m WHERE m.state = ANY(:s) AND m.txid IS NOT NULL"),
                     {"m": table, "s": list(states)}).all()


class EthMoves:
    tables: tuple[str, ...]  # the machines (and tables) of the subclass, in the order every job walks them
    prefix: str  # incidents `<prefix>_failed`, `<prefix>_nonce_conflict`, `<prefix>_refused`
    label: str  # in log lines

    def __init__(self, engine: Engine, ledger: Ledger, wallets: Wallets, ethereum: EthereumAdapter, signer: SignerPort, *,
                 hot_address: str, bump: EthBumpConfig | None = None) -> None:
        self.engine = engine
        self.ledger = ledger
        self.wallets = wallets
        self.ethereum = ethereum
        self.signer = signer
        self.hot_address = hot_address  # checksummed, as custody.payouts keys `eth_nonce` by it
        self.bump = bump or EthBumpConfig()

    # ---- what a subclass provides -----------------------------------------------------------

    def _book(self, c: Connection, table: str, row_id: int, gas: int, *, reverted: bool) -> None:
        """Post the row's journal transaction at finality, in the caller's transaction."""
        raise NotImplementedError

    def _resign(self, c: Connection, table: str, row, max_fee_wei: int, priority_fee_wei: int) -> SignedEthTx:
        """Ask the signer for the same transaction as the row's version `row.txid`, at these fees."""
        raise NotImplementedError

    def _bump_cap(self, c: Connection, table: str, row) -> int:
        """The highest max fee per gas a replacement of the row may offer."""
        return self.bump.max_fee_wei

    def _advance(self, c: Connection, table: str, row_id: int, from_state: str, to_state: str, **columns: object) -> None:
        """Every state change of a row (custody.states.advance); a subclass passes its own module's
        `advance`, where a crash test stands in for it."""
        advance(c, table, row_id, from_state, to_state, **columns)

    def _conflict_incident(self, table: str, row_id: int, txid: str, status: str) -> tuple[str, dict]:
        return f"{self.prefix}_nonce_conflict:{table}:{row_id}", {"table": table, "id": row_id, "txid": txid, "status": status}

    # ---- signing: the first version ---------------------------------------------------------

    def _store_signed(self, c: Connection, table: str, row_id: int, tx: SignedEthTx, *, gas: int, max_fee_wei: int,
                      priority_fee_wei: int, **columns: object) -> None:
        """Record a first signature: the row `open` -> `signed` with its txid and raw, and its first
        version, in the caller's database transaction."""
        self._advance(c, table, row_id, "open", "signed", txid=tx.txid, raw=tx.raw, **columns)
        c.execute(_INSERT_VERSION_SQL, {"m": table, "r": row_id, "t": tx.txid, "raw": tx.raw, "n": tx.nonce, "gas": gas,
                                        "max_fee": max_fee_wei, "priority": priority_fee_wei, "rep": None})

    # ---- broadcast ------------------------------------------------------------------------------

    def broadcast(self) -> int:
        """Send every stored signed row (idempotent at the node)."""
        if kill_switch(self.engine).engaged:
            return 0
        sent = 0
        for table in self.tables:
            with self.engine.connect() as c:
                rows = c.execute(text(f"SELECT id, txid, raw FROM {table} WHERE state = 'signed' ORDER BY id")).all()
            for r in rows:
                sent += bool(self._guard("broadcast", r.id, lambda r=r, table=table: self._broadcast_one(table, r)))
        return sent

    def _broadcast_one(self, table: str, r) -> bool:
        self.ethereum.broadcast(bytes(r.raw))
        height = self.ethereum.tip().height
        with self.engine.begin() as c:
            self._advance(c, table, r.id, "signed", "broadcast", broadcast_height=height)
        return True

    # ---- track ----------------------------------------------------------------------------------

    def track(self) -> int:
        """Follow every broadcast row; book each once at the ETH finality depth. How many were booked."""
        finality = self.wallets.chain_asset("ETH").finality_confirmations
        booked = 0
        for table in self.tables:
            with self.engine.connect() as c:
                rows = c.execute(text(f"SELECT id, txid, raw, state FROM {table} WHERE state IN ('broadcast', 'confirmed') "
                                      "ORDER BY id")).all()
            for r in rows:
                booked += self._guard("track", r.id, lambda r=r, table=table: self._track_one(table, r, finality)) or 0
        return booked

    def _track_one(self, table: str, r, finality: int) -> int:
        status = self.ethereum.tx_status(r.txid, raw=bytes(r.raw))
        if status.state is TxState.CONFIRMED:
            with self.engine.begin() as c:
                if r.state == "broadcast":
                    self._advance(c, table, r.id, "broadcast", "confirmed", confirmations=status.confirmations)
                else:
                    c.execute(text(f"UPDATE {table} SET confirmations = :n WHERE id = :i"), {"n": status.confirmations, "i": r.id})
                if status.confirmations < finality:
                    return 0
                mined = self.ethereum.mined(r.txid)
                if mined is None:
                    raise ChainError(f"{r.txid} left the main chain while being booked")
                self._advance(c, table, r.id, "confirmed", "reverted" if mined.reverted else "final", fee=mined.fee)
                self._book(c, table, r.id, mined.fee, reverted=mined.reverted)
            return 1
        if status.state is TxState.MEMPOOL and r.state == "confirmed":
            with self.engine.begin() as c:  # its block was reorged out; it waits in the mempool again
                self._advance(c, table, r.id, "confirmed", "broadcast", confirmations=0)
        elif status.state is TxState.UNKNOWN:
            self.ethereum.broadcast(bytes(r.raw))  # evicted (or stored and never sent): the same bytes again
        elif status.state in (TxState.REPLACED, TxState.CONFLICTED):
            other, other_state = self._live_version(table, r)
            if other_state is TxState.CONFIRMED:  # another version of ours was mined: it is the one booked
                followed = self._follow(table, r, other)
                return self._track_one(table, followed, finality) if followed is not None else 0
            if other_state is TxState.MEMPOOL:  # ours holds the nonce at a lower fee: send the version followed
                try:
                    self.ethereum.broadcast(bytes(r.raw))
                except ChainError as exc:
                    log.warning("%s %d: %s not sent over version %s: %s", table, r.id, r.txid, other.txid, exc)
                return 0
            with self.engine.begin() as c:
                key, detail = self._conflict_incident(table, r.id, r.txid, status.state.value)
                open_incident(c, f"{self.prefix}_nonce_conflict", key, detail)
        return 0

    def _live_version(self, table: str, r) -> tuple:
        """Another version of the row that the chain holds, with its state: a mined one first, else
        one in the mempool; (None, None) when there is none."""
        with self.engine.connect() as c:
            versions = c.execute(_OTHER_VERSIONS_SQL, {"m": table, "r": r.id, "t": r.txid}).all()
        return live_version(versions, self.ethereum)

    def _follow(self, table: str, r, v):
        """Make version `v` the row's: its txid, raw and fees are what is tracked and booked from now.
        The row as it is then (None when another worker moved it first)."""
        with self.engine.begin() as c:
            moved = c.execute(text(f"UPDATE {table} SET txid = :t, raw = :raw, max_fee_wei = :mf, priority_fee_wei = :pf, "
                                   "updated_at = now() WHERE id = :i AND txid = :old"),
                              {"t": v.txid, "raw": v.raw, "mf": v.max_fee_wei, "pf": v.priority_fee_wei, "i": r.id,
                               "old": r.txid}).rowcount
            if not moved:
                return None
            audit(c, "custody", f"{table}.version_followed", f"{table}:{r.id}", {"from": r.txid, "to": v.txid})
            row = c.execute(text(f"SELECT id, txid, raw, state FROM {table} WHERE id = :i"), {"i": r.id}).one()
        log.info("%s %d: following version %s instead of %s", table, r.id, v.txid, r.txid)
        return row

    # ---- fee bumps ------------------------------------------------------------------------------

    def bump_fees(self) -> list[str]:
        """Replace every row's version stuck in the mempool with the same transaction at higher
        fees (module docstring); the new txids (stored, then sent)."""
        if kill_switch(self.engine).engaged:
            return []
        new = []
        for table in self.tables:
            with self.engine.connect() as c:
                rows = c.execute(text(f"SELECT id, txid, raw, broadcast_height FROM {table} WHERE state = 'broadcast' "
                                      "ORDER BY id")).all()
            for r in rows:
                txid = self._guard("bump", r.id, lambda r=r, table=table: self._bump_one(table, r))
                new += [txid] if txid else []
        return new

    def _bump_one(self, table: str, r) -> str | None:
        tip = self.ethereum.tip().height
        if not is_stuck(tip, r.broadcast_height, self.bump.stuck_blocks):
            return None
        if self.ethereum.tx_status(r.txid, raw=bytes(r.raw)).state is not TxState.MEMPOOL:
            return None
        estimate = self.ethereum.estimate_fee()
        with self.engine.begin() as c:
            # the row locked across the signer call: a second worker waits, then finds a new txid and stops
            row = c.execute(text(f"SELECT * FROM {table} WHERE id = :i AND state = 'broadcast' FOR NO KEY UPDATE"),
                            {"i": r.id}).first()
            if row is None or row.txid != r.txid:
                return None
            recorded = c.execute(_RECORDED_REPLACEMENT_SQL[table], {"t": row.txid}).first()
            if recorded is not None:  # the signer already replaced it (its answer lost): the same request again
                fees = int(recorded.max_fee_wei), int(recorded.priority_fee_wei)
            else:
                fees = replacement_fees(int(row.max_fee_wei), int(row.priority_fee_wei), estimate_max_fee=estimate.max_fee_wei,
                                        estimate_priority=estimate.priority_fee_wei, bump_percent=self.bump.bump_percent,
                                        cap=self._bump_cap(c, table, row))
            if fees is None:
                open_incident(c, "fee_ceiling_reached", f"fee_ceiling:{table}:{row.txid}",
                              {"machine": table, "id": row.id, "txid": row.txid, "max_fee_wei": int(row.max_fee_wei)},
                              severity="warning")
                return None
            max_fee, priority = fees
            try:
                signed = self._resign(c, table, row, max_fee, priority)
            except SigningRefused as refused:  # the signer audited it; the version in the mempool stays as it is
                log.warning("%s %d fee bump refused: %s", table, row.id, refused)
                open_incident(c, f"{self.prefix}_refused", f"{self.prefix}_refused:{table}:{row.id}:bump:{refused.code.value}",
                              {"table": table, "id": row.id, "txid": row.txid, "code": refused.code.value,
                               "message": refused.message}, severity="warning")
                return None
            replaces = c.execute(_VERSION_ID_SQL, {"t": row.txid}).scalar()
            if replaces is None:  # a row signed before versions were kept: its version first
                c.execute(_INSERT_VERSION_SQL, {"m": table, "r": row.id, "t": row.txid, "raw": row.raw, "n": row.nonce,
                                                "gas": row.gas_limit, "max_fee": row.max_fee_wei,
                                                "priority": row.priority_fee_wei, "rep": None})
                replaces = c.execute(_VERSION_ID_SQL, {"t": row.txid}).scalar_one()
            c.execute(_INSERT_VERSION_SQL, {"m": table, "r": row.id, "t": signed.txid, "raw": signed.raw, "n": signed.nonce,
                                            "gas": row.gas_limit, "max_fee": max_fee, "priority": priority, "rep": replaces})
            # stuck is counted again from now: the replacement gets its own `stuck_blocks` before the next bump
            c.execute(text(f"UPDATE {table} SET txid = :t, raw = :raw, max_fee_wei = :mf, priority_fee_wei = :pf, "
                           "broadcast_height = :h, updated_at = now() WHERE id = :i"),
                      {"t": signed.txid, "raw": signed.raw, "mf": max_fee, "pf": priority, "h": tip, "i": row.id})
            audit(c, "custody", f"{table}.fee_bump", f"{table}:{row.id}",
                  {"replaces": row.txid, "txid": signed.txid, "nonce": signed.nonce, "max_fee_wei": str(max_fee),
                   "priority_fee_wei": str(priority)})
        log.info("%s %d fee bump: %s replaced by %s at max fee %d wei (nonce %d)", table, r.id, r.txid, signed.txid, max_fee,
                 signed.nonce)
        try:
            self.ethereum.broadcast(signed.raw)
        except ChainError as exc:  # stored: track() sends it again
            log.warning("%s %d replacement %s not sent yet: %s", table, r.id, signed.txid, exc)
        return signed.txid

    # ---- failures -------------------------------------------------------------------------------

    def _guard(self, step: str, row_id: int, work: Callable):
        """Run one row's step: a node or database error, or a row another worker moved, is retried
        next run; anything else is logged with an incident. Never raises: the rows go on."""
        try:
            return work()
        except (ChainError, OperationalError, IllegalTransition) as exc:
            log.warning("%s %s of %d failed (%s); retried next run", self.label, step, row_id, exc)
        except Exception as exc:  # noqa: BLE001 - one row must not stop the others; recorded below
            log.exception("%s %s of %d failed", self.label, step, row_id)
            on_chain = step in ("broadcast", "track", "bump")  # its transaction may be on chain, the books behind it
            with self.engine.begin() as c:
                open_incident(c, f"{self.prefix}_failed", f"{self.prefix}_failed:{step}:{row_id}:{type(exc).__name__}",
                              {"step": step, "id": row_id, "error": str(exc)[:500]},
                              severity="critical" if on_chain else "warning")
        return None
