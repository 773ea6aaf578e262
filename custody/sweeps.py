"""Sweeps: move booked deposit coins from deposit addresses into the hot wallet (bitcoin).

A sweep never changes what a customer is owed; it moves value between two of the firm's own asset
locations. Only deposits already booked (credited, quarantined, released, returned or dust) are
swept, so a reorg of a not-yet-final deposit can never strand a sweep. Steps, as jobs:

- `sweep_bitcoin()`: reserve up to `max_inputs` unswept booked deposit coins, only those the wallet
  index (custody.wallet_index) holds as unspent outputs in a block of the best chain up to the
  scanner's cursor (never one a block spent, never one whose block was reorged out after its
  deposit was booked: custody.deposits books that shortfall to suspense and freezes the credit
  under a `deposit_reorged_after_finality` incident, the coin is gone); a `sweep` row in `open`,
  each observation's `swept_by`. Then the signer (which re-checks the reservation and that the
  destination is our own hot receive address) signs one transaction paying everything but the
  network fee to the hot wallet; the signed bytes are stored before anything is broadcast.
- `broadcast()` / `track()` (custody.firm_moves, shared with rebalances): idempotent broadcast; at
  the finality depth the books move in one transaction: deposit location <- hot location
  (amount - fee) and <- network-fee expense (fee).
- `bump_fees()` (custody.firm_moves): a sweep stuck in the mempool is signed again over the same
  coins at a higher fee (RBF); whichever version is mined is the one booked, with its own fee.
- A sweep signed (or sent, or mined) before a coin of it was reorged out after finality and
  double-spent away can never be mined: the node refuses it (missing inputs). After each
  broadcast run, `drop_stranded()` drops such a sweep (`dropped`, audited `sweep.dropped` with the
  gone coins and their reorg incidents) and frees all its coins, so the next `sweep_bitcoin()`
  rebuilds a sweep of the coins still on chain. Nothing is booked or reversed: a sweep is booked
  only at finality, and the gone coin's shortfall stays where custody.deposits booked it
  (reconciliation explains it; a coin mined again later is indexed again and swept then).
The hot wallet may spend a swept coin only once its sweep is final (custody.payouts).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping

from sqlalchemy import Connection, Engine, text

from chain_adapters.base import ChainAdapter, TxState
from custody.containment import Step, contained
from custody.controls import audit, kill_switch
from custody.firm_moves import BumpConfig, FirmMoves
from custody.states import advance
from custody.wallets import Wallets
from ledger.model import Transfer
from ledger.service import Ledger
from signer.bitcoin_tx import address_to_script, dust_threshold, estimate_vsize, fee_for
from signer.protocol import BtcCoin, SignerPort, SigningRefused

log = logging.getLogger(__name__)
BOOKED = ("credited", "quarantined", "released", "returned", "dust")

# The coins of active sweeps not yet final that left the chain after their deposit was booked: the
# wallet index holds no output for them (their block was undone) and the deposit scanner booked
# that reorg (`reorg_count`: the shortfall to suspense, custody.deposits). A coin the index never
# held (recorded before migration 0023) has no reorg booked: it is never taken for gone.
_STRANDED_SQL = text("""
SELECT s.id, s.state, s.txid, s.raw, d.id AS observation_id, d.txid AS coin_txid
FROM sweep s
JOIN deposit_observation d ON d.swept_by = s.id
WHERE s.chain = 'bitcoin'
AND s.state IN ('signed', 'broadcast', 'confirmed')
AND s.containment = 'active'
AND (CAST(:s AS bigint) IS NULL OR s.id = :s)
AND d.reorg_count > 0
AND NOT EXISTS (SELECT 1 FROM btc_wallet_output o WHERE o.txid = d.txid AND o.vout = d.output_index)
ORDER BY s.id, d.id
""")

_FREE_COINS_SQL = text("""
UPDATE deposit_observation
SET swept_by = NULL, updated_at = now()
WHERE swept_by = :s
RETURNING id
""")

_REORG_INCIDENTS_SQL = text("""
SELECT id
FROM incident
WHERE kind = 'deposit_reorged_after_finality'
AND detail ->> 'observation_id' = ANY(:o)
ORDER BY id
""")


def stranded_coins(sweep: TxState, deposits: Mapping[int, TxState]) -> list[int]:
    """Which coins of a sweep, each of them no longer in the wallet index (reorged out after its
    deposit was booked; `deposits`: observation id -> what the node knows of its deposit's
    transaction), are gone for good, so that the sweep's transaction (`sweep`: what the node knows
    of it) can never be mined: those whose deposit transaction the node knows nowhere (neither in
    its chain nor in its mempool: double-spent away), and only while the node knows the sweep
    nowhere either. Empty means: leave the sweep as it is (the node has it, mined, pending,
    replaced or conflicted, and `track` follows it; or its deposits are in the chain or mempool
    and it may yet be mined with them)."""
    if sweep is not TxState.UNKNOWN:
        return []
    return sorted(i for i, known in deposits.items() if known is TxState.UNKNOWN)


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
                    "AND state = ANY(:s) AND EXISTS (SELECT 1 FROM btc_wallet_output o WHERE o.txid = d.txid "
                    "AND o.vout = d.output_index AND o.spent_txid IS NULL) ORDER BY id LIMIT :l FOR UPDATE SKIP LOCKED"), {"s": list(BOOKED), "l": self.max_inputs}).all()
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

    def broadcast(self) -> int:
        """`FirmMoves.broadcast`, then `drop_stranded()`: a sweep the node refuses because a coin of it
        is gone from the chain must not hold the sweep's other coins. Nothing while the kill switch is on."""
        sent = super().broadcast()
        if not kill_switch(self.engine).engaged:
            self.drop_stranded()
        return sent

    def drop_stranded(self) -> list[int]:
        """Drop every active sweep (signed, broadcast or confirmed) that can never be mined because a
        coin it spends was reorged out after its deposit was booked and is gone (`stranded_coins`),
        and free all its coins: one database transaction per sweep, audited `sweep.dropped` with the
        gone coins and their `deposit_reorged_after_finality` incidents. The next `sweep_bitcoin()`
        rebuilds a sweep from the coins the wallet index holds; a gone coin stays booked as
        custody.deposits left it. A node or database failure leaves the sweep for the next run
        (custody.containment). Returns the sweeps dropped."""
        with self.engine.connect() as c:
            rows = c.execute(_STRANDED_SQL, {"s": None}).all()
        candidates: dict[int, list] = {}
        for r in rows:
            candidates.setdefault(r.id, []).append(r)
        dropped = []
        for sweep_id, coins in candidates.items():
            if contained(self.engine, "sweep", sweep_id, coins[0].state, Step.track, lambda coins=coins: self._drop_if_gone(coins),
                         describe=lambda coins=coins: {"txid": coins[0].txid, "unindexed": [k.observation_id for k in coins]}):
                dropped.append(sweep_id)
        return dropped

    def _drop_if_gone(self, coins: list) -> bool:
        """Ask the node about one candidate sweep and its unindexed coins (`stranded_coins`); drop it
        if some are gone, re-checked under the sweep's row lock against the index (a scan may have
        walked a block mining the deposit again meanwhile)."""
        sweep = coins[0]
        gone = stranded_coins(self.bitcoin.tx_status(sweep.txid, raw=bytes(sweep.raw)).state,
                              {k.observation_id: self.bitcoin.tx_status(k.coin_txid).state for k in coins})
        if not gone:
            return False
        with self.engine.begin() as c:
            if c.execute(text("SELECT containment FROM sweep WHERE id = :s FOR UPDATE"), {"s": sweep.id}).scalar_one() != "active":
                return False  # set aside meanwhile: an operator's
            if not set(gone) <= {r.observation_id for r in c.execute(_STRANDED_SQL, {"s": sweep.id})}:
                return False  # indexed again, or the sweep moved on: the next run looks again
            state = sweep.state
            if state == "confirmed":  # its block was reorged out with the coin's
                advance(c, "sweep", sweep.id, "confirmed", "broadcast", confirmations=0)
                state = "broadcast"
            advance(c, "sweep", sweep.id, state, "dropped")
            freed = c.execute(_FREE_COINS_SQL, {"s": sweep.id}).scalars().all()
            incidents = c.execute(_REORG_INCIDENTS_SQL, {"o": [str(i) for i in gone]}).scalars().all()
            audit(c, "custody", "sweep.dropped", f"sweep:{sweep.id}",
                  {"txid": sweep.txid, "state": sweep.state, "gone": gone, "freed": sorted(set(freed) - set(gone)),
                   "reorg_incidents": incidents})
        log.warning("sweep %d (%s) dropped: deposit coin(s) %s reorged out after booking and gone (incidents %s); "
                    "%d other coin(s) freed for the next sweep", sweep.id, sweep.txid, gone, incidents, len(freed) - len(gone))
        return True

    def run_once(self) -> None:
        self.sweep_bitcoin()
        self.broadcast()
        self.track()
        self.bump_fees()
