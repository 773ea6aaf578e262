"""Refuse, at the door, text that PostgreSQL cannot store.

PostgreSQL's `text` (and `jsonb`) cannot hold U+0000, and UTF-8 cannot encode a lone surrogate
(U+D800..U+DFFF without its pair; JSON can carry one as `"\\ud800"`). Either, reaching the
database, raised deep inside a service (psycopg's DataError, or a UnicodeEncodeError before the
query was even sent) and answered 500, after whatever work the request had already done.

Guarantees:
- every request is checked before routing, authentication or any database work: the path (as the
  router sees it, percent-decoded), each query parameter's name and value, each header value, and
  every string of a JSON body, nested keys included (e.g. a transaction's metadata);
- the first offending place is answered `invalid_request` (422), naming where it is
  (`body.metadata.note`, `query.state`, `path`), never echoing the value;
- a request without such text reaches the app unchanged (the body is replayed byte for byte).

An ASGI middleware rather than a string type in every schema or a dependency on every route, so
that no route added later can forget it, and so that path and query strings, which FastAPI never
passes through the body schemas, are covered by the same rule.
"""
from __future__ import annotations

import json
import re
from typing import Any, Awaitable, Callable

from starlette.datastructures import QueryParams
from starlette.responses import JSONResponse

from custody.api.errors import body as error_body

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(text: str) -> bool:
    """True when PostgreSQL can store `text`: no NUL character and no lone surrogate."""
    return _UNSTORABLE.search(text) is None


def first_unstorable(value: Any, where: str) -> str | None:
    """Where the first unstorable string in a decoded JSON value is (dict keys included), or None.
    Iterative, so a deeply nested body cannot exhaust the stack."""
    stack = [(value, where)]
    while stack:
        item, place = stack.pop()
        if isinstance(item, str):
            if not storable(item):
                return place
        elif isinstance(item, dict):
            for key in item:
                if not storable(key):
                    return f"{place} (a key)"
            stack.extend((v, f"{place}.{k}") for k, v in reversed(list(item.items())))
        elif isinstance(item, list):
            stack.extend((v, f"{place}[{i}]") for i, v in reversed(list(enumerate(item))))
    return None


def unstorable_in_target(scope: Scope) -> str | None:
    """Where unstorable text is in the request line and headers (path, query, headers), or None."""
    if not storable(scope.get("path", "")):
        return "path"
    for name, value in QueryParams(scope.get("query_string", b"")).multi_items():
        if not storable(name):
            return "query (a parameter name)"
        if not storable(value):
            return f"query.{name}"
    for name, value in scope.get("headers", ()):
        if b"\x00" in value:
            return f"header.{name.decode('latin-1')}"
    return None


def unstorable_in_body(raw: bytes) -> str | None:
    """Where unstorable text is in a JSON body, or None (also for a body that is not JSON at all:
    FastAPI refuses that itself). Raw NUL bytes are not valid inside JSON, so only an escape
    (`\\u0000`, `\\ud800`) can carry such text: bodies without one are not parsed here."""
    if b"\\u" not in raw:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return first_unstorable(value, "body")


class RefuseUnstorableText:
    """ASGI middleware applying `unstorable_in_target` and `unstorable_in_body` to every request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        where = unstorable_in_target(scope)
        if where is None:
            raw, receive = await _buffered(receive)
            where = unstorable_in_body(raw)
        if where is not None:
            response = JSONResponse(error_body("invalid_request", f"{where}: text with a NUL character or a lone "
                                               "surrogate cannot be stored"), status_code=422)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def _buffered(receive: Receive) -> tuple[bytes, Receive]:
    """Read the whole request body; return it and a `receive` that hands it to the app again."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away: let the app see that
            return b"", _replay([message], receive)
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    raw = b"".join(chunks)
    return raw, _replay([{"type": "http.request", "body": raw, "more_body": False}], receive)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
