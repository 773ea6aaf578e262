"""Service settings, read from the environment (pydantic-settings).

| variable | default | meaning |
| --- | --- | --- |
| `ENVIRONMENT` | `development` | `development`, `test` or `production`; secrets must be set outside development/test |
| `DATABASE_URL` | unset | a PostgreSQL 14+ URL; unset starts the embedded PostgreSQL in `STATE_DIR/pgdata` |
| `STATE_DIR` | `<repo>/.state` | local state: embedded database, regtest data, demo keys |
| `API_KEY_PEPPER` | dev value | HMAC key mixed into stored API-key hashes; refused at its default in production |
| `API_HOST` / `API_PORT` | `127.0.0.1` / `8000` | where `python -m custody serve` listens |
| `TREASURY_ADJUSTMENT_QUORUM` | `1` | operators other than the proposer who must approve a treasury adjustment |
| `CONVERT_QUOTE_TTL_SECONDS` | `10` | how long a convert quote may be accepted (1-60 s; the database refuses a longer one) |
| `CONVERT_FEE_PPM` | `2500` | the convert fee in parts per million of the amount sold (2500 = 0.25%), rounded up, in the asset sold; the worker writes it into `convert_config` at start-up, which the api and the database read |
| `CONVERT_SPREAD_PPM` | `0` | the house's spread in parts per million: a quote's rate is the book's average (or the operator's) price times (10^6 - spread) / 10^6 (into `convert_config` like the fee) |
| `CONVERT_PRICE_BAND_PPM` | `50000` | how far (parts per million, 50000 = 5%) a book's average price for a quote may stray from the market's last trade and from the operator's price of the pair (each that exists) before convert refuses it (`convert_book_unreliable`; into `convert_config` like the fee) |
| `NATS_URL` | unset | the NATS server (with JetStream) the worker publishes events to; unset starts the embedded one (custody.broker) in `STATE_DIR/nats` |
| `WEBHOOK_SECRET_KEY` | unset | 64 hex digits: the key that encrypts webhook endpoint secrets; unset: `STATE_DIR/webhook-secret.key`, created on first use (api and worker must share it) |
| `WEBHOOK_MAX_ATTEMPTS` | `8` | failed attempts after which a webhook delivery is dead-lettered (`dead`) |
| `WEBHOOK_BACKOFF_SECONDS` | `10` | the first retry's delay; each later one doubles (jittered to 50-100%), capped at `WEBHOOK_BACKOFF_MAX_SECONDS` |
| `WEBHOOK_BACKOFF_MAX_SECONDS` | `3600` | the longest wait between two attempts of one delivery |
| `WEBHOOK_TIMEOUT_SECONDS` | `5` | the whole of one attempt (connect, send, answer); longer counts as a failure |
| `WEBHOOK_CONCURRENCY` | `8` | endpoints POSTed to at once by the worker's webhooks job |
| `WEBHOOK_ALLOW_PRIVATE_HOSTS` | empty | comma-separated IP addresses or CIDR networks that webhook URLs may name although internal (loopback, private, link-local, ...: refused otherwise, custody.webhooks.egress); e.g. `127.0.0.1` for a receiver on the same host |
| `WEBHOOK_ROTATION_GRACE_SECONDS` | `86400` | default time the old secret keeps signing beside the new one after a rotation |
| `NODE_VIEW_WARN_AFTER_SECONDS` | `300` | reconciliation passes without the node's own view of bitcoin (custody.node_view) for this long open a `node_view_blind` warning incident |
| `NODE_VIEW_CRITICAL_AFTER_SECONDS` | `1800` | ... and for this long a critical one, which engages the kill switch |
| `RESERVES_LEAVES_PER_ACCOUNT` | `4` | leaves each customer balance is split into in a proof-of-reserves tree (2 to 16; custody.merkle_sum): more leaves hide balances better and make the tree and each proof larger |
| `READINESS_TIMEOUT_SECONDS` | `3` | the longest `/health/ready` waits for its checks (database, each chain node, the signer, the broker; they run at once); a check without an answer by then fails with `TimeoutError` (above the broker probe's own 2 s, so its own reason shows) |
| `CONSOLE_RP_ID` | `localhost` | the WebAuthn relying party id of the operator console: its host name (credentials are scoped to it) |
| `CONSOLE_ORIGIN` | `http://localhost:8000` | the console's origin exactly as the browser sends it (scheme, host, port); sign-in and enrolment from any other origin are refused, and the session cookie is `Secure` when it is https |
| `CONSOLE_IDLE_SECONDS` | `900` | a console session unused for this long ends (`console_session_expired`) |
| `CONSOLE_SESSION_MAX_SECONDS` | `43200` | a console session ends this long after sign-in, used or not |
| `CONSOLE_CHALLENGE_SECONDS` | `120` | how long a sign-in or enrolment challenge can be answered (each is answered once) |
| `LOG_FORMAT` | `json` | `json`: one JSON object per line (custody.observability); `text`: one plain line per record, for developers |
| `LOG_LEVEL` | `INFO` | `DEBUG`, `INFO`, `WARNING`, `ERROR`; `DEBUG` also shows the scheduler's per-run lines |
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parents[1]
DEV_PEPPER = "development-only-pepper-do-not-use-in-production"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="", case_sensitive=False, extra="ignore")

    environment: Literal["development", "test", "production"] = "development"
    database_url: str | None = None
    state_dir: Path = REPO_ROOT / ".state"
    api_key_pepper: str = DEV_PEPPER
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    treasury_adjustment_quorum: int = Field(default=1, ge=1, le=10)
    convert_quote_ttl_seconds: int = Field(default=10, ge=1, le=60)
    convert_fee_ppm: int = Field(default=2500, ge=0, le=999_999)
    convert_spread_ppm: int = Field(default=0, ge=0, le=999_999)
    convert_price_band_ppm: int = Field(default=50_000, ge=0, le=999_999)
    nats_url: str | None = None
    webhook_secret_key: SecretStr | None = None
    webhook_max_attempts: int = Field(default=8, ge=1, le=100)
    webhook_backoff_seconds: float = Field(default=10.0, gt=0, le=86400)
    webhook_backoff_max_seconds: float = Field(default=3600.0, gt=0, le=7 * 86400)
    webhook_timeout_seconds: float = Field(default=5.0, gt=0, le=60)
    webhook_concurrency: int = Field(default=8, ge=1, le=256)
    webhook_rotation_grace_seconds: int = Field(default=86400, ge=0, le=7 * 86400)
    webhook_allow_private_hosts: str = ""
    node_view_warn_after_seconds: float = Field(default=300.0, ge=0, le=7 * 86400)
    node_view_critical_after_seconds: float = Field(default=1800.0, ge=0, le=7 * 86400)
    reserves_leaves_per_account: int = Field(default=4, ge=2, le=16)
    readiness_timeout_seconds: float = Field(default=3.0, gt=0, le=60)
    console_rp_id: str = Field(default="localhost", min_length=1, max_length=253)
    console_origin: str = Field(default="http://localhost:8000", pattern=r"^https?://[^/\s]+$")
    console_idle_seconds: int = Field(default=900, ge=10, le=86400)
    console_session_max_seconds: int = Field(default=43200, ge=60, le=7 * 86400)
    console_challenge_seconds: int = Field(default=120, ge=10, le=3600)
    # the console's root of trust (custody.console.auth): the admin credentials whose signed approval
    # makes an operator's console key exportable as an approver key; JSON list of approver entries
    console_admins: list[dict[str, str]] = Field(default_factory=list)

    @field_validator("webhook_secret_key")
    @classmethod
    def _webhook_key(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", key.get_secret_value().strip()):
            raise ValueError("WEBHOOK_SECRET_KEY must be 64 hex digits (32 bytes: `openssl rand -hex 32`)")
        return key

    @field_validator("console_admins")
    @classmethod
    def _console_admins(cls, entries: list[dict[str, str]]) -> list[dict[str, str]]:
        from signer.approvals import ApproverRegistry
        registry = ApproverRegistry.from_entries(entries)  # raises ValueError naming the bad entry
        if any(key.scheme != "webauthn" for key in registry.keys()):
            raise ValueError("CONSOLE_ADMINS lists console (webauthn) keys only")
        return entries

    @field_validator("webhook_allow_private_hosts")
    @classmethod
    def _webhook_private_hosts(cls, spec: str) -> str:
        from custody.webhooks.egress import parse_allowed
        parse_allowed(spec)  # raises ValueError naming the bad entry
        return spec
    log_format: Literal["json", "text"] = "json"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @model_validator(mode="after")
    def _refuse_default_secrets(self) -> "Settings":
        if self.environment == "production":
            if self.api_key_pepper == DEV_PEPPER or len(self.api_key_pepper) < 32:
                raise ValueError("API_KEY_PEPPER must be set to a secret of 32+ characters in production")
            if not self.database_url:
                raise ValueError("DATABASE_URL must be set in production (the embedded database is for development)")
        return self


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
