"""CPFP (child pays for parent) for a stuck bitcoin rebalance INTO hot that RBF cannot bump.

A rebalance into hot is re-signed at a higher fee by custody.rebalances `_resign` (RBF) only when
the worker holds its source key and it has change to take the fee from. A cold -> hot move (its
key is offline: an operator signed its PSBT) and a move without change are not; stuck in the
mempool they would wait forever. Such a parent pays our hot receive address, so the worker has
the signer sign a CHILD spending that output back to the hot receive address, whose fee pays for
both (miners take the package):

- when: the parent row is `broadcast`, still in the mempool `BumpConfig.stuck_blocks` blocks after
  it was sent (the same BumpConfig as RBF); the package rate aimed at is the parent's own rate
  raised by `bump_percent`, capped at `max_fee_rate_sat_per_kvb` (no room left: the warning
  incident `fee_ceiling_reached`, as for RBF). The child's fee makes (parent fee + child fee) /
  (parent vsize + child vsize) reach that rate (`child_fee`).
- the parent as the NODE has it: its bytes (`getrawtransaction`), vsize and own fee
  (`getmempoolentry`) through the bitcoin adapter (`raw_transaction`, `mempool_entry`), never the
  row's `raw`/`fee` (custody_api may write those for an imported PSBT: a padded witness keeps the
  txid and would inflate the child's fee). And only a move of ours (`_ours`): the parent's txid is
  a version of the row the worker recorded (`firm_tx_version`) and every coin it spends is in the
  wallet index in the row's source tier; else no child (the warning incident
  `cpfp_parent_not_ours`; custody_api can INSERT a rebalance row naming any transaction that pays
  hot). A SignerError (the signer's own sanity limits raise rather than refuse) is contained to its
  parent: the warning incident `cpfp_signer_error`, the later parents go on.
- the signer (signer.service `sign_bitcoin_cpfp`) checks it on its own: the parent's bytes are the
  row's transaction (it computes the txid), the output spent pays the hot receive address of its
  own key, the child pays only that address, one input, the fee within its ceiling (the parent's
  size counted from its txid-covered bytes with P2WPKH inputs at most), and at most
  one child per parent output (replacements only at a higher fee), from its own record.
- stored before it is sent: one `rebalance_cpfp` row per parent (UNIQUE: one child per parent;
  the parent row is locked across the signer call, so two workers make one child), every signed
  child in `firm_tx_version` (machine `cpfp`). `broadcast()`, `track()` and the RBF of the CHILD
  (never the parent) are custody.firm_moves' (this class is one more machine): a child still in
  the mempool `stuck_blocks` blocks after it was sent is replaced by one at the next package rate
  (`_resign`), kept only while the parent waits too.
- booked at finality, once, the mined version's fee only: key `cpfp:<id>:final`, hot location
  credited the fee, network-fee expense debited (kind `network_fee`). The parent is booked by its
  own rebalance row as always (`rebalance:<id>:final`, its own fee).
- dropped (`dropped`, nothing booked) when the parent is final and no version of the child is
  mined or in the mempool: the parent was mined alone and the child is gone.
- the hot wallet: the child spends the parent's output at the hot receive address and pays the
  hot receive address, so the wallet index's block walk sees both (custody.wallet_index). Coin
  selection (custody.payouts `spendable_coins`) never takes a parent output a child in progress
  spends, and takes a child's output once the child is final (booked); `hot_coin_origin` counts a
  child's output as ours, never as treasury funding.
- reconciliation: a child mined but not booked yet has taken its fee from the hot line on chain:
  `- fee` in transit there (custody.reconciliation `_hot_wallet`, `in_transit_fee`).
"""
from __future__ import annotations

import logging

from sqlalchemy import Connection, Engine, text

from chain_adapters.base import ChainAdapter, TxState
from chain_adapters.errors import ChainError
from custody.controls import audit, kill_switch, open_incident
from custody.firm_moves import BumpConfig, FirmMoves, bumped_rate, is_stuck
from custody.states import advance
from custody.wallets import Wallets
from ledger.model import Transfer
from ledger.service import Ledger
from signer.bitcoin_tx import ParsedTx, address_to_script, estimate_vsize, fee_for, parse_transaction
from signer.errors import SignerError
from signer.protocol import SignerPort, SigningRefused

log = logging.getLogger(__name__)
MIN_RELAY_SAT_PER_KVB = 1_000  # Bitcoin Core's default minrelaytxfee and incrementalrelayfee

# Rebalances into hot that RBF cannot bump (cold source, or no change), sent, with no child yet.
_PARENTS_SQL = text("""
SELECT r.id, r.txid, r.raw, r.fee, r.amount, r.broadcast_height, r.source_tier
FROM rebalance r
WHERE r.chain = 'bitcoin'
  AND r.state = 'broadcast'
  AND r.containment = 'active'
  AND r.destination_tier = 'hot'
  AND (r.source_tier = 'cold' OR r.change_amount = 0)
  AND NOT EXISTS (SELECT 1 FROM rebalance_cpfp p WHERE p.rebalance_id = r.id)
ORDER BY r.id
""")
_INSERT_SQL = text("""
INSERT INTO rebalance_cpfp (rebalance_id, parent_txid, parent_vout, amount, state, txid, raw, fee, fee_rate)
VALUES (:r, :pt, :pv, :a, 'signed', :t, :raw, :f, :fr)
RETURNING id
""")
_VERSION_SQL = text("INSERT INTO firm_tx_version (machine, row_id, txid, raw, fee, fee_rate) "
                    "VALUES ('cpfp', :i, :t, :raw, :f, :fr)")
# The parent is a version of this rebalance the worker recorded (firm_tx_version: the worker's own
# signature, or an imported cold PSBT that passed `Rebalances._checked_import` before it was sent).
_RECORDED_SQL = text("SELECT 1 FROM firm_tx_version WHERE machine = 'rebalance' AND row_id = :r AND txid = :t")
_INPUT_TIER_SQL = text("SELECT tier FROM btc_wallet_output WHERE txid = :t AND vout = :v")
_ROW_SQL = text("""
SELECT p.id, p.rebalance_id, p.parent_txid, p.parent_vout, p.txid, p.fee, r.raw AS parent_raw, r.fee AS parent_fee,
       r.state AS parent_state
FROM rebalance_cpfp p
JOIN rebalance r ON r.id = p.rebalance_id
WHERE p.id = :i
""")


def child_fee(parent_fee: int, parent_vsize: int, child_vsize: int, rate_sat_per_kvb: int,
              replaces_fee: int | None = None) -> int:
    """The child's fee (sat) so that the package (parent + child) pays `rate_sat_per_kvb`: at least
    the minimum relay rate for the child alone, and for a replacement of a child that paid
    `replaces_fee`, more than it by the incremental relay fee for its size (BIP 125 rule 4)."""
    for name, value in (("parent_fee", parent_fee), ("parent_vsize", parent_vsize), ("child_vsize", child_vsize),
                        ("rate_sat_per_kvb", rate_sat_per_kvb)):
        if type(value) is not int or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    fee = max(fee_for(parent_vsize + child_vsize, rate_sat_per_kvb) - parent_fee, fee_for(child_vsize, MIN_RELAY_SAT_PER_KVB))
    if replaces_fee is not None:
        fee = max(fee, replaces_fee + fee_for(child_vsize, MIN_RELAY_SAT_PER_KVB))
    return fee


def in_transit_fee(children: list, mined) -> int:
    """What CPFP children mined but not booked took from the hot line on chain: the sum of their
    fees (`children`: custody.firm_moves `unbooked(c, "cpfp")`; at most one version of a child can
    be mined). Reconciliation subtracts it from the hot line's in-transit figure."""
    return sum(int(ch.fee) for ch in children if mined(ch.txid, ch.raw))


class Cpfp(FirmMoves):
    """The children of stuck rebalances into hot (module docstring). Jobs, in order: `bump_fees()`
    (new children, then RBF of stuck children), `broadcast()`, `track()`."""

    machine = "cpfp"

    def __init__(self, engine: Engine, ledger: Ledger, wallets: Wallets, bitcoin: ChainAdapter, signer: SignerPort, *,
                 hot_address: str, network: str, bump: BumpConfig | None = None) -> None:
        super().__init__(engine, ledger, wallets, bitcoin, bump)
        self.signer = signer
        self.hot_address = hot_address
        self.network = network
        self.refusals: list[tuple[int, str]] = []  # (rebalance id, refusal code), most recent last

    @property
    def _hot_script(self) -> bytes:
        return address_to_script(self.hot_address, self.network)

    @property
    def child_vsize(self) -> int:
        """The child's virtual size, an upper bound: one P2WPKH input, one output to hot receive."""
        return estimate_vsize(1, [self._hot_script])

    # ---- new children -------------------------------------------------------------------

    def bump_fees(self) -> list[str]:
        """A child for every stuck parent without one (stored, then sent), then an RBF of every
        stuck child (custody.firm_moves); the new child txids."""
        if kill_switch(self.engine).engaged:
            return []
        with self.engine.connect() as c:
            parents = c.execute(_PARENTS_SQL).all()
        new = []
        for r in parents:
            try:
                txid = self._first_child(r)
            except SigningRefused as refused:  # the signer audited it; the parent waits as it is
                log.warning("rebalance %d: CPFP child refused: %s", r.id, refused)
                self.refusals.append((r.id, refused.code.value))
                continue
            except SignerError as exc:
                # the signer's own sanity limits (sign_batch: e.g. `fee_exceeds_maximum`) raise, not
                # refuse: contained to this parent (a warning incident), the later parents go on
                self._signer_error(r, exc)
                continue
            except ChainError as exc:
                log.warning("rebalance %d: CPFP not made now (%s); tried again next run", r.id, exc)
                continue
            if txid is not None:
                new.append(txid)
        if new:
            self.broadcast()
        return new + super().bump_fees()

    def _signer_error(self, r, exc: SignerError) -> None:
        log.error("rebalance %d: CPFP child not signed, signer error: %s", r.id, exc)
        self.refusals.append((r.id, exc.code.value))
        with self.engine.begin() as c:
            open_incident(c, "cpfp_signer_error", f"cpfp_signer_error:{r.id}:{r.txid}",
                          {"rebalance_id": r.id, "txid": r.txid, "code": exc.code.value, "message": str(exc)},
                          severity="warning")

    def _node_parent(self, txid: str) -> tuple[bytes, ParsedTx, int, int] | None:
        """The parent as the NODE has it in its mempool: (raw, parsed, vsize, fee), or None when it
        is not there. Never the rebalance row's `raw`/`fee`: custody_api may rewrite those (an
        imported PSBT's columns), and a padded witness keeps the txid but inflates the size, hence
        the child's fee. The node holds the valid witness (the one it relays)."""
        entry = self.bitcoin.mempool_entry(txid)
        raw = self.bitcoin.raw_transaction(txid) if entry is not None else None
        if entry is None or raw is None:
            return None
        parent = parse_transaction(raw)
        if parent.txid != txid:
            raise ChainError(f"the node's transaction for {txid} is {parent.txid}")
        return raw, parent, int(entry.vsize), int(entry.fee)

    def _ours(self, c: Connection, r, parent: ParsedTx) -> bool:
        """Whether the parent is a move into hot this service made from the row's source tier: its
        txid is a version of the row the worker recorded (`firm_tx_version`, never written by
        custody_api), and every coin it spends is one the wallet index (`btc_wallet_output`, the
        worker's) holds in that tier. custody_api may INSERT or rewrite a rebalance row naming any
        transaction that pays the hot receive address (a sweep, a stranger's deposit): no child of
        those is ever asked for."""
        if c.execute(_RECORDED_SQL, {"r": r.id, "t": parent.txid}).first() is None:
            return False
        return all(c.execute(_INPUT_TIER_SQL, {"t": t, "v": v}).scalar() == r.source_tier for t, v in parent.inputs)

    def _not_ours(self, r) -> None:
        log.error("rebalance %d: %s is not a move of ours from %s into hot; no CPFP", r.id, r.txid, r.source_tier)
        self.refusals.append((r.id, "unknown_input"))
        with self.engine.begin() as c:
            open_incident(c, "cpfp_parent_not_ours", f"cpfp_parent_not_ours:{r.id}:{r.txid}",
                          {"rebalance_id": r.id, "txid": r.txid, "source_tier": r.source_tier}, severity="warning")

    def _first_child(self, r) -> str | None:
        tip = self.bitcoin.tip().height
        if not is_stuck(tip, r.broadcast_height, self.bump):
            return None
        if self.bitcoin.tx_status(r.txid, raw=bytes(r.raw)).state is not TxState.MEMPOOL:
            return None
        node = self._node_parent(r.txid)
        if node is None:
            return None
        raw, parent, parent_vsize, parent_fee = node
        with self.engine.connect() as c:
            ours = self._ours(c, r, parent)
        if not ours:
            self._not_ours(r)
            return None
        vout = next((i for i, (amount, script) in enumerate(parent.outputs)
                     if script == self._hot_script and amount == int(r.amount)), None)
        if vout is None:
            log.error("rebalance %d: no output of %s pays %d sat to the hot receive address; no CPFP", r.id, r.txid,
                      int(r.amount))
            return None
        parent_rate = parent_fee * 1000 // parent_vsize
        rate = bumped_rate(parent_rate, self.bump)
        if rate is None:
            self._ceiling(r.txid, "rebalance", r.id, parent_rate)
            return None
        fee = child_fee(parent_fee, parent_vsize, self.child_vsize, rate)
        with self.engine.begin() as c:
            # the parent locked across the signer call: a second worker waits, then finds the child and stops
            current = c.execute(text("SELECT txid FROM rebalance WHERE id = :i AND state = 'broadcast' FOR NO KEY UPDATE"),
                                {"i": r.id}).scalar()
            if current != r.txid or c.execute(text("SELECT 1 FROM rebalance_cpfp WHERE rebalance_id = :r"),
                                              {"r": r.id}).first() is not None:
                return None
            signed = self.signer.sign_bitcoin_cpfp(r.id, raw, vout, self.hot_address, fee)
            child_id = c.execute(_INSERT_SQL, {"r": r.id, "pt": r.txid, "pv": vout, "a": parent.outputs[vout][0],
                                               "t": signed.txid, "raw": signed.raw, "f": signed.fee, "fr": rate}).scalar_one()
            c.execute(_VERSION_SQL, {"i": child_id, "t": signed.txid, "raw": signed.raw, "f": signed.fee, "fr": rate})
            audit(c, "custody", "rebalance.cpfp", f"rebalance:{r.id}",
                  {"cpfp_id": child_id, "parent": r.txid, "txid": signed.txid, "fee": signed.fee, "rate": rate})
        log.info("rebalance %d stuck: CPFP child %s pays %d sat (package at %d sat/kvB)", r.id, signed.txid, signed.fee, rate)
        return signed.txid

    def _ceiling(self, txid: str, machine: str, row_id: int, rate: int) -> None:
        with self.engine.begin() as c:
            open_incident(c, "fee_ceiling_reached", f"fee_ceiling:{machine}:{txid}",
                          {"machine": machine, "id": row_id, "txid": txid, "rate": rate, "cpfp": True}, severity="warning")

    # ---- replacing a child (FirmMoves._bump_one calls this, the child row locked) ----------------

    def _resign(self, c: Connection, row_id: int, rate: int):
        """A replacement of the child at package rate `rate`, or None when its parent is no longer
        waiting (mined: the child needs no help; the child follows by itself)."""
        row = c.execute(_ROW_SQL, {"i": row_id}).one()
        if row.parent_state != "broadcast" or self.bitcoin.tx_status(row.parent_txid).state is not TxState.MEMPOOL:
            return None
        node = self._node_parent(row.parent_txid)  # the node's figures, never the row's (see _node_parent)
        if node is None:
            return None
        raw, _, parent_vsize, parent_fee = node
        fee = child_fee(parent_fee, parent_vsize, self.child_vsize, rate, replaces_fee=int(row.fee))
        signed = self.signer.sign_bitcoin_cpfp(row.rebalance_id, raw, row.parent_vout, self.hot_address,
                                               fee, replaces_txid=row.txid)
        return signed, {}

    # ---- tracking and booking -------------------------------------------------------------

    def _track_one(self, r, finality: int) -> int:
        """FirmMoves' step, except a child that is neither mined nor in the mempool (no version
        of it) once its parent is final: dropped, nothing booked, never sent again."""
        if r.state == "broadcast":
            state = self.bitcoin.tx_status(r.txid, raw=bytes(r.raw)).state
            if state not in (TxState.CONFIRMED, TxState.MEMPOOL) and self._parent_final(r.id):
                other, _ = self._live_version(r)
                if other is None:
                    with self.engine.begin() as c:
                        advance(c, self.machine, r.id, "broadcast", "dropped")
                        audit(c, "custody", "cpfp.dropped", f"cpfp:{r.id}", {"txid": r.txid, "reason": "parent final alone"})
                    log.info("cpfp %d: the parent is final without the child %s; dropped, nothing booked", r.id, r.txid)
                    return 0
        return super()._track_one(r, finality)

    def _parent_final(self, row_id: int) -> bool:
        with self.engine.connect() as c:
            return c.execute(_ROW_SQL, {"i": row_id}).one().parent_state == "final"

    def _book(self, c: Connection, r) -> None:
        row = c.execute(_ROW_SQL, {"i": r.id}).one()
        fee = int(r.fee)
        hot = self.wallets.location_account("bitcoin", "hot", "BTC")
        expense = self.wallets.firm_account("network_fees", "BTC")
        self.ledger.post(f"cpfp:{r.id}:final", [Transfer(expense, hot, fee)], kind="network_fee",
                         metadata={"cpfp_id": r.id, "rebalance_id": row.rebalance_id, "txid": r.txid,
                                   "parent_txid": row.parent_txid, "network_fee": fee}, conn=c)

    def run_once(self) -> None:
        self.bump_fees()
        self.broadcast()
        self.track()

