"""Sweeps: move booked deposit coins from deposit addresses into the hot wallet (bitcoin).

A sweep never changes what a customer is owed; it moves value between two of the firm's own asset
locations. Only deposits already booked (credited, quarantined, released, returned or dust) are
swept, so a reorg of a not-yet-final deposit can never strand a sweep. Steps, as jobs:

- `sweep_bitcoin()`: reserve up to `max_inputs` unswept booked deposit coins (never one the wallet
  index, custody.wallet_index, holds as spent in a block; a `sweep` row in
  `open`, each observation's `swept_by`), then the signer (which re-checks the reservation and that
  the destination is our own hot receive address) signs one transaction paying everything but the
  network fee to the hot wallet; the signed bytes are stored before anything is broadcast.
- `broadcast()` / `track()` (custody.firm_moves, shared with rebalances): idempotent broadcast; at
  the finality depth the books move in one transaction: deposit location <- hot location
  (amount - fee) and <- network-fee expense (fee).
- `bump_fees()` (custody.firm_moves): a sweep stuck in the mempool is signed again over the same
  coins at a higher fee (RBF); whichever version is mined is the one booked, with its own fee.
The hot wallet may spend a swept coin only once its sweep is final (custody.payouts).
"""
from __future__ import annotations

import logging

from sqlalchemy import Connection, Engine, text

from chain_adapters.base import ChainAdapter
from custody.containment import Step, contained
from custody.controls import audit, kill_switch
from custody.firm_moves import BumpConfig, FirmMoves
from custody.wallets import Wallets
from ledger.model import Transfer
from ledger.service import Ledger
from signer.bitcoin_tx import address_to_script, dust_threshold, estimate_vsize, fee_for
from signer.protocol import BtcCoin, SignerPort, SigningRefused

log = logging.getLogger(__name__)
BOOKED = ("credited", "quarantined", "released", "returned", "dust")


class Sweeps(FirmMoves):
    machine = "sweep"

    def __init__(self, engine: Engine, ledger: Ledger, wallets: Wallets, bitcoin: ChainAdapter, signer: SignerPort,
                 *, hot_address: str, network: str, max_inputs: int = 200, bump: BumpConfig | None = None) -> None:
        super().__init__(engine, ledger, wallets, bitcoin, bump)
        self.signer = signer
        self.hot_address = hot_address
        self.network = network
        self.max_inputs = max_inputs

    def sweep_bitcoin(self) -> str | None:
        """Reserve, sign and store one sweep (or re-sign an open one after a crash); returns its txid."""
        if kill_switch(self.engine).engaged:
            return None
        rate = self.bitcoin.estimate_fee().sat_per_kvb
        with self.engine.begin() as c:
            sweep_id = c.execute(text("SELECT id FROM sweep WHERE chain = 'bitcoin' AND state = 'open' AND containment = 'active' "
                                      "ORDER BY id LIMIT 1")).scalar()
            if sweep_id is None:
                rows = c.execute(text(
                    "SELECT id, amount FROM deposit_observation d WHERE chain = 'bitcoin' AND swept_by IS NULL "
                    "AND state = ANY(:s) AND NOT EXISTS (SELECT 1 FROM btc_wallet_output o WHERE o.txid = d.txid "
                    "AND o.vout = d.output_index AND o.spent_txid IS NOT NULL) ORDER BY id LIMIT :l FOR UPDATE SKIP LOCKED"), {"s": list(BOOKED), "l": self.max_inputs}).all()
                total = sum(int(r.amount) for r in rows)
                script = address_to_script(self.hot_address, self.network)
                fee = fee_for(estimate_vsize(len(rows), [script]), rate) if rows else 0
                if not rows or total - fee < dust_threshold(script) or total < 2 * fee:
                    return None  # nothing worth its fee yet
                sweep_id = c.execute(text("INSERT INTO sweep (chain, asset, state, destination, amount, fee, fee_rate) "
                                          "VALUES ('bitcoin', 'BTC', 'open', :d, :a, :f, :r) RETURNING id"),
                                     {"d": self.hot_address, "a": total, "f": fee, "r": rate}).scalar_one()
                c.execute(text("UPDATE deposit_observation SET swept_by = :s WHERE id = ANY(:i)"),
                          {"s": sweep_id, "i": [r.id for r in rows]})
                audit(c, "custody", "sweep.create", f"sweep:{sweep_id}", {"inputs": len(rows), "amount": total, "fee": fee})
            sweep = c.execute(text("SELECT fee, fee_rate FROM sweep WHERE id = :s"), {"s": sweep_id}).one()
            coins = self._coins(c, sweep_id)
        # a failure to sign or store sets the sweep aside (nothing was sent: a warning), see custody.containment
        return contained(self.engine, "sweep", sweep_id, "open", Step.sign,
                         lambda: self._sign_and_store(sweep_id, coins, int(sweep.fee), int(sweep.fee_rate)),
                         describe=lambda: {"inputs": len(coins)})

    @staticmethod
    def _coins(c: Connection, sweep_id: int) -> list[BtcCoin]:
        """The deposit coins reserved for the sweep, in a stable order (a re-sign spends the same)."""
        return [BtcCoin(r.txid, r.output_index, int(r.amount), 0, r.derivation_index) for r in c.execute(text(
            "SELECT o.txid, o.output_index, o.amount, d.derivation_index FROM deposit_observation o "
            "JOIN deposit_address d ON d.id = o.deposit_address_id WHERE o.swept_by = :s ORDER BY o.id"), {"s": sweep_id})]

    def _resign(self, c: Connection, row_id: int, rate: int):
        """The same deposit coins to the hot wallet at `rate`: the higher fee comes out of the swept
        amount. None (logged) when what is left would be dust."""
        coins = self._coins(c, row_id)
        script = address_to_script(self.hot_address, self.network)
        fee = fee_for(estimate_vsize(len(coins), [script]), rate)
        if sum(k.amount for k in coins) - fee < dust_threshold(script):
            log.warning("sweep %d: a fee of %d sat would leave dust; not bumped", row_id, fee)
            return None
        return self.signer.sign_bitcoin_sweep(row_id, coins, self.hot_address, fee), {}

    def _sign_and_store(self, sweep_id: int, coins: list[BtcCoin], fee: int, rate: int) -> str | None:
        try:
            signed = self.signer.sign_bitcoin_sweep(sweep_id, coins, self.hot_address, fee)
        except SigningRefused as refused:
            log.warning("sweep %d not signed: %s", sweep_id, refused)
            return None
        with self.engine.begin() as c:
            self._store_version(c, sweep_id, "open", signed, rate)
        log.info("sweep %d: %d deposit coin(s) -> hot wallet, fee %d sat (%s)", sweep_id, len(coins), signed.fee, signed.txid)
        return signed.txid

    def _book(self, c, r) -> None:
        deposit = self.wallets.location_account("bitcoin", "deposit", "BTC")
        hot = self.wallets.location_account("bitcoin", "hot", "BTC")
        expense = self.wallets.firm_account("network_fees", "BTC")
        amount, fee = int(r.amount), int(r.fee)
        legs = [Transfer(hot, deposit, amount - fee)] + ([Transfer(expense, deposit, fee)] if fee else [])
        self.ledger.post(f"sweep:{r.id}:final", legs, kind="sweep", metadata={"sweep_id": r.id, "txid": r.txid}, conn=c)

    def run_once(self) -> None:
        self.sweep_bitcoin()
        self.broadcast()
        self.track()
        self.bump_fees()
