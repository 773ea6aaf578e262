"""The ledger's commands and reads, persisted in PostgreSQL.

Guarantees (each is checked by `ledger.verify`):
- every journal transaction balances per asset, and is never updated or deleted (database triggers);
- a key posted twice with the same content moves money once; with other content it is refused;
- balance limits are checked under row locks on every posting, so concurrent postings never
  overdraw an account or lose an update;
- a hold resolves (captured in full, released, or expired) at most once, and only its owner may
  capture or release it; `available = posted - held`;
- the balance projection is written in the same database transaction as the entries.

Hot accounts: an account opened with `balance_shards` > 1 (by default the firm's fee income,
asset-location, expense, suspense and equity accounts) keeps its projection in that many rows. A
posting that cannot break the account's limits locks one free shard; one that could locks them all
and checks the sum (see `ledger_post` in migrations/versions/0001_ledger.py; its current body,
with a scalar path for one transfer between two one-shard accounts, is in 0010_posting_fast_path.py).
Its entries carry no stored balance_after; `statement()` computes the running balance at read time.

Postings and holds are one SQL statement each (PL/pgSQL functions that lock, check and write).
Those three statements run on the pooled psycopg connection itself (`_call`), not through
SQLAlchemy's statement layer: they are the hot path, and that layer cost as much client CPU per
posting as the driver did. Errors are re-raised as SQLAlchemy's `DBAPIError` like every other
statement's, and a connection the server dropped is invalidated in the pool.

Every method takes an optional `conn`: pass one to make the ledger's writes part of a larger unit of
work (a fill row and its journal transaction commit together); without one the method runs in its
own database transaction and commits.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import psycopg
from psycopg import pq
from psycopg.rows import namedtuple_row
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from ledger.errors import ErrorCode, LedgerError
from ledger.model import (
    DEFAULT_LIMITS,
    DEFAULT_SHARDS,
    MAX_METADATA_BYTES,
    MAX_SHARDS,
    metadata_size,
    Account,
    AccountKind,
    Asset,
    Balance,
    CommandResult,
    Entry,
    Hold,
    Headroom,
    HoldState,
    JournalTransaction,
    LedgerCommand,
    PlaceHold,
    PostResult,
    PostTransfers,
    ReleaseHold,
    ReplaceHold,
    StatementLine,
    StatementPage,
    Transfer,
    content_hash,
    leg_metadata,
    pair_entries,
    require_amount,
    reversal_of,
    validate_transfers,
)


class Ledger:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # account id -> (asset, kind, decimals): facts no statement ever changes (an account's asset
        # and kind, an asset's decimals: `create_asset` refuses other decimals), so the cache
        # needs no invalidation; what does change (closed, balances) is read under lock by the
        # ledger's functions. Bounded: cleared when full.
        self._reference: dict[int, AccountReference] = {}
        self._reference_lock = threading.Lock()

    @contextlib.contextmanager
    def _tx(self, conn: Connection | None) -> Iterator[Connection]:
        if conn is not None:
            yield conn
            return
        with self.engine.begin() as own:
            yield own

    @contextlib.contextmanager
    def _one(self, conn: Connection | None) -> Iterator[Connection]:
        """For a command that is one SQL statement: without a caller's `conn`, run it in autocommit
        so the server commits as the statement ends. That saves the BEGIN and COMMIT round trips
        (half the round trips of a posting) and is just as atomic and durable: the result reaches
        the caller only after the commit (and its WAL flush) has succeeded."""
        if conn is not None:
            yield conn
            return
        with self.engine.connect() as own:
            raw = own.connection.driver_connection
            raw.autocommit = True
            try:
                yield own
            finally:
                if not raw.closed:
                    raw.autocommit = False

    def _call(self, conn: Connection | None, sql: str, params: tuple, precheck: Precheck | None = None) -> Any:
        """Run one of the ledger's function statements and return its single row.

        Without `conn`: a pooled connection in autocommit (see `_one`). With a `conn` inside a
        transaction: that connection's driver connection, so the statement is part of the caller's
        transaction. A `conn` not yet in a transaction goes through SQLAlchemy (which begins one).
        `precheck` (see `Precheck`) runs first: a StatementPrecheck in the same statement
        (`_gated`), a callable on the same connection."""
        if isinstance(precheck, StatementPrecheck):
            gated_sql, gated_params = _gated(sql, params, precheck)
            row = self._call(conn, gated_sql, gated_params)
            if row.refusal_ is not None:
                precheck.refuse(row.refusal_)
                raise AssertionError("a StatementPrecheck's refuse() must raise")
            return row
        if conn is not None:
            if precheck is not None:
                self._checked(precheck, conn.connection.driver_connection, None)
            if not conn.in_transaction():
                return conn.exec_driver_sql(sql, params).one()
            return self._fetch(conn.connection.driver_connection, sql, params, None)
        proxied = self.engine.raw_connection()
        try:
            raw = proxied.driver_connection
            raw.autocommit = True
            try:
                if precheck is not None:
                    self._checked(precheck, raw, proxied)
                return self._fetch(raw, sql, params, proxied)
            finally:
                if not raw.closed:
                    raw.autocommit = False
        finally:
            proxied.close()

    def _call_all(self, conn: Connection, sql: str, params: tuple) -> list[Any]:
        """Like `_call` inside the caller's transaction, returning every row."""
        if not conn.in_transaction():
            return list(conn.exec_driver_sql(sql, params).all())
        return self._fetch(conn.connection.driver_connection, sql, params, None, every=True)

    def _checked(self, precheck: Precheck, raw: psycopg.Connection, proxied: Any) -> None:
        """Run a caller's `precheck` on `raw`, its driver errors re-raised as `_fetch` does."""
        try:
            with raw.cursor(row_factory=namedtuple_row) as cur:
                precheck(cur)
        except psycopg.Error as exc:
            if proxied is not None and self.engine.dialect.is_disconnect(exc, raw, None):
                proxied.invalidate(exc)
            raise DBAPIError.instance("precheck", (), exc, psycopg.Error) from exc

    def _fetch(self, raw: psycopg.Connection, sql: str, params: tuple, proxied: Any, *, every: bool = False) -> Any:
        """Run `sql` on `raw` and return its rows (`every`) or its first row. The first statement of
        a transaction goes in pipeline mode, so the BEGIN psycopg sends first travels with it in
        one round trip instead of one of its own (a unit of order entry starts with one)."""
        try:
            with raw.cursor(row_factory=namedtuple_row) as cur:
                if (not raw.autocommit and raw.info.transaction_status == pq.TransactionStatus.IDLE
                        and psycopg.Pipeline.is_supported()):
                    with raw.pipeline():
                        cur.execute(sql, params)
                else:
                    cur.execute(sql, params)
                return cur.fetchall() if every else cur.fetchone()
        except psycopg.Error as exc:
            if proxied is not None and self.engine.dialect.is_disconnect(exc, raw, None):
                proxied.invalidate(exc)
            raise DBAPIError.instance(sql, params, exc, psycopg.Error) from exc

    # ---- reference data -------------------------------------------------------------------

    def create_asset(self, code: str, decimals: int, *, conn: Connection | None = None) -> Asset:
        """Create an asset; creating it again with the same decimals is a no-op."""
        if not isinstance(decimals, int) or isinstance(decimals, bool) or not 0 <= decimals <= 36:
            raise LedgerError(ErrorCode.invalid_request, "decimals must be an integer from 0 to 36")
        if not isinstance(code, str) or _ASSET_CODE.fullmatch(code) is None:
            raise LedgerError(
                ErrorCode.invalid_request, "asset code must be 1-32 characters of A-Z, 0-9, '_', '.', '-'"
            )
        with self._tx(conn) as c:
            c.execute(
                text("INSERT INTO asset (code, decimals) VALUES (:c, :d) ON CONFLICT (code) DO NOTHING"),
                {"c": code, "d": decimals},
            )
            existing = self.get_asset(code, conn=c)
        if existing.decimals != decimals:
            raise LedgerError(ErrorCode.asset_exists_with_different_decimals, asset=code)
        return existing

    def get_asset(self, code: str, *, conn: Connection | None = None) -> Asset:
        with self._one(conn) as c:
            row = c.execute(text("SELECT code, decimals FROM asset WHERE code = :c"), {"c": code}).first()
        if row is None:
            raise LedgerError(ErrorCode.asset_not_found, f"no asset {code!r}")
        return Asset(row.code, row.decimals)

    def list_assets(self, *, conn: Connection | None = None) -> list[Asset]:
        with self._one(conn) as c:
            rows = c.execute(text("SELECT code, decimals FROM asset ORDER BY code")).all()
        return [Asset(r.code, r.decimals) for r in rows]

    def open_account(
        self,
        asset: str,
        kind: AccountKind | str,
        name: str,
        *,
        owner: str | None = None,
        may_go_negative: bool | None = None,
        may_go_positive: bool | None = None,
        balance_shards: int | None = None,
        conn: Connection | None = None,
    ) -> Account:
        """Open an account. `name` is unique and makes the call idempotent: opening the same name
        again with the same asset and kind returns the existing account.

        `balance_shards` (default per kind, see `DEFAULT_SHARDS`) spreads a hot account's balance
        projection over that many rows so concurrent postings that cannot break its limits do not
        queue on one lock."""
        try:
            kind = AccountKind(kind)
        except ValueError:
            raise LedgerError(ErrorCode.invalid_request, f"unknown account kind {kind!r}") from None
        if not isinstance(name, str) or not 1 <= len(name) <= 200:
            raise LedgerError(ErrorCode.invalid_request, "account name must be 1-200 characters")
        neg, pos = DEFAULT_LIMITS[kind]
        neg = neg if may_go_negative is None else bool(may_go_negative)
        pos = pos if may_go_positive is None else bool(may_go_positive)
        shards = DEFAULT_SHARDS[kind] if balance_shards is None else balance_shards
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
            raise LedgerError(ErrorCode.invalid_request, f"balance_shards must be an integer from 1 to {MAX_SHARDS}")
        with self._tx(conn) as c:
            self.get_asset(asset, conn=c)
            row = c.execute(
                text(
                    "INSERT INTO account (asset, kind, name, owner, may_go_negative, may_go_positive, balance_shards) "
                    "VALUES (:a, :k, :n, :o, :neg, :pos, :s) ON CONFLICT (name) DO NOTHING RETURNING id"
                ),
                {"a": asset, "k": kind.value, "n": name, "o": owner, "neg": neg, "pos": pos, "s": shards},
            ).first()
            if row is not None:
                c.execute(text("SELECT ledger_open_balances(:i)"), {"i": row.id})  # its zero rows (0054)
                return self.get_account(row.id, conn=c)
            existing = self.account_by_name(name, conn=c)
        if (existing.asset, existing.kind, existing.owner) != (asset, kind, owner) or (
            existing.may_go_negative,
            existing.may_go_positive,
        ) != (neg, pos) or (balance_shards is not None and existing.balance_shards != shards):
            raise LedgerError(ErrorCode.idempotency_conflict, f"account {name!r} exists with other content")
        return existing

    def get_account(self, account_id: int, *, conn: Connection | None = None) -> Account:
        with self._one(conn) as c:
            row = c.execute(text(f"{_ACCOUNT_SQL} WHERE id = :i"), {"i": account_id}).first()
        if row is None:
            raise LedgerError(ErrorCode.account_not_found, f"no account {account_id}")
        return _account(row)

    def account_reference(self, account_id: int) -> AccountReference:
        """The account's asset, kind and the asset's decimals, from a per-process cache after the
        first read (one query); `account_not_found` is not cached."""
        found = self._reference.get(account_id)
        if found is not None:
            return found
        with self._one(None) as c:
            row = c.execute(text("SELECT a.asset, a.kind, s.decimals FROM account a JOIN asset s ON s.code = a.asset "
                                 "WHERE a.id = :i"), {"i": account_id}).first()
        if row is None:
            raise LedgerError(ErrorCode.account_not_found, f"no account {account_id}")
        found = AccountReference(row.asset, AccountKind(row.kind), row.decimals)
        with self._reference_lock:
            if len(self._reference) >= REFERENCE_CACHE_SIZE:
                self._reference.clear()
            self._reference[account_id] = found
        return found

    def account_by_name(self, name: str, *, conn: Connection | None = None) -> Account:
        with self._one(conn) as c:
            row = c.execute(text(f"{_ACCOUNT_SQL} WHERE name = :n"), {"n": name}).first()
        if row is None:
            raise LedgerError(ErrorCode.account_not_found, f"no account named {name!r}")
        return _account(row)

    def list_accounts(self, *, asset: str | None = None, kinds: Sequence[AccountKind] | None = None,
                      after_id: int | None = None, limit: int = 1000, conn: Connection | None = None) -> list[Account]:
        """Accounts by id, optionally of one asset and of the given kinds, after `after_id` when given."""
        with self._one(conn) as c:
            rows = c.execute(
                text(f"{_ACCOUNT_SQL} WHERE (CAST(:a AS text) IS NULL OR asset = :a) "
                     "AND (CAST(:k AS text[]) IS NULL OR kind = ANY(CAST(:k AS text[]))) AND id > :after "
                     "ORDER BY id LIMIT :l"),
                {"a": asset, "k": None if kinds is None else [AccountKind(k).value for k in kinds],
                 "after": after_id or 0, "l": limit},
            ).all()
        return [_account(r) for r in rows]

    def close_account(self, account_id: int, *, conn: Connection | None = None) -> Account:
        """Close an account with a zero balance and no pending holds. Closing twice is a no-op."""
        with self._tx(conn) as c:
            # ledger_close_account (0054) locks every balance shard, and closes only an empty
            # account; it then gives the locked rows a new version (same values), so a posting or
            # hold at REPEATABLE READ or SERIALIZABLE that waited for them fails to serialize
            # instead of missing the close. (At READ COMMITTED, what the service uses, the
            # functions see the close once they hold the locks.)
            row = c.execute(_CLOSE_ACCOUNT_SQL, {"i": account_id}).one()
            if not row.found:
                raise LedgerError(ErrorCode.account_not_found, f"no account {account_id}")
            if row.posted != 0:
                raise LedgerError(ErrorCode.account_not_empty, posted=int(row.posted))
            if row.held != 0:
                raise LedgerError(ErrorCode.account_has_open_holds, held=int(row.held))
            return self.get_account(account_id, conn=c)

    # ---- postings -------------------------------------------------------------------------

    def post(
        self,
        key: str,
        transfers: Sequence[Transfer],
        *,
        kind: str = "transfer",
        metadata: dict[str, Any] | None = None,
        hold_owner: str | None = None,
        conn: Connection | None = None,
        precheck: Precheck | None = None,
        _reverses: int | None = None,
    ) -> PostResult:
        """Post a linked batch of transfers as one journal transaction under idempotency `key`.

        All transfers commit together or none does. A transfer with `hold_id` captures that much of
        the hold (its debit must be the held account, and `hold_owner` must be the hold's owner).
        Raises LedgerError with the first failing check's code and the transfer `index`.
        `precheck`: a caller's own refusal, run just before the posting on its connection (`Precheck`).
        """
        _require_key(key)
        validate_transfers(transfers)
        _require_small_metadata(metadata)
        digest = content_hash(kind, transfers, {"metadata": metadata or {}, "reverses": _reverses})
        row = self._call(conn, _POST_SQL, (
            key,
            digest,
            kind,
            json.dumps(metadata or {}, sort_keys=True, default=str),
            _int_array([t.debit_account_id for t in transfers]),
            _int_array([t.credit_account_id for t in transfers]),
            _int_array([t.amount for t in transfers]),
            _int_array([t.hold_id for t in transfers]),
            hold_owner,
            _reverses,
        ), precheck)
        if row.status == "created":
            return PostResult(row.transaction_id, True)
        if row.status == "exists":
            return PostResult(row.transaction_id, False)
        raise LedgerError(ErrorCode(row.status), index=row.failed_index, transaction_id=row.transaction_id)

    def check_post(
        self,
        key: str,
        transfers: Sequence[Transfer],
        *,
        kind: str = "transfer",
        metadata: dict[str, Any] | None = None,
        hold_owner: str | None = None,
        conn: Connection | None = None,
    ) -> LedgerError | None:
        """What `post` with the same arguments would answer now, without posting and without locks:
        the LedgerError it would raise, or None (it would post, or answer a replay). One read-only
        statement (_CHECK_POST_SQL) with `ledger_post`'s refusals in its order of precedence:
        a replay of the key (exists; idempotency_conflict), missing or closed accounts or mixed
        assets, the captures' holds (not found, owner, account, resolved, expired, exceeded), then
        the limits on each account's net effect against its committed balance. Advisory: nothing
        is locked, so a change committed afterwards can make the posting answer otherwise (its own
        checks, under its locks, decide). Not covered: the NUMERIC(78,0) range check, reversals
        (check_post takes none) and a missing balance row (data_corrupted). Raises for input
        `post` would refuse before the database."""
        _require_key(key)
        validate_transfers(transfers)
        _require_small_metadata(metadata)
        digest = content_hash(kind, transfers, {"metadata": metadata or {}, "reverses": None})
        with self._one(conn) as c:
            row = c.exec_driver_sql(_CHECK_POST_SQL, {
                "key": key, "hash": digest, "owner": hold_owner,
                "d": _int_array([t.debit_account_id for t in transfers]),
                "c": _int_array([t.credit_account_id for t in transfers]),
                "a": _int_array([t.amount for t in transfers]),
                "h": _int_array([t.hold_id for t in transfers]),
            }).first()
        if row is None or row.status == "exists":
            return None
        return LedgerError(ErrorCode(row.status), index=row.failed_index)

    def apply(self, commands: Sequence[LedgerCommand], *, conn: Connection | None = None) -> list[CommandResult]:
        """Run `commands` in order in ONE statement (one round trip): holds, releases, hold
        replacements and postings, each exactly as when sent alone (same checks, same keys and
        content hashes, so a replay answers `exists` either way). A refused command writes nothing
        and does not stop the others: check each result (`CommandResult.ok`). Malformed input
        raises LedgerError(invalid_request) before anything is sent.
        See migrations/versions/0009_ledger_apply.py."""
        ops, keys, hashes, accounts, amounts, owners, refs, holds, ids, meta = [], [], [], [], [], [], [], [], [], []
        first, count, debits, credits, transfer_amounts, transfer_holds = [], [], [], [], [], []
        for command in commands:
            kind = type(command)
            if kind is PostTransfers:
                _require_key(command.key)
                validate_transfers(command.transfers)
                _require_small_metadata(command.metadata)
                ops.append("post")
                keys.append(command.key)
                hashes.append(content_hash(command.kind, command.transfers,
                                           {"metadata": command.metadata or {}, "reverses": None}))
                accounts.append(None)
                amounts.append(None)
                owners.append(command.hold_owner)
                refs.append(command.kind)
                holds.append(None)
                ids.append(None)
                meta.append(command.metadata or {})
                first.append(len(debits) + 1)
                count.append(len(command.transfers))
                for t in command.transfers:
                    debits.append(t.debit_account_id)
                    credits.append(t.credit_account_id)
                    transfer_amounts.append(t.amount)
                    transfer_holds.append(t.hold_id)
                continue
            if kind is ReleaseHold:
                if not command.owner:
                    raise LedgerError(ErrorCode.invalid_request, "a release names the hold's owner")
                ops.append("release")
                keys.append(None)
                hashes.append(None)
                accounts.append(None)
                amounts.append(None)
                holds.append(command.hold_id)
                ids.append(None)
                refs.append(None)
            elif kind is PlaceHold or kind is ReplaceHold:
                _require_key(command.key)
                require_amount(command.amount)
                if not command.owner or not command.reference:
                    raise LedgerError(ErrorCode.invalid_request, "a hold needs an owner and a reference")
                ops.append("hold" if kind is PlaceHold else "replace")
                keys.append(command.key)
                hashes.append(_hold_digest(command.account_id, command.amount, command.owner, command.reference, None))
                accounts.append(command.account_id)
                amounts.append(command.amount)
                holds.append(command.hold_id if kind is ReplaceHold else None)
                ids.append(command.new_hold_id if kind is ReplaceHold else command.hold_id)
                refs.append(command.reference)
            else:
                raise LedgerError(ErrorCode.invalid_request, f"not a ledger command: {command!r}")
            owners.append(command.owner)
            meta.append(None)
            first.append(None)
            count.append(None)
        if not ops:
            return []
        params = (_text_array(ops), _text_array(keys), _text_array(hashes), _int_array(accounts), _int_array(amounts),
                  _text_array(owners), _text_array(refs), _int_array(holds), _int_array(ids),
                  json.dumps(meta, sort_keys=True, default=str), _int_array(first), _int_array(count),
                  _int_array(debits), _int_array(credits), _int_array(transfer_amounts), _int_array(transfer_holds))
        if conn is None:
            with self.engine.begin() as own:
                rows = self._call_all(own, _APPLY_SQL, params)
        else:
            rows = self._call_all(conn, _APPLY_SQL, params)
        return [CommandResult(r.status, r.id, r.failed_index) for r in rows]

    def reserve_hold_ids(self, count: int, *, conn: Connection) -> list[int]:
        """`count` fresh hold ids from the holds' own sequence, for `PlaceHold.hold_id` /
        `ReplaceHold.new_hold_id`: a caller queueing commands names holds before they exist. An id
        never used leaves a gap in hold ids, nothing else."""
        if not 1 <= count <= 10_000:
            raise LedgerError(ErrorCode.invalid_request, "reserve between 1 and 10,000 hold ids")
        return [r.id for r in self._call_all(conn, _RESERVE_HOLD_IDS_SQL, (count,))]

    def lock_available(self, account_ids: Sequence[int], *, conn: Connection) -> dict[int, Headroom]:
        """Lock the balance rows of `account_ids` for the rest of the caller's transaction (in the
        postings' lock order) and return each account's headroom. While the locks are held no one
        else can change these balances, so the caller can tell in advance whether the holds it
        queues (`apply`) will be accepted; the ledger still checks each one when it runs. The
        flags are read in the same statement as the lock (a close committing while it waited is
        not seen: that hold is then refused when it runs, and the caller must treat a refusal it
        did not predict as a failure). Unknown ids are left out."""
        ids = sorted(set(account_ids))
        if not ids:
            return {}
        rows = self._call_all(conn, _LOCK_AVAILABLE_SQL, (_int_array(ids),))
        return {r.account_id: Headroom(int(r.available), r.may_go_negative, r.closed) for r in rows}

    def transfer(self, key: str, debit: int, credit: int, amount: int, **kw: Any) -> PostResult:
        """Shorthand for a one-transfer posting."""
        return self.post(key, [Transfer(debit, credit, amount)], **kw)

    def reverse(self, transaction_id: int, key: str, *, conn: Connection | None = None) -> PostResult:
        """Post the compensating transaction of `transaction_id` (entries mirrored). Once only."""
        with self._tx(conn) as c:
            transfers = self.transaction_transfers(transaction_id, conn=c)
            return self.post(
                key,
                reversal_of(transfers),
                kind="reversal",
                metadata={"reverses": transaction_id},
                conn=c,
                _reverses=transaction_id,
            )

    def transaction_key(self, transaction_id: int, *, conn: Connection | None = None) -> str:
        """The idempotency key a journal transaction was posted under (it names its writer)."""
        with self._one(conn) as c:
            key = c.execute(text("SELECT idempotency_key FROM journal_transaction WHERE id = :t"),
                            {"t": transaction_id}).scalar()
        if key is None:
            raise LedgerError(ErrorCode.transaction_not_found, f"no journal transaction {transaction_id}")
        return key

    def transaction_transfers(self, transaction_id: int, *, conn: Connection | None = None) -> list[Transfer]:
        """Reconstruct the transfers of a posted transaction (pairs of consecutive entries)."""
        with self._one(conn) as c:
            rows = c.execute(
                text("SELECT account_id, amount, hold_id FROM journal_entry WHERE transaction_id = :t ORDER BY id"),
                {"t": transaction_id},
            ).all()
        if not rows:
            raise LedgerError(ErrorCode.transaction_not_found, f"no journal transaction {transaction_id}")
        return [
            Transfer(debit.account_id, credit.account_id, int(credit.amount), debit.hold_id)
            for debit, credit in zip(rows[0::2], rows[1::2])
        ]

    def get_transaction(self, transaction_id: int, *, conn: Connection | None = None) -> JournalTransaction:
        """A posted transaction with its entries (`transaction_not_found` if there is none)."""
        with self._one(conn) as c:
            head = c.execute(text(_TRANSACTION_SQL), {"t": transaction_id}).first()
            if head is None:
                raise LedgerError(ErrorCode.transaction_not_found, f"no journal transaction {transaction_id}")
            rows = c.execute(text(_ENTRIES_SQL), {"t": transaction_id}).all()
        metadata = dict(head.metadata)
        pairs = pair_entries([(r.id, r.account_id) for r in rows])
        entries = tuple(Entry(r.id, r.account_id, AccountKind(r.kind), r.asset, int(r.amount), r.hold_id, index,
                              other_id, other_account, leg_metadata(metadata, index))
                        for r, (index, other_id, other_account) in zip(rows, pairs))
        return JournalTransaction(head.id, head.idempotency_key, head.kind, metadata, head.reverses_id,
                                  head.created_at, entries)

    # ---- holds ----------------------------------------------------------------------------

    def place_hold(
        self,
        key: str,
        account_id: int,
        amount: int,
        *,
        owner: str,
        reference: str,
        expires_at: dt.datetime | None = None,
        conn: Connection | None = None,
        precheck: Precheck | None = None,
    ) -> Hold:
        """Move `amount` from available to held on `account_id`. Idempotent per `key`.
        `precheck`: a caller's own refusal, run just before the hold on its connection (`Precheck`)."""
        _require_key(key)
        require_amount(amount)
        if not owner or not reference:
            raise LedgerError(ErrorCode.invalid_request, "a hold needs an owner and a reference")
        if expires_at is not None and expires_at.tzinfo is None:
            raise LedgerError(ErrorCode.invalid_request, "expires_at must be timezone-aware")
        digest = _hold_digest(account_id, amount, owner, reference, expires_at)
        row = self._call(conn, _PLACE_HOLD_SQL, (key, digest, account_id, amount, owner, reference, expires_at), precheck)
        if row.status == "created" or row.status == "exists":
            return _hold(row, created=row.status == "created")
        if row.status == "idempotency_conflict":
            raise LedgerError(ErrorCode.idempotency_conflict, hold_id=row.id)
        if row.status == "account_not_found":
            raise LedgerError(ErrorCode.account_not_found, f"no account {account_id}")
        raise LedgerError(ErrorCode(row.status), available=_int(row.available), amount=amount)

    def get_hold(self, hold_id: int, *, conn: Connection | None = None) -> Hold:
        with self._one(conn) as c:
            row = c.execute(text(f"{_HOLD_SQL} WHERE id = :i"), {"i": hold_id}).first()
        if row is None:
            raise LedgerError(ErrorCode.hold_not_found, f"no hold {hold_id}")
        return _hold(row)

    def capture_hold(
        self,
        key: str,
        hold_id: int,
        transfers: Sequence[Transfer],
        *,
        owner: str,
        final: bool = False,
        kind: str = "capture",
        metadata: dict[str, Any] | None = None,
        conn: Connection | None = None,
    ) -> PostResult:
        """Capture from a hold: post `transfers` (each debiting the held account through the hold,
        in one balanced transaction). With `final`, release whatever remains afterwards."""
        legs = [Transfer(t.debit_account_id, t.credit_account_id, t.amount, hold_id) for t in transfers]
        with self._tx(conn) as c:
            result = self.post(key, legs, kind=kind, metadata=metadata, hold_owner=owner, conn=c)
            if final and result.created:
                try:
                    self.release_hold(hold_id, owner=owner, conn=c)
                except LedgerError as err:  # captured in full: nothing remains to release
                    if err.code is not ErrorCode.hold_already_resolved:
                        raise
            return result

    def release_hold(self, hold_id: int, *, owner: str, conn: Connection | None = None) -> Hold:
        """Return what remains of a hold to available. Releasing a released hold again returns it
        unchanged (a retry); a captured or expired hold refuses with hold_already_resolved."""
        return self._resolve(hold_id, HoldState.released, owner=owner, conn=conn)

    def expire_holds(self, now: dt.datetime | None = None, *, limit: int = 1000) -> list[int]:
        """The expiry job: release every pending hold whose timeout has passed. Returns their ids."""
        with self._one(None) as c:
            ids = c.execute(
                text(
                    "SELECT id FROM hold WHERE state = 'pending' AND expires_at <= coalesce(:now, now()) "
                    "ORDER BY expires_at, id LIMIT :lim"
                ),
                {"now": now, "lim": limit},
            ).scalars().all()
        expired = []
        for hold_id in ids:
            status = self._call(None, _RESOLVE_HOLD_SQL, (hold_id, HoldState.expired.value, None, now)).status
            # `created`: this run expired it; `exists`: a concurrent run got there first; resolved by its
            # owner meanwhile: nothing to expire. Anything else is a real error.
            if status == "created":
                expired.append(hold_id)
            elif status not in ("exists", "hold_already_resolved", "not_timed_out"):
                raise LedgerError(ErrorCode(status), hold_id=hold_id)
        return expired

    def _resolve(
        self,
        hold_id: int,
        state: HoldState,
        *,
        owner: str | None,
        now: dt.datetime | None = None,
        conn: Connection | None = None,
    ) -> Hold:
        row = self._call(conn, _RESOLVE_HOLD_SQL, (hold_id, state.value, owner, now))
        if row.status == "created" or row.status == "exists":
            return _hold(row)
        if row.status == "hold_not_found":
            raise LedgerError(ErrorCode.hold_not_found, f"no hold {hold_id}")
        if row.status == "not_timed_out":
            raise LedgerError(ErrorCode.invalid_request, "the hold has not timed out")
        if row.status == "hold_already_resolved":
            raise LedgerError(ErrorCode.hold_already_resolved, state=row.state)
        raise LedgerError(ErrorCode(row.status), hold_id=hold_id)

    # ---- reads ----------------------------------------------------------------------------

    def balance(self, account_id: int, *, conn: Connection | None = None) -> Balance:
        with self._one(conn) as c:
            row = c.execute(_BALANCE_SQL, {"i": account_id}).first()
        if row is None:
            raise LedgerError(ErrorCode.account_not_found, f"no account {account_id}")
        return _balance(row)

    def statement(
        self, account_id: int, *, after: int | None = None, limit: int = 100, conn: Connection | None = None
    ) -> StatementPage:
        """Entries of an account in posting order, with the posted balance after each, paged by
        entry id (`after` = the last entry id of the previous page)."""
        if not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise LedgerError(ErrorCode.invalid_request, "limit must be 1-1000")
        with self._tx(conn) as c:
            account = self.get_account(account_id, conn=c)
            running = None
            if account.balance_shards > 1:
                # No writer of this account is mid-flight once every shard is share-locked, so every
                # entry id below what this read sees is committed: later entries get higher ids and
                # paging by id never skips one. The running balance is summed at read time.
                c.execute(text("SELECT ledger_share_balance(:a)"), {"a": account_id})
                running = int(c.execute(
                    text("SELECT coalesce(sum(amount), 0) FROM journal_entry WHERE account_id = :a AND id <= :after"),
                    {"a": account_id, "after": after or 0},
                ).scalar_one())
            rows = c.execute(_STATEMENT_SQL, {"a": account_id, "after": after or 0, "lim": limit + 1}).all()
        lines = []
        for r in rows[:limit]:
            if running is None:
                balance_after = int(r.balance_after)
            else:
                running += int(r.amount)
                balance_after = running
            lines.append(
                StatementLine(r.id, r.transaction_id, int(r.amount), balance_after, r.kind, r.idempotency_key, r.created_at,
                              r.counterpart_entry_id, r.counterpart_account_id)
            )
        return StatementPage(account_id, lines, lines[-1].entry_id if len(rows) > limit else None)

    def totals(self, *, conn: Connection | None = None) -> dict[str, int]:
        """Sum of all posted balances per asset. Double entry makes every one of them zero."""
        with self._one(conn) as c:
            rows = c.execute(
                text(
                    "SELECT a.code, coalesce(sum(b.posted), 0) AS total FROM asset a "
                    "LEFT JOIN account acc ON acc.asset = a.code "
                    "LEFT JOIN account_balance b ON b.account_id = acc.id GROUP BY a.code ORDER BY a.code"
                )
            ).all()
        return {r.code: int(r.total) for r in rows}

    def rebuild_projections(self, *, conn: Connection | None = None) -> int:
        """Recompute the projection of every account whose balance rows disagree with the journal
        and the holds (or miss a shard): shard 0 then carries the whole balance and the other
        shards zero. Returns how many accounts were repaired."""
        with self._tx(conn) as c:
            return int(c.execute(text("SELECT ledger_rebuild_projections()")).scalar_one())

    # ---- verification ---------------------------------------------------------------------

    def verify(self):  # noqa: ANN201 - see ledger.verify
        from ledger.verify import verify

        return verify(self.engine)

    def assert_verified(self) -> None:
        from ledger.verify import assert_verified

        assert_verified(self.engine)


# The same pattern as the asset table's CHECK, so a bad code is a ledger error, not a database one.
_ASSET_CODE = re.compile(r"[A-Z0-9][A-Z0-9_.-]{0,31}")


MAX_KEY_LENGTH = 300  # a caller's 200 characters behind its namespace (custody.money_rules)


_TRANSACTION_SQL = """
SELECT id, idempotency_key, kind, metadata, reverses_id, created_at
FROM journal_transaction
WHERE id = :t
"""

# A statement's lines, each with the other side of its transfer: entries are written as (debit,
# credit) pairs in id order, so the counterpart of the k-th entry of its transaction is the (k XOR 1)-th.
_STATEMENT_SQL = text("""
SELECT e.id, e.transaction_id, e.amount, e.balance_after, t.kind, t.idempotency_key, t.created_at,
       p.id AS counterpart_entry_id, p.account_id AS counterpart_account_id
FROM journal_entry e
JOIN journal_transaction t ON t.id = e.transaction_id
LEFT JOIN LATERAL (
    SELECT c.id, c.account_id
    FROM journal_entry c
    WHERE c.transaction_id = e.transaction_id
    ORDER BY c.id
    OFFSET ((SELECT count(*) FROM journal_entry b WHERE b.transaction_id = e.transaction_id AND b.id < e.id) # 1)
    LIMIT 1
) p ON true
WHERE e.account_id = :a
  AND e.id > :after
ORDER BY e.id
LIMIT :lim
""")

_ENTRIES_SQL = """
SELECT e.id, e.account_id, a.kind, e.asset, e.amount, e.hold_id
FROM journal_entry e
JOIN account a ON a.id = e.account_id
WHERE e.transaction_id = :t
ORDER BY e.id
"""


def _require_key(key: object) -> None:
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_LENGTH:
        raise LedgerError(ErrorCode.invalid_request, f"an idempotency key of 1-{MAX_KEY_LENGTH} characters is required")


def _require_small_metadata(metadata: dict | None) -> None:
    if metadata_size(metadata) > MAX_METADATA_BYTES:
        raise LedgerError(ErrorCode.invalid_request,
                          f"metadata is at most {MAX_METADATA_BYTES} bytes as JSON (it travels in the posting's event)")


def _int_array(values: list[int | None]) -> str:
    """A PostgreSQL array literal of integers (NULL for None), cast by the statement: cheaper
    than the driver's generic list adaptation, which cost a quarter of a posting's client CPU.
    Anything but an int or None (a bool, a float, a string) is refused, so no value can change the
    literal's shape."""
    parts = []
    for v in values:
        if v is None:
            parts.append("NULL")
        elif type(v) is int:
            parts.append(str(v))
        else:
            raise LedgerError(ErrorCode.invalid_request, f"account, hold ids and amounts must be integers, not {v!r}")
    return "{" + ",".join(parts) + "}"


def _text_array(values: list[str | None]) -> str:
    """A PostgreSQL array literal of texts (NULL for None): every element double-quoted with its
    backslashes and double quotes escaped, the array syntax's own quoting, so no value can change
    the literal's shape. Cheaper than the driver's generic list adaptation."""
    parts = []
    for v in values:
        if v is None:
            parts.append("NULL")
        elif type(v) is str:
            parts.append('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"')
        else:
            raise LedgerError(ErrorCode.invalid_request, f"expected a string, not {v!r}")
    return "{" + ",".join(parts) + "}"


def _hold_digest(account_id: int, amount: int, owner: str, reference: str, expires_at: dt.datetime | None) -> str:
    return _digest([account_id, str(amount), owner, reference, expires_at and expires_at.isoformat()])


def _digest(parts: list[Any]) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


# Driver-level SQL (psycopg placeholders): run by `Ledger._call`.
_POST_SQL = (
    "SELECT status, transaction_id, failed_index FROM ledger_post("
    "%s::text, %s::text, %s::text, %s::jsonb, %s::bigint[], %s::bigint[], %s::numeric[], %s::bigint[], "
    "%s::text, %s::bigint)"
)
# Ledger.check_post: ledger_post's refusals (0010, general path) read without locks, in its order.
_CHECK_POST_SQL = """
WITH l AS MATERIALIZED (
    SELECT u.debit, u.credit, u.amount, u.hold_id, u.i::integer AS i
      FROM unnest(%(d)s::bigint[], %(c)s::bigint[], %(a)s::numeric[], %(h)s::bigint[])
           WITH ORDINALITY AS u(debit, credit, amount, hold_id, i)
), replay AS (
    SELECT CASE WHEN t.content_hash = %(hash)s THEN 'exists' ELSE 'idempotency_conflict' END AS status,
           NULL::integer AS i
      FROM journal_transaction t WHERE t.idempotency_key = %(key)s
), accounts AS (
    SELECT CASE WHEN bool_or(d.id IS NULL OR c.id IS NULL) THEN 'account_not_found'
                WHEN bool_or(d.closed_at IS NOT NULL OR c.closed_at IS NOT NULL) THEN 'account_closed'
                ELSE 'asset_mismatch' END AS status, min(l.i) AS i
      FROM l LEFT JOIN account d ON d.id = l.debit LEFT JOIN account c ON c.id = l.credit
     WHERE d.id IS NULL OR c.id IS NULL OR d.closed_at IS NOT NULL OR c.closed_at IS NOT NULL OR d.asset <> c.asset
    HAVING count(*) > 0
), holds AS (
    SELECT CASE WHEN bool_or(h.id IS NULL) THEN 'hold_not_found'
                WHEN bool_or(h.owner IS DISTINCT FROM %(owner)s) THEN 'hold_owner_mismatch'
                WHEN bool_or(h.account_id <> l.debit) THEN 'hold_account_mismatch'
                WHEN bool_or(h.state <> 'pending') THEN 'hold_already_resolved'
                ELSE 'hold_expired' END AS status, min(l.i) AS i
      FROM l LEFT JOIN hold h ON h.id = l.hold_id
     WHERE l.hold_id IS NOT NULL
       AND (h.id IS NULL OR h.owner IS DISTINCT FROM %(owner)s OR h.account_id <> l.debit
            OR h.state <> 'pending' OR h.expires_at <= now())
    HAVING count(*) > 0
), exceeded AS (
    SELECT 'hold_exceeded' AS status, min(x.first_i) AS i
      FROM (SELECT l.hold_id, sum(l.amount) AS total, min(l.i) AS first_i FROM l
             WHERE l.hold_id IS NOT NULL GROUP BY l.hold_id) x
      JOIN hold h ON h.id = x.hold_id
     WHERE x.total > h.amount - h.captured - h.released
    HAVING count(*) > 0
), net AS (
    SELECT m.account_id, sum(m.delta) AS delta, sum(m.held_delta) AS held_delta, min(m.i) AS first_i
      FROM (SELECT l.debit AS account_id, -l.amount AS delta,
                   CASE WHEN l.hold_id IS NULL THEN 0 ELSE -l.amount END AS held_delta, l.i FROM l
            UNION ALL
            SELECT l.credit, l.amount, 0, l.i FROM l) m
     GROUP BY m.account_id
), limits AS (
    SELECT CASE WHEN bool_or(NOT a.may_go_negative AND n.delta < 0
                             AND b.posted + n.delta - (b.held + n.held_delta) < 0) THEN 'insufficient_funds'
                ELSE 'limit_exceeded' END AS status, min(n.first_i) AS i
      FROM net n
      JOIN account a ON a.id = n.account_id
      CROSS JOIN LATERAL (SELECT coalesce(sum(s.posted), 0) AS posted, coalesce(sum(s.held), 0) AS held
                            FROM account_balance s WHERE s.account_id = n.account_id) b
     WHERE (NOT a.may_go_negative AND n.delta < 0 AND b.posted + n.delta - (b.held + n.held_delta) < 0)
        OR (NOT a.may_go_positive AND n.delta > 0 AND b.posted + n.delta > 0)
    HAVING count(*) > 0
)
SELECT r.status, r.i - 1 AS failed_index
  FROM (SELECT 1 AS rank, * FROM replay
        UNION ALL SELECT 2, * FROM accounts
        UNION ALL SELECT 3, * FROM holds
        UNION ALL SELECT 4, * FROM exceeded
        UNION ALL SELECT 5, * FROM limits) r
 ORDER BY r.rank LIMIT 1
"""


@dataclass(frozen=True)
class StatementPrecheck:
    """A caller's refusal read in the SAME statement as a posting or hold, just before it: `sql` is
    a SELECT (psycopg named placeholders, `params`) whose first row, if any, refuses; `refuse` is
    called with that row (a dict of its columns) and must raise. The ledger's function then does
    not run: the statement gates it on the check's answer (`_gated`). One round trip instead of
    two, and atomic with the posting (in autocommit the statement is its transaction)."""

    sql: str
    params: dict[str, Any]
    refuse: Callable[[dict[str, Any]], None]


# A caller's check run before a posting or hold: a StatementPrecheck (in the same statement), or a
# callable run on the connection just before the statement (no second pool checkout, no
# transaction of its own: one more statement): it reads through the driver cursor it is given and
# raises to refuse; that form is not atomic with the posting. The ledger's own checks are (under
# its row locks).
Precheck = Callable[[psycopg.Cursor], None] | StatementPrecheck


def _gated(sql: str, params: tuple, check: StatementPrecheck) -> tuple[str, dict[str, Any]]:
    """`sql` (one of the ledger's `SELECT ... FROM <function>(%s, ...)` statements, no WHERE)
    behind `check`, as one statement: the check's first row is read first (`refusal_`, NULL when
    there is none) and the function runs only when there is none. Its lateral subquery's WHERE
    names only the check's row, so PostgreSQL plans it as a one-time filter above the function
    scan (OFFSET 0 keeps the subquery from being merged into the join): a refused call never
    starts the function."""
    parts = sql.split("%s")
    if len(parts) - 1 != len(params):
        raise ValueError("placeholders and parameters differ")
    body = parts[0] + "".join(f"%(p{i}_)s{part}" for i, part in enumerate(parts[1:]))
    named = {f"p{i}_": value for i, value in enumerate(params)}
    if named.keys() & check.params.keys():
        raise ValueError("a precheck's parameter names end without an underscore")
    gated = ("SELECT to_jsonb(pre_) - 'refused_' AS refusal_, call_.* FROM (SELECT 1) AS one_ "
             f"LEFT JOIN LATERAL (SELECT true AS refused_, x_.* FROM ({check.sql}) AS x_ LIMIT 1) AS pre_ ON true "
             f"LEFT JOIN LATERAL ({body} WHERE pre_.refused_ IS NULL OFFSET 0) AS call_ ON true")
    return gated, {**named, **check.params}
REFERENCE_CACHE_SIZE = 200_000  # accounts whose asset, kind and decimals a Ledger remembers


@dataclass(frozen=True)
class AccountReference:
    """What never changes about an account: its asset, its kind, and that asset's decimals."""

    asset: str
    kind: AccountKind
    decimals: int


_ACCOUNT_SQL = (
    "SELECT id, asset, kind, name, owner, may_go_negative, may_go_positive, closed_at IS NOT NULL AS closed, "
    "balance_shards FROM account"
)
_HOLD_COLUMNS = "id, account_id, amount, captured, released, state, owner, reference, expires_at, content_hash"
_HOLD_SQL = f"SELECT {_HOLD_COLUMNS} FROM hold"
_APPLY_SQL = (
    "SELECT status, id, failed_index FROM ledger_apply(%s::text[], %s::text[], %s::text[], %s::bigint[], "
    "%s::numeric[], %s::text[], %s::text[], %s::bigint[], %s::bigint[], %s::jsonb, %s::integer[], %s::integer[], "
    "%s::bigint[], %s::bigint[], %s::numeric[], %s::bigint[])"
)
_RESERVE_HOLD_IDS_SQL = "SELECT r AS id FROM ledger_reserve_hold_ids(%s::integer) r"
_LOCK_AVAILABLE_SQL = (
    "SELECT account_id, available, may_go_negative, closed FROM ledger_lock_available(%s::bigint[])"
)
_PLACE_HOLD_SQL = (
    "SELECT r.status, r.available, "
    + ", ".join(f"(r.hold_row).{c}" for c in _HOLD_COLUMNS.split(", "))
    + " FROM ledger_place_hold(%s::text, %s::text, %s::bigint, %s::numeric, %s::text, %s::text, %s::timestamptz) r"
)
_RESOLVE_HOLD_SQL = (
    "SELECT r.status, "
    + ", ".join(f"(r.hold_row).{c}" for c in _HOLD_COLUMNS.split(", "))
    + " FROM ledger_resolve_hold(%s::bigint, %s::text, %s::text, %s::timestamptz) r"
)
# A balance is the sum over the account's shards; its checkpoint the newest transaction any shard saw.
_BALANCE_SQL = text(
    "SELECT a.id AS account_id, a.asset, sum(b.posted) AS posted, sum(b.held) AS held, "
    "max(b.last_transaction_id) AS last_transaction_id "
    "FROM account a JOIN account_balance b ON b.account_id = a.id WHERE a.id = :i GROUP BY a.id"
)
# Locks every balance shard of the account, closes it if empty (migration 0054: SECURITY DEFINER).
_CLOSE_ACCOUNT_SQL = text("SELECT found, posted, held FROM ledger_close_account(:i)")


def _account(row: Any) -> Account:
    return Account(
        row.id,
        row.asset,
        AccountKind(row.kind),
        row.name,
        row.owner,
        row.may_go_negative,
        row.may_go_positive,
        row.closed,
        row.balance_shards,
    )


def _hold(row: Any, *, created: bool = True) -> Hold:
    return Hold(
        row.id,
        row.account_id,
        int(row.amount),
        int(row.captured),
        int(row.released),
        HoldState(row.state),
        row.owner,
        row.reference,
        row.expires_at,
        created,
    )


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _balance(row: Any) -> Balance:
    return Balance(row.account_id, row.asset, int(row.posted), int(row.held), row.last_transaction_id)
