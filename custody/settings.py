"""Service settings, read from the environment (pydantic-settings).

| variable | default | meaning |
| --- | --- | --- |
| `ENVIRONMENT` | `development` | `development`, `test` or `production`; secrets must be set outside development/test |
| `DATABASE_URL` | unset | a PostgreSQL 14+ URL; unset starts the embedded PostgreSQL in `STATE_DIR/pgdata` |
| `STATE_DIR` | `<repo>/.state` | local state: embedded database, regtest data, demo keys |
| `API_KEY_PEPPER` | dev value | HMAC key mixed into stored API-key hashes; refused at its default in production |
| `API_HOST` / `API_PORT` | `127.0.0.1` / `8000` | where `python -m custody serve` listens |
| `TREASURY_ADJUSTMENT_QUORUM` | `1` | operators other than the proposer who must approve a treasury adjustment |
| `LOG_FORMAT` | `json` | `json`: one JSON object per line (custody.observability); `text`: one plain line per record, for developers |
| `LOG_LEVEL` | `INFO` | `DEBUG`, `INFO`, `WARNING`, `ERROR`; `DEBUG` also shows the scheduler's per-run lines |
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
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
