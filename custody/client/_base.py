"""The transport under both clients: one request, its retries, and the error it raises.

- A call's body is validated and serialised once, before the first attempt; its idempotency key
  (`idempotency_key`, `client_order_id`, `client_withdrawal_id`: a uuid4 when the caller gave none)
  is therefore the same on every retry of that call.
- A 503 whose code is in `RETRY_CODES` is retried (nothing was committed, the API says), after the
  answer's `Retry-After` seconds (capped by `max_retry_wait`), or an exponential back-off without
  one; at most `retries` times, then it raises `ServiceUnavailable`.
- A failed connection (the request never left) is retried for every call; a connection lost after
  sending (a read timeout, a dropped answer) only for a call that is safe to send again: GET, PUT,
  DELETE, or a body carrying an idempotency key. Otherwise it raises `CustodyConnectionError` at
  once: the caller must look before sending again.
- `last_response` is the final answer (`httpx.Response`) of the latest call made on this client
  object, success or error (None before the first call, or when the latest got no answer): its
  `status_code` tells a create route's 201 (created) from its 200 (an idempotent replay of an
  earlier call), its `X-Request-ID` finds the call in the service log. One per client object
  (`with_key` gives the new one its own); not for a client shared by concurrent threads or tasks.
"""
from __future__ import annotations

import asyncio
import email.utils
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter

from custody.client.errors import CustodyApiError, CustodyConnectionError, error_class

log = logging.getLogger("custody.client")

RETRY_CODES = frozenset({"temporarily_unavailable", "node_unavailable"})
KEY_FIELDS = ("idempotency_key", "client_order_id", "client_withdrawal_id")
SAFE_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
NEXT_CURSOR = "X-Next-Cursor"


def _seg(value: object) -> str:
    """A path parameter, escaped as one path segment (an address or a symbol may hold any text)."""
    return quote(str(value), safe="")


def _body(model: type[BaseModel], body: BaseModel | Mapping[str, Any] | None, fields: Mapping[str, Any]) -> dict:
    """The JSON body of one logical call: validated once, idempotency keys filled once."""
    if body is not None and fields:
        raise TypeError("pass the request either as a model (or mapping) or as keyword fields, not both")
    value = body if isinstance(body, model) else model.model_validate(dict(body if body is not None else fields))
    data = value.model_dump(mode="json", exclude_unset=True)
    for key in KEY_FIELDS:
        if key in type(value).model_fields:
            data[key] = getattr(value, key)
    return data




def retry_wait(response: httpx.Response | None, attempt: int, max_wait: float) -> float:
    """Seconds to wait before attempt `attempt + 1`: the answer's Retry-After (seconds or an HTTP
    date) when it has one, else 0.25 s doubled per attempt; never more than `max_wait`."""
    header = response.headers.get("Retry-After") if response is not None else None
    wait = None
    if header:
        try:
            wait = float(header)
        except ValueError:
            when = email.utils.parsedate_to_datetime(header) if header else None
            wait = when.timestamp() - time.time() if when is not None else None
    if wait is None:
        wait = 0.25 * 2 ** attempt
    return max(0.0, min(wait, max_wait))


def _error(response: httpx.Response) -> CustodyApiError:
    try:
        error = response.json()["error"]
        code, message, detail = str(error["code"]), str(error["message"]), error.get("detail")
    except (ValueError, KeyError, TypeError):
        code, message, detail = f"http_{response.status_code}", response.text[:500], None
    return error_class(response.status_code)(response.status_code, code, message, detail,
                                             response.headers.get("X-Request-ID"))


def _retryable(response: httpx.Response) -> bool:
    if response.status_code != 503:
        return False
    try:
        return response.json()["error"]["code"] in RETRY_CODES
    except (ValueError, KeyError, TypeError):
        return False


def _may_resend(method: str, body: dict | None) -> bool:
    return method in SAFE_METHODS or any(key in (body or {}) for key in KEY_FIELDS)


def _clean(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return {k: v for k, v in params.items() if v is not None} if params else None


class _Settings:
    def __init__(self, base_url: str, api_key: str | None, timeout: float, retries: int, max_retry_wait: float) -> None:
        if retries < 0:
            raise ValueError("retries must be 0 or more")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.retries = retries
        self.max_retry_wait = max_retry_wait

    def headers(self) -> dict[str, str]:
        return {"X-API-Key": self.api_key} if self.api_key else {}

    def decide(self, method: str, url: str, attempt: int, body: dict | None, response: httpx.Response | None,
               failure: httpx.TransportError | None) -> float | None:
        """Seconds to wait before trying again, or None to stop here."""
        if attempt >= self.retries:
            return None
        if failure is not None:
            if not (isinstance(failure, (httpx.ConnectError, httpx.ConnectTimeout)) or _may_resend(method, body)):
                return None
        elif response is None or not _retryable(response):
            return None
        wait = retry_wait(response, attempt, self.max_retry_wait)
        why = f"answered 503 {response.json()['error']['code']}" if response is not None else f"failed: {failure!r}"
        log.warning("custody API %s %s %s; retry %d of %d in %.2fs", method, url, why, attempt + 1, self.retries, wait)
        return wait


class SyncCore:
    """The blocking transport (httpx.Client)."""

    def __init__(self, base_url: str, api_key: str | None, *, timeout: float = 10.0, retries: int = 3,
                 max_retry_wait: float = 30.0, http: httpx.Client | None = None) -> None:
        self._settings = _Settings(base_url, api_key, timeout, retries, max_retry_wait)
        self._http = http if http is not None else httpx.Client(timeout=timeout)
        self._owns_http = http is None
        self.last_response: httpx.Response | None = None

    def with_key(self, api_key: str | None) -> "SyncCore":
        """A client for another API key (another role) on the same connection pool and settings."""
        s = self._settings
        other = type(self)(s.base_url, api_key, timeout=s.timeout, retries=s.retries, max_retry_wait=s.max_retry_wait,
                           http=self._http)
        return other

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, method: str, path: str, params: Mapping[str, Any] | None, body: dict | None) -> httpx.Response:
        s, attempt = self._settings, 0
        url = s.base_url + path
        while True:
            response, failure = None, None
            try:
                response = self._http.request(method, url, params=_clean(params), json=body, headers=s.headers())
            except httpx.TransportError as exc:
                failure = exc
            self.last_response = response
            if response is not None and response.status_code < 400:
                return response
            wait = s.decide(method, path, attempt, body, response, failure)
            if wait is None:
                if failure is not None:
                    raise CustodyConnectionError(None, "connection_error", f"{method} {path}: {failure!r}") from failure
                raise _error(response)
            time.sleep(wait)
            attempt += 1

    def _call(self, method: str, path: str, *, params: Mapping[str, Any] | None, body: dict | None,
              answer: TypeAdapter[Any] | None) -> Any:
        response = self._send(method, path, params, body)
        return response.text if answer is None else answer.validate_json(response.content)

    def _page(self, method: str, path: str, *, params: Mapping[str, Any], answer: TypeAdapter[Any]) -> tuple[Any, str | None]:
        response = self._send(method, path, params, None)
        return answer.validate_json(response.content), response.headers.get(NEXT_CURSOR)

    @staticmethod
    def _walk(fetch: Callable[[str | None], tuple[Any, str | None]], items: str | None) -> Iterator[Any]:
        cursor: str | None = None
        while True:
            page, cursor = fetch(cursor)
            yield from (page if items is None else getattr(page, items))
            if not cursor:
                return


class AsyncCore:
    """The awaitable transport (httpx.AsyncClient)."""

    def __init__(self, base_url: str, api_key: str | None, *, timeout: float = 10.0, retries: int = 3,
                 max_retry_wait: float = 30.0, http: httpx.AsyncClient | None = None) -> None:
        self._settings = _Settings(base_url, api_key, timeout, retries, max_retry_wait)
        self._http = http if http is not None else httpx.AsyncClient(timeout=timeout)
        self._owns_http = http is None
        self.last_response: httpx.Response | None = None

    def with_key(self, api_key: str | None) -> "AsyncCore":
        """A client for another API key (another role) on the same connection pool and settings."""
        s = self._settings
        return type(self)(s.base_url, api_key, timeout=s.timeout, retries=s.retries, max_retry_wait=s.max_retry_wait,
                          http=self._http)

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, method: str, path: str, params: Mapping[str, Any] | None, body: dict | None) -> httpx.Response:
        s, attempt = self._settings, 0
        url = s.base_url + path
        while True:
            response, failure = None, None
            try:
                response = await self._http.request(method, url, params=_clean(params), json=body, headers=s.headers())
            except httpx.TransportError as exc:
                failure = exc
            self.last_response = response
            if response is not None and response.status_code < 400:
                return response
            wait = s.decide(method, path, attempt, body, response, failure)
            if wait is None:
                if failure is not None:
                    raise CustodyConnectionError(None, "connection_error", f"{method} {path}: {failure!r}") from failure
                raise _error(response)
            await asyncio.sleep(wait)
            attempt += 1

    async def _call(self, method: str, path: str, *, params: Mapping[str, Any] | None, body: dict | None,
                    answer: TypeAdapter[Any] | None) -> Any:
        response = await self._send(method, path, params, body)
        return response.text if answer is None else answer.validate_json(response.content)

    async def _page(self, method: str, path: str, *, params: Mapping[str, Any],
                    answer: TypeAdapter[Any]) -> tuple[Any, str | None]:
        response = await self._send(method, path, params, None)
        return answer.validate_json(response.content), response.headers.get(NEXT_CURSOR)

    @staticmethod
    async def _walk(fetch: Callable[[str | None], Awaitable[tuple[Any, str | None]]],
                    items: str | None) -> AsyncIterator[Any]:
        cursor: str | None = None
        while True:
            page, cursor = await fetch(cursor)
            for item in (page if items is None else getattr(page, items)):
                yield item
            if not cursor:
                return
