"""Ethereum rebalances: ether and ERC-20 tokens out of the hot address to warm or cold over the ceiling.

A rebalance never changes what a customer is owed: it moves value between two of the firm's own
asset locations (`location:ethereum:<tier>:<asset>`), and the gas goes to the network-fee expense
account (ETH). Thresholds are custody.rebalances' `RebalanceThreshold` (per asset, minor units:
wei, token base units), in `EthRebalanceConfig.thresholds`.

What is built (issue 16, ethereum), two directions in one table (`eth_rebalance`):
| direction | when | who signs | approval |
| --- | --- | --- | --- |
| hot -> warm or cold (`excess_to`) | hot spendable above `ceiling`: moves spendable - `target` | the signer (hot key) | none: value stays the firm's |
| warm -> hot (refill) | hot spendable below `floor`: moves `target` - spendable | the signer (warm key) | `refill_quorum` operators' SIGNED approvals (payload kind `rebalance-approval`, chain "ethereum"), verified by custody at the door (`approve_refill`) and by the signer against its own keys |
A refill needs ether at the warm address for its gas: warm must HOLD ETH (booked at the warm
location, e.g. from an earlier hot -> warm move of ether); custody opens a refill only when warm's
booked ether covers the gas limit x max fee (plus the amount, for an ether refill), and never funds
warm from hot. One refill at a time (the warm address sends nothing else, so its nonce is the
signer's last warm record + 1 or the node's pending count; a partial unique index backs it).
Operators approve over `POST /v1/eth-rebalances/{id}/approve` (custody.api.treasury_routes), which
calls `approve_refill`. Approvals are counted, and a refill short of its quorum after
`EthRebalanceConfig.refill_ttl` (policy data) expires, as bitcoin refills do (custody.rebalances
`counted_refill_approvals`, `expire_refill`, `refuse_late_approval`).

Destinations, never a custody row: warm is the signer's own warm key (ethereum account "warm",
0/0); cold is an address PINNED in the signer's configuration (`cold_addresses.ethereum`,
signer.config). Custody holds its own copy of both (`warm_address`, `EthRebalanceConfig.cold_address`)
to build the row and to reconcile; the signer derives or pins the address again itself and builds
the transfer itself (ether as the value, or `transfer(destination, amount)` to the contract of its
own asset table), refusing a row that names anything else (signer.service `sign_ethereum_rebalance`).

Hot spendable S (`hot_spendable`): what the books hold at the hot location for the asset, never
more than the hot address holds on chain, less what hot transactions signed and not booked may
still take from it (withdrawal batches, gas fundings, rebalances: value and, on the ETH line, their
gas limit x max fee). Over the ceiling the row moves S - target; the gas is paid by the hot
address in ether on top (a token move needs S(ETH) >= gas limit x max fee; an ether move needs the
target to cover it), so hot keeps target - gas. At most one unfinished rebalance per asset out of
hot (a partial unique index backs it); none is opened while the kill switch is engaged.

The hot nonce (crash-safe, no holes): a row has no nonce until it is signed. `sign()` takes it in
the signing transaction, under the row lock of the hot counter `eth_nonce` (the counter withdrawals
and gas fundings use), held across the signer call as custody.payouts holds it for withdrawals
(`allocate_hot_nonce`): the signer's own record of this rebalance first (a signature committed
whose reply custody lost: the same slot again, the same RFC 6979 txid), else max(counter, highest
hot nonce the signer recorded for anything + 1). A refusal or a crash before the store rolls the
counter back with the rest: the nonce was never used, so no hole; a crash after the signer
committed leaves a record no allocator hands out again. The signed bytes are stored before
anything is broadcast; broadcasting is idempotent.

Books (kind `rebalance`, at the ETH finality depth), ONE journal transaction per row, key
`eth_rebalance:<id>:final`: destination location <- source location (amount, its asset);
network-fee expense <- source ETH (the gas the mined transaction burnt). A transaction mined but
reverted (a token refusing the transfer): `eth_rebalance:<id>:reverted`, the gas only. Before
finality reconciliation explains a mined row as in transit (`in_transit`): - amount on the source
line of its asset and - gas on the source ETH line, + amount on the destination tier's line.

Jobs (`run_once()` runs them in order; each is callable alone): `decide()`, `sign()`,
`broadcast()`, `bump_fees()`, `track()`; the last three are custody.eth_moves' (shared with
ethereum sweeps): a rebalance stuck in the mempool is replaced at the same nonce with higher fees,
every version kept (`eth_tx_version`), the mined one booked with its own gas. Failures: a node or database error is retried next run; any other failure
opens an `eth_rebalance_failed` incident (critical in broadcast or track, where the transaction may
be on chain; else a warning); a signer refusal opens an `eth_rebalance_refused` warning (the row
stays open, retried every run, its nonce given back); a transaction of ours whose nonce something
else consumed opens a critical `eth_rebalance_nonce_conflict`.
"""
from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from sqlalchemy import Connection, Engine, text

from chain_adapters.ethereum import EthereumAdapter
from custody.controls import audit, kill_switch, open_incident
from custody.eth_moves import HOT_NONCE_RECORDED_SQL, EthBumpConfig, EthMoves, unsettled_versions
from custody.eth_sweeps import gas_limit_with_margin
from custody.rebalances import (RebalanceThreshold, amount_to_move, counted_refill_approvals, expire_refill, refill_amount,
                                refuse_late_approval, store_refill_approval)
from custody.states import advance
from custody.wallets import Wallets
from ledger.model import Transfer
from ledger.service import Ledger
from policies.rules import DEFAULT_REFILL_TTL
from signer.ethereum_tx import SignedEthTx, erc20_transfer_data
from custody.errors import CustodyError, CustodyErrorCode
from signer.approvals import ApprovalSignature, ApproverRegistry, rebalance_approval_payload
from signer.protocol import SignerPort, SigningRefused

log = logging.getLogger(__name__)
MACHINE = "eth_rebalance"
UNSETTLED = ("signed", "broadcast", "confirmed")  # signed, maybe mined, not booked yet
IN_PROGRESS = ("open",) + UNSETTLED


@dataclass(frozen=True)
class EthRebalanceConfig:
    """Per asset (ETH, each ERC-20) the hot address's thresholds; the pinned cold address (custody's
    copy: the signer checks its own); the max fee per gas a rebalance is signed at; the gas margin
    over the node's estimate."""

    thresholds: Mapping[str, RebalanceThreshold] = field(default_factory=dict)
    cold_address: str | None = None
    refill_quorum: int = 2  # distinct operators who must sign a warm -> hot refill (the signer applies its own too)
    max_fee_wei: int = 500 * 10**9
    gas_margin_percent: int = 10
    refill_ttl: dt.timedelta = DEFAULT_REFILL_TTL  # policy data (PolicySet.refill_ttl): how long a refill waits for its quorum


@dataclass(frozen=True)
class MinedRebalance:
    """An ethereum rebalance mined and not booked yet: what it carried and the gas it burnt (wei)."""

    asset: str
    amount: int
    gas: int
    destination_tier: str
    reverted: bool = False
    source_tier: str = "hot"


def in_transit(moves: Iterable[MinedRebalance], tier: str, asset: str, *, native: str = "ETH") -> int:
    """What mined, unbooked rebalances moved on chain but not yet in the books, for one
    reconciliation line (`tier` hot, warm or cold; `asset`), signed as the chain moved it: the
    source tier lost the value and (ETH line) the gas, the destination tier gained the value."""
    total = 0
    for m in moves:
        moved = 0 if m.reverted else m.amount
        if tier == m.source_tier:
            total -= moved if m.asset == asset else 0
            total -= m.gas if asset == native else 0
        elif tier == m.destination_tier and m.asset == asset:
            total += moved
    return total


# ---- named queries -------------------------------------------------------------------------------

# the warm address sends refills only: its next nonce by the signer's own record
_WARM_RECORDED_SQL = text("""
SELECT max(nonce) FROM signer_eth_rebalance WHERE chain_id = :ci AND lower(sender) = lower(:a)
""")
_RECORDED_FOR_SQL = text("""
SELECT nonce FROM signer_eth_rebalance WHERE rebalance_id = :r AND chain_id = :ci AND lower(sender) = lower(:a)
ORDER BY id DESC LIMIT 1
""")

# what hot transactions signed and not booked may still take from the hot address, per asset
_HOT_OUTGOING_SQL = text("""
SELECT asset, sum(amount) AS amount FROM (
    SELECT b.asset, (SELECT coalesce(sum(o.amount), 0) FROM batch_output o WHERE o.batch_id = b.id) AS amount
    FROM withdrawal_batch b WHERE b.chain = 'ethereum' AND b.state IN ('signed', 'broadcast', 'confirmed')
    UNION ALL
    SELECT 'ETH', t.fee FROM withdrawal_batch b JOIN chain_transaction t ON t.batch_id = b.id
    WHERE b.chain = 'ethereum' AND b.state IN ('signed', 'broadcast', 'confirmed')
      AND t.state IN ('signed', 'broadcast', 'confirmed')
      AND NOT EXISTS (SELECT 1 FROM chain_transaction n WHERE n.replaces_id = t.id)
    UNION ALL
    SELECT 'ETH', amount + gas_limit * max_fee_wei FROM eth_gas_funding WHERE state IN ('open', 'signed', 'broadcast', 'confirmed')
    UNION ALL
    SELECT asset, amount FROM eth_rebalance WHERE source_tier = 'hot' AND state = ANY(:busy)
    UNION ALL
    SELECT 'ETH', gas_limit * max_fee_wei FROM eth_rebalance WHERE source_tier = 'hot' AND state = ANY(:busy)
) o
GROUP BY asset
""")

_CURRENT_SQL = text("SELECT id FROM eth_rebalance WHERE asset = :a AND source_tier = 'hot' AND state = ANY(:busy) LIMIT 1")
_REFILL_CURRENT_SQL = text("SELECT id FROM eth_rebalance WHERE source_tier = 'warm' AND state = ANY(:busy) LIMIT 1")
_INSERT_SQL = text("""
INSERT INTO eth_rebalance (asset, source_tier, destination_tier, destination, amount, spendable, ceiling, target, floor,
                           approvals_required, gas_limit, max_fee_wei, priority_fee_wei, state)
VALUES (:asset, :src, :tier, :d, :amount, :s, :ceil, :tgt, :floor, :q, :gas, :max_fee, :priority, 'open')
RETURNING id
""")
_ROW_SQL = text("""
SELECT id, asset, source_tier, destination_tier, destination, amount, state, approvals_required
FROM eth_rebalance WHERE id = :r
""")
_OPEN_SQL = text("SELECT id FROM eth_rebalance WHERE state = 'open' ORDER BY id")
_CLAIM_SQL = text("""
SELECT id, asset, source_tier, destination_tier, amount, gas_limit, max_fee_wei, priority_fee_wei, approvals_required
FROM eth_rebalance WHERE id = :i AND state = 'open' FOR UPDATE SKIP LOCKED
""")


def unsettled(c: Connection) -> list:
    """Every signed version of the rebalances signed and not booked (asset, amount, source_tier,
    destination_tier, txid): reconciliation asks the node which is mined and at what gas
    (`in_transit`); one nonce per row, so at most one version of a row is."""
    return unsettled_versions(c, MACHINE, "m.asset, m.amount, m.source_tier, m.destination_tier", UNSETTLED)


def allocate_hot_nonce(c: Connection, address: str, *, chain_id: int, node_nonce: Callable[[], int]) -> int:
    """The next hot-address nonce, gap-free, in the caller's (signing) transaction: the `eth_nonce`
    row lock (custody.payouts' counter) is held until that transaction ends, across the signer
    call; never a nonce the signer recorded anything at (module docstring). `node_nonce` seeds the
    counter the first time (the node's pending count)."""
    c.execute(text("INSERT INTO eth_nonce (address, next_nonce) VALUES (:a, :n) ON CONFLICT DO NOTHING"),
              {"a": address, "n": node_nonce()})
    counter = int(c.execute(text("SELECT next_nonce FROM eth_nonce WHERE address = :a FOR UPDATE"), {"a": address}).scalar_one())
    # a statement after the lock: it sees what a signer committed while this worker waited for it
    recorded = c.execute(HOT_NONCE_RECORDED_SQL, {"a": address, "ci": chain_id}).scalar()
    nonce = max(counter, int(recorded) + 1 if recorded is not None else 0)
    c.execute(text("UPDATE eth_nonce SET next_nonce = :n WHERE address = :a"), {"n": nonce + 1, "a": address})
    return nonce


class _Refused(Exception):
    """A signer refusal inside the signing transaction: raised to roll it back (the nonce with it)."""

    def __init__(self, refused: SigningRefused) -> None:
        super().__init__(str(refused))
        self.refused = refused


class EthRebalances(EthMoves):
    tables = (MACHINE,)
    prefix = "eth_rebalance"
    label = "eth rebalance"

    def _advance(self, c: Connection, table: str, row_id: int, from_state: str, to_state: str, **columns: object) -> None:
        advance(c, table, row_id, from_state, to_state, **columns)  # this module's name (a crash test replaces it)

    def __init__(self, engine: Engine, ledger: Ledger, wallets: Wallets, ethereum: EthereumAdapter, signer: SignerPort, *,
                 hot_address: str, warm_address: str | None, config: EthRebalanceConfig | None = None,
                 approvers: ApproverRegistry | None = None, bump: EthBumpConfig | None = None) -> None:
        super().__init__(engine, ledger, wallets, ethereum, signer, hot_address=hot_address, bump=bump)
        self.approvers = approvers  # custody's check of a refill approval at the door; the signer checks again
        self.warm_address = warm_address  # the signer's warm 0/0 address (its xpub), custody's copy
        self.config = config or EthRebalanceConfig()
        self.refusals: list[tuple[int, str]] = []  # (rebalance id, refusal code), most recent last

    def destinations(self) -> dict[str, str]:
        """tier -> address of the tiers this service can move to (and reconciles)."""
        return {t: a for t, a in (("warm", self.warm_address), ("cold", self.config.cold_address)) if a}

    def run_once(self) -> None:
        self.decide()
        self.sign()
        self.broadcast()
        self.bump_fees()
        self.track()

    # ---- decide ---------------------------------------------------------------------------------

    def hot_spendable(self, c: Connection, asset: str) -> int:
        """S for `asset` (module docstring), read in the caller's transaction."""
        books = -self.ledger.balance(self.wallets.location_account("ethereum", "hot", asset), conn=c).posted
        contract = self.wallets.chain_asset(asset, conn=c).contract_address
        on_chain = (self.ethereum.token_balance(contract, self.hot_address) if contract
                    else self.ethereum.balance(self.hot_address))
        outgoing = {r.asset: int(r.amount) for r in c.execute(_HOT_OUTGOING_SQL, {"busy": list(IN_PROGRESS)})}
        return max(0, min(books, on_chain) - outgoing.get(asset, 0))

    def decide(self) -> list[int]:
        """Open one rebalance per asset whose hot spendable is above its ceiling (none while one of
        that asset is unfinished, or the kill switch is engaged); their ids."""
        if kill_switch(self.engine).engaged:
            return []
        made = []
        for asset, threshold in sorted(self.config.thresholds.items()):
            rebalance_id = self._guard("decide", 0, lambda asset=asset, threshold=threshold: self._decide_one(asset, threshold))
            if rebalance_id is not None:
                made.append(rebalance_id)
        return made

    def _decide_one(self, asset: str, threshold: RebalanceThreshold) -> int | None:
        return self._decide_out(asset, threshold) or self._decide_refill(asset, threshold)

    def _books(self, c: Connection, tier: str, asset: str) -> int:
        return -self.ledger.balance(self.wallets.location_account("ethereum", tier, asset), conn=c).posted

    def _fees(self) -> tuple[int, int]:
        fee = self.ethereum.estimate_fee()
        max_fee = min(fee.max_fee_wei, self.config.max_fee_wei)
        return max_fee, min(max(fee.priority_fee_wei, 1), max_fee)

    def _gas(self, sender: str, asset: str, destination: str, amount: int) -> int:
        contract = self.wallets.chain_asset(asset).contract_address
        if contract:
            estimate = self.ethereum.estimate_gas(sender, contract, data=erc20_transfer_data(destination, amount))
        else:
            estimate = self.ethereum.estimate_gas(sender, destination, value=amount)
        return gas_limit_with_margin(estimate, self.config.gas_margin_percent)

    def _decide_refill(self, asset: str, threshold: RebalanceThreshold) -> int | None:
        """Hot below its floor: a warm -> hot refill of target - spendable, open for approvals."""
        if threshold.floor is None or self.warm_address is None:
            return None
        max_fee, priority = self._fees()
        with self.engine.begin() as c:
            c.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"), {"k": "eth_rebalance:warm"})
            if c.execute(_REFILL_CURRENT_SQL, {"busy": list(IN_PROGRESS)}).first() is not None:
                return None
            spendable = self.hot_spendable(c, asset)
            amount = refill_amount(spendable, threshold)
            if amount == 0:
                return None
            warm_asset, warm_eth = self._books(c, "warm", asset), self._books(c, "warm", "ETH")
            if warm_asset < amount:
                log.warning("hot %s is below its floor but warm holds %d of the %d a refill needs", asset, warm_asset, amount)
                return None
            gas = self._gas(self.warm_address, asset, self.hot_address, amount)
            if warm_eth - (amount if asset == "ETH" else 0) < gas * max_fee:
                log.warning("refill of %d %s: warm holds too little ether for its gas (%d wei booked)", amount, asset, warm_eth)
                return None
            rebalance_id = c.execute(_INSERT_SQL, {
                "asset": asset, "src": "warm", "tier": "hot", "d": self.hot_address, "amount": amount, "s": spendable,
                "ceil": threshold.ceiling, "tgt": threshold.target, "floor": threshold.floor, "q": self.config.refill_quorum,
                "gas": gas, "max_fee": max_fee, "priority": priority}).scalar_one()
            audit(c, "custody", "eth_rebalance.create", f"eth_rebalance:{rebalance_id}",
                  {"asset": asset, "source_tier": "warm", "destination_tier": "hot", "amount": str(amount),
                   "spendable": str(spendable), "floor": str(threshold.floor), "target": str(threshold.target),
                   "approvals_required": self.config.refill_quorum, "gas_limit": gas, "max_fee_wei": str(max_fee)})
        log.info("eth refill %d: %d %s warm -> hot, waits for %d approvals", rebalance_id, amount, asset, self.config.refill_quorum)
        return rebalance_id

    # ---- refill approvals -------------------------------------------------------------------

    def refill_payload(self, rebalance_id: int) -> bytes:
        """The bytes an operator signs to approve ethereum refill `rebalance_id` (signer.approvals)."""
        with self.engine.connect() as c:
            row = c.execute(_ROW_SQL, {"r": rebalance_id}).first()
        if row is None or row.source_tier != "warm":
            raise CustodyError(CustodyErrorCode.rebalance_not_found, f"no ethereum warm -> hot refill {rebalance_id}")
        return _payload(row)

    def approve_refill(self, rebalance_id: int, *, operator: str, signature: ApprovalSignature | None) -> int:
        """An operator's signed approval of an open ethereum refill, verified here against
        `approvers` before it is stored (the signer verifies it again against its own keys); the
        number of distinct operators who approved it. Codes, in the order checked:
        rebalance_not_found, refill_expired (it waited `refill_ttl` or longer: custody.rebalances
        `refuse_late_approval`), invalid_state, approval_signature_required, approver_unknown,
        approval_scheme_mismatch, approval_signature_invalid, approver_not_caller, already_acted.

        The row is read without a lock: custody_api may not lock `eth_rebalance` (FOR UPDATE needs an
        UPDATE privilege the api has not; it is the worker's table, read-only for the api). Nothing
        needs one: an open refill's amount and destination never change, approvals only ever add,
        and the worker counts them in its signing transaction (the signer again, itself), so an
        approval stored as the row leaves `open` is a late extra row that changes nothing."""
        with self.engine.begin() as c:
            row = c.execute(_ROW_SQL, {"r": rebalance_id}).first()
            if row is None or row.source_tier != "warm":
                raise CustodyError(CustodyErrorCode.rebalance_not_found, f"no ethereum warm -> hot refill {rebalance_id}")
            refuse_late_approval(c, MACHINE, rebalance_id, row.state, self.config.refill_ttl)
            if row.state != "open":
                raise CustodyError(CustodyErrorCode.invalid_state, f"refill {rebalance_id} is {row.state}", state=row.state)
            store_refill_approval(c, "eth_rebalance_approval", MACHINE, rebalance_id, self.approvers, operator, _payload(row),
                                  signature)
            return counted_refill_approvals(c, "eth_rebalance_approval", rebalance_id, self.approvers,
                                            ttl=self.config.refill_ttl)

    # ---- hot over its ceiling -----------------------------------------------------------------

    def _decide_out(self, asset: str, threshold: RebalanceThreshold) -> int | None:
        destination = self.destinations().get(threshold.excess_to)
        if destination is None:
            log.warning("eth rebalance of %s: no %s address configured", asset, threshold.excess_to)
            return None
        contract = self.wallets.chain_asset(asset).contract_address
        max_fee, priority = self._fees()
        with self.engine.begin() as c:
            c.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"), {"k": f"eth_rebalance:hot:{asset}"})
            if c.execute(_CURRENT_SQL, {"a": asset, "busy": list(IN_PROGRESS)}).first() is not None:
                return None
            spendable = self.hot_spendable(c, asset)
            amount = amount_to_move(spendable, threshold)
            if amount == 0:
                return None
            gas = self._gas(self.hot_address, asset, destination, amount)
            ether_left = (spendable - amount) if not contract else self.hot_spendable(c, "ETH")
            if ether_left < gas * max_fee:
                log.warning("eth rebalance of %d %s: the hot address cannot pay its gas (%d wei left, %d needed)", amount, asset,
                            ether_left, gas * max_fee)
                return None
            rebalance_id = c.execute(_INSERT_SQL, {"asset": asset, "src": "hot", "tier": threshold.excess_to, "d": destination,
                                                   "amount": amount, "s": spendable, "ceil": threshold.ceiling,
                                                   "tgt": threshold.target, "floor": threshold.floor, "q": 0, "gas": gas,
                                                   "max_fee": max_fee, "priority": priority}).scalar_one()
            audit(c, "custody", "eth_rebalance.create", f"eth_rebalance:{rebalance_id}",
                  {"asset": asset, "destination_tier": threshold.excess_to, "destination": destination, "amount": str(amount),
                   "spendable": str(spendable), "ceiling": str(threshold.ceiling), "target": str(threshold.target),
                   "gas_limit": gas, "max_fee_wei": str(max_fee)})
        log.info("eth rebalance %d: %d %s hot -> %s %s", rebalance_id, amount, asset, threshold.excess_to, destination)
        return rebalance_id

    # ---- sign -----------------------------------------------------------------------------------

    def sign(self) -> list[str]:
        """Sign every open rebalance; each in one transaction with its hot nonce (module docstring)."""
        if kill_switch(self.engine).engaged:
            return []
        with self.engine.connect() as c:
            ids = c.execute(_OPEN_SQL).scalars().all()
        signed = []
        for rebalance_id in ids:
            txid = self._guard("sign", rebalance_id, lambda rebalance_id=rebalance_id: self._sign_one(rebalance_id))
            signed += [txid] if txid else []
        return signed

    def _sign_one(self, rebalance_id: int) -> str | None:
        chain_id = self.ethereum.chain_id
        try:
            with self.engine.begin() as c:
                row = c.execute(_CLAIM_SQL, {"i": rebalance_id}).first()
                if row is None:
                    return None
                if row.source_tier == "warm":
                    return self._sign_refill(c, row, chain_id)
                recorded = c.execute(_RECORDED_FOR_SQL, {"r": rebalance_id, "ci": chain_id, "a": self.hot_address}).scalar()
                # the counter's row lock, taken either way: it serialises every hot-address signing
                allocated = allocate_hot_nonce(c, self.hot_address, chain_id=chain_id,
                                               node_nonce=lambda: self.ethereum.nonce(self.hot_address))
                if recorded is not None:  # signed before, reply lost: the same slot; the counter was past it already
                    c.execute(text("UPDATE eth_nonce SET next_nonce = :n WHERE address = :a"), {"n": allocated, "a": self.hot_address})
                nonce = int(recorded) if recorded is not None else allocated
                try:
                    tx = self.signer.sign_ethereum_rebalance(
                        rebalance_id, asset=row.asset, amount=int(row.amount), destination_tier=row.destination_tier,
                        chain_id=chain_id, nonce=nonce, gas=int(row.gas_limit), max_fee_wei=int(row.max_fee_wei),
                        priority_fee_wei=int(row.priority_fee_wei))
                except SigningRefused as refused:
                    raise _Refused(refused) from None
                self._store_signed(c, MACHINE, rebalance_id, tx, gas=int(row.gas_limit), max_fee_wei=int(row.max_fee_wei),
                                   priority_fee_wei=int(row.priority_fee_wei), nonce=nonce)
        except _Refused as exc:  # rolled back: the nonce is back in the counter, the row stays open
            log.warning("eth rebalance %d not signed: %s", rebalance_id, exc.refused)
            self.refusals.append((rebalance_id, exc.refused.code.value))
            with self.engine.begin() as c:
                open_incident(c, "eth_rebalance_refused", f"eth_rebalance_refused:{rebalance_id}:{exc.refused.code.value}",
                              {"id": rebalance_id, "code": exc.refused.code.value, "message": exc.refused.message},
                              severity="warning")
            return None
        log.info("eth rebalance %d signed: %s (hot nonce %d)", rebalance_id, tx.txid, nonce)
        return tx.txid

    def _sign_refill(self, c: Connection, row, chain_id: int) -> str | None:
        """A refill, once `approvals_required` distinct operators signed it (custody's count; the
        signer counts again itself), at the warm address's next nonce (module docstring)."""
        approvals = counted_refill_approvals(c, "eth_rebalance_approval", row.id, self.approvers,
                                             ttl=self.config.refill_ttl)
        if expire_refill(c, MACHINE, row.id, self.config.refill_ttl, approvals, int(row.approvals_required)):
            return None  # the next decide() opens a fresh refill if hot is still below its floor
        if approvals < int(row.approvals_required):
            log.info("eth refill %d waits for approvals (%d of %d)", row.id, approvals, int(row.approvals_required))
            return None
        warm = self.warm_address
        c.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"), {"k": f"eth_rebalance:sender:{warm.lower()}"})
        recorded = c.execute(_RECORDED_FOR_SQL, {"r": row.id, "ci": chain_id, "a": warm}).scalar()
        if recorded is not None:
            nonce = int(recorded)
        else:
            highest = c.execute(_WARM_RECORDED_SQL, {"ci": chain_id, "a": warm}).scalar()
            nonce = max(self.ethereum.nonce(warm), int(highest) + 1 if highest is not None else 0)
        try:
            tx = self.signer.sign_ethereum_rebalance(
                row.id, asset=row.asset, amount=int(row.amount), destination_tier="hot", chain_id=chain_id, nonce=nonce,
                gas=int(row.gas_limit), max_fee_wei=int(row.max_fee_wei), priority_fee_wei=int(row.priority_fee_wei))
        except SigningRefused as refused:
            raise _Refused(refused) from None
        self._store_signed(c, MACHINE, row.id, tx, gas=int(row.gas_limit), max_fee_wei=int(row.max_fee_wei),
                           priority_fee_wei=int(row.priority_fee_wei), nonce=nonce)
        log.info("eth refill %d signed: %s (warm nonce %d)", row.id, tx.txid, nonce)
        return tx.txid

    # ---- fee bumps (custody.eth_moves) ----------------------------------------------------------

    def _resign(self, c: Connection, table: str, row, max_fee_wei: int, priority_fee_wei: int) -> SignedEthTx:
        return self.signer.sign_ethereum_rebalance(
            row.id, asset=row.asset, amount=int(row.amount), destination_tier=row.destination_tier,
            chain_id=self.ethereum.chain_id, nonce=int(row.nonce), gas=int(row.gas_limit), max_fee_wei=max_fee_wei,
            priority_fee_wei=priority_fee_wei, replaces_txid=row.txid)

    def _conflict_incident(self, table: str, row_id: int, txid: str, status: str) -> tuple[str, dict]:
        return f"eth_rebalance_nonce_conflict:{row_id}", {"id": row_id, "txid": txid, "status": status}

    def _book(self, c: Connection, table: str, rebalance_id: int, gas: int, *, reverted: bool) -> None:
        """The row's journal transaction (module docstring, "Books"), in the caller's transaction."""
        row = c.execute(text("SELECT asset, source_tier, destination_tier, amount, txid FROM eth_rebalance WHERE id = :i"),
                        {"i": rebalance_id}).one()
        source = self.wallets.location_account("ethereum", row.source_tier, row.asset, conn=c)
        legs = [] if reverted else [Transfer(self.wallets.location_account("ethereum", row.destination_tier, row.asset, conn=c),
                                             source, int(row.amount))]
        if gas:
            legs.append(Transfer(self.wallets.firm_account("network_fees", "ETH", conn=c),
                                 self.wallets.location_account("ethereum", row.source_tier, "ETH", conn=c), gas))
        outcome = "reverted" if reverted else "final"
        if legs:
            self.ledger.post(f"eth_rebalance:{rebalance_id}:{outcome}", legs, kind="rebalance",
                             metadata={"eth_rebalance_id": rebalance_id, "asset": row.asset, "txid": row.txid, "gas": gas,
                                       "source_tier": row.source_tier, "destination_tier": row.destination_tier,
                                       "reverted": reverted},
                             conn=c)
        audit(c, "custody", f"eth_rebalance.{outcome}", f"eth_rebalance:{rebalance_id}",
              {"txid": row.txid, "amount": str(row.amount), "gas": str(gas)})


def _payload(row) -> bytes:
    return rebalance_approval_payload(rebalance_id=int(row.id), chain="ethereum", asset=row.asset, amount=int(row.amount),
                                      source_tier=row.source_tier, destination_tier=row.destination_tier,
                                      destination=row.destination)
