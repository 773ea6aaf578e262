"""A minimal JSON-RPC 1.0/2.0 client over one keep-alive HTTP connection (bitcoind, anvil).

Kept deliberately thin because block scanning is dominated by RPC round trips: `http.client`
costs less per call than a general HTTP client. Safe to share between threads: each thread gets
its own keep-alive connection (the service's scheduler jobs and API handlers share one adapter).
`parse_float` lets the bitcoin adapter read amounts as `Decimal` (never float).

Authentication (bitcoind's two schemes; anvil needs none):
- user and password in the URL (`http://user:pass@host:port`), or `auth=(user, password)`;
- `cookie_file=`: the `.cookie` bitcoind writes at start (`__cookie__:<random>`). It is read when a
  connection is opened, not when the client is built, and read again after a 401: bitcoind
  writes a new cookie each time it restarts, so a long-running worker follows it. A cookie file
  that cannot be read is `NodeUnavailable` (the node may be starting), never a crash.
Give one scheme only; `ValueError` otherwise.

`error_for(rpc_code, message)` turns a JSON-RPC error reply into the exception raised (default
`RpcError`); the bitcoin adapter uses it to raise `NodeBusy` for bitcoind's one-at-a-time refusals.
`at_path(path)` is a client for the same node, credentials and error mapping at another URL path
(bitcoind's per-wallet endpoint `/wallet/<name>`).

`connection_serial` is the serial number of the newest connection opened (0: none yet), in any
thread: a caller that must re-check the node after a reconnect (custody.roots.guards.NetworkGate
verifies the node's chain) compares it before and after its calls.
"""
from __future__ import annotations

import base64
import http.client
import itertools
import json
import threading
from collections.abc import Callable, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from chain_adapters.errors import ChainError, NodeUnavailable, RpcError


class JsonRpcClient:
    def __init__(self, url: str, *, timeout: float = 30.0,
                 parse_float: Callable[[str], Any] = Decimal, auth: tuple[str, str] | None = None,
                 cookie_file: str | Path | None = None,
                 error_for: Callable[[int, str], ChainError] = RpcError) -> None:
        self._url, self._parse_float, self._auth = url, parse_float, auth
        self._error_for = error_for
        parts = urlsplit(url)
        if sum(x is not None and x != "" for x in (parts.username, auth, cookie_file)) > 1:
            raise ValueError("give one RPC authentication: credentials in the URL, auth=(user, password) or cookie_file")
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 80
        self._path = parts.path or "/"
        self._timeout = timeout
        self._headers = {"Content-Type": "application/json"}
        self._cookie_file = Path(cookie_file) if cookie_file is not None else None
        if parts.username:
            auth = (parts.username, parts.password or "")
        if auth is not None:
            self._headers["Authorization"] = _basic(*auth)
        self._decoder = json.JSONDecoder(parse_float=parse_float)
        self._local = threading.local()
        self._ids = itertools.count(1)
        self._serials = itertools.count(1)
        self.connection_serial = 0  # the newest connection's serial (see the module docstring)

    def at_path(self, path: str) -> JsonRpcClient:
        """A client of its own (own connections) for `path` on the same node, with the same
        credentials, cookie file, timeout, number parsing and error mapping."""
        parts = urlsplit(self._url)
        return JsonRpcClient(parts._replace(path=path).geturl(), timeout=self._timeout, parse_float=self._parse_float,
                             auth=self._auth, cookie_file=self._cookie_file, error_for=self._error_for)

    @property
    def _conn(self) -> http.client.HTTPConnection | None:
        return getattr(self._local, "conn", None)

    @_conn.setter
    def _conn(self, value: http.client.HTTPConnection | None) -> None:
        self._local.conn = value

    def _read_cookie(self) -> None:
        """Take the Authorization header from the cookie file as it is now (bitcoind rewrites it
        at every start)."""
        assert self._cookie_file is not None
        try:
            user, sep, password = self._cookie_file.read_text().strip().partition(":")
        except OSError as exc:
            raise NodeUnavailable(f"{self._host}:{self._port}: cannot read the RPC cookie {self._cookie_file}: "
                                  f"{exc.strerror or exc}") from exc
        if not sep:
            raise NodeUnavailable(f"{self._host}:{self._port}: {self._cookie_file} is not a user:password cookie")
        self._headers["Authorization"] = _basic(user, password)

    def _post(self, body: bytes) -> Any:
        cookie_retried = False
        for attempt in (1, 2, 3):  # a keep-alive connection the server closed is retried once
            if self._conn is None:
                if self._cookie_file is not None:
                    self._read_cookie()
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
                self.connection_serial = next(self._serials)
            try:
                self._conn.request("POST", self._path, body, self._headers)
                resp = self._conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if attempt >= 2:
                    raise NodeUnavailable(f"{self._host}:{self._port}: {exc}") from exc
                continue
            if resp.status in (401, 403):
                if self._cookie_file is not None and not cookie_retried:  # the node restarted: a new cookie
                    cookie_retried = True
                    self.close()
                    continue
                raise NodeUnavailable(f"{self._host}:{self._port}: HTTP {resp.status} (credentials?)")
            try:
                return self._decoder.decode(data.decode())
            except ValueError as exc:
                raise NodeUnavailable(f"HTTP {resp.status}: not JSON: {data[:200]!r}") from exc
        raise AssertionError("unreachable")

    def call(self, method: str, *params: Any) -> Any:
        body = json.dumps({"jsonrpc": "2.0", "id": next(self._ids), "method": method,
                           "params": list(params)}, default=str).encode()
        reply = self._post(body)
        err = reply.get("error")
        if err:
            raise self._error_for(int(err.get("code", 0)), str(err.get("message", err)))
        return reply["result"]

    def batch(self, calls: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
        """Several calls in one request; results in order; the first error raises."""
        if not calls:
            return []
        ids = [next(self._ids) for _ in calls]
        body = json.dumps([{"jsonrpc": "2.0", "id": i, "method": m, "params": list(p)}
                           for i, (m, p) in zip(ids, calls)], default=str).encode()
        replies = sorted(self._post(body), key=lambda r: r["id"])
        out = []
        for reply in replies:
            err = reply.get("error")
            if err:
                raise self._error_for(int(err.get("code", 0)), str(err.get("message", err)))
            out.append(reply["result"])
        return out

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
