"""Reconciliation: what the chain says we hold against what the books say, per asset location.

For each location and asset the figures are in minor units and must satisfy

    on_chain == books + in_transit

exactly; there is no tolerance band. `books` is what the ledger's asset-location account
(`location:<chain>:<tier>:<asset>`) says the firm holds there (minus its balance: asset locations
run negative). `in_transit` explains the moments when chain and books legitimately disagree.

Bitcoin (holdings read from our wallet index, custody.wallet_index: our outputs in the chain up to
the deposit scanner's cursor and unspent there, kept by the block walk; never the node's UTXO set,
whose `scantxoutset` takes minutes on mainnet). Every bitcoin line needs the scanner's cursor at
the pinned tip (height and hash), else it is skipped (None, logged), never guessed; the index
figure is read in the line's own snapshot, beside the books. `Line.on_chain` is the index's figure
(the seam for an independent cross-check against the node's own view, e.g. a watch-only wallet in
bitcoind, whose figure belongs beside it in the Line, so that the books are never compared only
with an index this same code built):
- deposit addresses: outputs already in blocks but not yet booked (observations seen, confirming
  or final, awaiting the credit job) are on chain and not yet in the books (+);
- hot wallet: batches mined but not yet final have left the wallet on chain while the books still
  hold them in-flight until finality (- amounts - network fee);
- sweeps mined but not yet final: gone from deposit addresses (- amount) and arrived in the hot
  wallet (+ amount - fee) on chain, booked only at finality;
- rebalances mined but not yet final: gone from their source tier (- amount - fee; the change
  stays in that tier) and arrived in their destination tier (+ amount), booked only at finality
  (custody.firm_moves.in_transit; every signed version is asked, at most one is mined);
- a CPFP child of a rebalance into hot (custody.cpfp) mined but not yet final: its fee has left
  the hot wallet on chain, booked only at its finality (- fee on the hot line).
The warm and cold wallets are each reconciled once registered (tier `warm` / `cold` in `wallet`),
the same way: their receive addresses up to the wallet's next index (rebalance destinations are
checked against the tier key's derivation at their index, custody.wallet_index), read like the
others from the wallet index. Cold is watch-only: value leaves it only through an offline-signed
PSBT (custody.rebalances).

The node's own view (custody.node_view) is put beside each bitcoin line (`Line.node`) and a tier
where it differs from the index opens a critical `wallet_index_divergence` incident (both count
coins at issued indices only, by one rule, custody.wallet_index.Issued; coins the node finds at
issued addresses that the index does not hold, paid before the index watched them, are in neither
figure and open a `wallet_index_unindexed` warning, once per tier and amount). The
cross-check fails closed: a pass that cannot read the node's figure leaves `node` None (the API's
answer shows null) and the worker's pass counts it in `node_view_health` (migration 0028; the
metric `custody_node_view_blind_seconds`); a run of such passes opens a `node_view_blind` warning
incident once it lasts `NODE_VIEW_WARN_AFTER_SECONDS` (300) and a critical one, which halts
withdrawals, at `NODE_VIEW_CRITICAL_AFTER_SECONDS` (1800) (`blind_severity`). A range the node
refuses opens a `node_view_refused` warning at once (custody.node_view.note_refusal).

Ethereum (one line per asset: ether and every configured ERC-20, for the deposit addresses issued
and for the hot address `<hot xpub>/0`; read with `eth_getBalance` and `balanceOf` at the pass's
block number, never at "latest"):
- deposit addresses: ether transfers and token `Transfer` logs already in blocks but not yet
  booked (observations seen, confirming or final) (+); deposit addresses send only sweeps;
- sweeps and their gas fundings (custody.eth_sweeps) mined but not yet final: a funding has left
  the hot address (- value - gas, ETH line) and arrived at the deposit address (+ value); a sweep
  has left the deposit address (- amount on its asset's line, - gas on the ETH line) and arrived
  at the hot address (+ amount), booked only at finality (`moves_in_transit`);
- hot address: a withdrawal transaction mined but not yet final has paid its value (ether, or the
  token for an ERC-20 transfer) and its gas (always ether: gas used x effective gas price, which
  the books take as the network fee at finality) while the books still hold the value in flight
  (- amount on its asset's line, - gas on the ETH line); a mined transaction that reverted cost
  only its gas, booked when the payout tracker fails the batch (- gas on the ETH line until then).
  Every signed version of an unbooked batch is asked (a bump's earlier version may be the one
  mined; one nonce, so at most one is). Treasury funding of the hot address is booked by
  `Payouts.book_hot_funding`; funding mined and not booked is a difference (a surplus, so a
  warning), on purpose.
- ethereum rebalances (custody.eth_rebalances) mined but not yet final: the value has left the
  source address (hot, or warm for a refill: - amount on its asset's line, - gas on the ETH line)
  and arrived at the destination's (+ amount on that tier's line), booked only at finality (`eth_rebalances.in_transit`).
- warm and cold (one line per asset each, once `eth_outer` names the tier's address: the service's
  EthRebalances sets it to the signer's warm 0/0 address and the pinned cold address): the
  address's balance at the pass's block against the tier's books, rebalances in transit
  explained. Cold is watch-only: its balance is read, never signed for.

Any other difference opens an incident with the figures (`line_severity` decides which):
- a SHORTFALL (the chain holds less than books + in transit: someone's money is missing) is
  critical, which engages the kill switch and halts every withdrawal;
- so is a SURPLUS THAT SHRANK unexplained (`shortfall_since`): a line's difference that fell since
  the line's previous pass by more than what explains a fall. Without this, an unexplained surplus
  masks a theft: +1 ETH of treasury funding not yet booked, then 0.4 ETH leaving the hot address
  unbooked, nets to a +0.6 ETH "surplus". What explains a fall: entries booked to the line's
  location account since the previous pass that follow no chain movement (`booked_off_chain`: every
  journal kind but those in `CHAIN_TRACKED_KINDS`, which custody posts for movements the line
  already counts on chain or in transit; e.g. `hot_funding`, `treasury_adjustment`), and, on deposit
  lines, deposits recorded since the previous pass in blocks that pass had already read (a scanner
  that missed a block and rescanned it: `observed_late`). Each line's previous pass is kept in
  `reconciliation_line` (difference, the running off-chain total, the highest observation id and
  the block read), written in the same transaction as the incident. A fall is reported once, as
  critical; the kill switch stays engaged until an operator releases it, and the next pass compares
  with the smaller figure. A line's first pass has nothing to compare with and is judged on its sign.
  Limits: figures are aggregates, so within one interval an off-chain booking that came with a real
  arrival (the bitcoin hot wallet sync books treasury funding as it arrives) can offset an equal
  theft (the firm holds no less than before); an off-chain booking with no coins behind it (forged
  funding) explains a fall as well as a true one does, so it masks a theft up to the surplus it
  consumes (such bookings are audited: `hot_funding` is read from the chain, adjustments need a
  quorum); a late-committing observation or booking with a
  lower id than the previous pass saw is not counted as an explanation, which errs towards halting;
- a SURPLUS (the chain holds more: nobody's money is missing) is a `warning`, opened once per line
  and amount, and does not halt anything. A surplus is inducible by anyone at will: one wei sent to
  the public ethereum hot address, or to a deposit address through a contract's internal call (the
  scanner sees top-level transfers only), third-party coins sent to a bitcoin cold address or a hot
  change address. Halting on it would hand the kill switch to anyone, repeatably. It still needs an
  explanation (unbooked treasury funding, a scanner that missed a deposit, an outgoing move booked
  that the chain does not have): it is logged as a warning on every pass until it is booked.

Each chain is read at one height of its own: the node's tip must not move while that chain's lines
are read (they are read again otherwise, up to `attempts` times, then skipped); the deposit lines
need the deposit scanner's cursor at that very block (height and hash), else they are skipped,
never guessed; and "mined" is asked of the node itself for every transaction of ours that the
books have not settled. All database figures of a line come from one REPEATABLE READ snapshot
taken after the tip was read, so a job committing meanwhile is counted on exactly one side.
Ethereum holdings cost one node call per address and asset; a production deployment with many
deposit addresses would batch them (JSON-RPC batches or a multicall contract) at the same block.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Callable

from sqlalchemy import Connection, Engine, text

from chain_adapters.base import BlockRef, ChainAdapter
from chain_adapters.errors import ChainError, NodeBusy, NodeUnavailable
from custody import wallet_index
from custody.addresses import derive_eth_address
from custody.controls import open_incident
from custody.eth_sweeps import MinedMove, moves_in_transit
from custody.eth_sweeps import unsettled as unsettled_eth_moves
from custody.eth_rebalances import MinedRebalance
from custody.eth_rebalances import in_transit as eth_rebalances_in_transit
from custody.eth_rebalances import unsettled as unsettled_eth_rebalances
from custody.cpfp import in_transit_fee
from custody.firm_moves import in_transit, unbooked
from custody.node_view import NodeView, NodeViewNotReady, record_blind, record_escalation, record_read
from custody.payouts import HOT_RECEIVE_INDEX
from custody.wallets import ChainAsset, Wallets
from ledger.service import Ledger

log = logging.getLogger(__name__)
NODE_VIEW_ATTEMPTS, NODE_VIEW_WAIT = 20, 0.1  # up to ~2 s for the node's wallet to reach the pinned tip
BLIND_WARN_AFTER, BLIND_CRITICAL_AFTER = 300.0, 1800.0  # NODE_VIEW_WARN_AFTER_SECONDS, NODE_VIEW_CRITICAL_AFTER_SECONDS
UNBOOKED_DEPOSITS = ("seen", "confirming", "final")
# Journal kinds custody posts for a chain movement the line counts itself (on chain or in transit):
# they never explain a change of the difference. Every other kind booked to a location account
# (hot_funding, treasury_adjustment, a reversal, ...) is an off-chain booking and can.
# A reversal (`Ledger.reverse`, e.g. a re-mined deposit's compensation given back) is tracked
# exactly when the transaction it reverses is: its coins came back on chain too.
CHAIN_TRACKED_KINDS = ("deposit", "deposit_quarantine", "deposit_dust", "deposit_reorg", "deposit_release",
                       "withdrawal_capture", "withdrawal_final", "network_fee", "sweep", "rebalance")


@dataclass(frozen=True)
class Line:
    chain: str
    asset: str
    tier: str
    on_chain: int
    books: int
    in_transit: int
    booked_off_chain: int = 0  # running total booked to the location account by off-chain entries (books' sign)
    observed_late: int = 0  # deposits recorded since the previous pass in blocks it had read (deposit lines)
    observation_mark: int = 0  # the highest deposit_observation id this pass's snapshot saw
    node: int | None = None  # bitcoin: the node's own figure (custody.node_view) at the same tip; None when not read

    @property
    def difference(self) -> int:
        return self.on_chain - self.books - self.in_transit


@dataclass(frozen=True)
class PreviousPass:
    """What a line's previous pass left in `reconciliation_line`."""

    difference: int
    booked_off_chain: int
    observation_mark: int
    height: int


def shortfall_since(previous: PreviousPass | None, line: Line) -> int:
    """How much the line's difference fell since `previous` beyond what explains a fall (>= 0): the
    off-chain bookings in between (which raise the books with no coin moving) and deposits recorded
    late. Positive means money left that nothing explains, whatever the difference's sign now."""
    if previous is None:
        return 0
    fell = previous.difference - line.difference
    explained = (line.booked_off_chain - previous.booked_off_chain) + line.observed_late
    return max(0, fell - explained)


def line_severity(line: Line, previous: PreviousPass | None = None) -> str | None:
    """The incident a line's difference opens: `critical` for a shortfall (chain < books + in
    transit) or a fall since the previous pass that nothing explains (`shortfall_since`; halts
    withdrawals); `warning` for a surplus (chain > books + in transit: attacker-inducible, loses no
    one's money); None when it reconciles and nothing fell."""
    if line.difference < 0 or shortfall_since(previous, line) > 0:
        return "critical"
    return "warning" if line.difference > 0 else None


def blind_severity(blind_seconds: float, warn_after: float, critical_after: float) -> str | None:
    """The incident a run of passes without the node's figure calls for, `blind_seconds` after its
    first pass: none at first (the wallet may be rescanning, a block just arrived), `warning` from
    `warn_after`, `critical` from `critical_after` (the books have been compared only with the
    index this code builds for that long)."""
    if blind_seconds >= critical_after:
        return "critical"
    return "warning" if blind_seconds >= warn_after else None


def incident_key(line: Line, tip: BlockRef, severity: str | None = None) -> str:
    """A shortfall (or an unexplained fall) is opened again at each new tip; a surplus once per line
    and amount (it is reported on every pass anyway, and a new incident per block would flood the
    queue). `severity` defaults to the line's on its own."""
    where = f"recon:{line.chain}:{line.tier}:{line.asset}"
    if (severity or line_severity(line)) == "warning":
        return f"{where}:surplus:{line.difference}"
    return f"{where}:{tip.hash}:{line.difference}"


# ---- named queries -------------------------------------------------------------------------------

_PREVIOUS_PASS_SQL = text("""
SELECT difference, booked_off_chain, observation_mark, height
FROM reconciliation_line
WHERE chain = :chain AND tier = :tier AND asset = :asset
FOR UPDATE
""")

_SAVE_PASS_SQL = text("""
INSERT INTO reconciliation_line (chain, tier, asset, difference, booked_off_chain, observation_mark, height)
VALUES (:chain, :tier, :asset, :difference, :booked_off_chain, :observation_mark, :height)
ON CONFLICT (chain, tier, asset) DO UPDATE
SET difference = EXCLUDED.difference, booked_off_chain = EXCLUDED.booked_off_chain,
    observation_mark = EXCLUDED.observation_mark, height = EXCLUDED.height, updated_at = now()
""")

# books' sign: the location account runs negative, so an entry of -x raises the books by x
_BOOKED_OFF_CHAIN_SQL = text("""
SELECT coalesce(-sum(e.amount), 0)
FROM journal_entry e
JOIN journal_transaction t ON t.id = e.transaction_id
LEFT JOIN journal_transaction o ON o.id = t.reverses_id
WHERE e.account_id = :account
AND t.kind <> ALL(:tracked)
AND NOT (t.kind = 'reversal' AND o.kind = ANY(:tracked))  -- a reversal follows the chain as what it reverses
""")

# the chain's previous deposit pass (every deposit line of a chain is saved by the same pass)
_DEPOSIT_PASS_SQL = text("""
SELECT observation_mark, height
FROM reconciliation_line
WHERE chain = :chain AND tier = 'deposit'
ORDER BY asset
LIMIT 1
""")

_OBSERVATION_MARK_SQL = text("""
SELECT coalesce(max(id), 0)
FROM deposit_observation
""")

# deposits recorded after the previous pass's snapshot for blocks that pass had already read
_OBSERVED_LATE_SQL = text("""
SELECT asset, sum(amount)
FROM deposit_observation
WHERE chain = :chain
AND id > :mark
AND block_height <= :height
AND state <> 'orphaned'
GROUP BY asset
""")


@dataclass(frozen=True)
class Unsettled:
    """A hot-address transaction of ours mined at or below the pass's block whose effect the books
    have not taken yet: it paid `amount` of `asset` (nothing if it reverted) and `gas` wei."""

    asset: str
    amount: int
    gas: int
    reverted: bool


def hot_in_transit(unsettled: Iterable[Unsettled], asset: str, *, native: str = "ETH") -> int:
    """What has left the hot address on chain but not in the books, for one asset's line (<= 0):
    the value of each successful transaction paying `asset`, and on the native line all the gas."""
    total = 0
    for u in unsettled:
        if u.asset == asset and not u.reverted:
            total -= u.amount
        if asset == native:
            total -= u.gas
    return total


class Reconciliation:
    def __init__(self, engine: Engine, ledger: Ledger, wallets: Wallets, adapters: Mapping[str, ChainAdapter], *,
                 network: str, before: Callable[[], object] | None = None, node_view: NodeView | None = None,
                 blind_warn_after: float = BLIND_WARN_AFTER, blind_critical_after: float = BLIND_CRITICAL_AFTER) -> None:
        self.before = before  # run before the bitcoin lines: the hot wallet sync books confirmed treasury funding
        self.node_view = node_view  # bitcoin: the independent cross-check of the index (custody.node_view)
        self.blind_warn_after = blind_warn_after  # seconds without the node's figure before a warning incident
        self.blind_critical_after = blind_critical_after  # ... before a critical one (halts withdrawals)
        self.engine = engine
        self.ledger = ledger
        self.wallets = wallets
        self.adapters = dict(adapters)
        self.network = network
        self.eth_outer: dict[str, str] = {}  # ethereum tier (warm, cold) -> its address: reconciled when named
        self._accounts: dict[tuple[str, str, str], int] = {}

    def run(self, *, chains: Iterable[str] | None = None, attempts: int = 3, prepare: bool = True) -> list[Line]:
        """Reconcile every location of each chain (default: every chain attached), each chain at
        one stable height; open an incident for any difference. Returns the lines compared (none
        for a chain whose tip kept moving). `prepare=False` skips the `before` hook (the worker's
        hot-wallet sync and wallet-index catch-up, which write): the api's on-demand pass, which
        reads what the worker's jobs recorded."""
        lines: list[Line] = []
        for chain in chains or self.adapters:
            lines += self._reconcile(chain, attempts, prepare)
        return lines

    def _reconcile(self, chain: str, attempts: int, prepare: bool = True) -> list[Line]:
        adapter = self.adapters[chain]
        read = self._bitcoin_lines(prepare) if chain == "bitcoin" else self._ethereum_lines()
        for _ in range(attempts):
            tip = adapter.tip()
            lines = [line for line in read(tip) if line is not None]
            if adapter.tip() == tip:
                break
        else:
            log.info("reconciliation of %s skipped: the chain kept moving", chain)
            return []
        if chain == "bitcoin":
            lines = self._cross_check(lines, tip, record=prepare)
        for line in lines:
            with self.engine.begin() as c:
                previous = self._previous(c, line)
                severity = line_severity(line, previous)
                fell = shortfall_since(previous, line)
                c.execute(_SAVE_PASS_SQL, {"chain": line.chain, "tier": line.tier, "asset": line.asset,
                                           "difference": line.difference, "booked_off_chain": line.booked_off_chain,
                                           "observation_mark": line.observation_mark, "height": tip.height})
                if severity is not None:
                    detail = {**line.__dict__, "difference": line.difference, "height": tip.height,
                              "previous_difference": previous.difference if previous else None, "unexplained_fall": fell}
                    open_incident(c, "reconciliation_difference", incident_key(line, tip, severity), detail, severity=severity)
            log.log(logging.WARNING if severity else logging.INFO,
                    "reconciliation %s/%s %s at %d: chain %d = books %d + in transit %d, difference %d", line.chain,
                    line.tier, line.asset, tip.height, line.on_chain, line.books, line.in_transit, line.difference)
        return lines

    def _cross_check(self, lines: list[Line], tip: BlockRef, record: bool = True) -> list[Line]:
        """Put the node's own figure beside each bitcoin line (read at the same pinned tip) and
        open a critical incident for a tier where it differs from the index: the books were compared
        with the index, and the index with the node, so books == node only when both agree.

        Fails closed: a pass that cannot read the node's figure leaves `node` None on its lines and
        (`record`: the worker's passes; the api's may not write `node_view_health`) counts one more
        blind pass; `blind_severity` opens a warning, then a critical incident, as the run lasts."""
        if self.node_view is None or not lines:
            return lines
        held = None
        error = ""
        for attempt in range(NODE_VIEW_ATTEMPTS):  # the wallet processes a new block a moment after the node
            try:
                view = self.node_view.read(tip)
                # the coins the index does not hold are compared apart (below): the lines were read
                # with the index at this very tip
                held = {t: amount - view.unindexed.get(t, 0) for t, amount in view.by_tier.items()}
                break
            except NodeViewNotReady as exc:
                error = exc.message
                if attempt + 1 < NODE_VIEW_ATTEMPTS:
                    time.sleep(NODE_VIEW_WAIT)
            except (NodeBusy, NodeUnavailable) as exc:  # the pass stops (a job skips its tick, the api answers 503)
                if record:  # ... and still counts as blind: a node that stays busy must not blind us unnoticed
                    self._blind(tip, str(exc))
                raise
            except ChainError as exc:  # the node refused, or the wallet holds a coin we never imported
                error = str(exc)
                break
        if held is None:
            log.warning("reconciliation of bitcoin at %d: the node's own view was not read (%s); lines compared with "
                        "the wallet index only this pass", tip.height, error)
            if record:
                self._blind(tip, error)
            return lines
        if record:
            with self.engine.begin() as c:
                record_read(c, "bitcoin", tip)
        for tier, amount in sorted(view.unindexed.items()):
            # paid to an address before the index watched it (ahead of its window), found by the
            # node's import rescan: on chain, in no book and in neither figure; a surplus anyone can
            # cause, so a warning (once per tier and amount), never the kill switch
            log.warning("the node's view holds %d sat at issued bitcoin %s addresses that the wallet index does not hold",
                        amount, tier)
            with self.engine.begin() as c:
                open_incident(c, "wallet_index_unindexed", f"wallet_index_unindexed:bitcoin:{tier}:{amount}",
                              {"tier": tier, "amount": amount, "height": tip.height, "block": tip.hash,
                               "coins": [f"{k.txid}:{k.vout}" for k in view.unindexed_coins][:100]},
                              severity="warning")
        checked = [replace(line, node=held.get(line.tier, 0)) for line in lines]
        for line in checked:
            if line.node != line.on_chain:
                detail = {"tier": line.tier, "asset": line.asset, "index": line.on_chain, "node": line.node,
                          "difference": line.on_chain - line.node, "height": tip.height, "block": tip.hash}
                log.error("wallet index and node disagree on bitcoin %s at %d: index %d, node %d", line.tier,
                          tip.height, line.on_chain, line.node)
                with self.engine.begin() as c:
                    open_incident(c, "wallet_index_divergence",
                                  f"wallet_index_divergence:bitcoin:{line.tier}:{tip.hash}:{line.on_chain}:{line.node}", detail)
        return checked

    def _blind(self, tip: BlockRef, error: str) -> None:
        """One more pass without the node's figure; escalate as `blind_severity` says."""
        with self.engine.begin() as c:
            blind = record_blind(c, "bitcoin", error)
            severity = blind_severity(blind.blind_seconds, self.blind_warn_after, self.blind_critical_after)
            if severity is None or severity == blind.severity:
                return
            log.error("the node's own view of bitcoin has not been read for %d pass(es) since %s: %s", blind.missed_passes,
                      blind.blind_since, error)
            open_incident(c, "node_view_blind", f"node_view_blind:bitcoin:{blind.blind_since.isoformat()}:{severity}",
                          {"chain": "bitcoin", "missed_passes": blind.missed_passes, "blind_since": blind.blind_since,
                           "blind_seconds": int(blind.blind_seconds), "last_error": error[:1000], "height": tip.height},
                          severity=severity)
            record_escalation(c, "bitcoin", severity)

    # ---- shared ---------------------------------------------------------------------------

    def _open_accounts(self, chain: str, tiers: Iterable[str], assets: Iterable[str]) -> None:
        """Opened (if new) before any snapshot is taken, so the snapshots can see them."""
        for tier in tiers:
            for asset in assets:
                self._accounts[(chain, tier, asset)] = self.wallets.location_account(chain, tier, asset)

    def _books(self, chain: str, tier: str, asset: str, conn: Connection) -> int:
        return -self.ledger.balance(self._accounts[(chain, tier, asset)], conn=conn).posted

    def _booked_off_chain(self, chain: str, tier: str, asset: str, conn: Connection) -> int:
        """The running total booked to the line by entries that follow no chain movement (read in
        the line's snapshot, beside its books)."""
        return int(conn.execute(_BOOKED_OFF_CHAIN_SQL, {"account": self._accounts[(chain, tier, asset)],
                                                        "tracked": list(CHAIN_TRACKED_KINDS)}).scalar_one())

    @staticmethod
    def _previous(c: Connection, line: Line) -> PreviousPass | None:
        row = c.execute(_PREVIOUS_PASS_SQL, {"chain": line.chain, "tier": line.tier, "asset": line.asset}).first()
        return PreviousPass(int(row.difference), int(row.booked_off_chain), int(row.observation_mark), int(row.height)) \
            if row else None

    @staticmethod
    def _observed_late(c: Connection, chain: str) -> tuple[dict[str, int], int]:
        """Per asset, deposits recorded since the deposit line's previous pass in blocks that pass
        had read (the scanner missed them then), and this snapshot's observation mark. Read in the
        line's snapshot; the previous pass is the one of the chain's first deposit line (every
        deposit line of a chain is saved by the same pass)."""
        mark = int(c.execute(_OBSERVATION_MARK_SQL).scalar_one())
        row = c.execute(_DEPOSIT_PASS_SQL, {"chain": chain}).first()
        if row is None:
            return {}, mark
        late = c.execute(_OBSERVED_LATE_SQL, {"chain": chain, "mark": int(row.observation_mark), "height": int(row.height)}).all()
        return {asset: int(amount) for asset, amount in late}, mark

    def _snapshot(self):
        """One REPEATABLE READ snapshot for every database figure of a line, so a job committing
        in between cannot count a deposit both as unbooked and as booked."""
        return self.engine.connect().execution_options(isolation_level="REPEATABLE READ")

    @staticmethod
    def _scanner_at(c: Connection, chain: str, tip: BlockRef, what: str = "deposit addresses") -> bool:
        cursor = c.execute(text("SELECT height, hash FROM chain_cursor WHERE chain = :c"), {"c": chain}).first()
        if cursor is None or (cursor.height, cursor.hash) != (tip.height, tip.hash):
            log.info("reconciliation of %s %s skipped: scanner at %s, chain at %d", chain, what,
                     cursor.height if cursor else None, tip.height)
            return False
        return True

    # ---- bitcoin --------------------------------------------------------------------------

    def _bitcoin_lines(self, prepare: bool = True) -> Callable[[BlockRef], list[Line | None]]:
        if prepare and self.before is not None:
            self.before()
        with self.engine.connect() as c:
            registered = set(c.execute(text("SELECT tier FROM wallet WHERE chain = 'bitcoin' AND tier IN ('warm', 'cold')"))
                             .scalars())
        outer = [t for t in ("warm", "cold") if t in registered]
        self._open_accounts("bitcoin", ("deposit", "hot", *outer), ["BTC"])
        return lambda tip: [self._deposit_addresses(tip), self._hot_wallet(tip), *(self._outer_wallet(tip, t) for t in outer)]

    def _deposit_addresses(self, tip: BlockRef) -> Line | None:
        with self._snapshot() as c, c.begin():
            if not self._scanner_at(c, "bitcoin", tip):
                return None
            on_chain = wallet_index.holdings(c, "deposit")
            arrived = c.execute(text("SELECT coalesce(sum(amount), 0) FROM deposit_observation WHERE chain = 'bitcoin' "
                                     "AND state = ANY(:s)"), {"s": list(UNBOOKED_DEPOSITS)}).scalar_one()
            books = self._books("bitcoin", "deposit", "BTC", c)
            off_chain = self._booked_off_chain("bitcoin", "deposit", "BTC", c)
            late, mark = self._observed_late(c, "bitcoin")
            sweeps = unbooked(c, "sweep")
        swept = sum(int(sw.amount) for sw in sweeps if self._mined(sw.txid, sw.raw))
        return Line("bitcoin", "BTC", "deposit", on_chain, books, int(arrived) - swept, off_chain, late.get("BTC", 0), mark)

    def _mined(self, txid: str, raw) -> bool:
        return self.adapters["bitcoin"].tx_status(txid, raw=bytes(raw)).state.value == "confirmed"

    def _hot_wallet(self, tip: BlockRef) -> Line | None:
        with self._snapshot() as c, c.begin():
            if not self._scanner_at(c, "bitcoin", tip, "hot wallet"):
                return None
            on_chain = wallet_index.holdings(c, "hot")
            pending = c.execute(text(
                "SELECT t.txid, t.raw, t.fee, (SELECT coalesce(sum(o.amount), 0) FROM batch_output o WHERE o.batch_id = t.batch_id) "
                "AS paid FROM chain_transaction t WHERE t.chain = 'bitcoin' AND t.state IN ('signed', 'broadcast', 'confirmed')")).all()
            books = self._books("bitcoin", "hot", "BTC", c)
            off_chain = self._booked_off_chain("bitcoin", "hot", "BTC", c)
            sweeps = unbooked(c, "sweep")
            rebalances = unbooked(c, "rebalance")
            children = unbooked(c, "cpfp")
        # Mined but not yet booked final: gone from the wallet on chain, still in flight in the books.
        leaving = sum(int(p.paid) + int(p.fee) for p in pending if self._mined(p.txid, p.raw))
        arriving = sum(int(sw.amount) - int(sw.fee) for sw in sweeps if self._mined(sw.txid, sw.raw))
        arriving += in_transit(rebalances, "hot", self._mined)
        arriving -= in_transit_fee(children, self._mined)  # a CPFP child's fee, mined, not booked (custody.cpfp)
        return Line("bitcoin", "BTC", "hot", on_chain, books, arriving - leaving, off_chain)

    def _outer_wallet(self, tip: BlockRef, tier: str) -> Line | None:
        """The warm or cold wallet: the index's holdings against the books, rebalances in transit explained."""
        with self._snapshot() as c, c.begin():
            if not self._scanner_at(c, "bitcoin", tip, f"{tier} wallet"):
                return None
            on_chain = wallet_index.holdings(c, tier)
            books = self._books("bitcoin", tier, "BTC", c)
            off_chain = self._booked_off_chain("bitcoin", tier, "BTC", c)
            rebalances = unbooked(c, "rebalance")
        return Line("bitcoin", "BTC", tier, on_chain, books, in_transit(rebalances, tier, self._mined), off_chain)

    # ---- ethereum -------------------------------------------------------------------------

    def _ethereum_lines(self) -> Callable[[BlockRef], list[Line | None]]:
        assets = self.wallets.chain_assets("ethereum")
        outer = dict(self.eth_outer)
        self._open_accounts("ethereum", ("deposit", "hot", *outer), [a.asset for a in assets])
        return lambda tip: [*self._eth_deposit_addresses(tip, assets), *self._eth_hot_address(tip, assets),
                            *(line for tier, address in outer.items() for line in self._eth_outer(tip, assets, tier, address))]

    def _eth_holdings(self, asset: ChainAsset, addresses: Iterable[str], height: int) -> int:
        eth = self.adapters["ethereum"]
        if asset.contract_address:
            return sum(eth.token_balance(asset.contract_address, a, block=height) for a in addresses)
        return sum(eth.balance(a, block=height) for a in addresses)

    def _eth_deposit_addresses(self, tip: BlockRef, assets: list[ChainAsset]) -> list[Line]:
        with self._snapshot() as c, c.begin():
            if not self._scanner_at(c, "ethereum", tip):
                return []
            addresses = c.execute(text("SELECT address FROM deposit_address WHERE chain = 'ethereum'")).scalars().all()
            arrived = dict(c.execute(text("SELECT asset, sum(amount) FROM deposit_observation WHERE chain = 'ethereum' "
                                          "AND state = ANY(:s) GROUP BY asset"), {"s": list(UNBOOKED_DEPOSITS)}).all())
            books = {a.asset: self._books("ethereum", "deposit", a.asset, c) for a in assets}
            off_chain = {a.asset: self._booked_off_chain("ethereum", "deposit", a.asset, c) for a in assets}
            late, mark = self._observed_late(c, "ethereum")
            moves = self._eth_moves_mined(c, tip)
        return [Line("ethereum", a.asset, "deposit", self._eth_holdings(a, addresses, tip.height), books[a.asset],
                     int(arrived.get(a.asset, 0)) + moves_in_transit(moves, "deposit", a.asset), off_chain[a.asset],
                     late.get(a.asset, 0), mark) for a in assets]

    def _eth_moves_mined(self, c: Connection, tip: BlockRef) -> list[MinedMove]:
        """Sweeps and gas fundings signed and not booked (read in the caller's snapshot) that the node
        has mined at or below the pass's block, with the gas each burnt."""
        moves = []
        for m in unsettled_eth_moves(c):
            mined = self.adapters["ethereum"].mined(m.txid)
            if mined is not None and mined.block.height <= tip.height:
                moves.append(MinedMove(m.kind, m.asset, int(m.amount), mined.fee, mined.reverted))
        return moves

    def _eth_hot_address(self, tip: BlockRef, assets: list[ChainAsset]) -> list[Line]:
        with self._snapshot() as c, c.begin():
            xpub = c.execute(text("SELECT xpub FROM wallet WHERE chain = 'ethereum' AND tier = 'hot'")).scalar_one()
            # every signed version of a batch the books have not settled (final, or failed with any
            # reverted gas booked): a replaced version may be the one mined
            versions = c.execute(text(
                "SELECT t.txid, b.asset, (SELECT coalesce(sum(o.amount), 0) FROM batch_output o WHERE o.batch_id = b.id) AS paid "
                "FROM chain_transaction t JOIN withdrawal_batch b ON b.id = t.batch_id WHERE t.chain = 'ethereum' "
                "AND t.state IN ('signed', 'broadcast', 'confirmed', 'replaced') AND b.state NOT IN ('final', 'failed')")).all()
            books = {a.asset: self._books("ethereum", "hot", a.asset, c) for a in assets}
            off_chain = {a.asset: self._booked_off_chain("ethereum", "hot", a.asset, c) for a in assets}
            moves = self._eth_moves_mined(c, tip)
            rebalances = self._eth_rebalances_mined(c, tip)
        unsettled = []
        for v in versions:
            mined = self.adapters["ethereum"].mined(v.txid)
            if mined is not None and mined.block.height <= tip.height:
                unsettled.append(Unsettled(v.asset, int(v.paid), mined.fee, mined.reverted))
        hot = derive_eth_address(xpub, HOT_RECEIVE_INDEX)
        return [Line("ethereum", a.asset, "hot", self._eth_holdings(a, [hot], tip.height), books[a.asset],
                     hot_in_transit(unsettled, a.asset, native=self.adapters["ethereum"].native_asset)
                     + moves_in_transit(moves, "hot", a.asset) + eth_rebalances_in_transit(rebalances, "hot", a.asset),
                     off_chain[a.asset])
                for a in assets]

    def _eth_rebalances_mined(self, c: Connection, tip: BlockRef) -> list[MinedRebalance]:
        """Ethereum rebalances signed and not booked (read in the caller's snapshot) that the node has
        mined at or below the pass's block, with the gas each burnt."""
        moves = []
        for m in unsettled_eth_rebalances(c):
            mined = self.adapters["ethereum"].mined(m.txid)
            if mined is not None and mined.block.height <= tip.height:
                moves.append(MinedRebalance(m.asset, int(m.amount), mined.fee, m.destination_tier, mined.reverted, m.source_tier))
        return moves

    def _eth_outer(self, tip: BlockRef, assets: list[ChainAsset], tier: str, address: str) -> list[Line]:
        """The warm or cold address: its holdings at the pass's block against the tier's books."""
        with self._snapshot() as c, c.begin():
            books = {a.asset: self._books("ethereum", tier, a.asset, c) for a in assets}
            off_chain = {a.asset: self._booked_off_chain("ethereum", tier, a.asset, c) for a in assets}
            rebalances = self._eth_rebalances_mined(c, tip)
        return [Line("ethereum", a.asset, tier, self._eth_holdings(a, [address], tip.height), books[a.asset],
                     eth_rebalances_in_transit(rebalances, tier, a.asset), off_chain[a.asset]) for a in assets]
