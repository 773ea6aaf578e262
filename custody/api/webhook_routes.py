"""Webhook routes under /v1 (admin only): register endpoints, rotate their secrets, look at and
replay deliveries (custody.webhooks; the README's "Webhooks" section has the signature scheme).

- `POST /v1/webhook-endpoints`: url, event types (`*` for all), description; answers 201 with the
  endpoint and its `secret`, shown this once.
- `GET /v1/webhook-endpoints`, `GET /v1/webhook-endpoints/{id}`: endpoints (never a secret).
- `PATCH /v1/webhook-endpoints/{id}`: event types, enabled, description (the URL never changes).
- `DELETE /v1/webhook-endpoints/{id}`: disabled and marked deleted; its pending deliveries stay unsent.
- `POST /v1/webhook-endpoints/{id}/rotate-secret`: a new secret (shown once); the old one keeps
  signing beside it for `grace_seconds` (default WEBHOOK_ROTATION_GRACE_SECONDS; 0: at once).
- `GET /v1/webhook-endpoints/{id}/deliveries?state=&after=&limit=`: deliveries, oldest first.
- `POST /v1/webhook-deliveries/{id}/replay`: send one delivery again (any state).
- `POST /v1/webhook-endpoints/{id}/replay-dead`: send every dead-lettered delivery again.

Errors: `webhook_url_invalid`, `webhook_event_types_invalid` (422), `webhook_endpoint_not_found`,
`webhook_delivery_not_found` (404), `webhook_key_unavailable` (503), besides the API's own.
"""
from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from custody.api.deps import Admin, ContainerDep
from custody.api.errors import responses
from custody.api.paging import PAGED, pager
from custody.api.params import IdPath
from custody.webhooks.endpoints import MAX_TYPES, DeliveryView, EndpointView, EndpointWithSecret

EndpointsPage = pager("webhook-endpoints", newest_first=False, default=1000, maximum=1000)
DeliveriesPage = pager("webhook-deliveries", newest_first=False, default=100, maximum=500)

router = APIRouter(prefix="/v1", tags=["webhooks"])
NOT_FOUND = "webhook_endpoint_not_found"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EndpointIn(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{
        "url": "https://hooks.example.com/custody", "event_types": ["deposit.credited", "withdrawal.final"],
        "description": "treasury dashboard"}]})
    url: str = Field(min_length=1, max_length=2048, description="http:// or https://, no user or password")
    event_types: list[Annotated[str, Field(min_length=1, max_length=100)]] = Field(
        min_length=1, max_length=MAX_TYPES, description="event types like deposit.credited, or * for every type")
    description: str = Field(default="", max_length=500)


class EndpointPatch(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{
        "event_types": ["*"], "enabled": False, "description": "paused while the receiver moves"}]})
    event_types: list[Annotated[str, Field(min_length=1, max_length=100)]] | None = Field(
        default=None, min_length=1, max_length=MAX_TYPES)
    enabled: bool | None = None
    description: str | None = Field(default=None, max_length=500)


class RotateIn(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"grace_seconds": 3600}]})
    grace_seconds: int | None = Field(default=None, ge=0, le=7 * 86400,
                                      description="how long the old secret keeps signing too (default: the setting)")


class EndpointOut(BaseModel):
    id: int
    url: str
    description: str
    event_types: list[str]
    enabled: bool
    created_by: str
    created_at: dt.datetime
    updated_at: dt.datetime
    previous_secret_expires_at: dt.datetime | None


class EndpointSecretOut(BaseModel):
    endpoint: EndpointOut
    secret: str = Field(description="shown once: store it now; the service keeps it only encrypted")


class DeliveryOut(BaseModel):
    id: int
    endpoint_id: int
    event_id: str
    event_type: str
    state: Literal["pending", "delivered", "dead"]
    attempts: int
    next_attempt_at: dt.datetime
    last_status: int | None
    last_error: str | None
    created_at: dt.datetime
    delivered_at: dt.datetime | None


class ReplayedOut(BaseModel):
    replayed: int


def _endpoint(v: EndpointView) -> EndpointOut:
    return EndpointOut(**v.__dict__)


def _with_secret(v: EndpointWithSecret) -> EndpointSecretOut:
    return EndpointSecretOut(endpoint=_endpoint(v.endpoint), secret=v.secret)


def _delivery(v: DeliveryView) -> DeliveryOut:
    return DeliveryOut(**v.__dict__)


@router.post("/webhook-endpoints", response_model=EndpointSecretOut, status_code=201,
             responses=responses("webhook_url_invalid", "webhook_event_types_invalid", "webhook_key_unavailable"))
def create_endpoint(body: EndpointIn, c: ContainerDep, who: Admin) -> EndpointSecretOut:
    return _with_secret(c.webhooks.create(body.url, body.event_types, body.description, by=f"api:{who.name}"))


@router.get("/webhook-endpoints", response_model=list[EndpointOut], responses=responses(*PAGED))
def list_endpoints(c: ContainerDep, _: Admin, page: EndpointsPage) -> list[EndpointOut]:
    """Registered endpoints, oldest first (paged: `X-Next-Cursor`)."""
    views = c.webhooks.list(after_id=page.key, limit=page.fetch)
    return [_endpoint(v) for v in page.finish(views, key=lambda v: v.id)]


@router.get("/webhook-endpoints/{endpoint_id}", response_model=EndpointOut, responses=responses(NOT_FOUND))
def get_endpoint(endpoint_id: IdPath, c: ContainerDep, _: Admin) -> EndpointOut:
    return _endpoint(c.webhooks.get(endpoint_id))


@router.patch("/webhook-endpoints/{endpoint_id}", response_model=EndpointOut,
              responses=responses("webhook_event_types_invalid", NOT_FOUND))
def update_endpoint(endpoint_id: IdPath, body: EndpointPatch, c: ContainerDep, who: Admin) -> EndpointOut:
    return _endpoint(c.webhooks.update(endpoint_id, by=f"api:{who.name}", event_types=body.event_types,
                                       enabled=body.enabled, description=body.description))


@router.delete("/webhook-endpoints/{endpoint_id}", response_model=EndpointOut, responses=responses(NOT_FOUND))
def delete_endpoint(endpoint_id: IdPath, c: ContainerDep, who: Admin) -> EndpointOut:
    return _endpoint(c.webhooks.delete(endpoint_id, by=f"api:{who.name}"))


@router.post("/webhook-endpoints/{endpoint_id}/rotate-secret", response_model=EndpointSecretOut,
             responses=responses(NOT_FOUND, "webhook_key_unavailable"))
def rotate_secret(endpoint_id: IdPath, body: RotateIn, c: ContainerDep, who: Admin) -> EndpointSecretOut:
    return _with_secret(c.webhooks.rotate_secret(endpoint_id, by=f"api:{who.name}", grace_seconds=body.grace_seconds))


@router.get("/webhook-endpoints/{endpoint_id}/deliveries", response_model=list[DeliveryOut],
            responses=responses(NOT_FOUND, *PAGED))
def list_deliveries(endpoint_id: IdPath, c: ContainerDep, _: Admin, page: DeliveriesPage,
                    state: Annotated[Literal["pending", "delivered", "dead"] | None, Query()] = None) -> list[DeliveryOut]:
    """An endpoint's deliveries, oldest first (paged: `X-Next-Cursor`)."""
    views = c.webhooks.deliveries(endpoint_id, state=state, after=page.key or 0, limit=page.fetch)
    return [_delivery(v) for v in page.finish(views, key=lambda v: v.id)]


@router.post("/webhook-deliveries/{delivery_id}/replay", response_model=DeliveryOut,
             responses=responses("webhook_delivery_not_found"))
def replay_delivery(delivery_id: IdPath, c: ContainerDep, who: Admin) -> DeliveryOut:
    return _delivery(c.webhooks.replay(delivery_id, by=f"api:{who.name}"))


@router.post("/webhook-endpoints/{endpoint_id}/replay-dead", response_model=ReplayedOut, responses=responses(NOT_FOUND))
def replay_dead(endpoint_id: IdPath, c: ContainerDep, who: Admin) -> ReplayedOut:
    return ReplayedOut(replayed=c.webhooks.replay_dead(endpoint_id, by=f"api:{who.name}"))
