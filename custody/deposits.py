"""The deposit pipeline: scan -> confirm -> screen -> credit, with reorg handling.

An observation is not a credit. Each step is a job (APScheduler runs them; tests call them):

1. `scan(chain)`: walk blocks from the stored cursor through the chain adapter; every output,
   ether transfer or ERC-20 log paying a watched address becomes one `deposit_observation`
   (unique per chain, asset, txid, index) in state `seen`. The cursor moves by compare-and-set in
   the same database transaction, so a crash or a second scanner cannot skip or double-record.
   On bitcoin the same transaction keeps the wallet index (custody.wallet_index): every output of
   the walked blocks paying any of our addresses (deposit, hot, change, cold) and every spend of
   one of ours, undone block by block on a reorg. Only deposit-address outputs become
   observations; ether a gas funding of ours sent a deposit address (custody.eth_sweeps) is not a
   deposit and is not recorded. `catch_up(chain)` scans until the cursor is at the node's tip (the hot wallet
   sync runs it first).
2. `confirm(chain)`: confirmations are counted up to the scan cursor (a chain we have verified,
   never the node's unverified tip) and move `seen -> confirming -> final` by the asset's
   finality depth (`chain_asset.finality_confirmations`).
3. `credit(chain)`: for each final observation, the compliance screen runs (only now), then one
   journal transaction with a key from the chain identifiers moves the value from the deposit
   pool's asset-location account to the customer (`credited`), to quarantine (`quarantined`, for
   an operator to release) or, below the asset's dust minimum, to the dust account (`dust`). The
   state change and the outbox event commit with the journal transaction.
4. Reorgs: an observation in an undone block before finality becomes `orphaned` (nothing to undo)
   and returns to `seen` if re-mined. A reorg that undoes a credited (or quarantined, or dust)
   deposit opens a critical incident, which trips the kill switch, and moves the shortfall from
   the pool to the suspense account with a compensating transaction; if the transaction is
   re-mined the compensation is reversed (the incident stays for an operator to close).
   A reorged-out credit is frozen in the same database transaction: a hold owned by custody
   (`custody:reorg`, no expiry, only custody releases it) on the customer's account for whatever of
   the credited amount is still available (`reorg_freeze_amount`), recorded in the incident. The
   customer's withdrawals, transfers and orders see that much less available until an operator
   resolves the incident (`custody.incidents`): release it to the customer, or capture it to
   suspense so the books recover the shortfall. The part of the credit that another hold on the
   account hid from the freeze (an order's, a pending transfer's: it could be released and moved
   away) is the incident's `remainder` (`reorg_remainder`); while it is above zero the account is
   frozen for API debits, holds, captures and withdrawals until the incident is resolved, and a
   capture takes what of it is available by then. When the deposit is re-mined, a capture already
   made is reversed with the shortfall booking, in the same database transaction, audited.
5. A deposit reorged out after finality and not re-mined (its shortfall booking stands) can be
   neither released from quarantine nor returned: its coins are gone (`deposit_reorged_out`). A
   return already requested is not approved, and one already approved is rejected at batching
   (`return_reorged_out`), which puts the deposit back to `quarantined`.

Quarantine returns (`return_quarantined`) are withdrawals from the quarantine account that name
their deposit: policy requires operators other than the one who asked, whatever the amount; the
default destination is the deposit's original sender, and any other is flagged to the approvers.
A return that ends unpaid (rejected by policy or an operator, dropped from a batch, its transaction
failed) puts the deposit back to `quarantined` in the same database transaction (`reopen_returns`),
so it can be released or returned again (a new withdrawal, `deposit-return:<id>:<attempt>`).
"""
from __future__ import annotations

import functools
import json
import logging
import threading
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping, Sequence

from sqlalchemy import Connection, Engine, text

from chain_adapters.base import BlockRef, ChainAdapter, Observation, ScanResult, Watch
from chain_adapters.errors import ReorgTooDeep
from custody.addresses import derive_eth_address
from custody.controls import audit, emit, open_incident
from custody.destinations import HOT_RECEIVE_INDEX
from custody.errors import CustodyError, CustodyErrorCode
from custody.incidents import give_back_captures
from custody.states import advance
from custody.wallet_index import Ours, WalletIndex
from custody.wallets import Wallets
from ledger.errors import ErrorCode, LedgerError
from ledger.model import Transfer, content_hash
from ledger.service import Ledger
from policies import normalise_address

log = logging.getLogger(__name__)
POST_FINAL = ("credited", "quarantined", "dust", "released", "returned")
REORG_HOLD_OWNER = "custody:reorg"  # a hold freezing a reorged-out credit; no API caller can own it
CUSTOMER_CREDITED = ("credited", "released")  # the states in which the customer holds the deposit's value


def reorg_freeze_amount(credited: int, available: int) -> int:
    """How much of a reorged-out credit custody can still freeze: what the customer has not moved
    away yet (never more than the credit, never negative)."""
    return max(0, min(credited, available))


def reorg_remainder(credited: int, frozen: int, held: int) -> int:
    """How much of a reorged-out credit escaped the freeze only because other holds on the account
    covered it: it comes back to `available` when they are released. What left the account before
    the reorg is not counted (it is gone: the shortfall stays in suspense)."""
    return max(0, min(credited - frozen, held))


@dataclass(frozen=True)
class ScreenResult:
    hit: bool
    reasons: tuple[str, ...] = ()


# An external screener gets (chain, asset, receiving address, senders, amount) and answers.
ExternalScreener = Callable[[str, str, str, tuple[str, ...], int], ScreenResult]


@dataclass(frozen=True)
class ScanSummary:
    chain: str
    blocks: int
    recorded: int
    orphaned: int
    deep_reorg_incidents: int
    cursor: BlockRef
    reorged: bool = False  # this scan undid blocks back to a fork point


@dataclass(frozen=True)
class CreditSummary:
    credited: int = 0
    quarantined: int = 0
    dust: int = 0


class Deposits:
    def __init__(self, engine: Engine, ledger: Ledger, wallets: Wallets, adapters: Mapping[str, ChainAdapter],
                 *, external_screener: ExternalScreener | None = None) -> None:
        self.engine = engine
        self.ledger = ledger
        self.wallets = wallets
        self.adapters = adapters
        self.external_screener = external_screener
        self.indexes: dict[str, WalletIndex] = {}  # per chain: watched addresses, (bitcoin) our unspent outpoints
        self._scan_locks: dict[str, threading.Lock] = {c: threading.Lock() for c in adapters}

    def index(self, chain: str) -> WalletIndex:
        if chain not in self.indexes:
            self.indexes[chain] = WalletIndex(chain)
        return self.indexes[chain]

    # ---- cursor ---------------------------------------------------------------------------

    def cursor(self, chain: str) -> BlockRef | None:
        with self.engine.connect() as c:
            row = c.execute(text("SELECT height, hash FROM chain_cursor WHERE chain = :c"), {"c": chain}).first()
        return BlockRef(row.height, row.hash) if row else None

    def start_cursor(self, chain: str, at: BlockRef | None = None) -> BlockRef:
        """Start watching `chain` from `at` (default: the node's current tip) unless already started."""
        at = at or self.adapters[chain].tip()
        with self.engine.begin() as c:
            c.execute(text("INSERT INTO chain_cursor (chain, height, hash) VALUES (:c, :h, :x) ON CONFLICT (chain) DO NOTHING"),
                      {"c": chain, "h": at.height, "x": at.hash})
        return self.cursor(chain)  # type: ignore[return-value]

    # ---- 1. scan --------------------------------------------------------------------------

    def scan(self, chain: str, *, max_blocks: int = 100) -> ScanSummary:
        """Walk up to `max_blocks` blocks from the cursor: record deposit observations, keep the
        wallet index (custody.wallet_index, bitcoin) and move the cursor, in one database
        transaction. Scans of one chain are serialised within the process (the payouts job's
        catch-up and the deposits job share the in-memory index state)."""
        with self._scan_locks.setdefault(chain, threading.Lock()):
            first = self._scan(chain, max_blocks)
            if not first.reorged:
                return first
            # A reorg is only undone by the scan that finds it (back to the fork point); the new
            # branch is walked by a second scan, whose watched outpoints were reloaded after the undo,
            # so a coin of ours spent in an undone block and spent again in the new branch is seen.
            again = self._scan(chain, max_blocks)
            return replace(again, orphaned=first.orphaned + again.orphaned,
                           deep_reorg_incidents=first.deep_reorg_incidents + again.deep_reorg_incidents, reorged=True)

    def catch_up(self, chain: str, *, pages: int = 100) -> BlockRef | None:
        """Scan until the cursor is at the node's tip (or `pages` scans made); what the hot
        wallet sync runs first, so the index it reads is the chain up to the tip. Returns the
        cursor reached."""
        cursor = self.cursor(chain)
        for _ in range(pages):
            if cursor is not None and cursor == self.adapters[chain].tip():
                break
            summary = self.scan(chain)
            if summary.cursor == cursor and not summary.blocks:
                break  # nothing to walk, or another scanner moved the cursor: it carries on
            cursor = summary.cursor
        return cursor

    def _scan(self, chain: str, max_blocks: int) -> ScanSummary:
        adapter = self.adapters[chain]
        cursor = self.cursor(chain) or self.start_cursor(chain)
        index = self.index(chain)
        index.prepare(self.engine, cursor)
        watched = index.addresses
        tokens = {a.contract_address: a.asset for a in self.wallets.chain_assets(chain) if a.contract_address}
        try:
            result = adapter.scan(cursor, Watch(watched, tokens, outpoints=index.outpoints), max_blocks=max_blocks)
            if result.reorg is not None:  # undo only: the new branch is walked next (see scan)
                result = ScanResult(reorg=result.reorg, blocks=(), cursor=result.reorg.fork_point)
        except ReorgTooDeep as exc:
            # The node no longer has our cursor's chain and the adapter cannot find the fork point:
            # nothing is safe to credit until an operator has looked (critical: the kill switch).
            with self.engine.begin() as c:
                open_incident(c, "chain_reorg_unresolved", f"reorg_unresolved:{chain}:{cursor.hash}",
                              {"chain": chain, "cursor": [cursor.height, cursor.hash], "error": str(exc)})
            return ScanSummary(chain, 0, 0, 0, 1, cursor)
        orphaned = deep = recorded = 0
        try:
            with self.engine.begin() as c:
                moved = c.execute(
                    text("UPDATE chain_cursor SET height = :h, hash = :x, updated_at = now() "
                         "WHERE chain = :c AND height = :oh AND hash = :ox"),
                    {"h": result.cursor.height, "x": result.cursor.hash, "c": chain, "oh": cursor.height, "ox": cursor.hash},
                ).rowcount
                if moved != 1:
                    log.warning("%s: the cursor moved under this scan; another scanner is running", chain)
                    c.rollback()
                    index.invalidate()
                    return ScanSummary(chain, 0, 0, 0, 0, self.cursor(chain))  # type: ignore[arg-type]
                if result.reorg is not None:
                    log.warning("%s: reorg, fork point %s, %d block(s) undone", chain, result.reorg.fork_point, len(result.reorg.undone))
                    for obs in result.reorg.orphaned:
                        if watched.get(obs.address, _NOT_OURS).deposit_address_id is None:
                            continue  # hot, cold and not-yet-issued outputs: the wallet index undoes them below
                        outcome = self._orphan(c, chain, obs)
                        orphaned += outcome == "orphaned"
                        deep += outcome == "incident"
                created, spent = index.apply(c, result)
                for obs in result.observations:
                    ours = watched[obs.address]
                    # hot and cold outputs, and outputs paying a deposit address before it was
                    # issued (watched ahead: no row, nobody to credit), live in the wallet index only
                    if ours.tier == "deposit" and ours.deposit_address_id is None:
                        ours = self._issued_meanwhile(c, chain, obs.address, ours)
                    if ours.tier == "deposit" and ours.deposit_address_id is not None and not _our_gas_funding(c, obs):
                        recorded += self._record(c, chain, obs, ours)
        except BaseException:
            index.invalidate()  # the transaction rolled back: reload the outpoints from the table
            raise
        index.committed(result, created, spent)
        if result.blocks or result.reorg:
            log.info("%s: scanned %d block(s) to %s: %d observation(s) recorded, %d orphaned",
                     chain, len(result.blocks), result.cursor.height, recorded, orphaned)
        return ScanSummary(chain, len(result.blocks), recorded, orphaned, deep, result.cursor, result.reorg is not None)

    @staticmethod
    def _issued_meanwhile(c: Connection, chain: str, address: str, ours: Ours) -> Ours:
        """A deposit address watched ahead (no row when this scan refreshed its map) that was issued
        since: the row is read now, in the scan's transaction, so a payment the walk found is
        credited whenever the row was committed before the walk read the block (it always is: an
        address is handed out after its row commits, and paid after it is handed out). Only the
        row at the very index the watched address was derived at counts (a row naming our
        derivation at another index, or on another branch, is not ours to trust here; the index's
        own check of rows sees it). What a lagging scanner cannot tell: a payment made before the
        address was issued, walked only after, is credited to the customer issued the address."""
        if ours.change != 0:
            return ours
        row = c.execute(text(
            "SELECT d.id, d.account_id, d.owner, d.derivation_index FROM deposit_address d JOIN wallet w ON w.id = d.wallet_id "
            "WHERE d.chain = :c AND d.address = :a AND w.chain = :c AND w.tier = 'deposit'"), {"c": chain, "a": address}).first()
        if row is None or row.derivation_index != ours.index:
            return ours
        return replace(ours, deposit_address_id=row.id, account_id=row.account_id, owner=row.owner)

    def _record(self, c: Connection, chain: str, obs: Observation, ours: Ours) -> int:
        address_id, account_id, owner = ours.deposit_address_id, ours.account_id, ours.owner
        account = self.ledger.get_account(account_id, conn=c)
        if account.asset != obs.asset:  # e.g. an ERC-20 token sent to an address issued for ether
            account_id = self.wallets.customer_account(owner, obs.asset, conn=c)
        senders = list(getattr(obs, "senders", ()) or ())
        row = c.execute(
            text("INSERT INTO deposit_observation (chain, asset, txid, output_index, address, senders, amount, block_hash, "
                 "block_height, state, deposit_address_id, account_id) VALUES (:chain, :asset, :txid, :idx, :addr, :senders, "
                 ":amount, :bh, :height, 'seen', :dep, :acc) ON CONFLICT (chain, asset, txid, output_index) DO NOTHING RETURNING id"),
            {"chain": chain, "asset": obs.asset, "txid": obs.txid, "idx": obs.index, "addr": obs.address, "senders": senders,
             "amount": obs.amount, "bh": obs.block.hash, "height": obs.block.height, "dep": address_id, "acc": account_id},
        ).first()
        if row is not None:
            first = c.execute(text("UPDATE deposit_address SET first_seen_at = now() WHERE id = :i AND first_seen_at IS NULL "
                                   "RETURNING wallet_id, derivation_index"), {"i": address_id}).first()
            if first is not None:  # the wallet's gap bookkeeping (Wallets._check_gap), O(1)
                c.execute(text("UPDATE wallet SET last_used_index = :x WHERE id = :w AND last_used_index < :x"),
                          {"x": first.derivation_index, "w": first.wallet_id})
            return 1
        existing = c.execute(text(f"{_OBS_SQL} WHERE chain = :c AND asset = :a AND txid = :t AND output_index = :i FOR UPDATE"),
                             {"c": chain, "a": obs.asset, "t": obs.txid, "i": obs.index}).one()
        if existing.block_hash == obs.block.hash and not (existing.state in POST_FINAL and _reorged_out(c, existing)):
            return 0  # seen before in this very block (a rescan after a crash); not a block that came back
        if existing.state == "orphaned":
            advance(c, "deposit_observation", existing.id, "orphaned", "seen", block_hash=obs.block.hash,
                    block_height=obs.block.height, confirmations=0)
            log.info("%s: %s:%d re-mined in block %d", chain, obs.txid, obs.index, obs.block.height)
            return 1
        if existing.state in POST_FINAL:
            self._remined_after_deep_reorg(c, existing, obs)
            return 1
        c.execute(text("UPDATE deposit_observation SET block_hash = :h, block_height = :n, updated_at = now() WHERE id = :i"),
                  {"h": obs.block.hash, "n": obs.block.height, "i": existing.id})
        return 1

    def _orphan(self, c: Connection, chain: str, obs: Observation) -> str:
        row = c.execute(text(f"{_OBS_SQL} WHERE chain = :c AND asset = :a AND txid = :t AND output_index = :i FOR UPDATE"),
                        {"c": chain, "a": obs.asset, "t": obs.txid, "i": obs.index}).first()
        if row is None or row.block_hash != obs.block.hash:
            return "ignored"  # never recorded, or already moved to another block
        if row.state in ("seen", "confirming", "final"):
            advance(c, "deposit_observation", row.id, row.state, "orphaned", reorg_count=row.reorg_count + 1)
            return "orphaned"
        if row.state in POST_FINAL:
            if _reorged_out(c, row):
                return "ignored"  # its shortfall is booked already and stands: one per reorg
            self._deep_reorg(c, row)
            return "incident"
        return "ignored"

    def _deep_reorg(self, c: Connection, row) -> None:
        """A block holding a deposit we already booked is gone: book the shortfall to suspense."""
        pool = self.wallets.location_account(row.chain, "deposit", row.asset, conn=c)
        suspense = self.wallets.firm_account("suspense", row.asset, conn=c)
        key = _reorg_key(row, row.reorg_count)
        tx = self.ledger.post(key, [Transfer(suspense, pool, int(row.amount))], kind="deposit_reorg",
                              metadata={"observation_id": row.id, "block_hash": row.block_hash}, conn=c)
        c.execute(text("UPDATE deposit_observation SET reorg_count = reorg_count + 1, updated_at = now() WHERE id = :i"), {"i": row.id})
        hold = self._freeze_credit(c, row, key, suspense) if row.state in CUSTOMER_CREDITED else None
        open_incident(c, "deposit_reorged_after_finality", f"deposit_reorg:{row.id}:{row.reorg_count}:{row.block_hash}",
                      {"observation_id": row.id, "txid": row.txid, "index": row.output_index, "asset": row.asset,
                       "amount": int(row.amount), "state": row.state, "block_hash": row.block_hash,
                       "suspense_transaction_id": tx.transaction_id, "hold": hold})

    def _freeze_credit(self, c: Connection, row, key: str, suspense: int) -> dict:
        """Hold what is still available of the credit on the customer's account (under its balance
        lock, so the amount read is the amount held), after rejecting as many of the account's
        withdrawals not batched yet as the credit needs: their holds (custody's own) would otherwise
        hide the credit from the freeze while the batcher pays it out. Returns the incident's record
        of the hold."""
        from custody.withdrawals import reject_for_reorg  # (custody.withdrawals imports this module)
        rejected = reject_for_reorg(c, self.ledger, row.account_id, int(row.amount), by="custody:reorg")
        headroom = self.ledger.lock_available([row.account_id], conn=c).get(row.account_id)
        amount = reorg_freeze_amount(int(row.amount), headroom.available if headroom else 0)
        remainder = reorg_remainder(int(row.amount), amount, self.ledger.balance(row.account_id, conn=c).held)
        record = {"id": None, "account_id": row.account_id, "amount": str(amount), "owner": REORG_HOLD_OWNER,
                  "capture_to": suspense, "remainder": str(remainder), "withdrawals_rejected": rejected}
        if amount > 0:
            record["id"] = self.ledger.place_hold(f"{key}:freeze", row.account_id, amount, owner=REORG_HOLD_OWNER,
                                                  reference=f"deposit-reorg:{row.id}", conn=c).id
        log.error("deposit %s reorged out after its credit: %s of %s frozen on account %s (remainder %s: account frozen)",
                  row.id, amount, row.amount, row.account_id, remainder)
        return record

    def _remined_after_deep_reorg(self, c: Connection, row, obs: Observation) -> None:
        key = _reorg_key(row, row.reorg_count - 1)  # the compensation booked before the count went up
        compensation = c.execute(text("SELECT id FROM journal_transaction WHERE idempotency_key = :k"), {"k": key}).first()
        given_back: list[int] = []
        if compensation is not None:
            key = f"deposit-remined:{row.id}:{row.reorg_count}:{obs.block.hash}"
            self.ledger.reverse(compensation.id, key, conn=c)
            given_back = give_back_captures(c, self.ledger, compensation.id, key)
        c.execute(text("UPDATE deposit_observation SET block_hash = :h, block_height = :n, updated_at = now() WHERE id = :i"),
                  {"h": obs.block.hash, "n": obs.block.height, "i": row.id})
        audit(c, "custody", "deposit.remined", f"observation:{row.id}",
              {"block_hash": obs.block.hash, "captures_given_back": given_back})

    # ---- 2. confirm -----------------------------------------------------------------------

    def confirm(self, chain: str) -> int:
        """Recount confirmations up to the scan cursor; returns how many became final."""
        cursor = self.cursor(chain)
        if cursor is None:
            return 0
        became_final = 0
        with self.engine.begin() as c:
            rows = c.execute(
                text("SELECT o.id, o.state, o.block_height, o.confirmations, a.finality_confirmations FROM deposit_observation o "
                     "JOIN chain_asset a ON a.asset = o.asset WHERE o.chain = :c AND o.state IN ('seen', 'confirming') FOR UPDATE OF o"),
                {"c": chain},
            ).all()
            for r in rows:
                confs = max(0, cursor.height - r.block_height + 1)
                target = "final" if confs >= r.finality_confirmations else ("confirming" if confs >= 1 else "seen")
                if target != r.state:
                    advance(c, "deposit_observation", r.id, r.state, target, confirmations=confs)
                    became_final += target == "final"
                elif confs != r.confirmations:
                    c.execute(text("UPDATE deposit_observation SET confirmations = :n WHERE id = :i"), {"n": confs, "i": r.id})
        return became_final

    # ---- 3 + 4. screen and credit ---------------------------------------------------------

    def credit(self, chain: str | None = None, *, limit: int = 1000, group: int = 100) -> CreditSummary:
        """Screen and book final observations. Up to `group` deposits share one database commit
        (one fsync, one pass over the pool account's lock), each inside its own savepoint: a deposit
        that fails is rolled back alone, logged, and retried on the next run."""
        with self.engine.connect() as c:
            ids = c.execute(
                text("SELECT id FROM deposit_observation WHERE state = 'final' AND (CAST(:c AS text) IS NULL OR chain = :c) "
                     "ORDER BY id LIMIT :l"), {"c": chain, "l": limit},
            ).scalars().all()
        counts = {"credited": 0, "quarantined": 0, "dust": 0}
        for start in range(0, len(ids), group):
            with self.engine.begin() as c:
                for obs_id in ids[start:start + group]:
                    try:
                        with c.begin_nested():
                            outcome = self._credit_one(obs_id, c)
                    except Exception:  # noqa: BLE001 - one bad deposit must not hold up the others
                        log.exception("deposit %s not booked this run; it stays final and is retried", obs_id)
                        continue
                    if outcome:
                        counts[outcome] += 1
        return CreditSummary(**counts)

    def _credit_one(self, obs_id: int, c: Connection) -> str | None:
        row = c.execute(text(f"{_OBS_SQL} WHERE id = :i FOR UPDATE"), {"i": obs_id}).one()
        if row.state != "final":
            return None  # another worker got here first
        screen = self.screen(c, row)
        pool = self.wallets.location_account(row.chain, "deposit", row.asset, conn=c)
        amount = int(row.amount)
        if screen.hit:
            target, to_account, kind = "quarantined", self.wallets.firm_account("quarantine", row.asset, conn=c), "deposit_quarantine"
        elif amount < self.wallets.chain_asset(row.asset, conn=c).dust_minimum:
            target, to_account, kind = "dust", self.wallets.firm_account("dust", row.asset, conn=c), "deposit_dust"
        else:
            target, to_account, kind = "credited", row.account_id, "deposit"
        key = _deposit_key(row) if target == "credited" else f"{_deposit_key(row)}:{target}"
        tx = self.ledger.post(key, [Transfer(pool, to_account, amount)], kind=kind,
                              metadata={"observation_id": row.id, "txid": row.txid, "index": row.output_index}, conn=c)
        advance(c, "deposit_observation", row.id, "final", target, journal_transaction_id=tx.transaction_id,
                screening=_json({"hit": screen.hit, "reasons": list(screen.reasons)}))
        emit(c, f"deposit.{target}", f"deposit.{target}:{row.id}", _event(row, tx.transaction_id),
             aggregate=f"deposit:{row.id}")
        if target != "credited":
            log.warning("deposit %s %s:%d %s (%s)", row.id, row.txid, row.output_index, target, ", ".join(screen.reasons) or "below dust minimum")
        return target

    def screen(self, c: Connection, row) -> ScreenResult:
        """The compliance screen: our denylist (receiving address and senders), then the external hook."""
        senders = list(row.senders)
        if not senders and hasattr(self.adapters.get(row.chain), "senders"):
            senders = list(self.adapters[row.chain].senders(row.txid))  # bitcoin: looked up once, here
            c.execute(text("UPDATE deposit_observation SET senders = :s WHERE id = :i"), {"s": senders, "i": row.id})
        parties = [row.address, *senders]
        hits = c.execute(text("SELECT address, reason FROM denylist_address WHERE lower(address) = ANY(:a)"),
                         {"a": [p.lower() for p in parties]}).all()
        reasons = tuple(f"denylisted {h.address}: {h.reason}" for h in hits)
        if self.external_screener is not None:
            external = self.external_screener(row.chain, row.asset, row.address, tuple(senders), int(row.amount))
            reasons += external.reasons if external.hit else ()
            return ScreenResult(bool(reasons) or external.hit, reasons)
        return ScreenResult(bool(reasons), reasons)

    # ---- operator actions and reads ----------------------------------------------------------

    def release_quarantined(self, obs_id: int, *, operator: str, comment: str) -> int:
        """An operator's decision to credit a quarantined deposit to its customer. Returns the
        journal transaction id; releasing again returns the same one."""
        if not comment.strip():
            raise LedgerError(ErrorCode.invalid_request, "a release needs a comment saying why")
        with self.engine.begin() as c:
            row = c.execute(text(f"{_OBS_SQL} WHERE id = :i FOR UPDATE"), {"i": obs_id}).first()
            if row is None:
                raise CustodyError(CustodyErrorCode.deposit_not_found, f"no deposit {obs_id}")
            key = f"{_deposit_key(row)}:release"
            if row.state == "released":
                return c.execute(text("SELECT id FROM journal_transaction WHERE idempotency_key = :k"), {"k": key}).scalar_one()
            if row.state != "quarantined":
                raise LedgerError(ErrorCode.invalid_request, f"deposit {obs_id} is {row.state}, not quarantined")
            _refuse_reorged_out(c, row)
            quarantine = self.wallets.firm_account("quarantine", row.asset, conn=c)
            # The database posts it and marks the deposit released (0055, custody_release_quarantined):
            # exactly its amount from quarantine into its own customer's account, once.
            metadata = {"observation_id": row.id, "operator": operator}
            digest = content_hash("deposit_release", [Transfer(quarantine, row.account_id, int(row.amount))],
                                  {"metadata": metadata, "reverses": None})
            released = c.execute(text(_RELEASE_QUARANTINED_SQL),
                                 {"o": row.id, "h": digest, "m": json.dumps(metadata, sort_keys=True, default=str)}).one()
            if released.status not in ("created", "exists"):
                if released.status == "not_quarantined":
                    raise LedgerError(ErrorCode.invalid_request,
                                      f"deposit {obs_id} cannot be released: it is not booked to quarantine or has a return")
                raise LedgerError(ErrorCode(released.status), index=released.failed_index)
            audit(c, operator, "deposit.release", f"observation:{row.id}", {"comment": comment, "transaction_id": released.transaction_id})
            emit(c, "deposit.credited", f"deposit.credited:{row.id}", _event(row, released.transaction_id),
             aggregate=f"deposit:{row.id}")
            return released.transaction_id

    def return_quarantined(self, obs_id: int, *, operator: str, comment: str, withdrawals, destination: str | None = None) -> int:
        """An operator's request to send a quarantined deposit back (to its original sender by default).
        It becomes a withdrawal from the quarantine account for the amount less the quoted network
        fee, requested by the operator and naming the deposit, so it passes policy, always needs a
        quorum of operators other than the one who asked (whatever the amount tier; a destination
        other than the original sender is flagged to them) and the signer's checks. The comment
        says why (and, for another destination, why there). Returns the withdrawal id; asking
        again returns the same one. A return that ended unpaid put the deposit back to
        `quarantined` (`reopen_returns`): asking again then requests a new withdrawal."""
        if not comment.strip():
            raise LedgerError(ErrorCode.invalid_request, "a return needs a comment saying why")
        with self.engine.connect() as c:
            row = c.execute(text(f"{_OBS_SQL} WHERE id = :i"), {"i": obs_id}).first()
        if row is None:
            raise CustodyError(CustodyErrorCode.deposit_not_found, f"no deposit {obs_id}")
        if row.state not in ("quarantined", "returned"):
            raise LedgerError(ErrorCode.invalid_request, f"deposit {obs_id} is {row.state}, not quarantined")
        destination = destination or (row.senders[0] if len(row.senders) == 1 else None)
        if destination is None:
            raise LedgerError(ErrorCode.invalid_request, "the deposit has no single sender: name the destination")
        # First the deposit leaves `quarantined` under its row lock, so a release can no longer
        # happen; then the (idempotent) withdrawal is requested. A crash in between is finished by
        # asking again: the deposit is `returned` without a withdrawal, and the request is repeated
        # (or the withdrawal it made is linked). A request that fails puts the deposit back.
        with self.engine.begin() as c:
            current = c.execute(text(f"{_OBS_SQL} WHERE id = :i FOR UPDATE"), {"i": obs_id}).one()
            linked = c.execute(text("SELECT return_withdrawal_id FROM deposit_observation WHERE id = :i"), {"i": obs_id}).scalar()
            if linked is not None:
                return linked
            if current.state not in ("quarantined", "returned"):
                raise LedgerError(ErrorCode.invalid_request, f"deposit {obs_id} is {current.state}, not quarantined")
            _refuse_reorged_out(c, current)
            live = c.execute(text(_LIVE_RETURN_SQL), {"o": obs_id, "ended": list(UNPAID_ENDS)}).scalar()
            if live is not None and current.state == "returned":  # requested before a crash: link it
                c.execute(text(_LINK_RETURN_SQL), {"w": live, "i": obs_id})
                return live
            if current.state == "quarantined":
                advance(c, "deposit_observation", obs_id, "quarantined", "returned")
                audit(c, operator, "deposit.return", f"observation:{obs_id}",
                      {"comment": comment, "destination": destination, "original_senders": list(row.senders),
                       "to_original_sender": normalise_address(destination) in {normalise_address(a) for a in row.senders}})
            quarantine = self.wallets.firm_account("quarantine", row.asset, conn=c)
            base = f"deposit-return:{obs_id}"
            attempts = c.execute(text(_RETURN_ATTEMPTS_SQL), {"q": quarantine, "base": base, "more": f"{base}:%"}).scalar_one()
        fee = self.wallets.chain_asset(row.asset).withdrawal_fee
        client_id = base if attempts == 0 else f"{base}:{attempts + 1}"
        try:
            w = withdrawals.request(client_withdrawal_id=client_id, account_id=quarantine,
                                    amount=int(row.amount) - fee, destination=destination, requested_by=operator,
                                    _return_of_deposit=obs_id)
        except Exception as exc:
            self._undo_return(obs_id, operator, exc)
            raise
        with self.engine.begin() as c:
            c.execute(text(_LINK_RETURN_SQL), {"w": w.id, "i": obs_id})
        return w.id

    def _undo_return(self, obs_id: int, operator: str, error: Exception) -> None:
        """The return's withdrawal could not be requested (nothing was written, or policy rejected
        it): the deposit goes back to `quarantined` unless a live withdrawal returns it."""
        with self.engine.begin() as c:
            current = c.execute(text("SELECT state, return_withdrawal_id FROM deposit_observation WHERE id = :i FOR UPDATE"),
                                {"i": obs_id}).one()
            if current.state != "returned" or current.return_withdrawal_id is not None:
                return
            if c.execute(text(_LIVE_RETURN_SQL), {"o": obs_id, "ended": list(UNPAID_ENDS)}).first() is not None:
                return
            advance(c, "deposit_observation", obs_id, "returned", "quarantined")
            audit(c, operator, "deposit.return_failed", f"observation:{obs_id}", {"error": str(error)[:500]})

    def list(self, *, account_id: int | None = None, state: str | None = None, before_id: int | None = None,
             limit: int = 200) -> list[dict]:
        """Observations newest first (below `before_id` when given: the next page of a walk)."""
        with self.engine.connect() as c:
            rows = c.execute(
                text(f"{_OBS_SQL} WHERE (CAST(:a AS bigint) IS NULL OR account_id = :a) AND (CAST(:s AS text) IS NULL OR state = :s) "
                     "AND (CAST(:b AS bigint) IS NULL OR id < :b) "
                     "ORDER BY id DESC LIMIT :l"), {"a": account_id, "s": state, "b": before_id, "l": limit},
            ).all()
        return [dict(r._mapping) for r in rows]

    def run_once(self, chains: Iterable[str] | None = None) -> dict[str, tuple[ScanSummary, int, CreditSummary]]:
        """One pass of every job for each chain, in pipeline order (what the scheduler does)."""
        out = {}
        for chain in chains or self.adapters:
            scanned = self.scan(chain)
            while scanned.blocks:  # catch up in pages
                more = self.scan(chain)
                if not more.blocks:
                    break
                scanned = more
            out[chain] = (scanned, self.confirm(chain), self.credit(chain))
        return out


_NOT_OURS = Ours("none", 0, 0)

_OBS_SQL = ("SELECT id, chain, asset, txid, output_index, address, senders, amount, block_hash, block_height, confirmations, "
            "state, deposit_address_id, account_id, journal_transaction_id, reorg_count FROM deposit_observation")


# An operator's release of a quarantined deposit (migration 0055): checked, posted and marked in the database.
_RELEASE_QUARANTINED_SQL = """
SELECT status, transaction_id, failed_index
FROM custody_release_quarantined(:o, :h, CAST(:m AS jsonb))
"""

# Withdrawal states in which a withdrawal ended without paying anything.
UNPAID_ENDS = ("rejected", "cancelled", "released", "failed")

_LIVE_RETURN_SQL = """
SELECT id
FROM withdrawal_request
WHERE return_of_deposit = :o
  AND state <> ALL(:ended)
ORDER BY id DESC
LIMIT 1
"""

# Every return withdrawal a deposit had (an ended one no longer names its deposit: see reopen_returns).
_RETURN_ATTEMPTS_SQL = """
SELECT count(*)
FROM withdrawal_request
WHERE account_id = :q
  AND (client_withdrawal_id = :base OR client_withdrawal_id LIKE :more)
"""

# An ended return lets go of its deposit: one withdrawal at most names a deposit (a unique column),
# and the next return needs it. The link stays in its policy decision's record and the audit event.
_RELEASE_RETURN_OF_SQL = """
UPDATE withdrawal_request
SET return_of_deposit = NULL, updated_at = now()
WHERE id = :w
"""

# Linked only while the deposit is still `returned` (a return rejected in the meantime reopened it).
_LINK_RETURN_SQL = """
UPDATE deposit_observation
SET return_withdrawal_id = :w, updated_at = now()
WHERE id = :i
  AND state = 'returned'
"""

_RETURNS_OF_SQL = """
SELECT o.id AS deposit_id, w.id AS withdrawal_id, w.state
FROM withdrawal_request w
JOIN deposit_observation o ON o.id = w.return_of_deposit
WHERE w.id = ANY(:w)
  AND o.state = 'returned'
  AND (o.return_withdrawal_id IS NULL OR o.return_withdrawal_id = w.id)
ORDER BY o.id
FOR UPDATE OF o
"""

# The shortfall booking of a deposit's latest reorg, if it still stands (not reversed by a re-mine).
_STANDING_SHORTFALL_SQL = """
SELECT t.id
FROM journal_transaction t
WHERE t.idempotency_key = :k
  AND NOT EXISTS (SELECT 1 FROM journal_transaction r WHERE r.reverses_id = t.id)
"""


_RETURNED_DEPOSIT_SQL = f"{_OBS_SQL} WHERE id = (SELECT return_of_deposit FROM withdrawal_request WHERE id = :w)"
_RETURNED_DEPOSITS_SQL = (f"SELECT o.*, w.id AS withdrawal_id FROM ({_OBS_SQL}) o "
                          "JOIN withdrawal_request w ON w.return_of_deposit = o.id WHERE w.id = ANY(CAST(:w AS bigint[]))")


def reopen_returns(c: Connection, withdrawal_ids: Iterable[int], *, by: str, reason: str) -> list[int]:
    """Withdrawals that ended unpaid (rejected, cancelled, released, failed): every deposit one of
    them was returning goes back from `returned` to `quarantined`, its link cleared, in the
    caller's database transaction (the one that ends the withdrawal), audited, so it can be
    released or returned again (the ended withdrawal no longer names it: the audit event and its
    policy decision's record do). Returns the deposits reopened."""
    rows = c.execute(text(_RETURNS_OF_SQL), {"w": sorted(set(withdrawal_ids))}).all()
    for r in rows:
        advance(c, "deposit_observation", r.deposit_id, "returned", "quarantined", return_withdrawal_id=None)
        c.execute(text(_RELEASE_RETURN_OF_SQL), {"w": r.withdrawal_id})
        audit(c, by, "deposit.return_ended", f"observation:{r.deposit_id}",
              {"withdrawal_id": r.withdrawal_id, "withdrawal_state": r.state, "reason": reason})
        log.warning("deposit %s: its return (withdrawal %s) ended %s (%s); quarantined again", r.deposit_id,
                    r.withdrawal_id, r.state, reason)
    return [r.deposit_id for r in rows]


def return_reorged_out(c: Connection, withdrawal_id: int) -> bool:
    """Does the withdrawal return a deposit that was reorged out after finality (and not re-mined)?
    Such a return would pay out coins the firm no longer has: it is not approved nor paid."""
    row = c.execute(text(_RETURNED_DEPOSIT_SQL), {"w": withdrawal_id}).first()
    return row is not None and _reorged_out(c, row)


def returns_reorged_out(c: Connection, withdrawal_ids: Sequence[int]) -> set[int]:
    """`return_reorged_out` for many withdrawals: those of them that return such a deposit. One
    statement finds the returns among them (most withdrawals return nothing)."""
    rows = c.execute(text(_RETURNED_DEPOSITS_SQL), {"w": list(withdrawal_ids)}).all()
    return {r.withdrawal_id for r in rows if _reorged_out(c, r)}


def _reorged_out(c: Connection, row) -> bool:
    """Is the deposit's transaction out of the chain after finality (its latest reorg's shortfall
    booking stands: not re-mined)?"""
    if row.reorg_count == 0:
        return False
    return c.execute(text(_STANDING_SHORTFALL_SQL), {"k": _reorg_key(row, row.reorg_count - 1)}).first() is not None


def _refuse_reorged_out(c: Connection, row) -> None:
    if _reorged_out(c, row):
        raise CustodyError(CustodyErrorCode.deposit_reorged_out,
                           f"deposit {row.id} was reorged out after finality and is not re-mined: its coins are gone",
                           deposit_id=row.id)


def _our_gas_funding(c: Connection, obs: Observation) -> bool:
    """Ether the hot address sent a deposit address for a token sweep's gas (custody.eth_sweeps,
    stored before it was broadcast): the firm's own money, booked by the sweep, never a deposit.
    Whatever our ethereum hot address sends a deposit address is never a deposit either, whether
    or not custody recorded it (review R15-S1: a funding signed for a forged sweep row, or one whose
    row is lost): the hot address pays a deposit address only gas (the signer refuses withdrawals
    to our own addresses, `destination_internal`). Such a transfer custody did not record stays
    on the deposit address as reconciliation's surplus on the deposit line (and a shortfall on the
    hot line) until an operator books it: it is never credited to the address's owner."""
    if obs.asset == "ETH" and c.execute(text("SELECT 1 FROM eth_gas_funding WHERE txid = :t"), {"t": obs.txid}).first():
        return True
    if not obs.senders or not obs.address.startswith("0x"):
        return False
    xpub = c.execute(text("SELECT xpub FROM wallet WHERE chain = 'ethereum' AND tier = 'hot'")).scalar()
    return xpub is not None and _eth_hot_address(xpub) in {s.lower() for s in obs.senders}


@functools.lru_cache(maxsize=4)
def _eth_hot_address(xpub: str) -> str:
    """The ethereum hot address (lowercase) derived from the hot wallet's xpub, as custody.payouts does."""
    return derive_eth_address(xpub, HOT_RECEIVE_INDEX).lower()


def _deposit_key(row) -> str:
    return f"deposit:{row.chain}:{row.asset}:{row.txid}:{row.output_index}"


def _reorg_key(row, count: int) -> str:
    # the count: a deposit reorged out of the same block twice (X -> Y -> X) is compensated twice
    return f"deposit-reorg:{row.id}:{count}:{row.block_hash}"


def _event(row, transaction_id: int) -> dict:
    return {"observation_id": row.id, "account_id": row.account_id, "asset": row.asset, "amount": int(row.amount),
            "txid": row.txid, "index": row.output_index, "transaction_id": transaction_id}


def _json(value: dict) -> str:
    import json

    return json.dumps(value)
