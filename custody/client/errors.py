"""What the client raises: one root, `CustodyApiError`, with a subclass per kind of answer.

Every error carries `status` (the HTTP status, None when no answer came), `code` (the API's stable
`error.code`, e.g. `insufficient_funds`; the README's error tables say what each means), `message`
(for people; never parse it), `detail` (values the code refers to, or None) and `request_id` (the
answer's `X-Request-ID`, to find the request in the service log). Catch a subclass to handle a kind
of failure, or compare `code` for one reason:

| class | status | when |
| --- | --- | --- |
| InvalidRequest | 422 | the request is malformed or refused by a rule |
| Unauthorized | 401 | no API key, or an unknown or revoked one |
| Forbidden | 403 | the key's role may not do this (or the money rules refuse it) |
| NotFound | 404 | no such resource (or route) |
| Conflict | 409 | conflicts with the current state (insufficient_funds, idempotency_conflict, ...) |
| ClientError | other 4xx | any other refusal of the request |
| ServerError | 500 | a bug in the service: see its log with `request_id` |
| ServiceUnavailable | 503 | not available now, after the client's bounded retries (temporarily_unavailable, node_unavailable, ...) |
| CustodyConnectionError | None | no answer: the connection failed (after retries when resending was safe) |
"""
from __future__ import annotations

from typing import Any


class CustodyApiError(Exception):
    """Any failed call: the root every other client error derives from."""

    def __init__(self, status: int | None, code: str, message: str, detail: dict[str, Any] | None = None,
                 request_id: str | None = None) -> None:
        self.status, self.code, self.message, self.detail, self.request_id = status, code, message, detail, request_id
        super().__init__(f"{status} {code}: {message}" if status else f"{code}: {message}")


class ClientError(CustodyApiError):
    """A 4xx: the service refused the request; sending it again unchanged gives the same answer."""


class InvalidRequest(ClientError):
    """422: malformed, or refused by a rule (`invalid_request`, `invalid_amount`, `invalid_cursor`, ...)."""


class Unauthorized(ClientError):
    """401: no API key, or an unknown or revoked one."""


class Forbidden(ClientError):
    """403: the key's role may not do this."""


class NotFound(ClientError):
    """404: no such resource."""


class Conflict(ClientError):
    """409: the request conflicts with the current state (e.g. `insufficient_funds`)."""


class ServerError(CustodyApiError):
    """A 5xx other than 503: a bug in the service."""


class ServiceUnavailable(ServerError):
    """503: not available now; raised once the client's retries are spent (or for a code it does not retry)."""


class CustodyConnectionError(CustodyApiError):
    """No answer at all: the connection failed or timed out (`code` is `connection_error`)."""


_BY_STATUS: dict[int, type[CustodyApiError]] = {401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
                                                 422: InvalidRequest, 503: ServiceUnavailable}


def error_class(status: int) -> type[CustodyApiError]:
    """The class raised for an error answer with this HTTP status."""
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return ClientError if status < 500 else ServerError
