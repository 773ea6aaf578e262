"""Paying approved withdrawals: batch -> sign -> broadcast -> confirm -> final, and fee bumps.

Jobs (APScheduler runs them; tests call them directly, in this order):
- `sync_hot_wallet()`: record the bitcoin hot wallet's confirmed coins (read from the wallet index,
  custody.wallet_index, after catching it up to the tip; never the node's UTXO set); coins that are not ours
  (`hot_coin_origin`) are treasury funding and are booked equity -> hot location. Ours is the exact
  change output of a payout (recorded when it was signed) or an output of our sweeps and
  rebalances (which pay no one else). Any other output of a payout that lands on a hot address is
  a withdrawal that paid the firm's own address (a change address derived further ahead than
  custody.destinations refuses): it is booked as funding too, so the books hold what the chain
  holds and the coin is spendable like any other, and a warning incident names it, for an
  operator to settle with the customer. Never silently ours: the payout already took it out of the
  books, so taken as change it would be spendable and unbooked, a difference on every pass.
- `book_ethereum_funding(txid, by=)` (an operator action, `POST /v1/treasury/hot-funding`; ethereum
  has no hot-wallet sync): books what one final treasury transaction paid the ethereum hot address,
  from the chain's own figures (its ether value; each configured token's `Transfer` log to the hot
  address), equity -> hot location, once per chain identifier.
- `batch_bitcoin()`: approved BTC withdrawals (rescreened against the denylist: a newly denylisted
  destination is rejected and released, the rest go on) become one batch; coins are selected from
  the tracked hot-wallet coins and reserved for it. `batch_ethereum()`: one batch per withdrawal.
- `sign_open_batches()`: the signer (which re-checks everything itself) signs each open batch; in
  ONE database transaction the ledger's answer to the capture is read before the signer is asked
  (`_try_capture`, `Ledger.check_post`: the posting's refusals in one read-only statement, no
  locks; a capture the ledger would refuse never reaches the signer, and no balance row stays
  locked across the call), the signer signs, then the holds are captured (customer -> in-flight,
  quoted fee -> fee income), the signed raw transaction is stored in `chain_transaction` and the
  rows move to `signed`. The capture is posted once, after the signature. Why that is as safe as
  the trial posting it replaces (issue 20: the trial in a rolled-back savepoint
  posted every batch's 1,000 legs twice): (1) nothing is signed unless a hold covers it: the
  signer itself refuses any withdrawal whose hold is not live (it reads the committed hold), and
  neither the trial nor the check holds anything across the call; (2) a signed transaction is
  always booked: a signature is stored (and so can be broadcast) only in the database transaction
  that posts its capture, and a refused capture rolls the store back with it; (3) the check's
  answer is advisory in both designs (the trial's locks were released before the call): what
  changes between it and the real capture is caught by the real capture, as before. A refusal the
  check does not read (the NUMERIC range) only moves the refusal after the signature, where a
  refused capture was always possible: the signature is not stored, the signer's record pins the
  batch (below) and the step fails contained. A crash before that commit leaves nothing
  signed on record, and nothing unrecorded is ever broadcast. That transaction locks the batch row
  first and holds it across the signer call (`_claim_batch`, NO KEY UPDATE SKIP LOCKED; on
  ethereum the `eth_nonce` row too): it blocks only a second worker in the same step (a job lock
  lost mid-run, see custody.jobs) or an operator acting on that batch; the second worker skips a
  batch being signed and leaves one signed meanwhile, so the signer is asked once and nothing is
  stored or captured twice.
  The signer keeps its own record of what it signed (`signer_signature`, committed before it
  answers) and signs a withdrawal again only in a conflicting transaction. A signature recorded
  but not stored here (a lost reply, a rollback after the signer committed, a capture refused
  after its answer) therefore pins its withdrawal (`_signer_recorded`): it stays in its batch on
  the coins reserved to it (bitcoin) or the nonce recorded for it (ethereum, `_batch_nonce`; new
  nonces skip every recorded one), and the next attempt re-signs the same slot, which the signer
  accepts even after the decision expired (signer.service). A `decision_expired` refusal (the
  batch waited past its withdrawals' decision TTL, never signed: the signer down, the kill switch
  on) would repeat on every run: `drop_expired` takes the withdrawals whose decision expired and
  that the signer never signed back to `approved` (the batch is abandoned, its coins freed, when
  it empties), and the next batching run re-decides them.
  Any other refusal that names ONE withdrawal (`SigningRefused.withdrawal_id`: an approver the
  signer no longer knows, a quorum its own table raised, a destination denylisted since batching)
  would hold every other withdrawal of the batch the same way: `drop_refused` takes that one out
  (back to the operators under a fresh decision, or rejected with its hold released, by code:
  BACK_TO_OPERATORS, REJECTED_ON_REFUSAL) with a warning incident, and the rest is signed on the
  next run. A refusal naming no withdrawal (kill switch, inputs, fee) leaves the batch open.
  Approver keys are counted again at both steps (`Withdrawals.lapsed_quorum`, the rule refills
  use): an approved withdrawal whose approvals no longer make its quorum with the keys that count
  now (a console credential revoked, an approver removed from `approvers`, after it approved) is
  not batched, and one batched meanwhile is taken out before its batch is signed (`drop_lapsed`;
  not one the signer already signed in that batch); either goes back to the operators under a fresh
  decision (`withdrawal.quorum_lapsed`). The signer counts its own configured keys and cannot see a
  console revocation until the entry leaves its configuration.
- `broadcast()`: sends every stored signed transaction (idempotent at the adapter: a transaction
  the node already has is success). A crash after sending but before recording re-sends the same
  bytes, which the node answers as already known: one payment.
- `track()`: follows each broadcast transaction; at the asset's finality depth the books move
  in-flight -> hot wallet location and the actual network fee hot location -> network-fee expense,
  exactly once (keys per withdrawal and per batch). A version replaced by a fee bump is marked
  `replaced`; a transaction conflicted by something that is not ours fails the batch: the
  captures are reversed with compensating transactions and the withdrawals are released.
- `bump_fees()`: a version pending for `stuck_blocks` or more is re-signed at a higher fee (RBF on
  bitcoin with the same coins and outputs; the same nonce on ethereum), linked by `replaces`; the
  version is locked across the signer call (`_claim_version`), so two workers bump it once.

Failures stay contained (custody.containment): each batch's signing, broadcast record, tracking
and fee bump runs in its own database transaction; a batch whose step fails (its capture or final
booking refused by the ledger, say) is set aside with an incident (critical once its transaction
was broadcast) and skipped by every step afterwards, while the other batches go on. An operator
retries it (`retry_batch`) once the cause is fixed; it then books exactly once. A hot-wallet coin
whose funding booking fails opens a critical incident and is tried again next run.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Mapping

from sqlalchemy import Connection, Engine, text

from chain_adapters.base import ChainAdapter, TxState, Utxo
from chain_adapters.errors import ChainError
from custody.addresses import derive_btc_address, derive_eth_address
from custody.containment import Retried, Step, contained, error_code, is_passing, reactivate
from custody.controls import DRAIN, audit, emit, flag, kill_switch, open_incident, set_flag
from custody.deposits import reopen_returns, returns_reorged_out
from custody.destinations import HOT_RECEIVE_INDEX, DestinationGuard, eth_payout_call
from custody.errors import CustodyError, CustodyErrorCode
from custody.eth_moves import HOT_NONCE_RECORDED_SQL
from custody.incidents import frozen_accounts
from custody.states import advance, advance_many
from custody.wallet_index import issued_rule
from custody.wallets import Wallets
from custody.withdrawals import HOLD_OWNER
from ledger.errors import ErrorCode, LedgerError
from ledger.model import PostResult, Transfer
from ledger.service import Ledger
from signer.bitcoin_tx import address_to_script, dust_threshold, estimate_vsize, fee_for, select_coins
from signer.errors import SignerError, SignerErrorCode
from signer.protocol import BatchOutput, BtcCoin, RefusalCode, SignerPort, SigningRefused

log = logging.getLogger(__name__)

# Which of our transactions is `:t`: a payout version, a sweep or rebalance (the row's transaction, or any
# signed version of it, custody.firm_moves: whichever is mined); no row for anyone else's.
_TX_KIND_SQL = text("""
SELECT 'payout' FROM chain_transaction WHERE txid = :t
UNION ALL
SELECT 'sweep' FROM sweep WHERE txid = :t
UNION ALL
SELECT 'rebalance' FROM rebalance WHERE txid = :t
UNION ALL
SELECT machine FROM firm_tx_version WHERE txid = :t
LIMIT 1
""")


# Is ethereum transaction `:t` (sent by `:s`) ours, so never treasury funding (`book_ethereum_funding`):
# a payout, sweep or rebalance txid, an ethereum sweep or gas funding (custody.eth_sweeps), or any
# transaction sent from one of our deposit addresses (only our sweeps leave them).
_OURS_ETH_TXID_SQL = text("""
SELECT 1 FROM chain_transaction WHERE txid = :t
UNION ALL
SELECT 1 FROM sweep WHERE txid = :t
UNION ALL
SELECT 1 FROM rebalance WHERE txid = :t
UNION ALL
SELECT 1 FROM eth_sweep WHERE txid = :t
UNION ALL
SELECT 1 FROM eth_gas_funding WHERE txid = :t
UNION ALL
SELECT 1 FROM deposit_address WHERE chain = 'ethereum' AND lower(address) = lower(:s)
LIMIT 1
""")


# What the signer recorded (its own `signer_signature`, which custody may read): the nonce of a
# withdrawal's signatures, the highest nonce it signed from an address, any signature of a batch's
# withdrawals in that batch. A withdrawal with a record stays on the coins or nonce it was signed
# over (`Payouts._signer_recorded`).
_RECORDED_NONCE_SQL = text("""
SELECT nonce FROM signer_signature
WHERE withdrawal_id = :w AND chain = 'ethereum' AND chain_id = :ci AND lower(sender) = lower(:a)
ORDER BY id DESC LIMIT 1
""")
# every hot-address transaction the signer recorded: withdrawals, gas fundings and ethereum rebalances,
# whose nonce a rolled-back signing transaction gave back to the counter but the signer holds (one
# statement for custody's allocators: custody.eth_moves)
_MAX_RECORDED_NONCE_SQL = HOT_NONCE_RECORDED_SQL
_RECORDED_SQL = text("""
SELECT DISTINCT withdrawal_id FROM signer_signature WHERE batch_id = :b AND withdrawal_id = ANY(:w)
""")


def hot_coin_origin(*, known: bool, tx_kind: str | None) -> str:
    """What a confirmed coin at a hot address is, from whether (txid, vout) is recorded already
    (`known`) and which of our transactions made it (`tx_kind`: payout, sweep, rebalance, cpfp, or
    None): `known` (our payout change, recorded when signed; or seen before), `ours` (sweep,
    rebalance or CPFP child output, custody.cpfp: booked by its own finality), `misdirected` (another output of our payout: a withdrawal
    paid our address), `funding` (anyone else's transaction)."""
    if known:
        return "known"
    if tx_kind in ("sweep", "rebalance", "cpfp"):
        return "ours"
    return "misdirected" if tx_kind == "payout" else "funding"


# Capture refusals over a hold that is no longer live: the signer reads the same committed hold and
# refuses it itself (hold_not_live), so it is asked anyway (Payouts._capture_first). Not hold_expired:
# an expired hold can still read `pending` until the expiry job runs.
SIGNER_REFUSES = frozenset({ErrorCode.hold_not_found, ErrorCode.hold_already_resolved, ErrorCode.hold_owner_mismatch,
                            ErrorCode.hold_account_mismatch, ErrorCode.hold_exceeded})

# What `drop_refused` does with the ONE withdrawal a signer's refusal names (SigningRefused.withdrawal_id)
# in a batch nothing was recorded for: back to the operators under a fresh decision (approval
# problems: Withdrawals.return_to_operators), or rejected with its hold released (the reason given).
# Codes not listed (decision_expired: `drop_expired`; no_decision, hold_not_live, withdrawal_not_batched,
# output_mismatch: custody's own rows were changed underneath it or disagree, for a person to look at)
# leave the batch as it is, with a warning incident naming the withdrawal; so do refusals naming none.
BACK_TO_OPERATORS = frozenset({RefusalCode.approval_unsigned, RefusalCode.approver_unknown,
                               RefusalCode.approval_signature_invalid, RefusalCode.approval_replayed,
                               RefusalCode.approval_payload_mismatch, RefusalCode.decision_not_approved})
REJECTED_ON_REFUSAL: Mapping[RefusalCode, str] = {
    RefusalCode.destination_denied: "destination_sanctioned",  # the reason batching's rescreen gives
    RefusalCode.destination_internal: "destination_internal",
    RefusalCode.asset_unknown: "asset_unknown",  # the signer pays no such asset: nothing operators can approve
}


@dataclass(frozen=True)
class PayoutConfig:
    bitcoin_network: str = "regtest"
    max_batch_outputs: int = 500
    stuck_blocks: int = 3
    bump_percent: int = 50  # each bump raises the fee rate by this much
    max_fee_rate_sat_per_kvb: int = 500_000  # ceiling for bitcoin bumps
    max_fee_wei: int = 500 * 10**9  # ceiling for ethereum max fee per gas
    drain_per_run: int = 10  # outage drain: withdrawals released per batch run, smallest first


def spendable_coins(c: Connection) -> list[BtcCoin]:
    """Unreserved, unspent hot coins whose creating transaction is confirmed (external ones are):
    a swept coin only once its sweep is final (booked), rebalance change once the rebalance is
    mined, a coin a rebalance brought into hot (warm or cold -> hot) once it is final (booked) and
    no CPFP child in progress spends it, a CPFP child's output once the child is final (custody.cpfp). They are locked (skipping coins another job has locked) for the caller's transaction,
    so withdrawal batches and rebalances never reserve the same coin.

    Only a coin the wallet index (custody.wallet_index) holds, unspent, in the chain up to the
    scanner's cursor is selected: not one it holds as spent in a block (whoever spent it: a
    transaction of ours marks its coins `spent_by` when signed; anything else spending a hot coin
    is not ours to sign over again, and reconciliation reports the difference), and not one it
    does not hold at all (its block was reorged out and its transaction double-spent, or its
    block is not walked yet: a confirmed change output becomes selectable once the scanner has
    walked its block, which the payouts job's hot-wallet sync does first).

    Databases older than the index (migration 0023): a coin recorded in `wallet_utxo` before the
    index existed is in no block the index walked, so it is not selected (it stays in the books
    and in reconciliation's hot line as a shortfall until it is indexed). No backfill is built:
    before upgrading a live deployment past 0023, spend the hot wallet down to coins created after
    the upgrade's cursor, or plan a one-off backfill of `btc_wallet_output` from `wallet_utxo` and
    the node's `gettxout` (`python -m custody rescan --tier hot` shows what the UTXO set holds, and
    writes nothing)."""
    rows = c.execute(text(
        "SELECT u.txid, u.vout, u.amount, u.derivation_change, u.derivation_index FROM wallet_utxo u "
        "LEFT JOIN chain_transaction t ON t.txid = u.txid LEFT JOIN firm_tx_version v ON v.txid = u.txid "
        "LEFT JOIN sweep s ON s.id = coalesce(CASE WHEN v.machine = 'sweep' THEN v.row_id END, "
        "(SELECT x.id FROM sweep x WHERE x.txid = u.txid)) "
        "LEFT JOIN rebalance r ON r.id = coalesce(CASE WHEN v.machine = 'rebalance' THEN v.row_id END, "
        "(SELECT x.id FROM rebalance x WHERE x.txid = u.txid)) "
        "LEFT JOIN rebalance_cpfp p ON v.machine = 'cpfp' AND p.id = v.row_id "
        "WHERE u.spent_by IS NULL AND u.reserved_by IS NULL AND u.rebalance_id IS NULL "
        "AND (p.id IS NULL OR p.state = 'final') "
        "AND NOT EXISTS (SELECT 1 FROM rebalance_cpfp q WHERE q.parent_txid = u.txid AND q.parent_vout = u.vout "
        "AND q.state IN ('signed', 'broadcast', 'confirmed')) "
        "AND (t.id IS NULL OR t.state IN ('confirmed', 'final')) AND (s.id IS NULL OR s.state = 'final') "
        "AND (r.id IS NULL OR r.state = 'final' OR (r.state = 'confirmed' AND r.destination_tier <> 'hot')) "
        "AND EXISTS (SELECT 1 FROM btc_wallet_output o WHERE o.txid = u.txid AND o.vout = u.vout AND o.spent_txid IS NULL) "
        "ORDER BY u.amount DESC FOR UPDATE OF u SKIP LOCKED")).all()
    return [BtcCoin(r.txid, r.vout, int(r.amount), r.derivation_change, r.derivation_index) for r in rows]


class Payouts:
    def __init__(self, engine: Engine, ledger: Ledger, wallets: Wallets, adapters: Mapping[str, ChainAdapter],
                 signer: SignerPort, config: PayoutConfig | None = None) -> None:
        self.engine = engine
        self.ledger = ledger
        self.wallets = wallets
        self.adapters = adapters
        self.signer = signer
        self.config = config or PayoutConfig()
        self.refusals: list[tuple[int, str]] = []  # (batch id, refusal code), most recent last
        self.withdrawals = None  # custody.withdrawals.Withdrawals: re-decides approvals that expired unpaid
        self.destinations = DestinationGuard(engine, wallets, adapters)  # re-checked as each withdrawal is batched
        self.catch_up: Callable[[], object] | None = None  # brings the wallet index to the tip (Deposits.catch_up)

    # ---- hot wallet -----------------------------------------------------------------------

    def hot_xpub(self, chain: str) -> str:
        with self.engine.connect() as c:
            return c.execute(text("SELECT xpub FROM wallet WHERE chain = :c AND tier = 'hot'"), {"c": chain}).scalar_one()

    def hot_address(self, chain: str, change: int = 0, index: int = HOT_RECEIVE_INDEX) -> str:
        if chain == "bitcoin":
            return derive_btc_address(self.hot_xpub(chain), self.config.bitcoin_network, change, index)
        return derive_eth_address(self.hot_xpub(chain), index)

    def book_hot_funding(self, chain: str, asset: str, amount: int, key: str, *, conn: Connection | None = None,
                         metadata: dict | None = None) -> PostResult:
        """Treasury moved `amount` into the hot wallet from outside: equity -> hot location. Idempotent
        by `key` (the same key and content again books nothing: `created` is False)."""
        hot = self.wallets.location_account(chain, "hot", asset, conn=conn)
        equity = self.wallets.firm_account("equity", asset, conn=conn)
        return self.ledger.post(key, [Transfer(hot, equity, amount)], kind="hot_funding", metadata=metadata, conn=conn)

    def book_ethereum_funding(self, txid: str, *, by: str) -> list[dict]:
        """Book what mined transaction `txid` paid the ethereum hot address, read from the chain:
        the ether it carried (to == hot, value > 0; key `hot-funding:ethereum:<txid>:value`) and each
        `Transfer` log of a configured token contract (chain_asset.contract_address) to the hot
        address (key `hot-funding:ethereum:<txid>:log<index>`), all in one database transaction
        with an audit record naming `by`. Calling it again books nothing more (each item comes
        back with created=False). Answers one dict per item: asset, amount (minor units), source
        ("value" or "log<index>"), key, transaction_id (the journal's) and created.

        Refused (CustodyError): `funding_not_mined` (not in the main chain), `funding_reverted`,
        `funding_own_transaction` (sent by the hot address or by one of our deposit addresses, or a
        txid of ours in chain_transaction, sweep, rebalance, eth_sweep or eth_gas_funding: the
        payout and sweep flows book those), `funding_not_to_hot` (nothing reached the
        hot address), `funding_not_final` (fewer confirmations than the finality depth of any asset
        it pays: a reorg must never reach the books)."""
        txid = txid.strip().lower()
        if len(txid) != 66 or not txid.startswith("0x") or any(ch not in "0123456789abcdef" for ch in txid[2:]):
            raise ValueError(f"{txid!r} is not an ethereum transaction hash")
        adapter = self.adapters["ethereum"]
        hot = self.hot_address("ethereum").lower()
        seen = adapter.transfers(txid)
        if seen is None:
            raise CustodyError(CustodyErrorCode.funding_not_mined, f"{txid} is not mined in the main chain", txid=txid)
        with self.engine.connect() as c:
            ours = c.execute(_OURS_ETH_TXID_SQL, {"t": txid, "s": seen.sender}).first()
            tokens = {r.contract_address.lower(): r.asset for r in c.execute(text(
                "SELECT asset, contract_address FROM chain_asset WHERE chain = 'ethereum' AND contract_address IS NOT NULL"))}
        if ours is not None or seen.sender.lower() == hot:
            raise CustodyError(CustodyErrorCode.funding_own_transaction,
                               f"{txid} is the hot wallet's own transaction; its payout flow books it", txid=txid)
        if seen.reverted:
            raise CustodyError(CustodyErrorCode.funding_reverted, f"{txid} reverted; it moved no value", txid=txid)
        items: list[tuple[str, int, str]] = []  # (asset, amount, source)
        if seen.to is not None and seen.to.lower() == hot and seen.value > 0:
            items.append((adapter.native_asset, seen.value, "value"))
        for t in seen.token_transfers:
            if t.to.lower() == hot and t.contract.lower() in tokens and t.amount > 0:
                items.append((tokens[t.contract.lower()], t.amount, f"log{t.log_index}"))
        if not items:
            raise CustodyError(CustodyErrorCode.funding_not_to_hot,
                               f"{txid} pays nothing to the hot address {self.hot_address('ethereum')}", txid=txid)
        required = max(self.wallets.chain_asset(asset).finality_confirmations for asset, _, _ in items)
        if seen.confirmations < required:
            raise CustodyError(CustodyErrorCode.funding_not_final,
                               f"{txid} has {seen.confirmations} confirmation(s); {required} are required",
                               txid=txid, confirmations=seen.confirmations, required=required)
        out = []
        with self.engine.begin() as c:
            for asset, amount, source in items:
                key = f"hot-funding:ethereum:{txid}:{source}"
                posted = self.book_hot_funding("ethereum", asset, amount, key, conn=c, metadata={
                    "chain": "ethereum", "txid": txid, "source": source, "block_height": seen.block.height,
                    "block_hash": seen.block.hash, "sender": seen.sender})
                out.append({"asset": asset, "amount": amount, "source": source, "key": key,
                            "transaction_id": posted.transaction_id, "created": posted.created})
            audit(c, by, "hot_funding.book", f"tx:{txid}", {
                "chain": "ethereum", "block_height": seen.block.height, "confirmations": seen.confirmations,
                "items": [{k: v for k, v in item.items() if k != "key"} for item in out]})
        log.info("hot funding %s by %s: %s", txid, by, [(i["asset"], i["amount"], i["created"]) for i in out])
        return out

    def sync_hot_wallet(self) -> int:
        """Record confirmed bitcoin hot-wallet coins we do not know yet; returns how many. What each
        is, and whether it is booked as funding, is `hot_coin_origin`'s decision.

        The coins come from the wallet index (custody.wallet_index: our outputs in blocks up to the
        deposit scanner's cursor, unspent there), never from the node's UTXO set. Confirmed means
        in a block the scanner has walked: `catch_up` (the bitcoin scan, wired by the container
        and the worker) runs first, so right after a block is mined the sync sees it, as it did
        when it asked the node. Without `catch_up` (a process that may not write the index) it
        reads the index as the worker's deposits job left it. A coin the index holds as spent is
        not taken (a coin already recorded stays as it is: payouts mark their own spends).

        Only coins at issued indices are taken (custody.wallet_index.Issued, the rule the node's
        view counts by): a coin paid to the change address of a batch that does not exist yet
        (the index watches ahead) waits in the index, in no tier's figure, until that batch
        exists; then it is taken like any other (booked as `hot_coin_origin` says)."""
        if self.catch_up is not None:
            self.catch_up()
        with self.engine.connect() as c, c.begin():
            found = c.execute(text(
                "SELECT o.txid, o.vout, o.address, o.amount, o.derivation_change, o.derivation_index FROM btc_wallet_output o "
                "WHERE o.tier = 'hot' AND o.spent_txid IS NULL "
                "AND NOT EXISTS (SELECT 1 FROM wallet_utxo u WHERE u.txid = o.txid AND u.vout = o.vout) "
                "ORDER BY o.block_height, o.txid, o.vout")).all()
            issued = issued_rule(c, [r.derivation_index for r in found if r.derivation_change == 1])
        coins = [r for r in found if issued("hot", r.derivation_change, r.derivation_index)]
        added = 0
        for r in coins:
            u = Utxo(r.txid, r.vout, r.address, int(r.amount), 0, b"")
            try:
                added += self._record_coin(u, r.derivation_change, r.derivation_index)
            except Exception as exc:  # noqa: BLE001 - one coin must not stop the others; it is tried again next run
                if is_passing(exc):
                    log.warning("hot coin %s:%d not recorded (%s); retried next run", u.txid, u.index, exc)
                    continue
                log.exception("hot coin %s:%d not recorded; retried next run", u.txid, u.index)
                with self.engine.begin() as c:  # on chain and not in the books: reconciliation would differ
                    open_incident(c, "hot_funding_booking_failed", f"hot_funding_failed:bitcoin:{u.txid}:{u.index}",
                                  {"txid": u.txid, "vout": u.index, "amount": u.amount, "code": error_code(exc),
                                   "error": str(exc)[:500]})
        return added

    def _record_coin(self, u, change: int, index: int) -> int:
        """Record one hot-wallet coin (and book it as funding when it is not ours), in one database
        transaction; 1 when it was new."""
        with self.engine.begin() as c:
            row = c.execute(
                text("INSERT INTO wallet_utxo (txid, vout, address, derivation_change, derivation_index, amount) "
                     "VALUES (:t, :v, :a, :c, :i, :m) ON CONFLICT (txid, vout) DO NOTHING RETURNING txid"),
                {"t": u.txid, "v": u.index, "a": u.address, "c": change, "i": index, "m": u.amount}).first()
            tx_kind = c.execute(_TX_KIND_SQL, {"t": u.txid}).scalar()
            origin = hot_coin_origin(known=row is None, tx_kind=tx_kind)
            if origin in ("funding", "misdirected"):
                self.book_hot_funding("bitcoin", "BTC", u.amount, f"hot-funding:bitcoin:{u.txid}:{u.index}", conn=c)
            if origin == "misdirected":
                open_incident(c, "withdrawal_paid_own_address", f"withdrawal_paid_own_address:bitcoin:{u.txid}:{u.index}",
                              {"txid": u.txid, "vout": u.index, "address": u.address, "amount": u.amount,
                               "derivation": f"{change}/{index}"}, severity="warning")
            return int(row is not None)

    # ---- batching -------------------------------------------------------------------------

    def _take_approved(self, c: Connection, chain: str, limit: int) -> list:
        """Approved withdrawals to pay now, rescreened. During the outage drain (after the kill
        switch is lifted) the backlog leaves in value tiers: smallest amounts first, at most
        `drain_per_run` per run, until nothing approved is left waiting."""
        draining = flag(c, DRAIN)
        order = "amount, id" if draining else "id"
        if draining:
            limit = min(limit, self.config.drain_per_run)
        if self.withdrawals is not None:  # a decision that expired while waiting is made again first
            expired = c.execute(text("SELECT w.id FROM withdrawal_request w JOIN policy_decision d ON d.id = w.decision_id "
                                     "WHERE w.state = 'approved' AND w.chain = :c AND d.expires_at <= now() "
                                     "FOR UPDATE OF w SKIP LOCKED"), {"c": chain}).scalars().all()
            for wid in expired:
                log.info("withdrawal %d: decision expired before payment; re-decided: %s", wid,
                         self.withdrawals.reevaluate_expired(c, wid))
        rows = c.execute(
            text("SELECT id, account_id, asset, amount, fee_quoted, destination, destination_script, hold_id FROM withdrawal_request "
                 f"WHERE state = 'approved' AND chain = :c ORDER BY {order} LIMIT :l FOR UPDATE SKIP LOCKED"),
            {"c": chain, "l": limit}).all()
        lapsed = self._return_lapsed(c, [w.id for w in rows])
        rows = [w for w in rows if w.id not in lapsed]
        if draining:
            left = c.execute(text("SELECT count(*) FROM withdrawal_request WHERE state = 'approved' AND NOT (id = ANY(:t))"),
                             {"t": [r.id for r in rows]}).scalar_one()
            if left == 0:
                set_flag(c, DRAIN, False, "backlog drained", "custody")
                log.info("outage drain finished")
        denied = {a.lower() for a in c.execute(text("SELECT address FROM denylist_address")).scalars()}
        frozen = frozen_accounts(c, [w.account_id for w in rows])
        # rescreen, and the destination again (it may have become ours, or a contract, since the
        # request: custody.destinations): dropped without holding up the rest
        refusals = self.destinations.refusals_at_payout(c, rows)
        reorged_out = returns_reorged_out(c, [w.id for w in rows])
        keep = []
        for w, refused in zip(rows, refusals, strict=True):
            reason = "destination_sanctioned" if w.destination.lower() in denied else refused.value if refused else None
            if reason is None and w.id in reorged_out:
                reason = "deposit_reorged_out"  # a quarantine return whose coins left the chain
            if reason is None and w.account_id in frozen:
                reason = "account_frozen"  # a reorged-out credit of the account: custody.incidents
            if reason is not None:
                self.ledger.release_hold(w.hold_id, owner=HOLD_OWNER, conn=c)
                advance(c, "withdrawal", w.id, "approved", "rejected", reject_reasons=[reason])
                reopen_returns(c, [w.id], by="custody", reason=reason)
                emit(c, "withdrawal.rejected", f"withdrawal.rejected:{w.id}", {"withdrawal_id": w.id, "reason": reason},
                     aggregate=f"withdrawal:{w.id}")
            else:
                keep.append(w)
        return keep

    def _return_lapsed(self, c: Connection, withdrawal_ids: list[int]) -> set[int]:
        """Those of `withdrawal_ids` (`approved`, locked by the caller) whose quorum no longer holds
        with the approver keys that count now (`Withdrawals.lapsed_quorum`: a console credential
        revoked, an approver removed, after it approved) go back to the operators under a fresh
        decision (`Withdrawals.return_to_operators`: `pending_approval`, or `rejected` with the hold
        released when the policy now rejects it), audited `withdrawal.quorum_lapsed`. The signer
        would sign them: it counts its own configured keys and cannot see a console revocation.
        Without withdrawals wired (a payouts object of its own in tests) nothing is checked."""
        if self.withdrawals is None or not withdrawal_ids:
            return set()
        lapsed = self.withdrawals.lapsed_quorum(c, withdrawal_ids)
        self._send_back(c, lapsed, None)
        return set(lapsed)

    def _send_back(self, c: Connection, lapsed: list[int], batch_id: int | None) -> None:
        """`approved` withdrawals short of their live quorum back to the operators (`_return_lapsed`)."""
        assert self.withdrawals is not None
        for wid in lapsed:
            state = self.withdrawals.return_to_operators(c, wid)
            audit(c, "custody", "withdrawal.quorum_lapsed", f"withdrawal:{wid}", {"state": state, "batch_id": batch_id})
            log.warning("withdrawal %d: its approvals no longer make its quorum (an approver key revoked or removed); %s",
                        wid, state)

    def _new_batch(self, c: Connection, chain: str, asset: str, members: list, fee_rate: int) -> int:
        batch_id = c.execute(text("INSERT INTO withdrawal_batch (chain, asset, state, fee_rate) VALUES (:c, :a, 'open', :f) RETURNING id"),
                             {"c": chain, "a": asset, "f": fee_rate}).scalar_one()
        advance_many(c, "withdrawal", [w.id for w in members], "approved", "batched", batch_id=batch_id)
        c.execute(text("INSERT INTO batch_output (batch_id, withdrawal_id, amount) "
                       "SELECT :b, unnest(CAST(:w AS bigint[])), unnest(CAST(:m AS numeric[]))"),
                  {"b": batch_id, "w": [w.id for w in members], "m": [int(w.amount) for w in members]})
        return batch_id

    def batch_bitcoin(self) -> int | None:
        """Group approved BTC withdrawals into one batch and reserve coins for it. If the hot
        wallet's confirmed coins cannot cover them, nothing changes and a warning incident asks
        treasury to rebalance (the withdrawals stay approved and are retried next run)."""
        if kill_switch(self.engine).engaged:
            return None
        rate = self.adapters["bitcoin"].estimate_fee().sat_per_kvb
        try:
            with self.engine.begin() as c:
                members = self._take_approved(c, "bitcoin", self.config.max_batch_outputs)
                if not members:
                    return None
                batch_id = self._new_batch(c, "bitcoin", "BTC", members, rate)
                coins = self._spendable_coins(c)
                scripts = [bytes(w.destination_script) for w in members]
                change_script = address_to_script(self.hot_address("bitcoin", 1, batch_id), self.config.bitcoin_network)
                chosen, _change, _fee = select_coins(coins, sum(int(w.amount) for w in members), rate, scripts, change_script)
                for coin in chosen:
                    c.execute(text("UPDATE wallet_utxo SET reserved_by = :b WHERE txid = :t AND vout = :v AND reserved_by IS NULL"),
                              {"b": batch_id, "t": coin.txid, "v": coin.vout})
                audit(c, "custody", "batch.create", f"batch:{batch_id}", {"withdrawals": [w.id for w in members], "fee_rate": rate})
        except SignerError as exc:
            if exc.code is not SignerErrorCode.INSUFFICIENT_FUNDS:
                raise
            with self.engine.begin() as c:
                open_incident(c, "hot_wallet_insufficient", f"hot_wallet_insufficient:bitcoin:{exc.detail}",
                              {"chain": "bitcoin", "detail": str(exc.detail)}, severity="warning")
            log.warning("bitcoin hot wallet cannot cover the approved withdrawals: %s", exc)
            return None
        log.info("batch %d: %d bitcoin withdrawal(s) at %d sat/kvB", batch_id, len(members), rate)
        return batch_id

    def _spendable_coins(self, c: Connection) -> list[BtcCoin]:
        return spendable_coins(c)

    def batch_ethereum(self) -> list[int]:
        """One batch per approved ether or ERC-20 withdrawal."""
        if kill_switch(self.engine).engaged:
            return []
        out = []
        with self.engine.begin() as c:
            for w in self._take_approved(c, "ethereum", self.config.max_batch_outputs):
                out.append(self._new_batch(c, "ethereum", w.asset, [w], 0))
        return out

    # ---- signing --------------------------------------------------------------------------

    def drop_from_batch(self, batch_id: int, withdrawal_id: int, *, reason: str, retry: bool = True) -> None:
        """Pull one withdrawal out of an open batch so the rest can be signed without it: back to
        `approved` (retry=True) or `rejected` with its hold released. An emptied batch is abandoned
        and its coins freed. A withdrawal the signer has a record for in this batch is never sent
        back to `approved` (ValueError): batched again over other coins or another nonce, the signer
        would refuse it `already_signed` for good (`_signer_recorded`)."""
        with self.engine.begin() as c:
            state = c.execute(text("SELECT state FROM withdrawal_batch WHERE id = :b FOR UPDATE"), {"b": batch_id}).scalar_one()
            if state != "open":
                raise ValueError(f"batch {batch_id} is {state}; only open batches change")
            if retry and self._signer_recorded(c, batch_id, [withdrawal_id]):
                raise ValueError(f"withdrawal {withdrawal_id} was signed in batch {batch_id} (the signer's record); "
                                 "it stays on that batch's coins or nonce")
            c.execute(text("DELETE FROM batch_output WHERE batch_id = :b AND withdrawal_id = :w"), {"b": batch_id, "w": withdrawal_id})
            w = c.execute(text("SELECT state, hold_id FROM withdrawal_request WHERE id = :w FOR UPDATE"), {"w": withdrawal_id}).one()
            if w.state == "batched" and retry:
                advance(c, "withdrawal", withdrawal_id, "batched", "approved", batch_id=None)
            elif w.state == "batched":
                hold = self.ledger.get_hold(w.hold_id, conn=c)
                if hold.state.value == "pending":
                    self.ledger.release_hold(w.hold_id, owner=HOLD_OWNER, conn=c)
                advance(c, "withdrawal", withdrawal_id, "batched", "rejected", batch_id=None, reject_reasons=[reason])
                reopen_returns(c, [withdrawal_id], by="custody", reason=reason)
            self._abandon_if_empty(c, batch_id)
            audit(c, "custody", "batch.drop_output", f"batch:{batch_id}", {"withdrawal_id": withdrawal_id, "reason": reason})

    @staticmethod
    def _signer_recorded(c: Connection, batch_id: int, withdrawal_ids: list[int]) -> set[int]:
        """Those of `withdrawal_ids` the signer has recorded a signature for in batch `batch_id`
        (`signer_signature`; a signature custody may never have stored: a lost reply, a rollback
        after the signer committed). Such a withdrawal stays in its batch, on the coins or nonce it
        was signed over: the signer signs it again only in a transaction conflicting with that one."""
        return set(c.execute(_RECORDED_SQL, {"b": batch_id, "w": list(withdrawal_ids)}).scalars())

    def _unbatch(self, c: Connection, batch_id: int, withdrawal_ids: list[int]) -> bool:
        """Take `withdrawal_ids` (all `batched` in open batch `batch_id`, locked by the caller) out of
        it, back to `approved` with their holds pending; True when that emptied the batch, which is
        then abandoned with its coins freed. In the caller's transaction."""
        c.execute(text("DELETE FROM batch_output WHERE batch_id = :b AND withdrawal_id = ANY(:w)"),
                  {"b": batch_id, "w": list(withdrawal_ids)})
        advance_many(c, "withdrawal", list(withdrawal_ids), "batched", "approved", batch_id=None)
        return self._abandon_if_empty(c, batch_id)

    def _abandon_if_empty(self, c: Connection, batch_id: int) -> bool:
        if self._batch_withdrawal_ids(c, batch_id):
            return False
        advance(c, "batch", batch_id, "open", "abandoned")
        c.execute(text("UPDATE wallet_utxo SET reserved_by = NULL WHERE reserved_by = :b"), {"b": batch_id})
        return True

    def drop_expired(self, batch_id: int) -> list[int]:
        """The signer refused open batch `batch_id` with `decision_expired`: its withdrawals whose
        policy decision has expired (by the database's clock; the rest stay) go back to `approved`,
        so the next batching run re-decides them (`Withdrawals.reevaluate_expired`: a fresh
        decision, and fresh operator approvals where it needs them, since approvals sign the
        decision id) and batches them anew. An emptied batch is abandoned and its coins freed. One
        database transaction, audited (`batch.drop_expired`); answers the withdrawals taken out,
        none when the batch is no longer open and active (another worker signed, dropped or set it
        aside meanwhile) or when no decision has expired yet by the database's clock (the signer's
        may run ahead: the next run sees it). A withdrawal the signer has a record for in this batch
        stays (`_signer_recorded`): the signer re-signs it over the same coins or nonce whatever
        its decision's expiry, since it was signed while live."""
        with self.engine.begin() as c:
            batch = c.execute(text("SELECT state, containment FROM withdrawal_batch WHERE id = :b FOR UPDATE"),
                              {"b": batch_id}).one()
            if batch.state != "open" or batch.containment != "active":
                return []
            expired = c.execute(text(
                "SELECT w.id FROM batch_output o JOIN withdrawal_request w ON w.id = o.withdrawal_id "
                "JOIN policy_decision d ON d.id = w.decision_id WHERE o.batch_id = :b AND w.state = 'batched' "
                "AND d.expires_at <= now() ORDER BY w.id FOR UPDATE OF w"), {"b": batch_id}).scalars().all()
            pinned = self._signer_recorded(c, batch_id, expired)
            expired = [wid for wid in expired if wid not in pinned]
            if not expired:
                return []
            abandoned = self._unbatch(c, batch_id, expired)
            audit(c, "custody", "batch.drop_expired", f"batch:{batch_id}",
                  {"withdrawals": expired, "reason": RefusalCode.decision_expired.value, "abandoned": abandoned})
        log.warning("batch %d: decision expired for withdrawal(s) %s; back to approved for a fresh decision%s",
                    batch_id, expired, "; the batch is abandoned" if abandoned else "")
        return expired

    def sign_open_batches(self) -> list[str]:
        """Sign every open batch that is not set aside; returns the txids signed. A refusal leaves the
        batch open (`decision_expired` takes the expired withdrawals out: `drop_expired`; one naming a
        single withdrawal takes that one out: `drop_refused`); one another
        worker is signing, or signed meanwhile, is skipped (`_claim_batch`); any other failure (its
        capture refused by the ledger, say) sets it aside with a warning incident (nothing was stored
        or sent) and the next batch is signed all the same."""
        with self.engine.connect() as c:
            open_batches = c.execute(text("SELECT id, chain FROM withdrawal_batch WHERE state = 'open' "
                                          "AND containment = 'active' ORDER BY id")).all()
        txids = []
        for b in open_batches:
            txid = contained(self.engine, "batch", b.id, "open", Step.sign, lambda b=b: self._sign_one(b.id, b.chain),
                             describe=lambda b=b: self._batch_detail(b.id))
            if txid is not None:
                txids.append(txid)
        return txids

    def drop_lapsed(self, batch_id: int) -> list[int]:
        """Before open batch `batch_id` is signed: its withdrawals whose quorum no longer holds with
        the approver keys that count now (`_return_lapsed`) leave it (an emptied batch is abandoned,
        its coins freed) and go back to the operators. One database transaction, audited
        (`batch.drop_lapsed`); answers the withdrawals taken out. A withdrawal the signer has a
        record for in this batch stays (`_signer_recorded`: signed while its quorum held, it is
        re-signed in the same slot), as does everything of a batch no longer open and active or being
        signed by another worker (`_claim_batch` skips it too)."""
        if self.withdrawals is None:
            return []
        with self.engine.begin() as c:
            # as `_claim_batch` locks it: a batch another worker is signing is skipped, never waited for
            batch = c.execute(text("SELECT state, containment FROM withdrawal_batch WHERE id = :b FOR NO KEY UPDATE SKIP LOCKED"),
                              {"b": batch_id}).first()
            if batch is None or batch.state != "open" or batch.containment != "active":
                return []
            members = c.execute(text("SELECT w.id FROM batch_output o JOIN withdrawal_request w ON w.id = o.withdrawal_id "
                                     "WHERE o.batch_id = :b AND w.state = 'batched' ORDER BY w.id FOR UPDATE OF w"),
                                {"b": batch_id}).scalars().all()
            pinned = self._signer_recorded(c, batch_id, members)
            lapsed = self.withdrawals.lapsed_quorum(c, [wid for wid in members if wid not in pinned])
            if not lapsed:
                return []
            abandoned = self._unbatch(c, batch_id, lapsed)  # batched -> approved, holds still pending
            self._send_back(c, lapsed, batch_id)
            audit(c, "custody", "batch.drop_lapsed", f"batch:{batch_id}", {"withdrawals": lapsed, "abandoned": abandoned})
        log.warning("batch %d: withdrawal(s) %s short of their quorum with the keys that count now; back to the "
                    "operators%s", batch_id, lapsed, "; the batch is abandoned" if abandoned else "")
        return lapsed

    def _sign_one(self, batch_id: int, chain: str) -> str | None:
        self.drop_lapsed(batch_id)  # an approver revoked since batching: not signed on its word
        try:
            return self._sign_bitcoin(batch_id) if chain == "bitcoin" else self._sign_ethereum(batch_id)
        except SigningRefused as refused:  # the signer audited it; the batch stays open for an operator
            log.warning("batch %d not signed: %s", batch_id, refused)
            self.refusals.append((batch_id, refused.code.value))
            if refused.code is RefusalCode.decision_expired:  # it would be refused on every run: re-decide them
                self.drop_expired(batch_id)
            elif refused.withdrawal_id is not None:  # one withdrawal: take it out, the rest is signed next run
                self.drop_refused(batch_id, refused)
            return None

    def drop_refused(self, batch_id: int, refused: SigningRefused) -> str | None:
        """The signer refused open batch `batch_id` over ONE of its withdrawals
        (`refused.withdrawal_id`), with a code of BACK_TO_OPERATORS or REJECTED_ON_REFUSAL: that
        withdrawal leaves the batch (an emptied batch is abandoned, its coins freed) and goes back
        to the operators under a fresh decision (`Withdrawals.return_to_operators`; without one
        wired, it is rejected and released like the rest) or is rejected with its hold released;
        a warning incident (`withdrawal_refused_by_signer`: nothing left the firm) names the
        withdrawal, batch and code, and the batch's other withdrawals are signed without it on the
        next run. One database transaction, audited (`batch.drop_refused`). Another code naming
        a withdrawal (no_decision, hold_not_live, ...: custody's rows changed underneath) opens
        the same warning incident and moves nothing. Answers the withdrawal's new state, or None
        (nothing moved) when the code is not one of those, the
        batch is no longer open and active or has a signed version on record (another worker
        signed it meanwhile), or the withdrawal is no longer `batched` in it."""
        wid, code = refused.withdrawal_id, refused.code
        if wid is None:
            return None
        if code not in BACK_TO_OPERATORS and code not in REJECTED_ON_REFUSAL:  # for a person: told, nothing moved
            with self.engine.begin() as c:
                open_incident(c, "withdrawal_refused_by_signer", f"signer_refused:{batch_id}:{wid}:{code.value}",
                              {"withdrawal_id": wid, "batch_id": batch_id, "code": code.value,
                               "message": refused.message[:500], "state": "batched", "abandoned": False}, severity="warning")
            return None
        with self.engine.begin() as c:
            batch = c.execute(text("SELECT state, containment FROM withdrawal_batch WHERE id = :b FOR UPDATE"),
                              {"b": batch_id}).one()
            signed = c.execute(text("SELECT 1 FROM chain_transaction WHERE batch_id = :b LIMIT 1"), {"b": batch_id}).first()
            if batch.state != "open" or batch.containment != "active" or signed is not None:
                return None
            w = c.execute(text("SELECT w.state, w.batch_id, w.hold_id FROM withdrawal_request w JOIN batch_output o "
                               "ON o.withdrawal_id = w.id AND o.batch_id = :b WHERE w.id = :w FOR UPDATE OF w"),
                          {"b": batch_id, "w": wid}).first()
            if w is None or w.state != "batched" or w.batch_id != batch_id:
                return None
            abandoned = self._unbatch(c, batch_id, [wid])  # batched -> approved, hold still pending
            if code in BACK_TO_OPERATORS and self.withdrawals is not None:
                state = self.withdrawals.return_to_operators(c, wid)
            else:
                reason = REJECTED_ON_REFUSAL.get(code, code.value)
                if self.ledger.get_hold(w.hold_id, conn=c).state.value == "pending":
                    self.ledger.release_hold(w.hold_id, owner=HOLD_OWNER, conn=c)
                advance(c, "withdrawal", wid, "approved", "rejected", reject_reasons=[reason])
                reopen_returns(c, [wid], by="custody", reason=reason)
                emit(c, "withdrawal.rejected", f"withdrawal.rejected:{wid}", {"withdrawal_id": wid, "reason": reason},
                     aggregate=f"withdrawal:{wid}")
                state = "rejected"
            detail = {"withdrawal_id": wid, "batch_id": batch_id, "code": code.value, "message": refused.message[:500],
                      "state": state, "abandoned": abandoned}
            audit(c, "custody", "batch.drop_refused", f"batch:{batch_id}", detail)
            open_incident(c, "withdrawal_refused_by_signer", f"signer_refused:{batch_id}:{wid}:{code.value}", detail,
                          severity="warning")
        log.warning("batch %d: the signer refused withdrawal %d (%s); taken out of the batch: %s%s", batch_id, wid,
                    code.value, state, "; the batch is abandoned" if abandoned else "")
        return state

    @staticmethod
    def _claim_batch(c: Connection, batch_id: int) -> bool:
        """Lock open batch `batch_id` for this worker's signing step, for the caller's transaction
        (held across the signer call). False when another worker holds it (a second worker in the
        same step, as after a lost job lock: custody.jobs) or it is no longer open and active:
        that worker signed or dropped it, and nothing is asked of the signer or stored twice.
        NO KEY UPDATE: the signer's own inserts referencing the batch are never blocked by it."""
        row = c.execute(text("SELECT state, containment FROM withdrawal_batch WHERE id = :b FOR NO KEY UPDATE SKIP LOCKED"),
                        {"b": batch_id}).first()
        if row is None or row.state != "open" or row.containment != "active":
            log.info("batch %d: %s; not signed here", batch_id,
                     "another worker is signing it" if row is None else f"{row.state}/{row.containment} meanwhile")
            return False
        return True

    @staticmethod
    def _claim_version(c: Connection, r) -> bool:
        """Lock version `r` (a broadcast chain_transaction) for this worker's fee bump, for the caller's
        transaction (held across the signer call). False when another worker holds it, or it is no
        longer broadcast, already replaced or its batch set aside: the bump was done meanwhile."""
        if c.execute(text("SELECT id FROM chain_transaction WHERE id = :i FOR NO KEY UPDATE SKIP LOCKED"),
                     {"i": r.id}).first() is None:
            log.info("fee bump of %s: another worker is bumping it", r.txid)
            return False
        # a statement of its own: its snapshot sees what a worker that held the lock committed
        row = c.execute(text("SELECT t.state, b.containment, "
                             "EXISTS (SELECT 1 FROM chain_transaction n WHERE n.replaces_id = t.id) AS replaced "
                             "FROM chain_transaction t JOIN withdrawal_batch b ON b.id = t.batch_id WHERE t.id = :i"),
                        {"i": r.id}).one()
        if row.state != "broadcast" or row.replaced or row.containment != "active":
            log.info("fee bump of %s: %s%s meanwhile; not bumped here", r.txid, row.state, ", replaced" if row.replaced else "")
            return False
        return True

    def _batch_detail(self, batch_id: int, txid: str | None = None) -> dict:
        """What an incident about a set-aside batch names: its chain, asset, withdrawals and txid."""
        with self.engine.connect() as c:
            b = c.execute(text("SELECT chain, asset FROM withdrawal_batch WHERE id = :b"), {"b": batch_id}).one()
            ids = self._batch_withdrawal_ids(c, batch_id)
        return {"batch_id": batch_id, "chain": b.chain, "asset": b.asset, "withdrawals": ids, "txid": txid}

    def retry_batch(self, batch_id: int, *, by: str, comment: str) -> Retried:
        """An operator retries a set-aside batch once the cause is fixed (custody.containment).
        Set aside before it was signed (still `open`: nothing stored, nothing on chain, nothing
        captured), the batch is abandoned, its coins are freed and its withdrawals go back to
        `approved`, so the next run batches and signs them under a new batch id: the capture key
        the old one needed may be taken for good. Except when the signer has a record of signing
        the batch (its capture refused after the signer answered; `_signer_recorded`): then it
        stays open with its coins (bitcoin) or nonce (ethereum, `_batch_nonce`) and is only active
        again, so the next run re-signs the same transaction, which the signer accepts; under
        another id the signer would refuse its withdrawals `already_signed` for good (audited
        `batch.retry_in_place`). Set aside later (signed, broadcast, confirmed), it is active again
        and the next run does the failed step (broadcast, track, book) once."""
        with self.engine.begin() as c:
            retried = reactivate(c, "batch", batch_id, by=by, comment=comment)
            members = self._batch_withdrawal_ids(c, batch_id)
            if retried.state == "open" and self._signer_recorded(c, batch_id, members):
                audit(c, by, "batch.retry_in_place", f"batch:{batch_id}",
                      {"withdrawals": members, "reason": "the signer signed it: it keeps its coins or nonce"})
            elif retried.state == "open":
                advance(c, "batch", batch_id, "open", "abandoned")
                c.execute(text("UPDATE wallet_utxo SET reserved_by = NULL WHERE reserved_by = :b"), {"b": batch_id})
                ids = c.execute(text("SELECT id FROM withdrawal_request WHERE batch_id = :b AND state = 'batched' ORDER BY id"),
                                {"b": batch_id}).scalars().all()
                c.execute(text("DELETE FROM batch_output WHERE batch_id = :b"), {"b": batch_id})
                advance_many(c, "withdrawal", ids, "batched", "approved", batch_id=None)
                audit(c, by, "batch.abandon", f"batch:{batch_id}", {"withdrawals": ids, "reason": "retry after set aside"})
        return retried

    def _batch_outputs(self, c: Connection, batch_id: int) -> list:
        return c.execute(text("SELECT w.id, w.account_id, w.asset, w.amount, w.fee_quoted, w.destination, w.destination_script, w.hold_id "
                              "FROM batch_output b JOIN withdrawal_request w ON w.id = b.withdrawal_id "
                              "WHERE b.batch_id = :b ORDER BY w.id"), {"b": batch_id}).all()

    def _bitcoin_plan(self, c: Connection, batch_id: int, rate: int):
        rows = self._batch_outputs(c, batch_id)
        coins = [BtcCoin(r.txid, r.vout, int(r.amount), r.derivation_change, r.derivation_index) for r in c.execute(
            text("SELECT txid, vout, amount, derivation_change, derivation_index FROM wallet_utxo WHERE reserved_by = :b "
                 "ORDER BY txid, vout"), {"b": batch_id})]
        outputs = [BatchOutput(r.id, r.destination, int(r.amount), bytes(r.destination_script)) for r in rows]
        change_address = self.hot_address("bitcoin", 1, batch_id)
        scripts = [o.script for o in outputs] + [address_to_script(change_address, self.config.bitcoin_network)]
        fee = fee_for(estimate_vsize(len(coins), scripts), rate)
        change = sum(k.amount for k in coins) - sum(o.amount for o in outputs) - fee
        keep_change = change >= dust_threshold(scripts[-1])
        return rows, coins, outputs, (change_address, change) if keep_change else None

    def _sign_bitcoin(self, batch_id: int) -> str | None:
        """Claim the batch, try its capture (`_try_capture`), sign over the batch's reserved coins,
        then capture and store, in ONE database transaction that holds no ledger row across the
        signer call. A retry after the signer recorded a signature the worker never stored plans the
        same coins (they stay reserved to the batch), so the signer accepts the re-sign."""
        with self.engine.begin() as c:
            if not self._claim_batch(c, batch_id):
                return None
            rate = int(c.execute(text("SELECT fee_rate FROM withdrawal_batch WHERE id = :b"), {"b": batch_id}).scalar_one())
            rows, coins, outputs, change = self._bitcoin_plan(c, batch_id, rate)
            not_captured = self._try_capture(c, batch_id, rows)
            signed = self.signer.sign_bitcoin_batch(batch_id, coins, outputs, change)
            if not_captured is not None:  # the signer saw a live hold the ledger would not capture: never stored
                raise not_captured
            tx_id = self._record_signed(c, batch_id, "bitcoin", signed.txid, signed.raw, signed.fee, rate, rows)
            for k in coins:
                c.execute(text("UPDATE wallet_utxo SET spent_by = :s WHERE txid = :t AND vout = :v"), {"s": tx_id, "t": k.txid, "v": k.vout})
            if change and signed.change_vout is not None:
                self._track_change(c, signed.txid, signed.change_vout, change, batch_id)
        return signed.txid

    def _track_change(self, c: Connection, txid: str, vout: int, change: tuple[str, int], batch_id: int) -> None:
        c.execute(text("INSERT INTO wallet_utxo (txid, vout, address, derivation_change, derivation_index, amount) "
                       "VALUES (:t, :v, :a, 1, :i, :m) ON CONFLICT DO NOTHING"),
                  {"t": txid, "v": vout, "a": change[0], "i": batch_id, "m": change[1]})

    def _try_capture(self, c: Connection, batch_id: int, rows) -> LedgerError | None:
        """The ledger's answer to the batch's capture before the signer is asked, without posting
        it and without locks (`Ledger.check_post`: the posting's own refusals, read in one
        statement): nothing of the ledger stays locked across the signer call (up to the client's
        timeout), and the capture is posted once, after the answer, with the store
        (`_record_signed`), in milliseconds. A capture the ledger would refuse for a lasting reason
        (a squatted capture key, say) fails the step before anything is signed, so the batch is
        set aside with no signer record and `retry_batch` can re-batch it. A hold that is no
        longer live (`SIGNER_REFUSES`) is returned instead: the signer, reading the same committed
        hold, is asked anyway and refuses it itself (`hold_not_live`, audited; the batch stays
        open). Should the capture after the answer be refused all the same (the hold or a balance
        changed meanwhile, or a refusal the check does not read), the signature is never stored or
        sent; the signer's record keeps the batch on its coins or nonce (`_signer_recorded`) and
        the next attempt re-signs the same transaction."""
        key, legs, metadata = self._capture_posting(c, batch_id, rows)
        refused = self.ledger.check_post(key, legs, kind="withdrawal_capture", hold_owner=HOLD_OWNER,
                                         metadata=metadata, conn=c)
        if refused is not None and refused.code not in SIGNER_REFUSES:
            raise refused
        return refused

    def _capture_posting(self, c: Connection, batch_id: int, rows) -> tuple[str, list[Transfer], dict]:
        """The batch's capture: one balanced transaction, each hold captured in full (customer ->
        in-flight, quoted fee -> fee income). (key, transfers, metadata)."""
        legs = []
        for w in rows:
            legs.append(Transfer(w.account_id, self.wallets.firm_account("in_flight", w.asset, conn=c), int(w.amount), w.hold_id))
            if int(w.fee_quoted) > 0:
                legs.append(Transfer(w.account_id, self.wallets.firm_account("fees", w.asset, conn=c), int(w.fee_quoted), w.hold_id))
        return f"batch:{batch_id}:capture", legs, {"batch_id": batch_id, "withdrawals": [w.id for w in rows]}

    def _capture(self, c: Connection, batch_id: int, rows) -> None:
        """Post the batch's capture (`_capture_posting`) in the caller's transaction."""
        key, legs, metadata = self._capture_posting(c, batch_id, rows)
        self.ledger.post(key, legs, kind="withdrawal_capture", hold_owner=HOLD_OWNER, metadata=metadata, conn=c)

    def _record_signed(self, c: Connection, batch_id: int, chain: str, txid: str, raw: bytes, fee: int, rate: int, rows,
                       *, nonce: int | None = None, sender: str | None = None) -> int:
        """Store the signed version, capture the holds and move the rows to `signed`, in the
        caller's transaction (after the signer answered: the capture's row locks last ms)."""
        tx_id = c.execute(
            text("INSERT INTO chain_transaction (batch_id, chain, txid, raw, fee, fee_rate, nonce, sender, state) "
                 "VALUES (:b, :c, :t, :r, :f, :fr, :n, :s, 'signed') RETURNING id"),
            {"b": batch_id, "c": chain, "t": txid, "r": raw, "f": fee, "fr": rate, "n": nonce, "s": sender}).scalar_one()
        advance(c, "batch", batch_id, "open", "signed")
        self._capture(c, batch_id, rows)
        advance_many(c, "withdrawal", [w.id for w in rows], "batched", "signed")
        emit(c, "batch.signed", f"batch.signed:{batch_id}:{txid}", {"batch_id": batch_id, "txid": txid},
             aggregate=f"batch:{batch_id}")
        return tx_id

    def _eth_call(self, c: Connection, w) -> tuple[str, int, bytes, int]:
        """(to, value, data, gas) of the transaction paying withdrawal `w`."""
        call = eth_payout_call(self.wallets.chain_asset(w.asset, conn=c).contract_address, w.destination, int(w.amount))
        return call.to, call.value, call.data, call.gas  # the same call custody.destinations simulates

    def _sign_ethereum(self, batch_id: int) -> str | None:
        adapter = self.adapters["ethereum"]
        hot = self.hot_address("ethereum")
        with self.engine.begin() as c:
            if not self._claim_batch(c, batch_id):
                return None
            [w] = self._batch_outputs(c, batch_id)
            nonce = self._batch_nonce(c, w.id, hot, adapter.chain_id)
            fee = adapter.estimate_fee()
            max_fee = min(fee.max_fee_wei, self.config.max_fee_wei)
            to, value, data, gas = self._eth_call(c, w)
            not_captured = self._try_capture(c, batch_id, [w])  # a refused capture gives a new nonce back unsigned
            signed = self.signer.sign_ethereum_payment(
                batch_id, BatchOutput(w.id, w.destination, int(w.amount)), hot_index=HOT_RECEIVE_INDEX,
                chain_id=adapter.chain_id, nonce=nonce, to=to, value=value, data=data, gas=gas, max_fee_wei=max_fee,
                priority_fee_wei=max(fee.priority_fee_wei, 1))
            if not_captured is not None:
                raise not_captured
            self._record_signed(c, batch_id, "ethereum", signed.txid, signed.raw, gas * max_fee, max_fee, [w],
                                nonce=nonce, sender=hot)
        return signed.txid

    # ---- fee bumps ------------------------------------------------------------------------

    def bump_fees(self) -> list[str]:
        """Replace every version pending for `stuck_blocks` or more with one paying a higher fee
        (up to the ceiling); returns the new txids, stored as `signed` for the broadcast job."""
        with self.engine.connect() as c:
            rows = c.execute(text("SELECT t.id, t.batch_id, t.chain, t.txid, t.raw, t.fee_rate, t.nonce, t.broadcast_height "
                                  "FROM chain_transaction t JOIN withdrawal_batch b ON b.id = t.batch_id "
                                  "WHERE t.state = 'broadcast' AND b.containment = 'active' AND NOT EXISTS "
                                  "(SELECT 1 FROM chain_transaction n WHERE n.replaces_id = t.id) ORDER BY t.id")).all()
        new = []
        for r in rows:
            txid = contained(self.engine, "batch", r.batch_id, "broadcast", Step.bump, lambda r=r: self._bump_one(r),
                             describe=lambda r=r: self._batch_detail(r.batch_id, r.txid))
            if txid is not None:
                new.append(txid)
        return new

    def _bump_one(self, r) -> str | None:
        """Re-sign one stuck version at a higher fee; its new txid, or None when it is not stuck, the
        ceiling is reached (a warning incident) or the signer refuses."""
        adapter = self.adapters[r.chain]
        if r.broadcast_height is None or adapter.tip().height - r.broadcast_height < self.config.stuck_blocks:
            return None
        if adapter.tx_status(r.txid, raw=bytes(r.raw)).state is not TxState.MEMPOOL:
            return None
        old_rate = int(r.fee_rate)
        ceiling = self.config.max_fee_rate_sat_per_kvb if r.chain == "bitcoin" else self.config.max_fee_wei
        rate = min(old_rate * (100 + self.config.bump_percent) // 100, ceiling)
        if rate <= old_rate:
            with self.engine.begin() as c:
                open_incident(c, "fee_ceiling_reached", f"fee_ceiling:{r.id}", {"txid": r.txid, "rate": old_rate},
                              severity="warning")
            return None
        try:
            txid = self._replace_bitcoin(r, rate) if r.chain == "bitcoin" else self._replace_ethereum(r, rate)
        except SigningRefused as refused:  # the signer audited it; the version in the mempool stays as it is
            log.warning("fee bump of %s (batch %d) refused: %s", r.txid, r.batch_id, refused)
            self.refusals.append((r.batch_id, refused.code.value))
            return None
        if txid is None:  # another worker bumped it
            return None
        log.info("fee bump: %s replaced by %s at %d", r.txid, txid, rate)
        return txid

    def _replace_bitcoin(self, r, rate: int) -> str | None:
        with self.engine.begin() as c:
            if not self._claim_version(c, r):
                return None
            _rows, coins, outputs, change = self._bitcoin_plan(c, r.batch_id, rate)
            signed = self.signer.sign_bitcoin_replacement(r.batch_id, r.txid, coins, outputs, change)
            self._record_replacement(c, r, signed.txid, signed.raw, signed.fee, rate)
            if change and signed.change_vout is not None:
                c.execute(text("INSERT INTO wallet_utxo (txid, vout, address, derivation_change, derivation_index, amount) "
                               "VALUES (:t, :v, :a, 1, :i, :m) ON CONFLICT DO NOTHING"),
                          {"t": signed.txid, "v": signed.change_vout, "a": change[0], "i": r.batch_id, "m": change[1]})
        return signed.txid

    def _replace_ethereum(self, r, max_fee: int) -> str | None:
        adapter = self.adapters["ethereum"]
        with self.engine.begin() as c:
            if not self._claim_version(c, r):
                return None
            [w] = self._batch_outputs(c, r.batch_id)
            to, value, data, gas = self._eth_call(c, w)
            priority = max(adapter.estimate_fee().priority_fee_wei, 1) * (100 + self.config.bump_percent) // 100 + 1
            signed = self.signer.sign_ethereum_payment(
                r.batch_id, BatchOutput(w.id, w.destination, int(w.amount)), hot_index=HOT_RECEIVE_INDEX,
                chain_id=adapter.chain_id, nonce=r.nonce, to=to, value=value, data=data, gas=gas, max_fee_wei=max_fee,
                priority_fee_wei=min(priority, max_fee), replaces_txid=r.txid)
            self._record_replacement(c, r, signed.txid, signed.raw, gas * max_fee, max_fee)
        return signed.txid

    def _record_replacement(self, c: Connection, r, txid: str, raw: bytes, fee: int, rate: int) -> None:
        new_id = c.execute(
            text("INSERT INTO chain_transaction (batch_id, chain, txid, raw, fee, fee_rate, nonce, sender, replaces_id, state) "
                 "SELECT batch_id, chain, :t, :raw, :f, :fr, nonce, sender, id, 'signed' FROM chain_transaction WHERE id = :i "
                 "RETURNING id"), {"t": txid, "raw": raw, "f": fee, "fr": rate, "i": r.id}).scalar_one()
        # the coins are now spent by the newest version, which is the one a further bump replaces
        c.execute(text("UPDATE wallet_utxo SET spent_by = :n WHERE spent_by = :o"), {"n": new_id, "o": r.id})
        c.execute(text("UPDATE withdrawal_batch SET fee_rate = :fr, updated_at = now() WHERE id = :b"), {"fr": rate, "b": r.batch_id})
        audit(c, "custody", "batch.fee_bump", f"batch:{r.batch_id}", {"replaces": r.txid, "txid": txid, "rate": rate})

    def _batch_nonce(self, c: Connection, withdrawal_id: int, address: str, chain_id: int) -> int:
        """The nonce withdrawal `withdrawal_id` is signed with: the one the signer already recorded
        for it (from `address` on `chain_id`: a signature it committed whose reply custody lost, or
        never stored), so every retry re-signs in the same slot, which the signer accepts; else a
        new one (`_allocate_nonce`)."""
        recorded = c.execute(_RECORDED_NONCE_SQL, {"w": withdrawal_id, "a": address, "ci": chain_id}).scalar()
        return int(recorded) if recorded is not None else self._allocate_nonce(c, address, chain_id)

    def _allocate_nonce(self, c: Connection, address: str, chain_id: int) -> int:
        """Next nonce for `address`, gap-free: the row lock (held, with the signing transaction,
        across the signer call; it blocks only another worker's ethereum signing) serialises
        allocators; the counter starts from the node's pending count the first time. It never
        hands out a nonce the signer has recorded a signature at (`signer_signature`, or a gas
        funding in `signer_eth_sweep`, committed before the signer answers): a signing transaction rolled back after the signer committed
        gives its nonce back to the counter, but that nonce stays its withdrawal's
        (`_batch_nonce`), so the next batch takes the one after it. A nonce allocated here and
        rolled back before anything was signed (a refusal, a refused capture) is given back: no gap."""
        c.execute(text("INSERT INTO eth_nonce (address, next_nonce) VALUES (:a, :n) ON CONFLICT DO NOTHING"),
                  {"a": address, "n": self.adapters["ethereum"].nonce(address)})
        counter = int(c.execute(text("SELECT next_nonce FROM eth_nonce WHERE address = :a FOR UPDATE"), {"a": address}).scalar_one())
        # a statement after the lock: it sees what a signer committed while this worker waited for it
        recorded = c.execute(_MAX_RECORDED_NONCE_SQL, {"a": address, "ci": chain_id}).scalar()
        nonce = max(counter, int(recorded) + 1 if recorded is not None else 0)
        c.execute(text("UPDATE eth_nonce SET next_nonce = :n WHERE address = :a"), {"n": nonce + 1, "a": address})
        return nonce

    # ---- broadcast ------------------------------------------------------------------------

    def broadcast(self) -> int:
        """Send every stored signed version. Nothing new leaves while the kill switch is on (a signed
        transaction waits; one already broadcast is still tracked and may be re-sent as it was)."""
        if kill_switch(self.engine).engaged:
            return 0
        with self.engine.connect() as c:
            rows = c.execute(text("SELECT t.id, t.batch_id, t.chain, t.txid, t.raw FROM chain_transaction t "
                                  "JOIN withdrawal_batch b ON b.id = t.batch_id "
                                  "WHERE t.state = 'signed' AND b.containment = 'active' ORDER BY t.id")).all()
        sent = 0
        for r in rows:
            adapter = self.adapters[r.chain]
            try:
                result = adapter.broadcast(bytes(r.raw))
            except ChainError as exc:
                log.error("broadcast of %s refused: %s", r.txid, exc)
                continue
            # sent: a failure to record it from here on sets the batch aside as on chain (critical)
            if contained(self.engine, "batch", r.batch_id, "signed", Step.broadcast, lambda r=r: self._record_broadcast(r),
                         describe=lambda r=r: self._batch_detail(r.batch_id, r.txid)):
                sent += 1
                log.info("broadcast %s (%s)%s", r.txid, r.chain, " already known" if result.already_known else "")
        return sent

    def _record_broadcast(self, r) -> bool:
        height = self.adapters[r.chain].tip().height
        with self.engine.begin() as c:
            advance(c, "chain_transaction", r.id, "signed", "broadcast", broadcast_height=height)
            c.execute(text("UPDATE chain_transaction SET broadcast_at = now() WHERE id = :i"), {"i": r.id})
            batch_state = c.execute(text("SELECT state FROM withdrawal_batch WHERE id = :b FOR UPDATE"), {"b": r.batch_id}).scalar_one()
            if batch_state == "signed":
                advance(c, "batch", r.batch_id, "signed", "broadcast")
                advance_many(c, "withdrawal", self._batch_withdrawal_ids(c, r.batch_id), "signed", "broadcast")
        return True

    @staticmethod
    def _batch_withdrawal_ids(c: Connection, batch_id: int) -> list[int]:
        return c.execute(text("SELECT withdrawal_id FROM batch_output WHERE batch_id = :b ORDER BY withdrawal_id"),
                         {"b": batch_id}).scalars().all()

    # ---- tracking and finality ------------------------------------------------------------

    def track(self) -> int:
        """Advance every broadcast version of a batch that is not set aside; returns how many batches
        became final. A batch whose tracking or booking fails (the final booking refused by the
        ledger, say) is set aside with a critical incident: its transaction is on chain. A node
        error is retried next run. Either way the other batches go on."""
        with self.engine.connect() as c:
            rows = c.execute(text("SELECT t.id, t.batch_id, t.chain, t.txid, t.raw, t.state, t.fee FROM chain_transaction t "
                                  "JOIN withdrawal_batch b ON b.id = t.batch_id "
                                  "WHERE t.state IN ('broadcast', 'confirmed') AND b.containment = 'active' ORDER BY t.id")).all()
        finals, failed = 0, set()
        for r in rows:
            if r.batch_id in failed:  # another version of it failed in this run
                continue
            done = contained(self.engine, "batch", r.batch_id, r.state, Step.track, lambda r=r: self._track_one(r),
                             describe=lambda r=r: self._batch_detail(r.batch_id, r.txid))
            if done is None:
                failed.add(r.batch_id)
            finals += done or 0
        return finals

    def _track_one(self, r) -> int:
        status = self.adapters[r.chain].tx_status(r.txid, raw=bytes(r.raw))
        if status.state is TxState.CONFIRMED and not status.reverted:
            return self._confirmed(r, status)
        if status.state is TxState.MEMPOOL and r.state == "confirmed":
            with self.engine.begin() as c:  # its block was reorged out; it waits in the mempool again
                advance(c, "chain_transaction", r.id, "confirmed", "broadcast", confirmations=0)
        elif status.state in (TxState.REPLACED, TxState.CONFLICTED) or status.reverted:
            self._lost(r, status)
        elif status.state is TxState.UNKNOWN:
            try:
                self.adapters[r.chain].broadcast(bytes(r.raw))  # evicted: send the same bytes again
            except ChainError as exc:
                log.warning("re-broadcast of %s refused: %s", r.txid, exc)
        return 0

    def _finality(self, c: Connection, batch_id: int) -> int:
        asset = c.execute(text("SELECT asset FROM withdrawal_batch WHERE id = :b"), {"b": batch_id}).scalar_one()
        return self.wallets.chain_asset(asset, conn=c).finality_confirmations

    def _confirmed(self, r, status) -> int:
        with self.engine.begin() as c:
            finality = self._finality(c, r.batch_id)
            if r.state == "broadcast":
                advance(c, "chain_transaction", r.id, "broadcast", "confirmed", confirmations=status.confirmations,
                        block_hash=status.block.hash if status.block else None,
                        block_height=status.block.height if status.block else None)
                self._supersede_others(c, r)
                self._move_batch(c, r.batch_id, "confirmed")
            else:
                c.execute(text("UPDATE chain_transaction SET confirmations = :n WHERE id = :i"), {"n": status.confirmations, "i": r.id})
            if status.confirmations < finality:
                return 0
            fee = self._actual_fee(r)
            advance(c, "chain_transaction", r.id, "confirmed", "final", fee=fee)
            self._book_final(c, r.batch_id, r.chain, fee)
            self._move_batch(c, r.batch_id, "final")
            return 1

    def _actual_fee(self, r) -> int:
        if r.chain != "ethereum":
            return int(r.fee)
        mined = self.adapters["ethereum"].mined(r.txid)  # gas used x effective price, as reconciliation reads it
        if mined is None:
            raise ChainError(f"{r.txid} is not in the main chain; its gas is not known yet")
        return mined.fee

    def _supersede_others(self, c: Connection, r) -> None:
        """Once one version of a batch is mined, every other version is dead."""
        for other in c.execute(text("SELECT id, state FROM chain_transaction WHERE batch_id = :b AND id <> :i "
                                    "AND state IN ('signed', 'broadcast')"), {"b": r.batch_id, "i": r.id}).all():
            advance(c, "chain_transaction", other.id, other.state, "replaced")

    def _move_batch(self, c: Connection, batch_id: int, to: str) -> None:
        batch_state = c.execute(text("SELECT state FROM withdrawal_batch WHERE id = :b FOR UPDATE"), {"b": batch_id}).scalar_one()
        if batch_state == to:
            return
        advance(c, "batch", batch_id, batch_state, to)
        ids = self._batch_withdrawal_ids(c, batch_id)
        advance_many(c, "withdrawal", ids, batch_state, to)
        if to == "final":
            for wid in ids:
                emit(c, "withdrawal.final", f"withdrawal.final:{wid}", {"withdrawal_id": wid, "batch_id": batch_id},
                     aggregate=f"withdrawal:{wid}")

    def _book_final(self, c: Connection, batch_id: int, chain: str, fee: int) -> None:
        """One balanced transaction: every withdrawal in-flight -> hot location, and the network fee
        actually paid hot location -> expense."""
        native = "BTC" if chain == "bitcoin" else "ETH"
        legs = [Transfer(self.wallets.firm_account("in_flight", w.asset, conn=c),
                         self.wallets.location_account(chain, "hot", w.asset, conn=c), int(w.amount))
                for w in self._batch_outputs(c, batch_id)]
        if fee > 0:
            legs.append(Transfer(self.wallets.firm_account("network_fees", native, conn=c),
                                 self.wallets.location_account(chain, "hot", native, conn=c), fee))
        self.ledger.post(f"batch:{batch_id}:final", legs, kind="withdrawal_final",
                         metadata={"batch_id": batch_id, "network_fee": fee}, conn=c)

    def _lost(self, r, status) -> None:
        """This version is replaced (in the mempool) or conflicted (something else spending its
        inputs or nonce is mined). A version is never written off on mempool evidence: only the
        chain decides. If any version of the batch, including an earlier one a bump replaced, is
        mined or still pending, nothing is failed (the mined one is followed and books the batch;
        `_supersede_others` retires the rest). Only when none is alive did the batch fail: the
        capture is reversed and the withdrawals are released."""
        if status.state is TxState.REPLACED:
            return  # wait for a block: the version the miners take decides
        with self.engine.connect() as c:
            siblings = c.execute(text("SELECT id, txid, raw, state FROM chain_transaction WHERE batch_id = :b AND id <> :i "
                                      "AND state <> 'dropped'"), {"b": r.batch_id, "i": r.id}).all()
        adapter = self.adapters[r.chain]
        for sib in siblings:
            sib_state = adapter.tx_status(sib.txid, raw=bytes(sib.raw)).state
            if sib_state is TxState.CONFIRMED:
                with self.engine.begin() as c:
                    if sib.state == "replaced":  # an earlier version was mined after all: follow it
                        advance(c, "chain_transaction", sib.id, "replaced", "broadcast")
                        audit(c, "custody", "chain_transaction.revived", f"batch:{r.batch_id}", {"txid": sib.txid})
                    advance(c, "chain_transaction", r.id, r.state, "replaced")
                return
            if sib_state is TxState.MEMPOOL and sib.state != "replaced":
                return
        with self.engine.begin() as c:
            advance(c, "chain_transaction", r.id, r.state, "dropped")
            batch_state = c.execute(text("SELECT state FROM withdrawal_batch WHERE id = :b FOR UPDATE"), {"b": r.batch_id}).scalar_one()
            advance(c, "batch", r.batch_id, batch_state, "failed")
            capture = c.execute(text("SELECT id FROM journal_transaction WHERE idempotency_key = :k"),
                                {"k": f"batch:{r.batch_id}:capture"}).scalar_one()
            self.ledger.reverse(capture, f"batch:{r.batch_id}:capture:reversal", conn=c)
            ids = self._batch_withdrawal_ids(c, r.batch_id)
            by_state: dict[str, list[int]] = {}
            for row in c.execute(text("SELECT id, state FROM withdrawal_request WHERE id = ANY(:w)"), {"w": ids}):
                by_state.setdefault(row.state, []).append(row.id)
            for state, members in by_state.items():
                advance_many(c, "withdrawal", members, state, "failed")
            advance_many(c, "withdrawal", ids, "failed", "released")
            reopen_returns(c, ids, by="custody", reason="transaction_failed")
            for wid in ids:
                emit(c, "withdrawal.released", f"withdrawal.released:{wid}", {"withdrawal_id": wid, "reason": "transaction_failed"},
                     aggregate=f"withdrawal:{wid}")
            if status.reverted:  # ethereum: mined but failed; the value stayed, the gas did not
                gas = self._actual_fee(r)
                self.ledger.post(f"batch:{r.batch_id}:reverted_gas:{r.txid}",
                                 [Transfer(self.wallets.firm_account("network_fees", "ETH", conn=c),
                                           self.wallets.location_account("ethereum", "hot", "ETH", conn=c), gas)],
                                 kind="network_fee", metadata={"batch_id": r.batch_id, "txid": r.txid, "reverted": True}, conn=c)
            # The coins stay marked spent: something else spent them on chain (see the incident).
            open_incident(c, "withdrawal_transaction_failed", f"tx_failed:{r.id}",
                          {"batch_id": r.batch_id, "txid": r.txid, "status": status.state.value}, severity="warning")
