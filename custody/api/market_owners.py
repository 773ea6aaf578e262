"""Several api processes on one database: each market's sequencer is owned by ONE process at a time.

Postings and reads are served by every api process (they are plain database transactions). A
market's order entry is not: its engine lives in memory and has a single writer. The owner of a
market is the process whose dedicated database session holds the market's PostgreSQL session
advisory lock, `(MARKET_LOCK_NAMESPACE, CRC-32 of the symbol)` (`market_lock_key`); only the
owner holds the market's runtime (`Trading.load`, the book rebuilt from its latest snapshot plus
the journal) and runs its group commits (`Trading.submit_grouped`).

- **Taking ownership.** At start, and then every `interval` seconds, a process tries the lock of
  every market it does not own (`pg_try_advisory_lock`, which never waits): whoever gets it loads
  the book and serves it. A request for a market nobody owns takes it on the spot.
- **Finding the owner.** The dedicated session's `application_name` is `custody-api <url>`, the
  owner's own base URL (`http://API_HOST:API_PORT`; the host name when it listens on every
  address). Another process finds the owner in `pg_locks` joined to `pg_stat_activity` (both
  readable by the api's role), and only believes a holder connected as its OWN role
  (`custody_api`): a session of another role that took the lock cannot attract the orders, nor the
  callers' API keys that travel with them.
- **Forwarding.** A place, cancel or amend (and a depth read) for a market owned elsewhere is sent to
  the owner over HTTP with the caller's `X-API-Key` and body unchanged (`forward`), marked with
  `X-Custody-Forwarded` (a forwarded request is never forwarded again: it is served, or answered
  503 `temporarily_unavailable`), and the owner's answer is returned as it is. The owner
  authenticates the caller itself.
- **A dead owner.** When its process dies (SIGKILL included) its sessions close and PostgreSQL drops
  the lock with them (TCP keepalives on the session bound a vanished host to ~25 s). A request
  that cannot connect to the owner waits (up to `TAKEOVER_SECONDS`) until the lock is free or
  held by a new owner, takes it itself when it is free, and is then served or forwarded; the
  background pass takes orphaned markets without any request. The new owner rebuilds the book
  from the journal: every acknowledged order was committed before it was acknowledged (group
  commit), so none is lost. A place that was sent to a dying owner is sent again (a retry of the
  same client order id is idempotent: answered 200 with the order if it had committed); a cancel
  or amend whose answer was lost is answered 503 (its effect is unknown: read the order).
- **Losing the session.** If the dedicated session fails, the process has lost its locks: it drops
  every runtime at once (`Trading.release`) and forwards from then on. Between the loss and its
  detection a stale writer can only fail: the journal's key (market, seq) refuses a second
  command under a number the new owner used, and that whole unit rolls back.

Run several api processes by starting `custody api` more than once on one configuration, each
with its own port (`CUSTODY_API__PORT=8001 python -m custody api --config FILE`; custody.launch's
`deploy(api_processes=N)` does so). Errors: a market whose owner cannot be reached and whose lock
is not released within `TAKEOVER_SECONDS` is answered 503 `temporarily_unavailable`
(`Retry-After`); nothing was done.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
import weakref
import zlib
from typing import Any

import anyio.to_thread
import httpx
from sqlalchemy import Connection, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool
from starlette.requests import Request
from starlette.responses import Response

from custody.api.errors import ApiError
from matching.service import Trading

log = logging.getLogger(__name__)

MARKET_LOCK_NAMESPACE = 0x4D4B5457  # "MKTW": the first key of every market-owner lock (pg_locks.classid)
APPLICATION_PREFIX = "custody-api "
FORWARDED_HEADER = "X-Custody-Forwarded"
TAKEOVER_SECONDS = 15.0
_PASSED_HEADERS = ("x-api-key", "content-type", "x-request-id", "accept")
_ANSWER_HEADERS = ("content-type", "retry-after", "x-request-id")

_OWNER_SQL = text(
    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
    "AND l.classid::bigint = :n AND l.objid::bigint = :k AND a.usename = current_user "
    "AND a.datname = current_database()")


def market_lock_key(symbol: str) -> tuple[int, int]:
    """(MARKET_LOCK_NAMESPACE, CRC-32 of the symbol as a signed int4): the same in every process
    and release (two symbols sharing a CRC share an owner, which is harmless)."""
    crc = zlib.crc32(symbol.encode())
    return MARKET_LOCK_NAMESPACE, crc - (1 << 32) if crc >= 1 << 31 else crc


def advertised_url(host: str, port: int) -> str:
    """The base URL the other api processes reach this one at."""
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    return f"http://{host}:{port}"


_registry: weakref.WeakKeyDictionary[Trading, "MarketOwners"] = weakref.WeakKeyDictionary()


def owners_of(trading: Trading) -> "MarketOwners | None":
    """The ownership of `trading`'s markets, or None (one process serves every market)."""
    return _registry.get(trading)


class MarketOwners:
    """Which markets this process owns (see the module docstring); one per api process."""

    def __init__(self, trading: Trading, db_url: URL | str, url: str, *, interval: float = 1.0) -> None:
        self.trading = trading
        self.url = url
        self.interval = interval
        self.owned: set[str] = set()
        self._engine = create_engine(make_url(db_url) if isinstance(db_url, str) else db_url,
                                     isolation_level="AUTOCOMMIT", poolclass=NullPool,
                                     connect_args={"application_name": (APPLICATION_PREFIX + url)[:63]})

        @event.listens_for(self._engine, "connect")
        def _keepalives(dbapi_connection, _record) -> None:  # noqa: ANN001 - DBAPI objects
            with dbapi_connection.cursor() as cur:  # ignored on a Unix socket (the embedded server)
                cur.execute("SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3")

        self._session: Connection | None = None
        self._lock = threading.RLock()  # the session, `owned`, and loading a book
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._clients: dict[int, httpx.AsyncClient] = {}  # one per event loop
        self._owner_cache: dict[str, tuple[str | None, float]] = {}
        _registry[trading] = self

    # ---- the lock session ------------------------------------------------------------------------

    def watch(self) -> None:
        """Keep checking the lock session and taking orphaned markets, every `interval` seconds, in
        a thread of its own until `stop()`."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="market-owners", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        with self._lock:
            self._drop("stopping")
        self._engine.dispose()

    def _conn(self) -> Connection:
        if self._session is None:
            self._session = self._engine.connect()
        return self._session

    def try_take(self, symbol: str) -> bool:
        """Own `symbol` if its lock is free (loading its book); True when this process owns it."""
        with self._lock:
            if symbol in self.owned:
                return True
            namespace, key = market_lock_key(symbol)
            try:
                got = self._conn().execute(text("SELECT pg_try_advisory_lock(:n, :k)"),
                                           {"n": namespace, "k": key}).scalar_one()
            except DBAPIError:
                self._drop("its lock session failed")
                raise
            if not got:
                return False
            try:
                self.trading.load(symbol)
            except BaseException:
                self._conn().execute(text("SELECT pg_advisory_unlock(:n, :k)"), {"n": namespace, "k": key})
                raise
            self.owned.add(symbol)
            self._owner_cache.pop(symbol, None)
            log.info("market %s: owned by this api process (%s); book rebuilt from its journal", symbol, self.url)
            return True

    def claim(self) -> None:
        """One pass: check the session, then try every market not owned here."""
        with self._lock:
            if self._session is not None:
                try:
                    self._session.execute(text("SELECT 1"))
                except DBAPIError:
                    self._drop("its lock session failed")
        for row in self.trading.markets():
            symbol = row.market.symbol
            if symbol not in self.owned:
                self.try_take(symbol)

    def _drop(self, why: str) -> None:
        """Forget every lock (the session is gone, or the process stops): no runtime stays here."""
        if self.owned:
            log.warning("api process %s: %s; releasing markets %s", self.url, why, sorted(self.owned))
        for symbol in list(self.owned):
            self.trading.release(symbol)
        self.owned.clear()
        if self._session is not None:
            try:
                self._session.invalidate()
                self._session.close()
            except Exception:  # noqa: BLE001 - already broken
                pass
            self._session = None

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.claim()
            except Exception:  # noqa: BLE001 - the database is unreachable: the next pass tries again
                log.warning("market owners: a pass failed", exc_info=True)

    # ---- routing -----------------------------------------------------------------------------------

    def owner_url(self, symbol: str, *, fresh: bool = False) -> str | None:
        """The base URL of the process owning `symbol` (this one's own when it owns it), or None."""
        if symbol in self.owned:
            return self.url
        cached = self._owner_cache.get(symbol)
        if cached is not None and not fresh and time.monotonic() - cached[1] < 5.0:
            return cached[0]
        namespace, key = market_lock_key(symbol)
        with self.trading.db.connect() as conn:
            names = conn.execute(_OWNER_SQL, {"n": namespace, "k": key & 0xFFFFFFFF}).scalars().all()
        url = next((n[len(APPLICATION_PREFIX):] for n in names if n and n.startswith(APPLICATION_PREFIX)), None)
        self._owner_cache[symbol] = (url, time.monotonic())
        return url

    def _client(self) -> httpx.AsyncClient:
        loop = id(asyncio.get_running_loop())
        client = self._clients.get(loop)
        if client is None:
            limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
            client = self._clients[loop] = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=2.0), limits=limits)
        return client

    async def route(self, request: Request, symbol: str) -> Response | None:
        """None when this process serves `symbol` (it owns it, or just took it over); else the
        owner's answer to the forwarded request."""
        if self.trading.holds(symbol):
            return None
        deadline = time.monotonic() + TAKEOVER_SECONDS
        forwarded = FORWARDED_HEADER.lower() in request.headers
        fresh = forwarded  # a forwarded request's sender believed this process the owner: look again
        while True:
            url = await anyio.to_thread.run_sync(lambda: self.owner_url(symbol, fresh=fresh))
            if url is None or url == self.url:
                if await anyio.to_thread.run_sync(self.try_take, symbol):
                    return None
            elif not forwarded:
                answer = await self._forward(request, url)
                if answer is not None:
                    return answer
            if time.monotonic() > deadline or (forwarded and url is not None and url != self.url):
                raise ApiError(503, "temporarily_unavailable",
                               f"market {symbol}: its owning api process cannot be reached now; send it again")
            fresh = True
            await asyncio.sleep(0.1)

    async def _forward(self, request: Request, url: str) -> Response | None:
        """The owner's answer, or None when the owner could not be reached (try again)."""
        headers = {k: v for k, v in request.headers.items() if k.lower() in _PASSED_HEADERS}
        headers[FORWARDED_HEADER] = self.url
        target = url + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        try:
            answer = await self._client().request(request.method, target, content=await request.body(),
                                                  headers=headers)
        except (httpx.ConnectError, httpx.ConnectTimeout):
            return None  # nothing was sent: safe to send anywhere
        except httpx.TransportError:
            # sent, answer lost: a place is idempotent (same client order id); anything else is unknown
            if request.method == "GET" or request.url.path.endswith("/orders"):
                return None
            raise ApiError(503, "temporarily_unavailable", "the market's owning api process failed while "
                                                           "answering; read the order to see whether it was done")
        return Response(answer.content, answer.status_code,
                        headers={k: v for k, v in answer.headers.items() if k.lower() in _ANSWER_HEADERS})


def attach_owners(trading: Trading, db_url: Any, url: str) -> MarketOwners:
    """Share `trading`'s markets with the other api processes (`trading` must have `autoload`
    off): take every market nobody owns now; `watch()` keeps doing so (the serving process)."""
    owners = MarketOwners(trading, db_url, url)
    owners.claim()
    return owners
