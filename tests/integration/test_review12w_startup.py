"""Review of issue 12 (R2): what `custody api` / `custody worker` accept at start
(custody.roots.common.build_services), which the issue wants refused "at start with a clear
message, never later".

1. Wallet xpubs the signer does not hold. Only `custody config check` compares [wallets.*] with
   the signer's `xpubs`; a process starts with whatever the file says. With deposit and hot
   swapped (a copy-paste slip between two lines of `python -m signer xpubs`), or another signer's
   xpubs (staging's), custody issues deposit addresses and credits customers for coins that no
   key of this signer can spend (its sweeps and payouts sign with keys that do not match the
   coins, the node rejects them): customers are credited, the firm is stuck. build_services holds
   a signer client and can ask it (`xpubs()`) when it answers; it must refuse to start on a
   mismatch (StartupError naming wallets.<chain>.<tier>).
2. The schema owner as the process's role. The roles of migration 0020 only help if each process
   uses its own; nothing checks it: `database.url` (or the DATABASE_URL fallback) naming the owner
   (here the superuser `postgres`) starts an api or worker that may write the signer's audit,
   rewrite the journal's triggers, drop tables. `open_engine` should ask `current_user` and refuse
   anything but custody_api / custody_worker (or at least a superuser or the owner of the tables).

3. A node's network is checked once, and only if it answers at that moment (`verify_networks`: an
   unreachable node is a warning "the jobs retry"). A bitcoind that is down while the worker starts
   and then comes up on another chain (mainnet's RPC port reused by a testnet node, a URL pointing
   at the wrong host; ethereum is worse, its addresses are the same on every chain id) is never
   checked: the deposit job starts its cursor on it and scans it. The network must be verified on
   the first successful contact (and after a reconnect), before any job reads or sends anything.

All build the services on a migrated database of the test's own with no chain adapters (nothing
here needs a node) and a stand-in signer client that answers `ping` and `xpubs` as the signer
process would for the test seed.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import tomli_w

from custody.config import DeploymentConfig
from custody.database import with_user
from custody.roots.common import StartupError, build_services
from signer.keys import Secret, SignerKeys, seed_from_text
from signer.wire import Xpubs
from tests.integration.own_database import own_database

log = logging.getLogger(__name__)
KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")


class SignerStandIn:
    """What SignerClient answers for a signer holding KEYS (ping, xpubs); it signs nothing here."""

    def ping(self):  # noqa: ANN201
        return {"network": "regtest"}

    def xpubs(self) -> Xpubs:
        return Xpubs(network="regtest", master_fingerprint="00000000",
                     accounts={"bitcoin": {t: KEYS.account_xpub("bitcoin", t) for t in ("deposit", "hot", "cold")}})


def write_config(tmp_path: Path, database_url: str, wallets: dict) -> DeploymentConfig:
    key = tmp_path / "signer-auth.key"
    key.write_text("ab" * 32)
    os.chmod(key, 0o600)
    path = tmp_path / "custody.toml"
    path.write_text(tomli_w.dumps({
        "database": {"url": database_url},
        "bitcoin": {"rpc_url": "http://127.0.0.1:9", "network": "regtest", "rpc_user": "u", "rpc_password": "p"},
        "assets": {"BTC": {"chain": "bitcoin", "decimals": 8, "finality": 3, "dust_minimum": 1000,
                           "min_withdrawal": 10000, "withdrawal_fee": 5000}},
        "wallets": {"bitcoin": wallets},
        "signer": {"endpoint": f"unix:{tmp_path / 'signer.sock'}", "client": "worker", "auth_key_file": str(key)},
    }))
    return DeploymentConfig.load(path, process="worker")


@pytest.fixture()
def database(database_url):
    with own_database(database_url, "r12w_start") as eng:
        yield eng


def test_a_process_does_not_start_with_wallets_the_signer_does_not_hold(tmp_path, database):
    swapped = {"deposit": KEYS.account_xpub("bitcoin", "hot"), "hot": KEYS.account_xpub("bitcoin", "deposit")}
    config = write_config(tmp_path, database.url.render_as_string(hide_password=False), swapped)
    try:
        services = build_services(config, adapters={}, signer=SignerStandIn(), engine=database)
    except StartupError as exc:
        log.info("refused at start: %s", exc)
        assert "wallets.bitcoin" in str(exc)
        return
    pytest.fail("custody started with deposit and hot xpubs swapped against the signer's: it would issue addresses "
                f"whose coins the signer cannot spend (deposit xpub in use: {services.config.wallets['bitcoin'].deposit[:12]}...)")


def test_a_process_does_not_start_as_the_schema_owner(tmp_path, database):
    owner_url = with_user(database.url.render_as_string(hide_password=False), "postgres")
    config = write_config(tmp_path, owner_url, {t: KEYS.account_xpub("bitcoin", t) for t in ("deposit", "hot")})
    try:
        services = build_services(config, adapters={}, signer=SignerStandIn())
    except StartupError as exc:
        log.info("refused at start: %s", exc)
        return
    try:
        from sqlalchemy import text

        with services.engine.connect() as c:
            role, superuser = c.execute(text("SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user")).one()
    finally:
        services.close()
    pytest.fail(f"custody worker started connected as {role} (superuser: {superuser}), not as custody_worker")


class WrongChainNode(BaseHTTPRequestHandler):
    """A bitcoind JSON-RPC stand-in on chain "test" (testnet), at height 100."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        answers = {"getblockchaininfo": {"chain": "test", "blocks": 100, "bestblockhash": "aa" * 32},
                   "getblockcount": 100, "getblockhash": "aa" * 32, "getindexinfo": {"txindex": {}}}
        if req["method"] in answers:
            body = {"result": answers[req["method"]], "error": None, "id": req.get("id")}
        else:
            body = {"result": None, "error": {"code": -32601, "message": "Method not found"}, "id": req.get("id")}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:  # noqa: ANN002
        pass


def test_a_node_unreachable_at_start_is_checked_before_the_jobs_use_it(tmp_path, database):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = write_config(tmp_path, database.url.render_as_string(hide_password=False),
                          {t: KEYS.account_xpub("bitcoin", t) for t in ("deposit", "hot")})
    config = config.model_copy(update={"bitcoin": config.bitcoin.model_copy(update={"rpc_url": f"http://127.0.0.1:{port}"})})
    log.info("the worker starts while its regtest bitcoind (port %d) is down", port)
    services = build_services(config, signer=SignerStandIn(), engine=database)
    server = HTTPServer(("127.0.0.1", port), WrongChainNode)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        log.info("a node on testnet comes up on that port; the deposit job runs")
        try:
            services.deposits.run_once(["bitcoin"])
        except Exception as exc:  # noqa: BLE001 - refusing is what a fixed job may do
            log.info("deposit job: %s: %s", type(exc).__name__, exc)
        cursor = services.deposits.cursor("bitcoin")
    finally:
        server.shutdown()
        server.server_close()
        for adapter in services.adapters.values():
            adapter.close()
    assert cursor is None, f"the deposit job started its cursor on a testnet node of a regtest deployment: {cursor}"
