"""A minimal JSON-RPC 1.0/2.0 client over one keep-alive HTTP connection (bitcoind, anvil).

Kept deliberately thin because block scanning is dominated by RPC round trips: `http.client`
costs less per call than a general HTTP client. Safe to share between threads: each thread gets
its own keep-alive connection (the service's scheduler jobs and API handlers share one adapter).
`parse_float` lets the bitcoin adapter read amounts as `Decimal` (never float).
"""
from __future__ import annotations

import base64
import http.client
import itertools
import json
import threading
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from chain_adapters.errors import NodeUnavailable, RpcError


class JsonRpcClient:
    def __init__(self, url: str, *, timeout: float = 30.0,
                 parse_float: Callable[[str], Any] = Decimal) -> None:
        parts = urlsplit(url)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 80
        self._path = parts.path or "/"
        self._timeout = timeout
        self._headers = {"Content-Type": "application/json"}
        if parts.username:
            token = base64.b64encode(f"{parts.username}:{parts.password or ''}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        self._decoder = json.JSONDecoder(parse_float=parse_float)
        self._local = threading.local()
        self._ids = itertools.count(1)

    @property
    def _conn(self) -> http.client.HTTPConnection | None:
        return getattr(self._local, "conn", None)

    @_conn.setter
    def _conn(self, value: http.client.HTTPConnection | None) -> None:
        self._local.conn = value

    def _post(self, body: bytes) -> Any:
        for attempt in (1, 2):  # a keep-alive connection the server closed is retried once
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
            try:
                self._conn.request("POST", self._path, body, self._headers)
                resp = self._conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if attempt == 2:
                    raise NodeUnavailable(f"{self._host}:{self._port}: {exc}") from exc
                continue
            if resp.status in (401, 403):
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
            raise RpcError(int(err.get("code", 0)), str(err.get("message", err)))
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
                raise RpcError(int(err.get("code", 0)), str(err.get("message", err)))
            out.append(reply["result"])
        return out

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
