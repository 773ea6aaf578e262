"""Rebalances: move bitcoin between the firm's own wallet tiers by thresholds, both ways.

A rebalance never changes what a customer is owed: it moves value between two of the firm's own
asset locations (`location:bitcoin:<tier>:BTC`), and the network fee goes to the network-fee
expense account. Three directions, one table (`rebalance`), one state machine:

| direction | when | who signs | approval |
| --- | --- | --- | --- |
| hot -> warm or cold (`excess_to`) | hot spendable above `ceiling`: moves spendable - `target` | the signer (hot keys) | none: value stays the firm's |
| warm -> hot (refill) | hot spendable below `floor`: moves `target` - spendable | the signer (warm keys) | an operator quorum of SIGNED approvals, verified by the signer |
| cold -> hot (PSBT) | an operator asks for an amount (`open_cold_to_hot`) | an operator, offline, with the cold key | the offline signature itself |

Thresholds (`RebalanceThreshold`, per asset, integers in minor units, in `RebalanceConfig`):
`floor` < `target` < `ceiling`. The hot wallet's spendable balance S is what a withdrawal batch
could use now (`custody.payouts.spendable_coins`). Above the ceiling one transaction pays
S - target to a fresh address of the `excess_to` tier; the fee comes out of the change, so hot
keeps `target - fee`. Below the floor one transaction pays target - S from warm coins to the hot
receive address (change to a fresh warm address). Nothing happens without the tier's registered
wallet, while one from the same source tier is in progress, or while the kill switch is engaged.

Steps, as jobs (`run_once()` runs them in order; each is also callable alone):
- `decide_bitcoin()`, the deciding step alone: under the destination (or warm) wallet's row lock,
  which serialises rebalance creators, if none from that source tier is in progress, decide from
  the thresholds, reserve the coins (hot: `wallet_utxo.rebalance_id`; warm and cold:
  `rebalance_input`), derive the next address of the tier that receives (or of the source, for
  change: `wallet.next_index`) and record a `rebalance` row in `open`, in one database
  transaction. It never calls the signer: the API process runs it for `POST /v1/rebalances/run`.
- `rebalance_bitcoin()`: `decide_bitcoin()` (or take the open one it or a crash left), then the
  signer re-checks everything (`Signer.sign_bitcoin_rebalance`) and signs; the signed bytes are
  stored (`signed`, with the first `firm_tx_version`) before anything is broadcast. After a crash
  between the signature and the store, the next run signs the same open rebalance again: same
  coins, outputs and fee, and deterministic (RFC 6979) signatures give the same txid. A refill
  is sent to the signer only once `approvals_required` distinct operators signed its payload
  (`approve_refill`, checked at the door as a withdrawal approval is), counting only approvals
  whose key still counts now and that were given before the refill's TTL ran out
  (`counted_refill_approvals`: a key revoked or removed after it approved does not, nor an approval
  stored late past the door); the signer counts them again itself against its own keys and refuses with
  `rebalance_not_approved` otherwise. A refill still short of its quorum `refill_ttl` (policy
  data, PolicySet.refill_ttl) after it was opened expires (`expire_refill`: open -> expired,
  audited; its warm coins free again) and late approvals are `refill_expired`; while hot is still
  below its floor the next run opens a fresh one.
- Cold -> hot: `open_cold_to_hot(amount)` chooses cold coins (the wallet index's, unspent, issued,
  not reserved), builds the unsigned PSBT (custody.psbt: our hot receive address only, change to a
  fresh cold address) at the node's fee estimate clamped to the bounds, and stores it on the row
  (`open`). `export_psbt(id)` answers it (base64); `import_psbt(id, psbt)` checks that its
  transaction is exactly the one built, verifies every signature and the fee rate bounds, and
  stores the signed transaction (`signed`). Before it broadcasts a cold row the worker checks the
  stored bytes' txid against the transaction built from the row's own inputs and outputs again.
- `broadcast()` / `track()` / `bump_fees()` (custody.firm_moves, shared with sweeps): idempotent
  broadcast; RBF for a stuck hot or warm rebalance (the higher fee out of the change; a cold move,
  or one into hot without change, is bumped by a CPFP child instead: `self.cpfp`, custody.cpfp,
  run after the RBF step); at the finality depth ONE journal transaction,
  key `rebalance:<id>:final`: destination location debited by the amount, source location
  credited by amount + fee, network-fee expense debited by the fee, with the mined version's fee.
The change back to the hot receive address is spendable once the rebalance is mined (like payout
change); a coin a rebalance brings INTO hot once it is final. `sync_hot_wallet` records both as
ours, never as treasury funding. Reconciliation explains a rebalance mined but not final as in
transit on both lines (source: - amount - fee; destination: + amount; custody.firm_moves.in_transit).
"""
from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import Mapping

from sqlalchemy import Connection, Engine, Row, text

from chain_adapters.base import ChainAdapter
from chain_adapters.bitcoin import txid_of
from custody.addresses import btc_key_origin, derive_btc_address
from custody.destinations import HOT_RECEIVE_INDEX
from custody.containment import Step, contained
from custody.controls import audit, kill_switch
from custody.cpfp import Cpfp
from custody.errors import CustodyError, CustodyErrorCode
from custody.firm_moves import BumpConfig, FirmMoves
from custody.payouts import spendable_coins
from custody.psbt import KeyOrigin, PsbtError, PsbtInput, build, decode, encode, extract, unsigned_tx
from custody.states import MACHINES, advance
from custody.wallets import Wallets
from ledger.model import Transfer
from ledger.service import Ledger
from policies.rules import DEFAULT_REFILL_TTL
from custody.withdrawals import live_approvers, verify_operator_approval
from signer.approvals import ApprovalSignature, ApproverRegistry, rebalance_approval_payload
from signer.bitcoin_tx import _sha256d, address_to_script, dust_threshold, estimate_vsize, fee_for, select_coins
from signer.errors import SignerError, SignerErrorCode
from signer.protocol import BtcCoin, SignerPort, SigningRefused

log = logging.getLogger(__name__)
SAT_PER_BTC = 100_000_000
OUT_TIERS = ("warm", "cold")  # where hot's excess may go
IN_PROGRESS = ("open", "signed", "broadcast", "confirmed")

# Unspent coins of a warm or cold tier in the wallet index, at issued receive indices, not reserved
# by a rebalance in progress, and not made by a rebalance that is not booked yet (its value reaches
# the tier's books only at finality): what a move from that tier may spend.
_TIER_COINS_SQL = text("""
SELECT o.txid, o.vout, o.amount, o.derivation_change, o.derivation_index
FROM btc_wallet_output o
WHERE o.tier = :tier
  AND o.spent_txid IS NULL
  AND o.derivation_change = 0
  AND o.derivation_index < :next_index
  AND NOT EXISTS (SELECT 1 FROM rebalance_input i JOIN rebalance r ON r.id = i.rebalance_id
                  WHERE i.txid = o.txid AND i.vout = o.vout AND r.state = ANY(:busy))
  AND NOT EXISTS (SELECT 1 FROM firm_tx_version v JOIN rebalance r ON v.machine = 'rebalance' AND r.id = v.row_id
                  WHERE v.txid = o.txid AND r.state <> 'final')
ORDER BY o.amount DESC, o.txid, o.vout
""")
_INSERT_SQL = text("""
INSERT INTO rebalance (chain, asset, source_tier, destination_tier, state, destination, destination_index, amount, fee,
                       change_amount, fee_rate, spendable, ceiling, target, floor, approvals_required, change_address,
                       change_index, psbt)
VALUES ('bitcoin', 'BTC', :src, :dst, 'open', :d, :i, :a, :f, :ch, :r, :s, :ceil, :tgt, :floor, :q, :ca, :ci, :psbt)
RETURNING id
""")
_ROW_SQL = text("""
SELECT id, source_tier, destination_tier, state, containment, destination, destination_index, amount, fee, change_amount,
       change_address, fee_rate, approvals_required, psbt, txid
FROM rebalance
WHERE id = :r
""")


@dataclass(frozen=True)
class RebalanceThreshold:
    """Hot above `ceiling` minor units spendable: the excess over `target` goes to `excess_to` (warm
    or cold). Hot below `floor` (when set): a refill from warm brings it back to `target`."""

    ceiling: int
    target: int
    floor: int | None = None
    excess_to: str = "cold"

    def __post_init__(self) -> None:
        for name in ("ceiling", "target", "floor"):
            value = getattr(self, name)
            if name == "floor" and value is None:
                continue
            if type(value) is not int or value < 0:  # bool and float are refused: minor units only
                raise ValueError(f"{name} must be a non-negative int of minor units, got {value!r}")
        if self.target >= self.ceiling:
            raise ValueError(f"target {self.target} must be below ceiling {self.ceiling}")
        if self.floor is not None and self.floor >= self.target:
            raise ValueError(f"floor {self.floor} must be below target {self.target}")
        if self.excess_to not in OUT_TIERS:
            raise ValueError(f"excess_to must be one of {OUT_TIERS}, got {self.excess_to!r}")


def amount_to_move(spendable: int, threshold: RebalanceThreshold) -> int:
    """How much to send out of hot: spendable - target when spendable is above the ceiling, else 0."""
    _check_spendable(spendable)
    return spendable - threshold.target if spendable > threshold.ceiling else 0


def refill_amount(spendable: int, threshold: RebalanceThreshold) -> int:
    """How much to bring into hot from warm: target - spendable when spendable is below the floor, else 0."""
    _check_spendable(spendable)
    if threshold.floor is None or spendable >= threshold.floor:
        return 0
    return threshold.target - spendable


def _check_spendable(spendable: int) -> None:
    if type(spendable) is not int or spendable < 0:
        raise ValueError(f"spendable must be a non-negative int of minor units, got {spendable!r}")


def default_thresholds() -> dict[str, RebalanceThreshold]:
    """Regtest defaults: above 50 BTC spendable in the hot wallet, bring it back to 20 BTC (to cold); no floor."""
    return {"BTC": RebalanceThreshold(ceiling=50 * SAT_PER_BTC, target=20 * SAT_PER_BTC)}


@dataclass(frozen=True)
class RebalanceConfig:
    bitcoin_network: str = "regtest"
    thresholds: Mapping[str, RebalanceThreshold] = field(default_factory=default_thresholds)
    refill_quorum: int = 2  # distinct operators who must sign a warm -> hot refill (the signer applies its own too)
    psbt_min_fee_rate_sat_per_kvb: int = 1_000  # a cold -> hot PSBT is built and accepted within these bounds
    psbt_max_fee_rate_sat_per_kvb: int = 100_000
    refill_ttl: dt.timedelta = DEFAULT_REFILL_TTL  # policy data (PolicySet.refill_ttl): how long a refill waits for its quorum
    # tier -> the master fingerprint (8 hex digits) of its account xpub's key origin, when known: a
    # PSBT's BIP32 derivations then start there (custody.psbt); absent: the xpub's own fingerprint
    master_fingerprints: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.refill_ttl, dt.timedelta) or self.refill_ttl <= dt.timedelta(0):
            raise ValueError(f"refill_ttl must be a positive timedelta, got {self.refill_ttl!r}")
        for tier, fingerprint in self.master_fingerprints.items():
            if not isinstance(fingerprint, str) or len(fingerprint) != 8 or any(ch not in "0123456789abcdef" for ch in fingerprint):
                raise ValueError(f"the {tier} master fingerprint must be 8 lowercase hex digits, got {fingerprint!r}")


def treasury_config(section, *, bitcoin_network: str, refill_ttl: dt.timedelta = DEFAULT_REFILL_TTL,
                    master_fingerprints: Mapping[str, str] | None = None) -> tuple[RebalanceConfig, BumpConfig]:
    """The rebalance and fee-bump configuration of a deployment's `[treasury]` section (custody.config);
    `refill_ttl` is the policy's (PolicySet.refill_ttl), `master_fingerprints` the bitcoin wallets'
    (`[wallets.bitcoin] hot_fingerprint`, `cold_fingerprint`)."""
    threshold = RebalanceThreshold(ceiling=section.ceiling, target=section.target, floor=section.floor,
                                   excess_to=section.excess_to)
    return (RebalanceConfig(bitcoin_network=bitcoin_network, thresholds={"BTC": threshold}, refill_quorum=section.refill_quorum,
                            psbt_min_fee_rate_sat_per_kvb=section.psbt_min_fee_rate_sat_per_kvb,
                            psbt_max_fee_rate_sat_per_kvb=section.psbt_max_fee_rate_sat_per_kvb, refill_ttl=refill_ttl,
                            master_fingerprints=dict(master_fingerprints or {})),
            BumpConfig(stuck_blocks=section.stuck_blocks, bump_percent=section.bump_percent,
                       max_fee_rate_sat_per_kvb=section.max_fee_rate_sat_per_kvb))


class Rebalances(FirmMoves):
    machine = "rebalance"

    def __init__(self, engine: Engine, ledger: Ledger, wallets: Wallets, bitcoin: ChainAdapter, signer: SignerPort,
                 *, hot_address: str, config: RebalanceConfig | None = None, approvers: ApproverRegistry | None = None,
                 bump: BumpConfig | None = None) -> None:
        super().__init__(engine, ledger, wallets, bitcoin, bump)
        self.signer = signer
        self.hot_address = hot_address  # the hot receive address (0/0): where hot change and refills go
        self.config = config or RebalanceConfig()
        self.approvers = approvers  # custody's check of a refill approval at the door; the signer checks again
        self.refusals: list[tuple[int, str]] = []  # (rebalance id, refusal code), most recent last
        # a stuck move into hot that `_resign` cannot bump (cold source, no change) gets a CPFP child
        self.cpfp = Cpfp(engine, ledger, wallets, bitcoin, signer, hot_address=hot_address, network=self.network,
                         bump=self.bump)

    @property
    def network(self) -> str:
        return self.config.bitcoin_network

    # ---- deciding ---------------------------------------------------------------------------

    def decide_bitcoin(self) -> int | None:
        """The deciding step alone, no signer call: open a hot -> warm/cold rebalance or a warm ->
        hot refill if the thresholds call for one (or find the active open one already there); its
        id, or None. The worker's `rebalance_bitcoin()` signs it on its next run."""
        claimed = self._claim_out() or self._claim_refill()
        return claimed[0] if claimed is not None else None

    def rebalance_bitcoin(self) -> str | None:
        """Open (if the thresholds call for it), sign and store one rebalance out of hot, else one
        approved refill into hot; or sign again the open one a crash (or `decide_bitcoin`) left.
        Returns its txid, or None when nothing was signed."""
        claimed = self._claim_out() or self._claim_refill(signable=True)
        if claimed is None:
            return None
        rebalance_id, coins, row = claimed
        # a failure to sign or store sets the rebalance aside (nothing was sent: a warning), see custody.containment
        return contained(self.engine, "rebalance", rebalance_id, "open", Step.sign,
                         lambda: self._sign_and_store(rebalance_id, coins, row),
                         describe=lambda: {"amount": int(row.amount), "destination": row.destination})

    def _threshold(self) -> RebalanceThreshold | None:
        if kill_switch(self.engine).engaged:
            return None
        return self.config.thresholds.get("BTC")

    @staticmethod
    def _wallet(c: Connection, tier: str):
        return c.execute(text("SELECT id, tier, xpub, network, next_index FROM wallet WHERE chain = 'bitcoin' AND tier = :t "
                              "FOR UPDATE"), {"t": tier}).first()

    @staticmethod
    def _current(c: Connection, source_tier: str):
        return c.execute(text("SELECT id, state, containment FROM rebalance WHERE chain = 'bitcoin' AND asset = 'BTC' "
                              "AND source_tier = :s AND state = ANY(:busy) ORDER BY id LIMIT 1"),
                         {"s": source_tier, "busy": list(IN_PROGRESS)}).first()

    def _claim_out(self) -> tuple[int, list[BtcCoin], Row] | None:
        """The active open rebalance out of hot (opened now if the thresholds call for one and none
        is in progress) with its reserved coins; None when there is nothing to sign."""
        threshold = self._threshold()
        if threshold is None:
            return None
        rate = self.bitcoin.estimate_fee().sat_per_kvb
        with self.engine.begin() as c:
            wallet = self._wallet(c, threshold.excess_to)
            if wallet is None:
                return None
            current = self._current(c, "hot")
            if current is not None and (current.state != "open" or current.containment != "active"):
                return None  # one is in progress (or set aside); the next starts once it is final
            rebalance_id = current.id if current is not None else self._open_out(c, wallet, threshold, rate)
            if rebalance_id is None:
                return None
            return rebalance_id, self._coins(c, rebalance_id, "hot"), c.execute(_ROW_SQL, {"r": rebalance_id}).one()

    def _claim_refill(self, *, signable: bool = False) -> tuple[int, list[BtcCoin], Row] | None:
        """The active open warm -> hot refill (opened now if hot is below its floor and none is in
        progress); with `signable`, only once it carries `approvals_required` distinct approvals."""
        threshold = self._threshold()
        if threshold is None or threshold.floor is None:
            return None
        rate = self.bitcoin.estimate_fee().sat_per_kvb
        with self.engine.begin() as c:
            warm = self._wallet(c, "warm")
            if warm is None:
                return None
            current = self._current(c, "warm")
            if current is not None and (current.state != "open" or current.containment != "active"):
                return None
            rebalance_id = current.id if current is not None else self._open_refill(c, warm, threshold, rate)
            if rebalance_id is None:
                return None
            row = c.execute(_ROW_SQL, {"r": rebalance_id}).one()
            if current is not None and expire_refill(c, "rebalance", rebalance_id, self.config.refill_ttl,
                                                     self._approvals(c, rebalance_id), row.approvals_required):
                return None  # the next run opens a fresh refill if hot is still below its floor
            if signable and (approvals := self._approvals(c, rebalance_id)) < row.approvals_required:
                log.info("refill %d waits for approvals (%d of %d)", rebalance_id, approvals, row.approvals_required)
                return None
            return rebalance_id, self._coins(c, rebalance_id, "warm"), row

    def _approvals(self, c: Connection, rebalance_id: int) -> int:
        """Distinct operators whose approval still counts (`counted_refill_approvals`)."""
        return counted_refill_approvals(c, "rebalance_approval", rebalance_id, self.approvers, ttl=self.config.refill_ttl)

    @staticmethod
    def _coins(c: Connection, rebalance_id: int, source_tier: str) -> list[BtcCoin]:
        """The coins reserved for the rebalance, in a stable order (a re-sign spends the same)."""
        sql = ("SELECT txid, vout, amount, derivation_change, derivation_index FROM wallet_utxo WHERE rebalance_id = :r "
               "ORDER BY txid, vout") if source_tier == "hot" else \
              ("SELECT txid, vout, amount, derivation_change, derivation_index FROM rebalance_input WHERE rebalance_id = :r "
               "ORDER BY txid, vout")
        return [BtcCoin(k.txid, k.vout, int(k.amount), k.derivation_change, k.derivation_index)
                for k in c.execute(text(sql), {"r": rebalance_id})]

    def _wrong_network(self, wallet) -> bool:
        if wallet.network != self.network:
            log.error("the %s wallet is registered for %s, this service runs on %s: no rebalance", wallet.tier,
                      wallet.network, self.network)
            return True
        return False

    def _open_out(self, c: Connection, wallet, threshold: RebalanceThreshold, rate: int) -> int | None:
        """Hot above its ceiling: reserve hot coins, pay the excess to the next address of `wallet`."""
        if self._wrong_network(wallet):
            return None
        coins = spendable_coins(c)
        spendable = sum(k.amount for k in coins)
        amount = amount_to_move(spendable, threshold)
        if amount == 0:
            return None
        destination = derive_btc_address(wallet.xpub, self.network, 0, wallet.next_index)
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
        rebalance_id = c.execute(_INSERT_SQL, {
            "src": "hot", "dst": wallet.tier, "d": destination, "i": wallet.next_index, "a": amount, "f": fee, "ch": change,
            "r": rate, "s": spendable, "ceil": threshold.ceiling, "tgt": threshold.target, "floor": threshold.floor, "q": 0,
            "ca": self.hot_address if change else None, "ci": None, "psbt": None}).scalar_one()
        c.execute(text("UPDATE wallet SET next_index = next_index + 1 WHERE id = :w"), {"w": wallet.id})
        for k in chosen:
            c.execute(text("UPDATE wallet_utxo SET rebalance_id = :r WHERE txid = :t AND vout = :v AND rebalance_id IS NULL"),
                      {"r": rebalance_id, "t": k.txid, "v": k.vout})
        audit(c, "custody", "rebalance.create", f"rebalance:{rebalance_id}",
              {"source_tier": "hot", "destination_tier": wallet.tier, "spendable": spendable, "ceiling": threshold.ceiling,
               "target": threshold.target, "amount": amount, "fee": fee, "inputs": len(chosen), "destination": destination})
        return rebalance_id

    def _open_from(self, c: Connection, wallet, amount: int, rate: int, *, spendable: int, threshold: RebalanceThreshold | None,
                   quorum: int, by: str, psbt: bool) -> int:
        """Reserve `wallet`'s (warm or cold) coins for `amount` to the hot receive address, change to
        the tier's next address; the row, its inputs and (cold) its unsigned PSBT. Raises
        CustodyError rebalance_insufficient_funds when the tier's coins cannot pay it."""
        coins = [BtcCoin(k.txid, k.vout, int(k.amount), k.derivation_change, k.derivation_index)
                 for k in c.execute(_TIER_COINS_SQL, {"tier": wallet.tier, "next_index": wallet.next_index,
                                                      "busy": list(IN_PROGRESS)})]
        hot_script = address_to_script(self.hot_address, self.network)
        change_address = derive_btc_address(wallet.xpub, self.network, 0, wallet.next_index)
        change_script = address_to_script(change_address, self.network)
        try:
            chosen, change, fee = select_coins(coins, amount, rate, [hot_script], change_script)
        except SignerError as exc:
            if exc.code is not SignerErrorCode.INSUFFICIENT_FUNDS:
                raise
            raise CustodyError(CustodyErrorCode.rebalance_insufficient_funds, str(exc), tier=wallet.tier, amount=amount) from None
        outputs = [(hot_script, amount)] + ([(change_script, change)] if change else [])
        unsigned = build([self._psbt_input(k, wallet) for k in chosen], outputs,
                         self._psbt_output_origins(c, wallet, wallet.next_index if change else None)) if psbt else None
        rebalance_id = c.execute(_INSERT_SQL, {
            "src": wallet.tier, "dst": "hot", "d": self.hot_address, "i": 0, "a": amount, "f": fee, "ch": change, "r": rate,
            "s": spendable, "ceil": threshold.ceiling if threshold else 0, "tgt": threshold.target if threshold else 0,
            "floor": threshold.floor if threshold else None, "q": quorum, "ca": change_address if change else None,
            "ci": wallet.next_index if change else None, "psbt": unsigned}).scalar_one()
        if change:
            c.execute(text("UPDATE wallet SET next_index = next_index + 1 WHERE id = :w"), {"w": wallet.id})
        c.execute(text("INSERT INTO rebalance_input (rebalance_id, txid, vout, amount, derivation_change, derivation_index) "
                       "VALUES (:r, :t, :v, :a, :c, :i)"),
                  [{"r": rebalance_id, "t": k.txid, "v": k.vout, "a": k.amount, "c": k.change, "i": k.index} for k in chosen])
        audit(c, by, "rebalance.create", f"rebalance:{rebalance_id}",
              {"source_tier": wallet.tier, "destination_tier": "hot", "spendable": spendable, "amount": amount, "fee": fee,
               "inputs": len(chosen), "approvals_required": quorum, "psbt": psbt})
        return rebalance_id

    def _psbt_input(self, k: BtcCoin, wallet) -> PsbtInput:
        address = derive_btc_address(wallet.xpub, self.network, k.change, k.index)
        return PsbtInput(k.txid, k.vout, k.amount, address_to_script(address, self.network),
                         self._origin(wallet.tier, wallet.xpub, k.change, k.index))

    def _origin(self, tier: str, xpub: str, change: int, index: int) -> KeyOrigin:
        """The BIP32 derivation a PSBT states for the key at `<tier account>/<change>/<index>`
        (custody.psbt module docstring): from the tier's master fingerprint when one is configured
        (`RebalanceConfig.master_fingerprints`), else from the account xpub's own."""
        return KeyOrigin(*btc_key_origin(xpub, self.network, change, index, self.config.master_fingerprints.get(tier)))

    def _psbt_output_origins(self, c: Connection, wallet, change_index: int | None) -> list[KeyOrigin | None]:
        """The derivations of a cold -> hot PSBT's outputs: the hot receive address (0/0 of the hot
        wallet's xpub, only if that is indeed `hot_address`) and the change (the source tier's
        `0/<change_index>`), in the order the outputs are built."""
        hot = c.execute(text("SELECT xpub, network FROM wallet WHERE chain = 'bitcoin' AND tier = 'hot'")).first()
        hot_origin = None
        if hot is not None and hot.network == self.network and \
                derive_btc_address(hot.xpub, self.network, 0, HOT_RECEIVE_INDEX) == self.hot_address:
            hot_origin = self._origin("hot", hot.xpub, 0, HOT_RECEIVE_INDEX)
        change = [self._origin(wallet.tier, wallet.xpub, 0, change_index)] if change_index is not None else []
        return [hot_origin] + change

    def _open_refill(self, c: Connection, warm, threshold: RebalanceThreshold, rate: int) -> int | None:
        """Hot below its floor: reserve warm coins for target - spendable (a quorum must approve it)."""
        if self._wrong_network(warm):
            return None
        spendable = sum(k.amount for k in spendable_coins(c))
        amount = refill_amount(spendable, threshold)
        if amount == 0:
            return None
        try:
            return self._open_from(c, warm, amount, rate, spendable=spendable, threshold=threshold,
                                   quorum=self.config.refill_quorum, by="custody", psbt=False)
        except CustodyError as exc:
            log.warning("hot is below its floor but warm cannot refill it: %s", exc)
            return None

    # ---- refill approvals -------------------------------------------------------------------

    def refill_payload(self, rebalance_id: int) -> bytes:
        """The bytes an operator signs to approve refill `rebalance_id` (signer.approvals)."""
        with self.engine.connect() as c:
            row = c.execute(_ROW_SQL, {"r": rebalance_id}).first()
        if row is None or row.source_tier != "warm":
            raise CustodyError(CustodyErrorCode.rebalance_not_found, f"no warm -> hot refill {rebalance_id}")
        return _payload(rebalance_id, row)

    def approve_refill(self, rebalance_id: int, *, operator: str, signature: ApprovalSignature | None) -> int:
        """An operator's signed approval of an open refill, verified here against `approvers` before
        it is stored (the signer verifies it again against its own keys). Returns the number of
        distinct operators whose approval still counts. Codes in the order checked:
        rebalance_not_found, refill_expired (it waited `refill_ttl` or longer, expired by the worker
        yet or not), invalid_state, approval_signature_required, approver_unknown (also a revoked
        console key), approval_scheme_mismatch, approval_signature_invalid, approver_not_caller,
        already_acted."""
        with self.engine.begin() as c:
            row = c.execute(text(f"{_ROW_SQL.text} FOR UPDATE"), {"r": rebalance_id}).first()
            if row is None or row.source_tier != "warm":
                raise CustodyError(CustodyErrorCode.rebalance_not_found, f"no warm -> hot refill {rebalance_id}")
            refuse_late_approval(c, "rebalance", rebalance_id, row.state, self.config.refill_ttl)
            if row.state != "open":
                raise CustodyError(CustodyErrorCode.invalid_state, f"refill {rebalance_id} is {row.state}", state=row.state)
            store_refill_approval(c, "rebalance_approval", "rebalance", rebalance_id, self.approvers, operator,
                                  _payload(rebalance_id, row), signature)
            return self._approvals(c, rebalance_id)

    # ---- cold -> hot through a PSBT ---------------------------------------------------------

    def open_cold_to_hot(self, amount: int, *, by: str) -> int:
        """Build the unsigned PSBT moving `amount` sat from cold to the hot receive address (module
        docstring) and record it `open`; its id. Codes: withdrawals_halted (kill switch),
        rebalance_wallet_missing, rebalance_in_progress, rebalance_insufficient_funds."""
        if type(amount) is not int or amount <= 0:
            raise ValueError(f"amount must be a positive int of satoshis, got {amount!r}")
        if kill_switch(self.engine).engaged:
            raise CustodyError(CustodyErrorCode.withdrawals_halted, "the kill switch is engaged: no rebalance is opened")
        rate = min(max(self.bitcoin.estimate_fee().sat_per_kvb, self.config.psbt_min_fee_rate_sat_per_kvb),
                   self.config.psbt_max_fee_rate_sat_per_kvb)
        with self.engine.begin() as c:
            cold = self._wallet(c, "cold")
            if cold is None or cold.network != self.network:
                raise CustodyError(CustodyErrorCode.rebalance_wallet_missing, "no cold wallet is registered for this network")
            current = self._current(c, "cold")
            if current is not None:
                raise CustodyError(CustodyErrorCode.rebalance_in_progress,
                                   f"cold -> hot {current.id} is {current.state}: one at a time", rebalance_id=current.id)
            return self._open_from(c, cold, amount, rate, spendable=0, threshold=None, quorum=0, by=by, psbt=True)

    def export_psbt(self, rebalance_id: int) -> str:
        """The unsigned PSBT of an open cold -> hot move, base64 (what an offline signer takes)."""
        with self.engine.connect() as c:
            row = c.execute(_ROW_SQL, {"r": rebalance_id}).first()
        if row is None or row.psbt is None:
            raise CustodyError(CustodyErrorCode.rebalance_not_found, f"no cold -> hot move {rebalance_id}")
        if row.state != "open":
            raise CustodyError(CustodyErrorCode.invalid_state, f"cold -> hot {rebalance_id} is {row.state}", state=row.state)
        return encode(bytes(row.psbt))

    def import_psbt(self, rebalance_id: int, psbt: str, *, by: str) -> str:
        """Check a signed PSBT for an open cold -> hot move and store its transaction (`signed`; the
        worker broadcasts it); the txid. Importing it again after that answers the same txid. Codes:
        rebalance_not_found, invalid_state, psbt_malformed, psbt_transaction_mismatch,
        psbt_not_signed, psbt_signature_invalid, psbt_fee_out_of_bounds."""
        with self.engine.begin() as c:
            row = c.execute(text(f"{_ROW_SQL.text} FOR UPDATE"), {"r": rebalance_id}).first()
            if row is None or row.psbt is None:
                raise CustodyError(CustodyErrorCode.rebalance_not_found, f"no cold -> hot move {rebalance_id}")
            inputs, outputs = self._cold_plan(c, row)
            try:
                signed = extract(decode(psbt), unsigned_tx(inputs, outputs), inputs, outputs)
            except PsbtError as exc:
                raise CustodyError(CustodyErrorCode(exc.code.value), str(exc), rebalance_id=rebalance_id) from None
            if row.state != "open":
                if row.txid == signed.txid:
                    return signed.txid  # the same transaction imported again
                raise CustodyError(CustodyErrorCode.invalid_state, f"cold -> hot {rebalance_id} is {row.state}", state=row.state)
            fee = int(row.fee)
            rate = fee * 1000 // signed.vsize
            if not self.config.psbt_min_fee_rate_sat_per_kvb <= rate <= self.config.psbt_max_fee_rate_sat_per_kvb:
                raise CustodyError(CustodyErrorCode.psbt_fee_out_of_bounds, f"{rate} sat/kvB is outside the bounds",
                                   rate=rate, minimum=self.config.psbt_min_fee_rate_sat_per_kvb,
                                   maximum=self.config.psbt_max_fee_rate_sat_per_kvb)
            # the api stores the transaction; the worker records its version before it sends it (FirmMoves.broadcast)
            advance(c, "rebalance", rebalance_id, "open", "signed", txid=signed.txid, raw=signed.raw, fee=fee)
            audit(c, by, "rebalance.psbt_imported", f"rebalance:{rebalance_id}", {"txid": signed.txid, "fee": fee})
        log.info("cold -> hot %d: signed PSBT imported by %s (%s)", rebalance_id, by, signed.txid)
        return signed.txid

    def _cold_plan(self, c: Connection, row) -> tuple[list[PsbtInput], list[tuple[bytes, int]]]:
        """The inputs and outputs a cold -> hot row was built with, from its own rows."""
        cold = c.execute(text("SELECT xpub, network, tier FROM wallet WHERE chain = 'bitcoin' AND tier = 'cold'")).one()
        inputs = [self._psbt_input(k, cold) for k in self._coins(c, row.id, "cold")]
        outputs = [(address_to_script(row.destination, self.network), int(row.amount))]
        if int(row.change_amount):
            outputs.append((address_to_script(row.change_address, self.network), int(row.change_amount)))
        return inputs, outputs

    def _checked_import(self, c: Connection, r) -> bool:
        """A cold row's stored bytes (an imported PSBT's, written by the api) must be the transaction
        built from its own inputs and outputs: its txid is that transaction's (a forged `raw` is
        never sent). Other rows: False, they are checked against the versions the worker recorded."""
        row = c.execute(_ROW_SQL, {"r": r.id}).one()
        if row.source_tier != "cold":
            return False
        inputs, outputs = self._cold_plan(c, row)
        expected = _sha256d(unsigned_tx(inputs, outputs))[::-1].hex()
        fee = sum(k.amount for k in inputs) - sum(amount for _, amount in outputs)  # what the built transaction pays
        if r.txid != expected or txid_of(bytes(r.raw)) != expected or int(r.fee) != fee:
            log.error("rebalance %d: the stored transaction is not the one built from its PSBT; not sent", r.id)
            return False
        return True

    # ---- signing ------------------------------------------------------------------------------

    def _change_address(self, row) -> str:
        """Where the row's change goes: its own column (rows before migration 0038: hot receive)."""
        return row.change_address or self.hot_address

    def _sign_and_store(self, rebalance_id: int, coins: list[BtcCoin], row) -> str | None:
        change = (self._change_address(row), int(row.change_amount)) if int(row.change_amount) else None
        try:
            signed = self.signer.sign_bitcoin_rebalance(rebalance_id, coins, row.destination, int(row.amount), change)
        except SigningRefused as refused:  # the signer audited it; the rebalance stays open for an operator
            log.warning("rebalance %d not signed: %s", rebalance_id, refused)
            self.refusals.append((rebalance_id, refused.code.value))
            return None
        self._store_signed(rebalance_id, signed, int(row.fee_rate))
        log.info("rebalance %d: %d sat %s -> %s %s, fee %d sat (%s)", rebalance_id, int(row.amount), row.source_tier,
                 row.destination_tier, row.destination, signed.fee, signed.txid)
        return signed.txid

    def _store_signed(self, rebalance_id: int, signed, rate: int) -> None:
        with self.engine.begin() as c:
            self._store_version(c, rebalance_id, "open", signed, rate)

    def _resign(self, c: Connection, row_id: int, rate: int):
        """The same coins, destination and amount at `rate`, the higher fee out of the change. None
        for a cold move (its key is offline) or a move without change: one INTO hot is bumped by a
        CPFP child instead (custody.cpfp, `self.cpfp`), any other is logged; None too when the
        change cannot carry the fee."""
        row = c.execute(_ROW_SQL, {"r": row_id}).one()
        if row.source_tier == "cold" or not int(row.change_amount):
            if row.destination_tier != "hot":
                log.warning("rebalance %d (%s -> %s) is not bumped: it has no change", row_id, row.source_tier,
                            row.destination_tier)
            return None
        coins = self._coins(c, row_id, row.source_tier)
        change_script = address_to_script(self._change_address(row), self.network)
        fee = fee_for(estimate_vsize(len(coins), [address_to_script(row.destination, self.network), change_script]), rate)
        change = sum(k.amount for k in coins) - int(row.amount) - fee
        if change < dust_threshold(change_script):
            log.warning("rebalance %d: a fee of %d sat would leave dust change; not bumped", row_id, fee)
            return None
        signed = self.signer.sign_bitcoin_rebalance(row_id, coins, row.destination, int(row.amount),
                                                    (self._change_address(row), change), replaces_txid=row.txid)
        return signed, {"change_amount": change}

    def _followed(self, c: Connection, row_id: int, v) -> None:
        row = c.execute(_ROW_SQL, {"r": row_id}).one()
        total = sum(k.amount for k in self._coins(c, row_id, row.source_tier))
        c.execute(text("UPDATE rebalance SET change_amount = :ch WHERE id = :r"),
                  {"ch": total - int(row.amount) - int(v.fee), "r": row_id})

    def abandon(self, rebalance_id: int, *, by: str, reason: str) -> None:
        """An operator gives up an open (never signed and stored) rebalance: its coins are freed
        (hot coins' reservation cleared; warm and cold inputs count as reserved only while the
        rebalance is in progress)."""
        with self.engine.begin() as c:
            advance(c, "rebalance", rebalance_id, "open", "abandoned")
            c.execute(text("UPDATE wallet_utxo SET rebalance_id = NULL WHERE rebalance_id = :r"), {"r": rebalance_id})
            audit(c, by, "rebalance.abandon", f"rebalance:{rebalance_id}", {"reason": reason})

    def _book(self, c: Connection, r) -> None:
        tiers = c.execute(text("SELECT source_tier, destination_tier FROM rebalance WHERE id = :r"), {"r": r.id}).one()
        source = self.wallets.location_account("bitcoin", tiers.source_tier, "BTC")
        destination = self.wallets.location_account("bitcoin", tiers.destination_tier, "BTC")
        expense = self.wallets.firm_account("network_fees", "BTC")
        amount, fee = int(r.amount), int(r.fee)
        legs = [Transfer(destination, source, amount)] + ([Transfer(expense, source, fee)] if fee else [])
        self.ledger.post(f"rebalance:{r.id}:final", legs, kind="rebalance",
                         metadata={"rebalance_id": r.id, "txid": r.txid, "network_fee": fee,
                                   "source_tier": tiers.source_tier, "destination_tier": tiers.destination_tier}, conn=c)

    def run_once(self) -> None:
        self.rebalance_bitcoin()
        self.broadcast()
        self.track()
        self.bump_fees()
        self.cpfp.run_once()


def store_refill_approval(c: Connection, table: str, machine: str, rebalance_id: int, approvers: ApproverRegistry | None,
                          operator: str, payload: bytes, signature: ApprovalSignature | None) -> None:
    """Verify an operator's approval of a refill's `payload` at the door with the check withdrawal
    approvals use (custody.withdrawals `verify_operator_approval`: its codes; a revoked console key
    is `approver_unknown`) and store it in `table` (bitcoin `rebalance_approval`, ethereum
    `eth_rebalance_approval`), audited `<machine>.approve`; `already_acted` when that key already
    approved it. The signer verifies every stored approval again against its own keys."""
    verify_operator_approval(c, approvers, operator, payload, signature)
    assert signature is not None  # verify_operator_approval refuses None
    inserted = c.execute(text(
        f"INSERT INTO {table} (rebalance_id, operator, key_id, scheme, signed_payload, signature, "
        "authenticator_data, client_data_json) VALUES (:r, :o, :k, :s, :p, :sig, :ad, :cd) "
        "ON CONFLICT (rebalance_id, key_id) DO NOTHING RETURNING id"),
        {"r": rebalance_id, "o": operator, "k": signature.key_id, "s": signature.scheme, "p": payload,
         "sig": signature.signature, "ad": signature.authenticator_data, "cd": signature.client_data_json}).first()
    if inserted is None:
        raise CustodyError(CustodyErrorCode.already_acted, f"{operator} already approved refill {rebalance_id}")
    audit(c, operator, f"{machine}.approve", f"{machine}:{rebalance_id}", {"key_id": signature.key_id})


def _waited(c: Connection, machine: str, rebalance_id: int, ttl: dt.timedelta) -> bool:
    """Whether the row was made `ttl` or longer ago, by the database's clock (the one that stamped it)."""
    table, _ = MACHINES[machine]
    return bool(c.execute(text(f"SELECT now() - created_at >= :ttl FROM {table} WHERE id = :r"),
                          {"ttl": ttl, "r": rebalance_id}).scalar_one())


def refuse_late_approval(c: Connection, machine: str, rebalance_id: int, state: str, ttl: dt.timedelta) -> None:
    """`refill_expired` for an approval of a refill (`machine` "rebalance" or "eth_rebalance") that
    expired, or that waited `ttl` or longer and has not been expired by the worker yet: no
    approval is taken once its time is up, so a quorum is never completed late."""
    if state == "expired" or (state == "open" and _waited(c, machine, rebalance_id, ttl)):
        raise CustodyError(CustodyErrorCode.refill_expired,
                           f"refill {rebalance_id} waited {ttl} for its approvals: it expired", rebalance_id=rebalance_id)


def expire_refill(c: Connection, machine: str, rebalance_id: int, ttl: dt.timedelta, approvals: int,
                  required: int) -> bool:
    """Expire open refill `rebalance_id` (`machine` "rebalance" or "eth_rebalance") if it waited
    `ttl` or longer short of its quorum (`approvals` counted now < `required`): open -> expired,
    audited `<machine>.expire`; True when it did. Nothing of it was signed; what it reserved is
    free again with the state (bitcoin: its warm inputs count as reserved only while it is in
    progress; ethereum: a refill reserves nothing, its nonce is taken only when it is signed).
    A refill whose quorum is complete is signed, never expired."""
    if approvals >= required or not _waited(c, machine, rebalance_id, ttl):
        return False
    advance(c, machine, rebalance_id, "open", "expired")
    audit(c, "custody", f"{machine}.expire", f"{machine}:{rebalance_id}",
          {"approvals": approvals, "approvals_required": int(required), "ttl_seconds": int(ttl.total_seconds())})
    log.warning("%s %d expired: %d of %d approvals after %s", machine, rebalance_id, approvals, required, ttl)
    return True


_APPROVED = {"rebalance_approval": "rebalance", "eth_rebalance_approval": "eth_rebalance"}  # approvals -> refills


def counted_refill_approvals(c: Connection, table: str, rebalance_id: int, approvers: ApproverRegistry | None, *,
                             ttl: dt.timedelta) -> int:
    """How many distinct operators approved refill `rebalance_id` (rows of `table`) in time with a
    key that still counts now (custody.withdrawals `live_approvers`: in `approvers`, the operator's
    own, a console credential still active): what the worker compares with `approvals_required`
    before it asks the signer, so a key revoked after it approved no longer makes up a quorum.

    In time: stamped (`at`) before the refill's `created_at + ttl`, the very bound the door applies
    (`refuse_late_approval`: refused from `ttl` on), both stamps the database's clock (migration
    0049 forces them on INSERT and keeps `created_at` from moving). The door is not enough:
    custody_api may INSERT approval rows directly and set an expired bitcoin refill back to `open`,
    so a late approval stored past the door, on a refill the worker has not expired yet or one put
    back, never completes a quorum and the refill expires at the worker's pass instead of being
    signed. An approval given in time still counts after the TTL (a refill whose quorum was met in
    time is signed, never expired)."""
    refills = _APPROVED[table]
    rows = c.execute(text(f"SELECT a.operator, a.key_id FROM {table} a JOIN {refills} r ON r.id = a.rebalance_id "
                          "WHERE a.rebalance_id = :r AND a.at < r.created_at + :ttl"),
                     {"r": rebalance_id, "ttl": ttl}).all()
    return len(live_approvers(c, approvers, [(r.operator, r.key_id) for r in rows]))


def _payload(rebalance_id: int, row) -> bytes:
    return rebalance_approval_payload(rebalance_id=rebalance_id, chain="bitcoin", asset="BTC", amount=int(row.amount),
                                      source_tier=row.source_tier, destination_tier=row.destination_tier,
                                      destination=row.destination)
