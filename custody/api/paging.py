"""Cursor pagination for every list route: one opaque cursor, one bounded limit, one answer header.

The rule (README "HTTP API", "Paging"):

- A list route takes `cursor` (opaque: copy it from the previous answer) and `limit` (1..its
  maximum, a documented default). Without a cursor it starts at the beginning of the list.
- The answer keeps the shape it always had (an array stays an array, so existing clients keep
  working). The next page's cursor is in the `X-Next-Cursor` header and in a
  `Link: <...>; rel="next"` header (the same request with `cursor` set); both are absent on the last
  page. A route whose answer is already an object also carries it as `next_cursor`.
- Order is fixed per route and by row id (keyset paging, never an offset): newest first
  (`id < cursor`) or oldest first (`id > cursor`), as each route always answered. A row inserted
  between two pages never shifts a page, so every row that existed when a walk began is returned
  exactly once. A newest-first walk does not see rows inserted after it began (start again from the
  top for them); an oldest-first walk sees them at its end. A filter (e.g. `state`) is applied on
  every page, so a row whose state changes during the walk is seen on the pages it matches then.
- A cursor names its list: one from `/v1/withdrawals` is refused by `/v1/deposits`. It carries a
  checksum, so a cursor that does not decode, was edited, or names another list is refused with
  `invalid_cursor` (422) before any database work. A cursor is no secret and grants nothing: the
  caller's role and the route's filters are checked on every page.

A route declares its list once:

    Deposits = pager("deposits", newest_first=True, default=200, maximum=1000)

    @router.get("/deposits", response_model=list[DepositOut], responses=responses(*PAGED))
    def deposits(c: ContainerDep, page: Deposits) -> list[DepositOut]:
        rows = service.list(before_id=page.key, limit=page.fetch)   # limit + 1 rows
        return [out(r) for r in page.finish(rows, key=lambda r: r.id)]

`page.fetch` is `limit + 1`: the extra row only tells whether a next page exists, and `finish`
drops it. Lists kept in memory (markets) use `page.slice(items, key=...)`. Lists paged by a service
that computes its own next position (a ledger statement, fills) call `page.next_at(key)`.
"""
# no `from __future__ import annotations`: FastAPI reads the dependency's annotations, which name locals of `pager`

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Query, Request, Response

from custody.api.errors import ApiError
from custody.api.params import MAX_ID

T = TypeVar("T")
Key = int | str | tuple[str, int]

NEXT_CURSOR_HEADER = "X-Next-Cursor"
MAX_CURSOR_LENGTH = 400
_CHECK_BYTES = 8
_PERSON = b"custody-cursor1"  # binds the checksum to this format (blake2b personalisation, <= 16 bytes)

# Every code a paged route can add to its documented answers (custody.api.errors.responses).
PAGED = ("invalid_cursor",)


def _check(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=_CHECK_BYTES, person=_PERSON).digest()


def encode(list_name: str, key: Key) -> str:
    """The opaque cursor that continues `list_name` past `key` (url-safe base64, no padding)."""
    payload = json.dumps([list_name, list(key) if isinstance(key, tuple) else key], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(payload + _check(payload)).rstrip(b"=").decode()


def decode(list_name: str, cursor: str) -> Key:
    """The key a cursor of `list_name` continues past; `invalid_cursor` (422) for anything else."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (binascii.Error, ValueError):
        raise _invalid("it is not url-safe base64") from None
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != cursor:
        # the last character of unpadded base64 carries bits the decoder ignores: only the one
        # spelling `encode` writes is a cursor, so a changed character is never the same cursor
        raise _invalid("it is not the cursor X-Next-Cursor gave: copy it unchanged")
    payload, check = raw[:-_CHECK_BYTES], raw[-_CHECK_BYTES:]
    if len(raw) <= _CHECK_BYTES or _check(payload) != check:
        raise _invalid("its checksum does not match: copy it unchanged from X-Next-Cursor")
    try:
        name, key = json.loads(payload)
    except (ValueError, TypeError):  # a checksum of our own over something we never wrote
        raise _invalid("it is not a cursor of this service") from None
    if name != list_name:
        raise _invalid(f"it continues another list ({name}), not {list_name}")
    if isinstance(key, list) and len(key) == 2:
        return key[0], key[1]
    return key


def _invalid(why: str) -> ApiError:
    return ApiError(422, "invalid_cursor", f"invalid cursor: {why}")


@dataclass
class Page:
    """One request's position in a list: where it starts (`key`), how many rows (`limit`)."""

    list_name: str
    newest_first: bool
    key: Any
    limit: int
    request: Request
    response: Response
    next_cursor: str | None = field(default=None)

    @property
    def fetch(self) -> int:
        """How many rows to read: one more than answered, to know whether a next page exists."""
        return self.limit + 1

    def finish(self, rows: Sequence[T], *, key: Callable[[T], Key]) -> list[T]:
        """The page's rows (at most `limit` of the `fetch` read); sets the next cursor when there are more."""
        rows = list(rows)
        if len(rows) > self.limit:
            rows = rows[: self.limit]
            self.next_at(key(rows[-1]))
        return rows

    def slice(self, items: Iterable[T], *, key: Callable[[T], Any]) -> list[T]:
        """Page a list kept in memory: sorted by `key` in the list's order, past the cursor."""
        ordered = sorted(items, key=key, reverse=self.newest_first)
        if self.key is not None:
            past = (lambda k: k < self.key) if self.newest_first else (lambda k: k > self.key)
            ordered = [item for item in ordered if past(_comparable(key(item)))]
        return self.finish(ordered[: self.fetch], key=key)

    def next_at(self, key: Key | None) -> None:
        """The next page continues past `key` (None: this is the last page). Sets the headers."""
        if key is None:
            return
        self.next_cursor = encode(self.list_name, key)
        self.response.headers[NEXT_CURSOR_HEADER] = self.next_cursor
        url = self.request.url.remove_query_params("cursor").include_query_params(cursor=self.next_cursor)
        self.response.headers["Link"] = f'<{url.path}?{url.query}>; rel="next"'


def _comparable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


def _id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_ID


def _key_type(key: Any, kind: type) -> Key:
    """The decoded key, if it has the shape this list's keys have (a row id, a text key, or a
    (text, row id) pair), else `invalid_cursor`."""
    fits = {int: _id(key), str: isinstance(key, str) and len(key) <= MAX_CURSOR_LENGTH,
            tuple: isinstance(key, tuple) and isinstance(key[0], str) and _id(key[1])}[kind]
    if not fits:
        raise _invalid("it does not name a row of this list")
    return key


def pager(list_name: str, *, newest_first: bool, default: int, maximum: int, key_type: type = int) -> Any:
    """The dependency (an `Annotated[Page, Depends(...)]`) of a list route: reads `cursor` and
    `limit` from the query, documents both, and answers the next cursor in the headers."""
    order = "newest first" if newest_first else "oldest first"

    def page(
        request: Request,
        response: Response,
        cursor: Annotated[str | None, Query(min_length=1, max_length=MAX_CURSOR_LENGTH, pattern=r"^[A-Za-z0-9_-]+$",
                                            description="the `X-Next-Cursor` of the previous page (opaque); "
                                                        "absent: the first page")] = None,
        limit: Annotated[int, Query(ge=1, le=maximum, description=f"rows per page, 1..{maximum} "
                                                                  f"(default {default}); {order}")] = default,
    ) -> Page:
        key = None if cursor is None else _key_type(decode(list_name, cursor), key_type)
        return Page(list_name, newest_first, key, limit, request, response)

    return Annotated[Page, Depends(page)]
