"""Rebalances: move bitcoin from the hot wallet to the watch-only cold wallet when the hot wallet
holds more than its configured ceiling.

A rebalance never changes what a customer is owed: it moves value between two of the firm's own
asset locations (`location:bitcoin:hot:BTC` -> `location:bitcoin:cold:BTC`), and the network fee
goes to the network-fee expense account. Cold is watch-only: custody knows it only by the xpub
registered in `wallet` (tier `cold`) and the signer holds no key for it, so nothing here can spend
from cold; the way back (cold -> hot) is an offline, manual operation and is booked by whoever
performs it (it would arrive as treasury funding otherwise).

Thresholds (`RebalanceThreshold`, per asset, integers in minor units, in `RebalanceConfig`):
when the hot wallet's spendable balance S (the tracked coins a withdrawal batch could use now,
`custody.payouts.spendable_coins`) is above `ceiling`, one transaction pays S - `target` to a
fresh cold address; the network fee comes out of the change, so the hot wallet keeps
`target - fee`. Nothing happens at or below the ceiling, without a registered cold wallet, or
while the kill switch is engaged.

Steps, as jobs (`run_once()` runs them in order; each is also callable alone):
- `decide_bitcoin()`, the deciding step alone: under the cold wallet's row lock (which serialises
  rebalance creators), if no rebalance is in progress, decide from the thresholds, reserve the
  hot coins (`wallet_utxo.rebalance_id`, so no withdrawal batch can take them), derive the next
  cold address (`wallet.next_index`) and record a `rebalance` row in `open`, in one database
  transaction. It never calls the signer: the API process runs it for `POST /v1/rebalances/run`
  (its signer client may not sign a rebalance), and the worker's next run signs what it opened.
- `rebalance_bitcoin()`: `decide_bitcoin()` (or take the open one it or a crash left), then the
  signer re-checks everything (`Signer.sign_bitcoin_rebalance`) and signs;
  the signed bytes are stored (`signed`) before anything is broadcast. After a crash between the
  signature and the store, the next run signs the same open rebalance again: same coins, outputs
  and fee, and deterministic (RFC 6979) signatures give the same txid. While one is signed,
  broadcast or confirmed, no second one starts (a partial unique index is the backstop).
- `broadcast()` / `track()` (custody.firm_moves, shared with sweeps): idempotent broadcast; at the
  finality depth ONE journal transaction, key `rebalance:<id>:final`: cold location debited by the
  amount, hot location credited by amount + fee, network-fee expense debited by the fee.
The change back to the hot receive address is spendable once the rebalance is mined (like payout
change); `sync_hot_wallet` records it as ours, not as treasury funding. Reconciliation explains a
rebalance mined but not final as in transit on both lines (hot: - amount - fee; cold: + amount).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping

from sqlalchemy import Connection, Engine, Row, text

from chain_adapters.base import ChainAdapter
from custody.addresses import derive_btc_address
from custody.containment import Step, contained
from custody.controls import audit, kill_switch
from custody.firm_moves import FirmMoves
from custody.payouts import spendable_coins
from custody.states import advance
from custody.wallets import Wallets
from ledger.model import Transfer
from ledger.service import Ledger
from signer.bitcoin_tx import address_to_script, dust_threshold, select_coins
from signer.errors import SignerError, SignerErrorCode
from signer.protocol import BtcCoin, SignerPort, SigningRefused

log = logging.getLogger(__name__)
SAT_PER_BTC = 100_000_000


@dataclass(frozen=True)
class RebalanceThreshold:
    """Above `ceiling` minor units spendable in the hot wallet, move the excess over `target` to cold."""

    ceiling: int
    target: int

    def __post_init__(self) -> None:
        for name in ("ceiling", "target"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:  # bool and float are refused: minor units only
                raise ValueError(f"{name} must be a non-negative int of minor units, got {value!r}")
        if self.target >= self.ceiling:
            raise ValueError(f"target {self.target} must be below ceiling {self.ceiling}")


def amount_to_move(spendable: int, threshold: RebalanceThreshold) -> int:
    """How much to send to cold: spendable - target when spendable is above the ceiling, else 0."""
    if type(spendable) is not int or spendable < 0:
        raise ValueError(f"spendable must be a non-negative int of minor units, got {spendable!r}")
    return spendable - threshold.target if spendable > threshold.ceiling else 0


def default_thresholds() -> dict[str, RebalanceThreshold]:
    """Regtest defaults: above 50 BTC spendable in the hot wallet, bring it back to 20 BTC."""
    return {"BTC": RebalanceThreshold(ceiling=50 * SAT_PER_BTC, target=20 * SAT_PER_BTC)}


@dataclass(frozen=True)
class RebalanceConfig:
    bitcoin_network: str = "regtest"
    thresholds: Mapping[str, RebalanceThreshold] = field(default_factory=default_thresholds)


class Rebalances(FirmMoves):
    machine = "rebalance"

    def __init__(self, engine: Engine, ledger: Ledger, wallets: Wallets, bitcoin: ChainAdapter, signer: SignerPort,
                 *, hot_address: str, config: RebalanceConfig | None = None) -> None:
        super().__init__(engine, ledger, wallets, bitcoin)
        self.signer = signer
        self.hot_address = hot_address  # the hot receive address (0/0): where change goes
        self.config = config or RebalanceConfig()
        self.refusals: list[tuple[int, str]] = []  # (rebalance id, refusal code), most recent last

    @property
    def network(self) -> str:
        return self.config.bitcoin_network

    def decide_bitcoin(self) -> int | None:
        """The deciding step alone, no signer call: open a hot -> cold rebalance if the thresholds
        call for it (coins reserved, next cold address, row `open`), or find the active open one
        already there; its id, or None (nothing due, one in progress or set aside, no cold wallet,
        the kill switch engaged). The worker's `rebalance_bitcoin()` signs it on its next run."""
        claimed = self._claim()
        return claimed[0] if claimed is not None else None

    def rebalance_bitcoin(self) -> str | None:
        """Open (if the thresholds call for it), sign and store one hot -> cold rebalance, or sign
        again the open one a crash (or `decide_bitcoin`) left; returns its txid, or None when
        nothing was signed."""
        claimed = self._claim()
        if claimed is None:
            return None
        rebalance_id, coins, row = claimed
        # a failure to sign or store sets the rebalance aside (nothing was sent: a warning), see custody.containment
        return contained(self.engine, "rebalance", rebalance_id, "open", Step.sign,
                         lambda: self._sign_and_store(rebalance_id, coins, row),
                         describe=lambda: {"amount": int(row.amount), "destination": row.destination})

    def _claim(self) -> tuple[int, list[BtcCoin], Row] | None:
        """The active open rebalance (opened now if the thresholds call for one and none is in
        progress) with its reserved coins and amounts; None when there is nothing to sign."""
        if kill_switch(self.engine).engaged:
            return None
        threshold = self.config.thresholds.get("BTC")
        if threshold is None:
            return None
        rate = self.bitcoin.estimate_fee().sat_per_kvb
        with self.engine.begin() as c:
            cold = c.execute(text("SELECT id, xpub, network, next_index FROM wallet WHERE chain = 'bitcoin' AND tier = 'cold' "
                                  "FOR UPDATE")).first()
            if cold is None:
                return None
            current = c.execute(text("SELECT id, state, containment FROM rebalance WHERE chain = 'bitcoin' AND asset = 'BTC' "
                                     "AND state IN ('open', 'signed', 'broadcast', 'confirmed') ORDER BY id LIMIT 1")).first()
            if current is not None and (current.state != "open" or current.containment != "active"):
                return None  # one is in progress (or set aside); the next starts once it is final
            rebalance_id = current.id if current is not None else self._open(c, cold, threshold, rate)
            if rebalance_id is None:
                return None
            row = c.execute(text("SELECT destination, amount, change_amount FROM rebalance WHERE id = :r"),
                            {"r": rebalance_id}).one()
            coins = [BtcCoin(k.txid, k.vout, int(k.amount), k.derivation_change, k.derivation_index) for k in c.execute(text(
                "SELECT txid, vout, amount, derivation_change, derivation_index FROM wallet_utxo WHERE rebalance_id = :r "
                "ORDER BY txid, vout"), {"r": rebalance_id})]
        return rebalance_id, coins, row

    def _sign_and_store(self, rebalance_id: int, coins: list[BtcCoin], row) -> str | None:
        change = (self.hot_address, int(row.change_amount)) if int(row.change_amount) else None
        try:
            signed = self.signer.sign_bitcoin_rebalance(rebalance_id, coins, row.destination, int(row.amount), change)
        except SigningRefused as refused:  # the signer audited it; the rebalance stays open for an operator
            log.warning("rebalance %d not signed: %s", rebalance_id, refused)
            self.refusals.append((rebalance_id, refused.code.value))
            return None
        self._store_signed(rebalance_id, signed)
        log.info("rebalance %d: %d sat hot -> cold %s, fee %d sat (%s)", rebalance_id, int(row.amount), row.destination,
                 signed.fee, signed.txid)
        return signed.txid

    def _open(self, c: Connection, cold, threshold: RebalanceThreshold, rate: int) -> int | None:
        """Decide from the thresholds and reserve coins; the new rebalance's id, or None."""
        if cold.network != self.network:
            log.error("the cold wallet is registered for %s, this service runs on %s: no rebalance", cold.network, self.network)
            return None
        coins = spendable_coins(c)
        spendable = sum(k.amount for k in coins)
        amount = amount_to_move(spendable, threshold)
        if amount == 0:
            return None
        destination = derive_btc_address(cold.xpub, self.network, 0, cold.next_index)
        script = address_to_script(destination, self.network)
        if amount < dust_threshold(script):
            return None
        try:
            chosen, change, fee = select_coins(coins, amount, rate, [script], address_to_script(self.hot_address, self.network))
        except SignerError as exc:
            if exc.code is not SignerErrorCode.INSUFFICIENT_FUNDS:
                raise
            log.warning("rebalance of %d sat cannot pay its own fee from %d sat spendable: %s", amount, spendable, exc)
            return None
        rebalance_id = c.execute(text(
            "INSERT INTO rebalance (chain, asset, source_tier, destination_tier, state, destination, destination_index, amount, "
            "fee, change_amount, fee_rate, spendable, ceiling, target) VALUES ('bitcoin', 'BTC', 'hot', 'cold', 'open', :d, :i, "
            ":a, :f, :ch, :r, :s, :ceil, :tgt) RETURNING id"),
            {"d": destination, "i": cold.next_index, "a": amount, "f": fee, "ch": change, "r": rate, "s": spendable,
             "ceil": threshold.ceiling, "tgt": threshold.target}).scalar_one()
        c.execute(text("UPDATE wallet SET next_index = next_index + 1 WHERE id = :w"), {"w": cold.id})
        for k in chosen:
            c.execute(text("UPDATE wallet_utxo SET rebalance_id = :r WHERE txid = :t AND vout = :v AND rebalance_id IS NULL"),
                      {"r": rebalance_id, "t": k.txid, "v": k.vout})
        audit(c, "custody", "rebalance.create", f"rebalance:{rebalance_id}",
              {"spendable": spendable, "ceiling": threshold.ceiling, "target": threshold.target, "amount": amount, "fee": fee,
               "inputs": len(chosen), "destination": destination})
        return rebalance_id

    def _store_signed(self, rebalance_id: int, signed) -> None:
        with self.engine.begin() as c:
            advance(c, "rebalance", rebalance_id, "open", "signed", txid=signed.txid, raw=signed.raw, fee=signed.fee)

    def abandon(self, rebalance_id: int, *, by: str, reason: str) -> None:
        """An operator gives up an open (never signed and stored) rebalance: its coins are freed."""
        with self.engine.begin() as c:
            advance(c, "rebalance", rebalance_id, "open", "abandoned")
            c.execute(text("UPDATE wallet_utxo SET rebalance_id = NULL WHERE rebalance_id = :r"), {"r": rebalance_id})
            audit(c, by, "rebalance.abandon", f"rebalance:{rebalance_id}", {"reason": reason})

    def _book(self, c: Connection, r) -> None:
        hot = self.wallets.location_account("bitcoin", "hot", "BTC")
        cold = self.wallets.location_account("bitcoin", "cold", "BTC")
        expense = self.wallets.firm_account("network_fees", "BTC")
        amount, fee = int(r.amount), int(r.fee)
        legs = [Transfer(cold, hot, amount)] + ([Transfer(expense, hot, fee)] if fee else [])
        self.ledger.post(f"rebalance:{r.id}:final", legs, kind="rebalance",
                         metadata={"rebalance_id": r.id, "txid": r.txid, "network_fee": fee}, conn=c)

    def run_once(self) -> None:
        self.rebalance_bitcoin()
        self.broadcast()
        self.track()
