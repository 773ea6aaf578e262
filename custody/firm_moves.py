"""Broadcast and tracking shared by the firm's internal bitcoin moves: sweeps and rebalances.

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
"""
from __future__ import annotations

import logging

from sqlalchemy import Connection, Engine, text

from chain_adapters.base import ChainAdapter, TxState
from chain_adapters.errors import ChainError
from custody.containment import Retried, Step, contained, retry
from custody.controls import kill_switch
from custody.states import MACHINES, advance
from custody.wallets import Wallets
from ledger.service import Ledger

log = logging.getLogger(__name__)
UNBOOKED = ("signed", "broadcast", "confirmed")


class FirmMoves:
    machine: str  # "sweep" or "rebalance": names the state machine and, through it, the table

    def __init__(self, engine: Engine, ledger: Ledger, wallets: Wallets, bitcoin: ChainAdapter) -> None:
        self.engine = engine
        self.ledger = ledger
        self.wallets = wallets
        self.bitcoin = bitcoin

    @property
    def table(self) -> str:
        return MACHINES[self.machine][0]

    def _book(self, c: Connection, r) -> None:
        """Post the row's journal transaction at finality (r has id, txid, amount, fee)."""
        raise NotImplementedError

    def broadcast(self) -> int:
        if kill_switch(self.engine).engaged:
            return 0
        with self.engine.connect() as c:
            rows = c.execute(text(f"SELECT id, txid, raw FROM {self.table} WHERE state = 'signed' AND containment = 'active' "
                                  "ORDER BY id")).all()
        sent = 0
        for r in rows:
            try:
                self.bitcoin.broadcast(bytes(r.raw))
            except ChainError as exc:
                log.error("%s %d broadcast refused: %s", self.machine, r.id, exc)
                continue
            sent += bool(contained(self.engine, self.machine, r.id, "signed", Step.broadcast,
                                   lambda r=r: self._record_broadcast(r), describe=lambda r=r: {"txid": r.txid}))
        return sent

    def _record_broadcast(self, r) -> bool:
        with self.engine.begin() as c:
            advance(c, self.machine, r.id, "signed", "broadcast")
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
        with self.engine.begin() as c:
            if status.state is TxState.CONFIRMED:
                if r.state == "broadcast":
                    advance(c, self.machine, r.id, "broadcast", "confirmed", confirmations=status.confirmations)
                if status.confirmations >= finality:
                    advance(c, self.machine, r.id, "confirmed", "final", confirmations=status.confirmations)
                    self._book(c, r)
                    return 1
            elif status.state is TxState.MEMPOOL and r.state == "confirmed":
                advance(c, self.machine, r.id, "confirmed", "broadcast", confirmations=0)
            elif status.state is TxState.UNKNOWN:
                try:
                    self.bitcoin.broadcast(bytes(r.raw))
                except ChainError as exc:
                    log.warning("%s %d re-broadcast refused: %s", self.machine, r.id, exc)
        return 0

    def retry(self, row_id: int, *, by: str, comment: str) -> Retried:
        """An operator retries a set-aside row once the cause is fixed: active again, and the next
        run does the failed step (sign again the same open row, record the broadcast, track and
        book at finality) exactly once (custody.containment)."""
        return retry(self.engine, self.machine, row_id, by=by, comment=comment)


def unbooked(c: Connection, machine: str) -> list:
    """Bitcoin rows of `machine` signed but not yet booked (txid, raw, amount, fee): once mined they
    are on chain while the books still wait for finality."""
    table = MACHINES[machine][0]
    return c.execute(text(f"SELECT txid, raw, amount, fee FROM {table} WHERE chain = 'bitcoin' AND state = ANY(:s)"),
                     {"s": list(UNBOOKED)}).all()
