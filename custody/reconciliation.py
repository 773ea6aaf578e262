"""Reconciliation: what the chain says we hold against what the books say, per asset location.

For each location the figures are in minor units and must satisfy

    on_chain == books + in_transit

exactly; there is no tolerance band. `books` is what the ledger's asset-location account says the
firm holds there (minus its balance: asset locations run negative). `in_transit` explains the
moments when chain and books legitimately disagree:
- deposit addresses: outputs already in blocks but not yet booked (observations seen, confirming
  or final, awaiting the credit job) are on chain and not yet in the books (+);
- hot wallet: batches mined but not yet final have left the wallet on chain while the books still
  hold them in-flight until finality (- amounts - network fee);
- sweeps mined but not yet final: gone from deposit addresses (- amount) and arrived in the hot
  wallet (+ amount - fee) on chain, booked only at finality;
- rebalances mined but not yet final: gone from the hot wallet (- amount - fee; the change stays
  at the hot receive address) and arrived in the cold wallet (+ amount), booked only at finality.
The cold wallet is reconciled once one is registered (tier `cold` in `wallet`): its addresses are
the ones custody derived from its xpub (`<xpub>/0/0 .. next_index - 1`, every address a rebalance
was ever told to pay), read like the others from the UTXO set; it is watch-only, so nothing leaves
it through this service.
Any other difference opens a critical incident (which halts withdrawals) with the figures.

Chain and books are read at one chain height: the node's tip must not move while a pass runs (it
is retried otherwise), the deposit line needs the deposit scanner's cursor at that tip (else it
is skipped, never guessed), and "mined" is asked of the node itself for every payout of ours that
the books still carry in flight.

Bitcoin only for now: its holdings are read from the UTXO set (`scantxoutset`, confirmed outputs).
Ethereum locations are not reconciled yet (they need balance reads at a pinned block).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from sqlalchemy import Engine, text

from chain_adapters.base import ChainAdapter
from custody.addresses import derive_btc_address
from custody.controls import open_incident
from custody.firm_moves import unbooked
from custody.wallets import Wallets
from ledger.service import Ledger

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Line:
    chain: str
    asset: str
    tier: str
    on_chain: int
    books: int
    in_transit: int

    @property
    def difference(self) -> int:
        return self.on_chain - self.books - self.in_transit


class Reconciliation:
    def __init__(self, engine: Engine, ledger: Ledger, wallets: Wallets, bitcoin: ChainAdapter, *, network: str,
                 before: Callable[[], object] | None = None) -> None:
        self.before = before  # e.g. the hot wallet sync, so confirmed treasury funding is booked first
        self.engine = engine
        self.ledger = ledger
        self.wallets = wallets
        self.bitcoin = bitcoin
        self.network = network

    def run(self, *, attempts: int = 3) -> list[Line]:
        """Reconcile every bitcoin location at one stable height; open an incident for any
        difference. Returns the lines compared (empty when the chain kept moving)."""
        if self.before is not None:
            self.before()
        with self.engine.connect() as c:
            has_cold = c.execute(text("SELECT 1 FROM wallet WHERE chain = 'bitcoin' AND tier = 'cold'")).first() is not None
        tiers = ("deposit", "hot", "cold") if has_cold else ("deposit", "hot")
        # opened (if new) before any snapshot is taken, so the snapshots can see them
        self._accounts = {tier: self.wallets.location_account("bitcoin", tier, "BTC") for tier in tiers}
        for _ in range(attempts):
            tip = self.bitcoin.tip()
            lines = [line for line in (self._deposit_addresses(tip.height), self._hot_wallet(),
                                       self._cold_wallet() if has_cold else None) if line is not None]
            if self.bitcoin.tip() == tip:
                break
        else:
            log.info("reconciliation skipped: the chain kept moving")
            return []
        for line in lines:
            if line.difference != 0:
                with self.engine.begin() as c:
                    open_incident(c, "reconciliation_difference",
                                  f"recon:{line.chain}:{line.tier}:{line.asset}:{tip.hash}:{line.difference}",
                                  {**line.__dict__, "difference": line.difference, "height": tip.height})
            log.info("reconciliation %s/%s %s at %d: chain %d = books %d + in transit %d, difference %d", line.chain,
                     line.tier, line.asset, tip.height, line.on_chain, line.books, line.in_transit, line.difference)
        return lines

    def _books(self, tier: str, conn) -> int:
        return -self.ledger.balance(self._accounts[tier], conn=conn).posted

    def _snapshot(self):
        """One REPEATABLE READ snapshot for every database figure of a line, so a job committing
        in between cannot count a deposit both as unbooked and as booked."""
        return self.engine.connect().execution_options(isolation_level="REPEATABLE READ")

    def _deposit_addresses(self, height: int) -> Line | None:
        with self._snapshot() as c, c.begin():
            cursor = c.execute(text("SELECT height FROM chain_cursor WHERE chain = 'bitcoin'")).scalar()
            if cursor != height:
                log.info("reconciliation of deposit addresses skipped: scanner at %s, chain at %d", cursor, height)
                return None
            addresses = c.execute(text("SELECT address FROM deposit_address WHERE chain = 'bitcoin'")).scalars().all()
            arrived = c.execute(text("SELECT coalesce(sum(amount), 0) FROM deposit_observation WHERE chain = 'bitcoin' "
                                     "AND state IN ('seen', 'confirming', 'final')")).scalar_one()
            books = self._books("deposit", c)
            sweeps = unbooked(c, "sweep")
        on_chain = sum(u.amount for u in self.bitcoin.unspent(addresses)) if addresses else 0
        swept = sum(int(sw.amount) for sw in sweeps if self._mined(sw.txid, sw.raw))
        return Line("bitcoin", "BTC", "deposit", on_chain, books, int(arrived) - swept)

    def _mined(self, txid: str, raw) -> bool:
        return self.bitcoin.tx_status(txid, raw=bytes(raw)).state.value == "confirmed"

    def _hot_wallet(self) -> Line:
        with self._snapshot() as c, c.begin():
            xpub = c.execute(text("SELECT xpub FROM wallet WHERE chain = 'bitcoin' AND tier = 'hot'")).scalar_one()
            batches = c.execute(text("SELECT id FROM withdrawal_batch WHERE chain = 'bitcoin'")).scalars().all()
            pending = c.execute(text(
                "SELECT t.txid, t.raw, t.fee, (SELECT coalesce(sum(o.amount), 0) FROM batch_output o WHERE o.batch_id = t.batch_id) "
                "AS paid FROM chain_transaction t WHERE t.chain = 'bitcoin' AND t.state IN ('signed', 'broadcast', 'confirmed')")).all()
            books = self._books("hot", c)
            sweeps = unbooked(c, "sweep")
            rebalances = unbooked(c, "rebalance")
        # Mined but not yet booked final: gone from the wallet on chain, still in flight in the books.
        leaving = sum(int(p.paid) + int(p.fee) for p in pending if self._mined(p.txid, p.raw))
        leaving += sum(int(rb.amount) + int(rb.fee) for rb in rebalances if self._mined(rb.txid, rb.raw))
        arriving = sum(int(sw.amount) - int(sw.fee) for sw in sweeps if self._mined(sw.txid, sw.raw))
        addresses = [derive_btc_address(xpub, self.network, 0, 0)] + [derive_btc_address(xpub, self.network, 1, b) for b in batches]
        on_chain = sum(u.amount for u in self.bitcoin.unspent(addresses))
        return Line("bitcoin", "BTC", "hot", on_chain, books, arriving - leaving)

    def _cold_wallet(self) -> Line:
        with self._snapshot() as c, c.begin():
            cold = c.execute(text("SELECT xpub, next_index FROM wallet WHERE chain = 'bitcoin' AND tier = 'cold'")).one()
            books = self._books("cold", c)
            rebalances = unbooked(c, "rebalance")
        arriving = sum(int(rb.amount) for rb in rebalances if self._mined(rb.txid, rb.raw))
        addresses = [derive_btc_address(cold.xpub, self.network, 0, i) for i in range(cold.next_index)]
        on_chain = sum(u.amount for u in self.bitcoin.unspent(addresses)) if addresses else 0
        return Line("bitcoin", "BTC", "cold", on_chain, books, arriving)
