"""API-key management under /v1 (admin only): list, revoke, rotate (custody.auth).

- `GET /v1/api-keys`: every key, oldest first (paged: `cursor`, `limit` 1..1000, default 1000;
  `next_cursor` in the answer and the `X-Next-Cursor` header, custody.api.paging), with its id, name, role, prefix (its first 10
  characters), when it was created and revoked, and the key it `replaces`; never the key itself.
  `?live=true` lists only the keys that authenticate now.
- `POST /v1/api-keys/{key_id}/revoke`: the key stops working at the commit in this process, and
  within `AUTH_CACHE_SECONDS` (0.5 s) in every other one (custody.auth remembers a live key that
  briefly). Revoking your own key is allowed (the answer
  is the last thing it does).
- `POST /v1/api-keys/{key_id}/rotate` with `{"grace_seconds": 0..604800}` (default 0): a new key
  of the same name and role, shown once in the answer's `key`; the old one keeps working for the
  grace period, then stops.

Both changes are audited in the admin key's name (`api:<name>`). A key in its own rotation grace
period may not make them (`api_key_in_grace_period`, 403: a leaked key its owner rotated must not
take over the key that replaced it). Errors: `api_key_not_found`
(404), `api_key_not_live` (409: revoked already, or rotated already), `invalid_request` (422: a
grace period outside 0..604800, an id outside 1..2^63-1). New keys of a new name are made with the
owner's CLI only (`python -m custody create-api-key`): the api process may not write `api_key`,
only call the two functions of migration 0025.
"""
from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from custody.api.deps import Admin, ContainerDep
from custody.api.errors import responses
from custody.errors import CustodyError, CustodyErrorCode
from custody.api.paging import PAGED, pager
from custody.api.params import IdPath
from custody.auth import MAX_GRACE_SECONDS, ApiKeyView, Principal, get_api_key, list_api_keys, revoke_api_key, rotate_api_key

router = APIRouter(prefix="/v1/api-keys", tags=["api-keys"])
KeysPage = pager("api-keys", newest_first=False, default=1000, maximum=1000)


class ApiKeyOut(BaseModel):
    id: int
    name: str
    role: str
    prefix: str = Field(description="the key's first 10 characters, to tell keys apart; never the key")
    created_at: datetime
    revoked_at: datetime | None = Field(description="when it stopped (or, in a rotation's grace period, will stop) working")
    revoked_by: str | None
    replaces: int | None = Field(description="the key this one rotated")
    live: bool = Field(description="whether it authenticates now")


class ApiKeyList(BaseModel):
    keys: list[ApiKeyOut]
    next_cursor: str | None = Field(default=None, description="the next page's `cursor`; null on the last page")


class RotateIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"grace_seconds": 3600}]})
    grace_seconds: int = Field(default=0, ge=0, le=MAX_GRACE_SECONDS,
                               description="how long the old key keeps working (0: stops at once)")


class RotatedOut(BaseModel):
    new: ApiKeyOut
    key: str = Field(description="the new key: shown this once, never again")
    old_key_stops_at: datetime


def _out(k: ApiKeyView) -> ApiKeyOut:
    return ApiKeyOut(id=k.id, name=k.name, role=k.role.value, prefix=k.prefix, created_at=k.created_at,
                     revoked_at=k.revoked_at, revoked_by=k.revoked_by, replaces=k.replaces, live=k.live)


@router.get("", response_model=ApiKeyList, responses=responses(*PAGED))
def api_keys(container: ContainerDep, _: Admin, page: KeysPage, live: bool = False) -> ApiKeyList:
    keys = page.finish(list_api_keys(container.engine, include_revoked=not live, after_id=page.key, limit=page.fetch),
                       key=lambda k: k.id)
    return ApiKeyList(keys=[_out(k) for k in keys], next_cursor=page.next_cursor)


def _manager(principal: Principal) -> int | None:
    """The caller's key id, after refusing a key in its rotation grace period (the database
    functions refuse it too, migration 0031)."""
    if principal.retiring:
        raise CustodyError(CustodyErrorCode.api_key_in_grace_period,
                           "this key is in its rotation grace period: it may not revoke or rotate keys; "
                           "use the key that replaced it")
    return principal.key_id


_REFUSALS = ("api_key_in_grace_period", "api_key_not_found", "api_key_not_live")


@router.post("/{key_id}/revoke", response_model=ApiKeyOut, responses=responses(*_REFUSALS))
def revoke(key_id: IdPath, container: ContainerDep, principal: Admin) -> ApiKeyOut:
    return _out(revoke_api_key(container.engine, key_id, by=f"api:{principal.name}", caller=_manager(principal)))


@router.post("/{key_id}/rotate", response_model=RotatedOut, responses=responses(*_REFUSALS))
def rotate(key_id: IdPath, body: RotateIn, container: ContainerDep, principal: Admin) -> RotatedOut:
    new, key = rotate_api_key(container.engine, key_id, container.settings.api_key_pepper,
                              by=f"api:{principal.name}", grace_seconds=body.grace_seconds,
                              caller=_manager(principal))
    old = get_api_key(container.engine, key_id)
    return RotatedOut(new=_out(new), key=key, old_key_stops_at=old.revoked_at or new.created_at)
