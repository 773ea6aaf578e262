"""PostgreSQL persistence of matching: markets, the command journal, order rows, fills, snapshots.

Every function takes the caller's SQLAlchemy `Connection`, so the journal row of a command, its
fills, its ledger postings and its order rows commit in ONE database transaction (the service's
unit of work decides when). Writes of one command are buffered in a `UnitOfWork` and flushed in a
few batched statements just before commit: journal rows first, then order rows, then fill rows
(the order the foreign keys need).

Tables (migration 0004_matching): `market` (reference), `matching_command` (append-only journal),
`trade_order` (operational, mirrors the engine), `fill` (append-only), `matching_snapshot`
(derived: rebuildable from the journal).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterator

import psycopg
from psycopg.rows import namedtuple_row
from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from matching.fees import FeeSchedule
from matching.model import Command, Market, command_from_record, command_to_record
from matching.snapshot import Snapshot
from matching.stp import StpPolicy


@dataclass(frozen=True)
class MarketRow:
    """A `market` row: the engine's configuration plus the fee income account."""

    market: Market
    fees: FeeSchedule
    default_stp: StpPolicy
    fee_account_id: int


# ---- markets ---------------------------------------------------------------------------------

def insert_market(conn: Connection, row: MarketRow) -> bool:
    """Insert a market; False if the symbol exists already (the caller compares content)."""
    m = row.market
    result = conn.execute(
        text("INSERT INTO market (symbol, base_asset, quote_asset, lot_size, quote_per_tick_lot, "
             "min_notional, fees, default_stp, fee_account_id) VALUES (:s, :b, :q, :l, :u, :n, "
             "CAST(:f AS jsonb), :stp, :fa) ON CONFLICT (symbol) DO NOTHING RETURNING symbol"),
        {"s": m.symbol, "b": m.base_asset, "q": m.quote_asset, "l": m.lot_size,
         "u": m.quote_per_tick_lot, "n": m.min_notional, "f": json.dumps(row.fees.to_record()),
         "stp": row.default_stp.value, "fa": row.fee_account_id},
    ).first()
    return result is not None


def load_markets(conn: Connection, symbol: str | None = None) -> list[MarketRow]:
    sql = ("SELECT symbol, base_asset, quote_asset, lot_size, quote_per_tick_lot, min_notional, fees, "
           "default_stp, fee_account_id FROM market")
    rows = conn.execute(text(sql + (" WHERE symbol = :s" if symbol else "") + " ORDER BY symbol"),
                        {"s": symbol}).all()
    return [MarketRow(Market(r.symbol, r.base_asset, r.quote_asset, int(r.lot_size),
                             int(r.quote_per_tick_lot), int(r.min_notional)),
                      FeeSchedule.from_record(r.fees), StpPolicy(r.default_stp), r.fee_account_id)
            for r in rows]


# ---- the journal -----------------------------------------------------------------------------

def load_commands(conn: Connection, market: str, after_seq: int = 0) -> Iterator[tuple[int, Command]]:
    """Journal entries of `market` with seq > `after_seq`, in order (streamed)."""
    result = conn.execution_options(stream_results=True, yield_per=2000).execute(
        text("SELECT seq, record FROM matching_command WHERE market = :m AND seq > :s ORDER BY seq"),
        {"m": market, "s": after_seq})
    for row in result:
        yield row.seq, command_from_record(row.record)


def last_seq(conn: Connection, market: str) -> int:
    return conn.execute(text("SELECT coalesce(max(seq), 0) FROM matching_command WHERE market = :m"),
                        {"m": market}).scalar_one()


# ---- snapshots -------------------------------------------------------------------------------

def save_snapshot(conn: Connection, market: str, snap: Snapshot) -> None:
    conn.execute(text("INSERT INTO matching_snapshot (market, seq, hash, data) VALUES (:m, :s, :h, :d) "
                      "ON CONFLICT (market, seq) DO NOTHING"),
                 {"m": market, "s": snap.seq, "h": snap.hash, "d": snap.data})


def latest_snapshot(conn: Connection, market: str) -> Snapshot | None:
    row = conn.execute(text("SELECT seq, hash, data FROM matching_snapshot WHERE market = :m "
                            "ORDER BY seq DESC LIMIT 1"), {"m": market}).first()
    return Snapshot(row.seq, bytes(row.data), row.hash) if row else None


# ---- order rows and fills: one unit of work per command (or per group commit) -----------------

_ORDER_COLUMNS = ("id", "market", "account", "client_order_id", "side", "order_type", "tif",
                  "post_only", "price", "qty", "display_qty", "stop_price", "budget", "fee_tier",
                  "state", "seq", "last_seq", "filled", "remaining", "quote_traded", "fees_paid",
                  "hold_id", "hold_no", "prior_captured", "reject_code", "close_reason")
_FILL_COLUMNS = ("market", "seq", "match_no", "maker_order_id", "taker_order_id", "maker_account",
                 "taker_account", "taker_side", "price_ticks", "qty_lots", "base_amount",
                 "quote_amount", "maker_fee", "taker_fee", "journal_transaction_id")
# A unit of work's rows of one table go in ONE statement as one JSON array of objects keyed by
# column (json_populate_recordset types each value by its column; integers stay exact: JSON
# numbers become numeric, never floats). Driver-level SQL, run on the caller's transaction.
_INSERT_COMMANDS = (
    "INSERT INTO matching_command (market, seq, record) "
    "SELECT r.market, r.seq, r.record FROM json_populate_recordset(NULL::matching_command, %s::json) r")
_UPSERT_ORDERS = (
    f"INSERT INTO trade_order ({', '.join(_ORDER_COLUMNS)}) "
    f"SELECT {', '.join('r.' + c for c in _ORDER_COLUMNS)} FROM json_populate_recordset(NULL::trade_order, %s::json) r "
    "ON CONFLICT (id) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in _ORDER_COLUMNS[5:]) + ", updated_at = now() "
    f"RETURNING {', '.join('trade_order.' + c for c in _ORDER_COLUMNS)}, trade_order.created_at, trade_order.updated_at")
_INSERT_FILLS = (
    f"INSERT INTO fill ({', '.join(_FILL_COLUMNS)}, settlement_version) "
    f"SELECT {', '.join('r.' + c for c in _FILL_COLUMNS)}, r.settlement_version "
    "FROM json_populate_recordset(NULL::fill, %s::json) r "
    "ON CONFLICT (market, seq, match_no) DO NOTHING")


@dataclass
class UnitOfWork:
    """Rows written by the commands of one database transaction, flushed together before commit."""

    market: str
    commands: list[dict] = field(default_factory=list)
    orders: dict[str, dict] = field(default_factory=dict)
    fills: list[dict] = field(default_factory=list)
    # owners whose new orders and amends this unit refuses (Trading.blocked_code), and whether each
    # account asked about (locked in this unit) is blocked (Trading._blocked)
    blocked_owners: set[str] = field(default_factory=set)
    blocked: dict[int, bool] = field(default_factory=dict)

    def journal(self, seq: int, command: Command) -> None:
        self.commands.append({"market": self.market, "seq": seq, "record": command_to_record(command)})

    def order(self, row: dict) -> None:
        """Record an order row's latest values (a later call for the same id replaces it)."""
        self.orders[row["id"]] = row

    def fill(self, row: dict) -> None:
        self.fills.append(row)

    def flush(self, conn: Connection, *, commit: bool = False) -> dict[str, Any]:
        """Write the buffered rows: journal rows first, then order rows, then fill rows (the order
        the foreign keys need), one statement each, sent together in one round trip (psycopg's
        pipeline mode; an error of any of them raises here and fails the unit). With `commit` (the
        last statement of the caller's transaction) the transaction's COMMIT goes in the same round
        trip, and the caller's `Engine.begin()` block then finds nothing left to commit; a failed
        COMMIT raises here like any other statement. Returns the order rows as written (every
        column `order_row` reads, timestamps included), by order id: the answers to the callers."""
        statements = [(sql, json.dumps(rows, separators=(",", ":")))
                      for sql, rows in ((_INSERT_COMMANDS, self.commands), (_UPSERT_ORDERS, list(self.orders.values())),
                                        (_INSERT_FILLS, self.fills)) if rows]
        self.commands, self.orders, self.fills = [], {}, []
        raw = conn.connection.driver_connection
        if not isinstance(raw, psycopg.Connection) or not psycopg.Pipeline.is_supported():
            written: dict[str, Any] = {}
            for sql, data in statements:
                result = conn.exec_driver_sql(sql, (data,))
                if sql is _UPSERT_ORDERS:
                    written = {row.id: row for row in result}
            return written
        cursors = []
        try:
            with raw.pipeline():
                for sql, data in statements:
                    cur = raw.cursor(row_factory=namedtuple_row)
                    cur.execute(sql, (data,))
                    cursors.append((sql, cur))
                if commit:
                    raw.cursor().execute("COMMIT")
        except psycopg.Error as exc:  # as SQLAlchemy raises it (retries and the API's error mapping read it)
            raise DBAPIError.instance(" ; ".join(sql for sql, _ in statements), None, exc, psycopg.Error) from exc
        for sql, cur in cursors:
            if sql is _UPSERT_ORDERS:
                return {row.id: row for row in cur.fetchall()}
        return {}


class JournalBuffer:
    """The sequencer's `JournalSink`: appends go into the current unit of work, which the service
    flushes inside the same database transaction as the command's effects. A command is durable
    when that transaction commits, and nothing is acknowledged before then."""

    def __init__(self) -> None:
        self.uow: UnitOfWork | None = None

    def append(self, seq: int, command: Command) -> None:
        if self.uow is None:
            raise RuntimeError("journal append outside a unit of work")
        self.uow.journal(seq, command)


# ---- reads -----------------------------------------------------------------------------------

_ORDER_SELECT = f"SELECT {', '.join(_ORDER_COLUMNS)}, created_at, updated_at FROM trade_order"


def order_row(conn: Connection, order_id: str) -> Any | None:
    return conn.execute(text(f"{_ORDER_SELECT} WHERE id = :i"), {"i": order_id}).first()


def order_row_by_client_id(conn: Connection, market: str, account: str, client_order_id: str) -> Any | None:
    return conn.execute(text(f"{_ORDER_SELECT} WHERE market = :m AND account = :a AND client_order_id = :c"),
                        {"m": market, "a": account, "c": client_order_id}).first()


def risk_rejected_keys(conn: Connection, market: str) -> dict[tuple[str, str], str]:
    """(account, client order id) -> order id of orders rejected before sequencing."""
    rows = conn.execute(text("SELECT id, account, client_order_id FROM trade_order "
                             "WHERE market = :m AND seq IS NULL"), {"m": market}).all()
    return {(r.account, r.client_order_id): r.id for r in rows}


def fills(conn: Connection, market: str, *, order_id: str | None = None, account: str | None = None,
          after: int = 0, limit: int = 100) -> list[Any]:
    where = ["market = :m", "id > :after"]
    if order_id is not None:
        where.append("(maker_order_id = :o OR taker_order_id = :o)")
    if account is not None:
        where.append("(maker_account = :a OR taker_account = :a)")
    return conn.execute(
        text(f"SELECT id, {', '.join(_FILL_COLUMNS)}, created_at FROM fill WHERE {' AND '.join(where)} "
             "ORDER BY id LIMIT :lim"),
        {"m": market, "o": order_id, "a": account, "after": after, "lim": limit}).all()
