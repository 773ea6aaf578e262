"""The `custody api` process: the HTTP API and the operator console, and nothing scheduled.

`build_api_root(config)` wires `ApiRoot` (custody.roots.common's services plus the matching
sequencer, `trading`, rebuilt from its journal at start); `serve_api(root)` runs uvicorn on the
configured address until SIGTERM/SIGINT. Several api processes may serve one database (start
`custody api` again with another port, e.g. `CUSTODY_API__PORT=8001`): every one serves postings
and reads; each market's sequencer is owned by one of them at a time (custody.api.market_owners:
a PostgreSQL session advisory lock per market), and the others forward its orders there. No other
kind of process runs a `Trading` (the worker snapshots the journal without one).

The API keeps a signer *client* for one operator route only: `POST /v1/reserves/reports` signs
its control messages (`sign_reserves_message`). It speaks as its own client (`[signer] client`,
`api` when deployed, with its own key: custody.config's `CUSTODY_API_SIGNER_*`), which the
signer lets call `ping`, `xpubs` and `sign_reserves_message` and nothing else, so this process
cannot even ask for a batch, sweep or rebalance to be signed. `POST /v1/rebalances/run` runs the
deciding step only (custody.rebalances `decide_bitcoin`; the worker signs), and the set-aside
retries only make a row active again for the worker's jobs (custody.containment).
This module and everything it imports never load `signer.keys` or `signer.service`
(tests/unit/test_roots_imports.py).
"""
from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from typing import Mapping

import anyio.to_thread
import uvicorn
import uvloop
from sqlalchemy import Engine

from chain_adapters.base import ChainAdapter
from custody.api.app import create_app
from custody.config import DeploymentConfig
from custody.convert.service import Convert
from custody.roots.common import REFERENCE_WAIT_SECONDS, CustodyServices, build_services, install_module_dump
from custody.api.market_owners import advertised_url, owners_of
from custody.trading import attach
from matching.service import Trading
from signer.protocol import SignerPort

log = logging.getLogger(__name__)


@dataclass
class ApiRoot(CustodyServices):
    trading: Trading | None = None  # the sequencer; custody.trading.attach() builds it
    convert: Convert | None = None  # custody.convert's quotes; custody.api.convert_routes builds it

    def close(self) -> None:
        """Finish the queued group commits, give up the markets' ownership, then the rest."""
        if self.trading is not None:
            self.trading.close()
            owners = owners_of(self.trading)
            if owners is not None:
                owners.stop()  # the locks go with the session: another process takes the markets
        super().close()


async def _serve(server: uvicorn.Server) -> None:
    """uvicorn's own serve(), with anyio's thread limiter (per event loop) set to API_THREADS first."""
    anyio.to_thread.current_default_thread_limiter().total_tokens = API_THREADS
    await server.serve()


def build_api_root(config: DeploymentConfig, *, adapters: Mapping[str, ChainAdapter] | None = None,
                   signer: SignerPort | None = None, engine: Engine | None = None,
                   reference_wait: float = REFERENCE_WAIT_SECONDS) -> ApiRoot:
    """The api's root. It writes no reference data: it waits (up to `reference_wait` seconds) for
    the database's wallets and assets to equal its file's, as a worker applies them."""
    services = build_services(config, process="api", adapters=adapters, signer=signer, engine=engine,
                              reference_wait=reference_wait)
    root = ApiRoot(**{f: getattr(services, f) for f in services.__dataclass_fields__})
    # markets are shared with every other api process on the database (custody.api.market_owners):
    # this one loads the books it takes the ownership of and forwards orders for the others
    attach(root, owner_url=advertised_url(root.settings.api_host, root.settings.api_port))  # type: ignore[arg-type]
    return root


# Requests run on anyio's worker threads; each holds at most one pooled database connection at a
# time. The api's pool (custody.database.make_engine) keeps API_THREADS connections open, so no
# request opens (and closes) an overflow connection under load; 16 threads already keep this
# process's 2 cores and PostgreSQL busy.
API_THREADS = 16


def serve_api(root: ApiRoot) -> int:
    """Run the HTTP API until SIGTERM/SIGINT (uvicorn's own handlers); SIGUSR1 dumps the modules.
    uvloop and httptools (uvicorn's fast loop and parser); API_THREADS request threads."""
    install_module_dump("custody-api", root.settings.state_dir)
    # uvicorn handles SIGTERM/SIGINT while it serves (finishing open requests), then restores these
    # handlers and raises the signal again: with them, that second delivery is a no-op and the
    # process exits 0 instead of dying by the signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: log.info("%s: the api has stopped serving", signal.Signals(signum).name))
    host, port = root.settings.api_host, root.settings.api_port
    app = create_app(root)  # type: ignore[arg-type]
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", loop="uvloop",
                                           http="httptools", log_config=None, access_log=False))
    log.info("custody api serving on http://%s:%d (OpenAPI at /docs); config %s", host, port, root.config.source)
    # log_config=None: uvicorn's lines go through the process's own (JSON) logging
    # (custody.observability); its access log is replaced by custody.api.access's, which carries
    # the request id
    owners = owners_of(root.trading) if root.trading is not None else None
    if owners is not None:
        owners.watch()  # a market whose owner dies is taken over from here within a second
    try:
        uvloop.run(_serve(server))
    finally:
        root.close()
    log.info("custody api stopped")
    return 0
