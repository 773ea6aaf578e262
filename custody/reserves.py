"""Proof of reserves v2: per asset, liabilities as a private Merkle sum tree and holdings as signed
statements that standard tools check; and the verifier a customer runs alone.

Publishing is work the worker does, off the request path (migration 0043_reserves_jobs):
- `Reserves.request(key, ...)` (`POST /v1/reserves/reports`, `python -m custody reserves publish`)
  records one `reserve_job` row per asset, `building`; its id is the report's. Idempotent per key.
- `Reserves.run_once()` (the worker's `reserves` job, custody.jobs) builds the oldest request still
  building (`build`): reads the snapshot below, hashes each tree recording its progress
  (`leaves_built` of `leaves_total`, every merkle_sum.PROGRESS_LEAVES leaves), then stores the
  reports, leaves and nodes and marks the rows `published`, all in ONE transaction: a crash at any
  point leaves nothing stored and the rows `building`, and the next run starts again from nothing
  (`attempts` + 1). A refusal a retry cannot change (FINAL_CODES) makes them `failed`.
- `proof()` of a report still building is `reserves_report_building`.
- `publish()` requests and builds at once in the calling process (tests, the CLI's core).

A build writes one report per asset (BTC, ETH and each ERC-20 token of `chain_asset` whose chain
has an adapter here), all from ONE ledger snapshot:
- liabilities: in a REPEATABLE READ, read-only snapshot the ledger's own checks
  (`ledger.verify.verify_in`) must all pass, else `reserves_ledger_unverified`; in that snapshot
  every customer account's posted balance per asset is read, and the checkpoint stated in every
  report of the set (`ledger`): the newest journal transaction id, the number of transactions and
  `journal_digest` = SHA-256 over "<id> <content_hash>\\n" of every journal transaction in id order
  (an auditor with read access recomputes it; see README). Each asset's balances go into a tree of
  custody.merkle_sum (`place`: every balance split into `parts` random leaves with per-leaf nonces,
  padded, shuffled; the `RESERVES_LEAVES_PER_ACCOUNT` setting, default 4); leaves and the upper
  nodes are stored (`reserve_leaf`, `reserve_node`, migration 0036).
- holdings, at one stated block per chain, read in the same snapshot as the liabilities: bitcoin at
  the wallet index's block (the deposit scanner's cursor; our unspent coins of the deposit and hot
  tiers, custody.wallet_index); ethereum at the ethereum scanner's cursor (ether with
  `eth_getBalance`, each token with `balanceOf`, both at that block number, for every deposit
  address issued and the hot address). A cursor whose block has left the node's main chain is
  `reserves_index_behind`. Cold coins (watch-only, their keys offline) are not listed, so a report
  understates what the firm holds by them.
- for every listed address a `ReservesStatement` (signer.protocol: report, asset, chain, block,
  address, amount, liabilities root) signed by the signer with that address's key: BIP-322 simple
  for bitcoin (P2WPKH), EIP-191 personal_sign for ethereum.

What a customer's proof (`Reserves.proof`) reveals and does not: see custody.merkle_sum and the
README. `check_report` / `check_proof` (pure, no database, no node) are what
`python -m custody.reserves verify REPORT [PROOF]` runs: every problem is listed, exit status 1.
They cannot tell whether the listed amounts are on chain at the stated block (that needs a node:
README) nor whether accounts are missing (each customer checks their own).

It is NOT a proof of solvency; the report says so (`disclaimer`).
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import logging
import sys
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from sqlalchemy import Connection, Engine, text

from chain_adapters.base import BlockRef, ChainAdapter
from chain_adapters.errors import NotFound
from custody import wallet_index
from custody.addresses import derive_eth_address
from custody.destinations import HOT_RECEIVE_INDEX
from custody.errors import CustodyError, CustodyErrorCode
from custody.merkle_sum import (CHUNK, CHUNK_LEVELS, DEFAULT_PARTS, NONCE_BYTES, PADDING_ACCOUNT, Node, Step, Tree, leaf, leaf_count,
                                place, prove, upper_positions, verify)
from ledger.model import AccountKind
from ledger.verify import verify_in
from signer import bip322, eip191
from signer.protocol import ReservesStatement, SignerPort, SigningRefused

VERSION = 2
DISCLAIMER = ("This is a proof of reserves, not a proof of solvency: it shows the listed holdings and a commitment to "
              "customer liabilities at one block height, and nothing about other obligations or later changes.")
FORMATS = {"bitcoin": "bip322-simple", "ethereum": "eip191-personal-sign"}
_INSERT_ROWS = 20_000  # upper nodes per INSERT statement
# refusals a retry of the same request cannot change: its reports become `failed` (others stay `building`)
FINAL_CODES = frozenset({CustodyErrorCode.no_customer_accounts, CustodyErrorCode.reserves_ledger_unverified,
                         CustodyErrorCode.signer_refused})
log = logging.getLogger(__name__)

_ASSETS_SQL = """
SELECT asset, chain, contract_address
FROM chain_asset
WHERE chain = ANY(:chains)
ORDER BY asset
"""
_BALANCES_SQL = """
SELECT a.asset, a.id, coalesce(sum(b.posted), 0) AS posted
FROM account a
JOIN account_balance b ON b.account_id = a.id
WHERE a.kind = :kind
  AND a.asset = ANY(:assets)
GROUP BY a.asset, a.id
ORDER BY a.asset, a.id
"""
_JOURNAL_SQL = """
SELECT id, content_hash
FROM journal_transaction
ORDER BY id
"""
_REQUESTABLE_SQL = """
SELECT ca.asset
FROM chain_asset ca
WHERE ca.chain = ANY(:chains)
  AND EXISTS (SELECT 1 FROM account a JOIN account_balance b ON b.account_id = a.id
              WHERE a.kind = :kind AND a.asset = ca.asset)
ORDER BY ca.asset
"""
_REQUEST_SQL = """
INSERT INTO reserve_job (request_key, asset, requested_by)
SELECT :k, unnest(CAST(:assets AS text[])), :by
ORDER BY 2
ON CONFLICT (request_key, asset) DO NOTHING
RETURNING id
"""
_JOBS_SQL = """
SELECT id, request_key, asset, requested_by, state, leaves_built, leaves_total, attempts, error_code, error,
       created_at, updated_at, published_at
FROM reserve_job
WHERE {where}
ORDER BY asset
"""
_ETH_ADDRESSES_SQL = """
SELECT address, derivation_index
FROM deposit_address
WHERE chain = 'ethereum'
ORDER BY derivation_index
"""
_ETH_HOT_XPUB_SQL = "SELECT xpub FROM wallet WHERE chain = 'ethereum' AND tier = 'hot'"
_LEAVES_OF_SQL = """
SELECT leaf_index
FROM reserve_leaf
WHERE report_id = :r
  AND account_id = :a
ORDER BY leaf_index
"""
_CHUNKS_SQL = """
SELECT l.leaf_index, l.account_id, l.amount, l.nonce
FROM unnest(CAST(:lo AS int[])) AS c(lo)
JOIN reserve_leaf l ON l.report_id = :r AND l.leaf_index >= c.lo AND l.leaf_index < c.lo + :n
ORDER BY l.leaf_index
"""
_NODES_SQL = """
SELECT n.level, n.position, n.hash, n.sum
FROM unnest(CAST(:lv AS int[]), CAST(:p AS int[])) AS w(level, position)
JOIN reserve_node n ON n.report_id = :r AND n.level = w.level AND n.position = w.position
"""


@dataclass(frozen=True)
class ReportJob:
    """One requested report: `building` (leaves hashed so far of `leaves_total`, None until the
    build has read the ledger; `attempts` builds started; the last one's failure in `error_code`,
    `error`), then `published` (its body in `reserve_report`) or `failed`."""

    report_id: int
    request_key: str
    asset: str
    requested_by: str
    state: str
    leaves_built: int
    leaves_total: int | None
    attempts: int
    error_code: str | None
    error: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    published_at: dt.datetime | None


def _jobs(c: Connection, where: str, **params: object) -> list[ReportJob]:
    return [ReportJob(r.id, r.request_key, r.asset, r.requested_by, r.state, int(r.leaves_built),
                      None if r.leaves_total is None else int(r.leaves_total), r.attempts, r.error_code, r.error,
                      r.created_at, r.updated_at, r.published_at)
            for r in c.execute(text(_JOBS_SQL.format(where=where)), params)]


@dataclass(frozen=True)
class Holding:
    """One address of ours holding `amount` of an asset at the report's block, and the key
    (tier, change, index) the signer signs its statement with."""

    address: str
    amount: int
    tier: str
    change: int
    index: int


@dataclass(frozen=True)
class AssetInput:
    asset: str
    chain: str
    contract: str | None
    block: BlockRef
    balances: list[tuple[int, int]]  # (account id, posted balance), every customer account
    holdings: list[Holding]


class Reserves:
    def __init__(self, engine: Engine, adapters: Mapping[str, ChainAdapter], signer: SignerPort, *, network: str,
                 parts: int = DEFAULT_PARTS) -> None:
        self.engine = engine
        self.adapters = adapters
        self.signer = signer
        self.network = network  # bitcoin's
        self.parts = parts

    # ---- publishing: a request, then the worker's build --------------------------------------

    def request(self, key: str, requested_by: str, assets: Sequence[str] | None = None) -> tuple[list[ReportJob], bool]:
        """Record a request for one report per asset (those named, or every asset of a configured
        chain with a customer account), each `building`; the worker's `run_once` builds them.
        Answers the reports and True, or for a key seen before with the same assets the original
        reports and False (`reserves_request_exists_with_different_assets` with other assets).
        Refused with `no_customer_accounts` when none of the assets has a customer account."""
        with self.engine.begin() as c:
            existing = _jobs(c, "request_key = :k", k=key)
            if not existing:
                wanted = c.execute(text(_REQUESTABLE_SQL), {"chains": sorted(self.adapters),
                                                            "kind": AccountKind.customer.value}).scalars().all()
                if assets is not None:
                    wanted = [a for a in wanted if a in set(assets)]
                if not wanted:
                    raise CustodyError(CustodyErrorCode.no_customer_accounts,
                                       "no customer account of these assets exists: a report has no liabilities to commit to")
                if assets is not None and set(assets) - set(wanted):
                    raise CustodyError(CustodyErrorCode.no_customer_accounts,
                                       f"no customer account of {sorted(set(assets) - set(wanted))} on a configured chain")
                inserted = c.execute(text(_REQUEST_SQL), {"k": key, "assets": sorted(wanted), "by": requested_by}).all()
                existing = _jobs(c, "request_key = :k", k=key)
                if len(inserted) == len(existing):
                    return existing, True
                if inserted:  # a concurrent request under this key took some of these assets: keep neither half
                    raise CustodyError(CustodyErrorCode.reserves_request_exists_with_different_assets,
                                       f"the key {key!r} was used at the same moment for {[j.asset for j in existing]}")
                # else a concurrent request with the same key committed first: answered below as a replay
        if assets is not None and sorted(set(assets)) != [j.asset for j in existing]:
            raise CustodyError(CustodyErrorCode.reserves_request_exists_with_different_assets,
                               f"the key {key!r} requested reports of {[j.asset for j in existing]}, not {sorted(set(assets))}")
        return existing, False

    def job(self, report_id: int) -> ReportJob:
        """The report's request and progress; LookupError when no report has that id."""
        with self.engine.connect() as c:
            found = _jobs(c, "id = :i", i=report_id)
        if not found:
            raise LookupError(f"report {report_id} does not exist")
        return found[0]

    def report(self, report_id: int) -> dict | None:
        """The published report's body (what the customer's verifier reads); None before it is
        published, and for a version-1 report (before migration 0036: another format)."""
        with self.engine.connect() as c:
            return c.execute(text("SELECT body FROM reserve_report WHERE id = :i AND version = :v"),
                             {"i": report_id, "v": VERSION}).scalar()

    def run_once(self, *, between_chunks: Callable[[str, int, int], None] | None = None) -> list[int]:
        """The worker's `reserves` job: build the oldest request that is still building (all its
        reports from one ledger snapshot) and publish it; the published report ids ([] when
        nothing waits). `between_chunks(asset, done, total)` runs after each progress record (tests
        inject a crash there). A failure is recorded on the request's rows: a refusal that a retry
        cannot change (`FINAL_CODES`) makes them `failed`; anything else leaves them `building`
        for the next run, which starts the build again from nothing."""
        with self.engine.connect() as c:
            key = c.execute(text("SELECT request_key FROM reserve_job WHERE state = 'building' ORDER BY id LIMIT 1")).scalar()
        if key is None:
            return []
        return [r["report_id"] for r in self.build(key, between_chunks=between_chunks)]

    def build(self, key: str, *, between_chunks: Callable[[str, int, int], None] | None = None) -> list[dict]:
        """Build, sign, store and publish the reports of request `key` (module docstring), in one
        transaction with their rows' `published`; progress (leaves hashed of the total) is
        recorded on the rows as the trees are built. Raises what refused the build, recorded."""
        with self.engine.connect() as c:
            jobs = _jobs(c, "request_key = :k AND state = 'building'", k=key)
        if not jobs:
            return []
        ids = {j.asset: j.report_id for j in jobs}
        self._start(ids)
        try:
            checkpoint, inputs = self._read(sorted(ids))
            if sorted(i.asset for i in inputs) != sorted(ids):
                raise CustodyError(CustodyErrorCode.no_customer_accounts,
                                   f"reports of {sorted(set(ids) - {i.asset for i in inputs})} have no customer account "
                                   "or no configured chain any more")
            totals = {i.asset: leaf_count(len(i.balances), self.parts) for i in inputs}
            self._progress(ids, {a: 0 for a in ids}, totals)
            trees = {}
            for i in inputs:
                def step(done: int, asset: str = i.asset) -> None:
                    self._progress({asset: ids[asset]}, {asset: done}, totals)
                    if between_chunks is not None:
                        between_chunks(asset, done, totals[asset])
                trees[i.asset] = place(i.balances, self.parts, progress=step)
            with self.engine.begin() as c:
                still = c.execute(text("SELECT id FROM reserve_job WHERE id = ANY(:ids) AND state = 'building' FOR UPDATE"),
                                  {"ids": list(ids.values())}).scalars().all()
                if len(still) != len(ids):  # another builder (the CLI beside the worker) published them meanwhile
                    raise CustodyError(CustodyErrorCode.reserves_report_building,
                                       f"the reports {sorted(ids.values())} were finished by another builder")
                bodies = [self._store(c, ids[i.asset], i, trees[i.asset], checkpoint) for i in inputs]
                c.execute(text("UPDATE reserve_job SET state = 'published', published_at = now(), updated_at = now(), "
                               "leaves_built = leaves_total, error_code = NULL, error = NULL WHERE id = ANY(:ids)"),
                          {"ids": list(ids.values())})
            return bodies
        except Exception as exc:
            self._failed(ids, exc)
            raise

    def publish(self, assets: Sequence[str] | None = None, *, key: str | None = None,
                requested_by: str = "custody") -> list[dict]:
        """Request and build at once, in the calling process (tests and e2e suites; the operators'
        command is `publish_command`): the published report bodies. Refused as `request` and `build` are."""
        key = key or f"publish:{uuid.uuid4()}"
        jobs, _ = self.request(key, requested_by, assets)
        if all(j.state == "published" for j in jobs):
            return [self.report(j.report_id) for j in jobs]  # type: ignore[misc]
        return self.build(key)

    def _start(self, ids: Mapping[str, int]) -> None:
        with self.engine.begin() as c:
            c.execute(text("UPDATE reserve_job SET attempts = attempts + 1, leaves_built = 0, updated_at = now() "
                           "WHERE id = ANY(:ids) AND state = 'building'"), {"ids": list(ids.values())})

    def _progress(self, ids: Mapping[str, int], done: Mapping[str, int], totals: Mapping[str, int]) -> None:
        with self.engine.begin() as c:
            c.execute(text("UPDATE reserve_job SET leaves_built = :n, leaves_total = :t, updated_at = now() "
                           "WHERE id = :i AND state = 'building'"),
                      [{"i": ids[a], "n": done[a], "t": totals[a]} for a in ids])

    def _failed(self, ids: Mapping[str, int], exc: Exception) -> None:
        code = exc.code.value if isinstance(exc, CustodyError) else type(exc).__name__
        final = isinstance(exc, CustodyError) and exc.code in FINAL_CODES
        try:
            with self.engine.begin() as c:
                c.execute(text("UPDATE reserve_job SET state = CASE WHEN :final THEN 'failed' ELSE state END, "
                               "error_code = :code, error = :error, updated_at = now() WHERE id = ANY(:ids) AND state = 'building'"),
                          {"ids": list(ids.values()), "final": final, "code": code, "error": str(exc)[:1000]})
        except Exception as record:  # noqa: BLE001 - the build's own failure is what the caller sees
            log.warning("reserves: the failure of reports %s was not recorded (%s)", sorted(ids.values()), record)

    def _read(self, only: Sequence[str] | None) -> tuple[dict, list[AssetInput]]:
        with self.engine.connect().execution_options(isolation_level="REPEATABLE READ") as c, c.begin():
            c.execute(text("SET TRANSACTION READ ONLY"))
            checks = verify_in(c)
            failed = [check.name for check in checks if not check.ok]
            if failed:
                raise CustodyError(CustodyErrorCode.reserves_ledger_unverified,
                                   f"the ledger fails its own checks ({', '.join(failed)}): no report is published")
            checkpoint = {**_journal_checkpoint(c), "checks_passed": [check.name for check in checks]}
            rows = c.execute(text(_ASSETS_SQL), {"chains": sorted(self.adapters)}).all()
            if only is not None:
                rows = [r for r in rows if r.asset in set(only)]
            balances: dict[str, list[tuple[int, int]]] = {}
            for r in c.execute(text(_BALANCES_SQL), {"kind": AccountKind.customer.value, "assets": [r.asset for r in rows]}):
                balances.setdefault(r.asset, []).append((r.id, int(r.posted)))
            negative = [a for pairs in balances.values() for a, b in pairs if b < 0]
            if negative:  # verify() holds customers at posted >= held >= 0; a tree refuses a negative leaf
                raise CustodyError(CustodyErrorCode.reserves_ledger_unverified,
                                   f"customer accounts {negative[:5]} have a negative balance: no report is published")
            rows = [r for r in rows if r.asset in balances]
            if not rows:
                raise CustodyError(CustodyErrorCode.no_customer_accounts,
                                   "no customer account of these assets exists: a report has no liabilities to commit to")
            chains = {r.chain for r in rows}
            blocks = {chain: wallet_index.cursor(c, chain) for chain in chains}
            btc_coins = ([*wallet_index.unspent(c, "deposit"), *wallet_index.unspent(c, "hot")]
                         if "bitcoin" in chains else [])
            eth_addresses = self._eth_addresses(c) if "ethereum" in chains else []
        for chain, block in blocks.items():
            if block is None or self._hash_at(chain, block.height) != block.hash:
                raise CustodyError(CustodyErrorCode.reserves_index_behind,
                                   f"the {chain} scanner is not at a block of the node's main chain (it has not caught up "
                                   "with a reorg yet, or has not started): ask again shortly")
        inputs = []
        for r in rows:
            if r.chain == "bitcoin":
                holdings = _btc_holdings(btc_coins)
            else:
                holdings = self._eth_holdings(eth_addresses, r.contract_address, blocks["ethereum"].height)
            inputs.append(AssetInput(r.asset, r.chain, r.contract_address, blocks[r.chain], balances[r.asset], holdings))
        return checkpoint, inputs

    def _hash_at(self, chain: str, height: int) -> str | None:
        try:
            return self.adapters[chain].block_at(height).hash
        except NotFound:  # the node's chain is shorter than the cursor (a reorg)
            return None

    def _eth_addresses(self, c: Connection) -> list[tuple[str, str, int]]:
        """(address, tier, index) of every ethereum address of ours that signs: deposits and hot."""
        out = [(r.address, "deposit", int(r.derivation_index)) for r in c.execute(text(_ETH_ADDRESSES_SQL))]
        xpub = c.execute(text(_ETH_HOT_XPUB_SQL)).scalar()
        if xpub is not None:
            out.append((derive_eth_address(xpub, HOT_RECEIVE_INDEX), "hot", HOT_RECEIVE_INDEX))
        return out

    def _eth_holdings(self, addresses: list[tuple[str, str, int]], contract: str | None, height: int) -> list[Holding]:
        eth = self.adapters["ethereum"]
        out = []
        for address, tier, index in addresses:
            amount = (eth.token_balance(contract, address, block=height) if contract  # type: ignore[attr-defined]
                      else eth.balance(address, block=height))  # type: ignore[attr-defined]
            if amount:
                out.append(Holding(address, amount, tier, 0, index))
        return out

    def _store(self, c: Connection, report_id: int, i: AssetInput, tree: Tree, checkpoint: dict) -> dict:
        root = tree.root.hash.hex()
        addresses = []
        for h in i.holdings:
            message = ReservesStatement(report_id, i.asset, i.chain, i.block.height, i.block.hash, h.address, h.amount,
                                        root).message()
            try:
                signed = self.signer.sign_reserves_message(i.chain, h.tier, h.change, h.index, message)
            except SigningRefused as refused:  # nothing is stored: the whole set is rolled back
                raise CustodyError(CustodyErrorCode.signer_refused, f"the statement of {h.address}: {refused}") from None
            if signed.address.lower() != h.address.lower():
                raise CustodyError(CustodyErrorCode.signer_refused,
                                   f"the signer signed for {signed.address}, not {h.address}: the index or the signer's seed differs")
            addresses.append({"address": h.address, "amount": str(h.amount), "message": message,
                              "signature": signed.signature, "format": FORMATS[i.chain]})
        held = sum(h.amount for h in i.holdings)
        network = self.network if i.chain == "bitcoin" else getattr(self.adapters[i.chain], "network", "")
        body = {"version": VERSION, "report_id": report_id, "asset": i.asset, "chain": i.chain, "network": network,
                "contract": i.contract, "height": i.block.height, "block_hash": i.block.hash, "ledger": checkpoint,
                "liabilities": {"root_hash": root, "total": str(tree.root.sum), "accounts": len(i.balances),
                                "leaves": len(tree.leaves), "leaves_per_account": self.parts},
                "holdings": {"total": str(held), "addresses": addresses}, "disclaimer": DISCLAIMER}
        c.execute(text(
            "INSERT INTO reserve_report (id, asset, chain_height, block_hash, root_hash, liabilities, holdings, body, version) "
            "VALUES (:id, :a, :h, :b, :r, :l, :s, CAST(:body AS jsonb), :v)"),
            {"id": report_id, "a": i.asset, "h": i.block.height, "b": i.block.hash, "r": root, "l": tree.root.sum,
             "s": held, "body": json.dumps(body), "v": VERSION})
        leaves = tree.leaves
        with c.connection.driver_connection.cursor().copy(  # COPY: millions of rows for a large asset
                "COPY reserve_leaf (report_id, leaf_index, account_id, amount, nonce) FROM STDIN") as copy:
            for j, (account, amount) in enumerate(zip(leaves.accounts, leaves.amounts)):
                copy.write_row((report_id, j, account if account != PADDING_ACCOUNT else None, amount, leaves.nonce(j)))
        nodes = list(tree.stored_nodes())
        for lo in range(0, len(nodes), _INSERT_ROWS):
            part = nodes[lo:lo + _INSERT_ROWS]
            c.execute(text("INSERT INTO reserve_node (report_id, level, position, hash, sum) "
                           "SELECT :r, unnest(CAST(:l AS int[])), unnest(CAST(:p AS int[])), unnest(CAST(:h AS bytea[])), "
                           "unnest(CAST(:s AS numeric[]))"),
                      {"r": report_id, "l": [n[0] for n in part], "p": [n[1] for n in part],
                       "h": [n[2].hash for n in part], "s": [n[2].sum for n in part]})
        return body

    # ---- a customer's proof ----------------------------------------------------------------

    def proof(self, report_id: int, account_id: int) -> dict:
        """The inclusion proof of `account_id` in report `report_id`: each of its leaves (position,
        amount, nonce) with the sibling (hash, sum) of every level up to the root. LookupError when
        the report or the account in it is unknown, the report failed, or it is a v1 one (whose
        proofs showed other customers' balances: no longer served); `reserves_report_building`
        while it is being built."""
        with self.engine.connect() as c:
            report = c.execute(text("SELECT version, asset, root_hash, liabilities, body->'liabilities'->>'leaves' AS leaves "
                                    "FROM reserve_report WHERE id = :r"), {"r": report_id}).first()
            if report is None:
                job = _jobs(c, "id = :i", i=report_id)
                if job and job[0].state == "building":
                    raise CustodyError(CustodyErrorCode.reserves_report_building,
                                       f"report {report_id} is still being built ({job[0].leaves_built} of "
                                       f"{job[0].leaves_total if job[0].leaves_total is not None else '?'} leaves): "
                                       "its proofs are served once it is published")
                if job:
                    raise LookupError(f"report {report_id} failed ({job[0].error_code}): it has no proofs")
            if report is None or report.version != VERSION:
                raise LookupError(f"report {report_id} does not exist" if report is None else
                                  f"report {report_id} is a version-1 report: its proofs are no longer served")
            mine = c.execute(text(_LEAVES_OF_SQL), {"r": report_id, "a": account_id}).scalars().all()
            if not mine:
                raise LookupError(f"account {account_id} is not in report {report_id}")
            count = int(report.leaves)
            out = self._leaf_proofs(c, report_id, mine, count)
        return {"version": VERSION, "report_id": report_id, "asset": report.asset, "account_id": account_id,
                "balance": str(sum(int(x["amount"]) for x in out)), "leaf_count": count,
                "root": {"hash": report.root_hash, "sum": str(int(report.liabilities))}, "leaves": out}

    @staticmethod
    def _leaf_proofs(c: Connection, report_id: int, indexes: Sequence[int], count: int) -> list[dict]:
        """The proofs of leaves `indexes`: their chunks' leaves in one query, the stored nodes of
        every path in another."""
        bases = sorted({i - i % CHUNK for i in indexes})
        rows = {r.leaf_index: r for r in c.execute(text(_CHUNKS_SQL), {"r": report_id, "lo": bases, "n": CHUNK})}
        wanted = sorted({w for i in indexes for w in upper_positions(i, count)})
        stored = {(r.level, r.position): Node(bytes(r.hash), int(r.sum)) for r in c.execute(
            text(_NODES_SQL), {"r": report_id, "lv": [w[0] for w in wanted], "p": [w[1] for w in wanted]})}
        out = []
        for index in indexes:
            base = index - index % CHUNK
            chunk = [leaf(rows[j].account_id or PADDING_ACCOUNT, int(rows[j].amount), bytes(rows[j].nonce))
                     for j in range(base, base + CHUNK)]
            steps = prove(chunk, index, count, lambda level, position: stored[(level, position)])
            out.append({"index": index, "amount": str(int(rows[index].amount)), "nonce": bytes(rows[index].nonce).hex(),
                        "steps": [{"hash": s.sibling.hash.hex(), "sum": str(s.sibling.sum)} for s in steps]})
        return out


def _journal_checkpoint(c: Connection) -> dict:
    """The journal as of `c`'s snapshot: newest transaction id, count, and the digest over every
    transaction's id and content hash in id order (module docstring)."""
    digest, count, last = hashlib.sha256(), 0, 0
    for tx_id, content_hash in c.execute(text(_JOURNAL_SQL).execution_options(yield_per=20_000)):
        digest.update(f"{tx_id} {content_hash}\n".encode())
        count, last = count + 1, tx_id
    return {"last_transaction_id": last, "transactions": count, "journal_digest": digest.hexdigest()}


def _btc_holdings(coins: Sequence[wallet_index.IndexedOutput]) -> list[Holding]:
    held: dict[str, int] = {}
    paths: dict[str, tuple[str, int, int]] = {}
    for u in coins:
        held[u.address] = held.get(u.address, 0) + u.amount
        paths[u.address] = (u.tier, u.change, u.derivation_index)
    return [Holding(address, amount, *paths[address]) for address, amount in sorted(held.items())]


# ---- the verifier (pure: what a customer runs) ----------------------------------------------


def _int(value: Any, what: str, problems: list[str]) -> int:
    if isinstance(value, str) and value.isdigit() and (value == "0" or not value.startswith("0")):
        return int(value)
    problems.append(f"{what} is not a non-negative integer of minor units: {value!r}")
    return -1


def check_report(report: dict) -> list[str]:
    """Every problem with a report on its own: its version, its figures, and each address entry
    (the statement rebuilt from the report's own fields must be the message, and the signature
    must be the address's: BIP-322 simple or EIP-191). Empty: the report is consistent."""
    problems: list[str] = []
    try:
        if report.get("version") != VERSION:
            return [f"not a version-{VERSION} report"]
        liabilities, holdings = report["liabilities"], report["holdings"]
        root, chain = liabilities["root_hash"], report["chain"]
        _int(liabilities["total"], "liabilities total", problems)
        leaves = liabilities["leaves"]
        if not isinstance(leaves, int) or leaves <= 0 or leaves % CHUNK:
            problems.append(f"the leaf count {leaves!r} is not a positive multiple of {CHUNK}")
        total, seen = 0, set()
        for entry in holdings["addresses"]:
            address = entry["address"]
            amount = _int(entry["amount"], f"the amount of {address}", problems)
            total += max(amount, 0)
            if address.lower() in seen:
                problems.append(f"{address} is listed twice")
            seen.add(address.lower())
            expected = ReservesStatement(report["report_id"], report["asset"], chain, report["height"], report["block_hash"],
                                         address, amount, root).message()
            if entry["message"] != expected:
                problems.append(f"the statement of {address} is not this report's ({entry['message']!r})")
            elif not _signed(chain, report.get("network", ""), address, entry["message"], entry["signature"]):
                problems.append(f"the signature of {address} does not verify ({FORMATS.get(chain, chain)})")
        if _int(holdings["total"], "holdings total", problems) != total:
            problems.append(f"the holdings total {holdings['total']} is not the sum of the addresses' amounts ({total})")
    except (KeyError, TypeError, AttributeError) as exc:
        problems.append(f"the report is malformed: {type(exc).__name__} {exc}")
    return problems


def _signed(chain: str, network: str, address: str, message: str, signature: str) -> bool:
    if chain == "bitcoin":
        hrp = bip322.HRPS.get(network)
        return hrp is not None and address.lower().startswith(hrp + "1") and bip322.verify_simple(address, message, signature)
    if chain == "ethereum":
        return eip191.verify_personal(address, message, signature)
    return False


def check_proof(report: dict, proof: dict) -> list[str]:
    """Every problem with a customer's proof against the report it names: the same report and
    root, distinct leaf positions inside the tree, each leaf (the customer's account id, its
    amount and nonce) linked to the root by its steps (the left/right order follows from the
    position, never from the proof), no negative sum, and the leaves summing to the balance."""
    problems: list[str] = []
    try:
        if proof.get("version") != VERSION or report.get("version") != VERSION:
            return [f"not a version-{VERSION} proof and report"]
        if (proof["report_id"], proof["asset"]) != (report["report_id"], report["asset"]):
            problems.append(f"the proof is for report {proof['report_id']} ({proof['asset']}), "
                            f"not {report['report_id']} ({report['asset']})")
        liabilities = report["liabilities"]
        root = Node(bytes.fromhex(liabilities["root_hash"]), _int(liabilities["total"], "liabilities total", problems))
        if (proof["root"]["hash"], proof["root"]["sum"]) != (liabilities["root_hash"], liabilities["total"]):
            problems.append("the proof's root is not the report's")
        count, account = liabilities["leaves"], proof["account_id"]
        if proof["leaf_count"] != count:
            problems.append(f"the proof counts {proof['leaf_count']} leaves, the report {count}")
        if not isinstance(account, int) or isinstance(account, bool) or not 0 < account < 2**63:
            return [*problems, f"the account id {account!r} is not one"]
        indexes = [x["index"] for x in proof["leaves"]]
        if not indexes or len(set(indexes)) != len(indexes):
            problems.append("the proof has no leaf, or one leaf twice")
        balance = 0
        for x in proof["leaves"]:
            index, amount = x["index"], _int(x["amount"], f"leaf {x['index']}'s amount", problems)
            nonce = bytes.fromhex(x["nonce"])
            if not isinstance(index, int) or not 0 <= index < count or len(nonce) != NONCE_BYTES or amount < 0:
                problems.append(f"leaf {index!r} is outside the tree or malformed")
                continue
            balance += amount
            sums = [_int(s["sum"], f"a sibling sum of leaf {index}", problems) for s in x["steps"]]
            steps = [Step(Node(bytes.fromhex(s["hash"]), v), bool((index >> level) & 1))
                     for level, (s, v) in enumerate(zip(x["steps"], sums))]
            if len(steps) != CHUNK_LEVELS + len(upper_positions(index, count)) or not verify(leaf(account, amount, nonce), steps, root):
                problems.append(f"leaf {index} ({amount} of account {account}) does not link to the report's root")
        if _int(proof["balance"], "the balance", problems) != balance:
            problems.append(f"the leaves sum to {balance}, not the balance {proof['balance']}")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        problems.append(f"the proof is malformed: {type(exc).__name__} {exc}")
    return problems


def publish_command(config_path: str | None, assets: Sequence[str] | None, key: str | None,
                    *, out: Callable[[str], None] = print, poll_seconds: float = 2.0) -> int:
    """`python -m custody reserves publish`: an operator's request (as the API records it, under
    the `cli:` key namespace), built here at once with its progress printed; when the worker is
    building already (it holds the `reserves` job lock), its progress is printed until the reports
    are published or failed. Exit 0 when all are published, 1 otherwise."""
    import time

    from custody.config import DeploymentConfig
    from custody.jobs import JobLocks
    from custody.roots.common import build_services

    services = build_services(DeploymentConfig.load(config_path, process="worker"), process="worker")
    reserves = services.reserves
    locks = JobLocks(services.engine)
    try:
        if reserves is None:
            out("reserves publish: no bitcoin adapter and signer are configured")
            return 1
        request_key = f"cli:{key or uuid.uuid4()}"
        try:
            jobs, created = reserves.request(request_key, "cli", assets)
        except CustodyError as exc:
            out(f"reserves publish: {exc}")
            return 1
        out(f"{'requested' if created else 'already requested'} under {request_key}: "
            + ", ".join(f"report {j.report_id} ({j.asset}, {j.state})" for j in jobs))
        with locks.hold("reserves") as got:
            if got:
                try:
                    reserves.build(request_key, between_chunks=lambda asset, done, total: out(
                        f"{asset}: {done:,} of {total:,} leaves hashed"))
                except Exception as exc:  # noqa: BLE001 - recorded on the reports; shown below
                    out(f"reserves publish: the build failed: {exc}")
        jobs = [reserves.job(j.report_id) for j in jobs]
        while not got and any(j.state == "building" for j in jobs):  # the worker builds them: follow it (Ctrl-C leaves it be)
            out("the worker is building: " + ", ".join(
                f"{j.asset} {j.leaves_built:,}/{j.leaves_total or 0:,}" + (f" (last attempt: {j.error_code})" if j.error_code else "")
                for j in jobs))
            time.sleep(poll_seconds)
            jobs = [reserves.job(j.report_id) for j in jobs]
        for j in jobs:
            out(f"report {j.report_id} ({j.asset}): {j.state}" + (f" ({j.error_code}: {j.error})" if j.error_code else ""))
        return 0 if all(j.state == "published" for j in jobs) else 1
    finally:
        locks.dispose()
        services.close()


def verify_report(report: dict, proof: dict | None = None) -> bool:
    return not check_report(report) and (proof is None or not check_proof(report, proof))


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m custody.reserves verify REPORT [PROOF]`: check a report (JSON file, as
    `POST /v1/reserves/reports` answers one asset's) and, given one, a proof (as
    `GET /v1/reserves/reports/{id}/proof` answers it). Prints what holds or every problem;
    exit status 0 when all holds, 1 when anything does not, 2 on a usage error."""
    parser = argparse.ArgumentParser(prog="python -m custody.reserves", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    verify_cmd = commands.add_parser("verify", help="check a report and, optionally, your inclusion proof")
    verify_cmd.add_argument("report")
    verify_cmd.add_argument("proof", nargs="?")
    args = parser.parse_args(argv)
    with open(args.report, encoding="utf-8") as f:
        report = json.load(f)
    problems = check_report(report)
    proof = None
    if args.proof:
        with open(args.proof, encoding="utf-8") as f:
            proof = json.load(f)
        problems += check_proof(report, proof)
    for problem in problems:
        print(f"FAIL {problem}")
    if problems:
        return 1
    print(f"OK report {report['report_id']} ({report['asset']} on {report['chain']} at block {report['height']} "
          f"{report['block_hash']}): liabilities {report['liabilities']['total']} in {report['liabilities']['leaves']} leaves, "
          f"holdings {report['holdings']['total']} at {len(report['holdings']['addresses'])} addresses, every signature valid")
    if proof is not None:
        print(f"OK account {proof['account_id']}: balance {proof['balance']} in {len(proof['leaves'])} leaves, "
              "each linked to the root")
    print("Not checked here: that the amounts are on chain at that block (ask your own node), and solvency.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
