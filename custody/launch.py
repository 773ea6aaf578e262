"""Deploy the three processes against nodes and a database that already run, wired only by
configuration files; and `python -m custody demo`, which first starts those nodes and the embedded
PostgreSQL itself.

`deploy()` is what the demo and the e2e suite share. Given a PostgreSQL owner URL (migrations, the
first API keys) and the nodes' RPC endpoints, it:
1. migrates the database (the migrations create the roles custody_api, custody_worker,
   custody_signer);
2. writes a development seed (0600) and one signer authentication key per client (0600:
   `signer-worker.key`, `signer-api.key`) under `root`, plus one Ed25519 approver key per
   scripted approver;
3. writes `signer.toml` (connects as custody_signer; its `[[clients]]` are signer.config's
   DEPLOYED_CLIENTS: `worker` may call every method, `api` only ping, xpubs and
   sign_reserves_message) and starts `python -m signer serve`;
4. asks the signer for its xpubs over its socket (custody never derives from a seed) and writes
   `custody.toml` as the worker's file (database role custody_worker, signer client `worker`);
   the api process reads the same file with its own role, signer client and key from its
   environment (`CUSTODY_API_DATABASE_URL`, `CUSTODY_API_SIGNER_CLIENT`,
   `CUSTODY_API_SIGNER_AUTH_KEY_FILE`: custody.config's per-process overrides);
5. starts `python -m custody worker` and `python -m custody api` and waits for `/health`; the
   worker publishes events to `nats_url` ([events] of custody.toml, with any other [events] keys
   given as `events`, e.g. `{"stream": ..., "subject_prefix": ...}`; the demo starts the embedded
   NATS server with JetStream unless NATS_URL is set).

Every process logs to `root/logs/<name>.log`; `Deployment.stop()` stops them in reverse order.
"""
from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import tomli_w
from sqlalchemy import make_url

from custody.topology import Processes

log = logging.getLogger(__name__)
@dataclass(frozen=True)
class Nodes:
    """Where the chains are: bitcoind's RPC URL (user:password in it, as regtest's nodes give it),
    anvil's RPC URL and chain id, and the test ERC-20's address."""

    bitcoin_rpc_url: str
    ethereum_rpc_url: str
    token_address: str
    ethereum_chain_id: int = 31337
    network: str = "regtest"


@dataclass
class Deployment:
    root: Path
    owner_url: str
    processes: Processes
    api_base: str
    xpubs: dict
    approver_keys: dict[str, Path] = field(default_factory=dict)  # operator name -> Ed25519 private key file
    signer_clients: dict[str, Path] = field(default_factory=dict)  # signer client name -> its auth key file
    # every api process's base URL by instance name (custody-api, custody-api-2, ...; api_base is the first)
    api_bases: dict[str, str] = field(default_factory=dict)

    def stop(self) -> None:
        self.processes.stop_all()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def role_url(owner_url: str, role: str) -> str:
    """The owner's URL with the user replaced by one of the service's database roles."""
    return make_url(owner_url).set(username=role, password=None).render_as_string(hide_password=False)


def _write_toml(path: Path, data: dict) -> Path:
    path.write_text(tomli_w.dumps(data))
    return path


def deploy(root: Path, *, owner_url: str, nodes: Nodes, approvers: tuple[str, ...] = ("approver-1", "approver-2"),
           api_port: int | None = None, job_scale: float = 0.5, seed_file: Path | None = None,
           pepper: str | None = None, nats_url: str | None = None, events: dict | None = None,
           api_processes: int = 1) -> Deployment:
    """The deployed topology under `root`: the signer, the worker and `api_processes` api processes
    (the first on `api_port`, the others on free ports of their own, `CUSTODY_API__PORT`: they share
    the markets, custody.api.market_owners)."""
    from custody.approve_cli import approver_entry, load_private_key, new_key_file
    from custody.database import migrate
    from custody.policy_config import default_policy
    from custody.devchains import REGTEST_ASSETS, dev_seed_file, signer_asset_entries
    from signer.config import DEPLOYED_CLIENTS, quorum_entries
    from signer.wire import write_auth_key

    root.mkdir(parents=True, exist_ok=True)
    migrate(owner_url)
    seed = seed_file or dev_seed_file(root)
    client_keys: dict[str, Path] = {}
    for name in DEPLOYED_CLIENTS:  # one key per client: a key is the client's identity at the signer
        client_keys[name] = root / f"signer-{name}.key"
        if not client_keys[name].exists():
            write_auth_key(client_keys[name])
    approver_keys, approver_entries = {}, []
    for name in approvers:
        key_file = root / "approvers" / f"{name}.pem"
        key_file.parent.mkdir(parents=True, exist_ok=True)
        key = load_private_key(key_file) if key_file.exists() else new_key_file(key_file)
        approver_keys[name] = key_file
        approver_entries.append(approver_entry(key, name))
    socket_path = root / "signer.sock"
    signer_cfg = _write_toml(root / "signer.toml", {
        "network": nodes.network, "seed_file": str(seed), "database_url": role_url(owner_url, "custody_signer"),
        "listen": f"unix:{socket_path}", "approvers": approver_entries,
        "clients": [{"name": name, "auth_key_file": str(client_keys[name]), "methods": list(methods)}
                    for name, methods in DEPLOYED_CLIENTS.items()],
        "quorum": quorum_entries(default_policy()),
        # the signer's own asset table and chain id (never custody's chain_asset); no cold wallet in the demo
        "assets": signer_asset_entries(nodes.token_address), "ethereum_chain_id": nodes.ethereum_chain_id})
    processes = Processes(root, signer_config=signer_cfg, custody_config=root / "custody.toml",
                          env={"PYTHONUNBUFFERED": "1", "STATE_DIR": str(root),  # SIGUSR1 module lists land here
                               **({"API_KEY_PEPPER": pepper} if pepper else {})})
    from signer.client import SignerClient

    client = SignerClient.from_key_file(f"unix:{socket_path}", client_keys["api"], client="api")  # ping and xpubs only
    try:
        processes.start("custody-signer", ready=lambda: client.ping() is not None)
        xpubs = client.xpubs().accounts
    except BaseException:
        processes.stop_all()
        raise
    port = api_port or free_port()
    base = f"http://127.0.0.1:{port}"
    custody_cfg = {  # the worker's file; the api's own role, client and key come from its environment
        "database": {"url": role_url(owner_url, "custody_worker")},
        "api": {"host": "127.0.0.1", "port": port},
        "bitcoin": {"rpc_url": nodes.bitcoin_rpc_url, "network": nodes.network},
        "ethereum": {"rpc_url": nodes.ethereum_rpc_url, "chain_id": nodes.ethereum_chain_id,
                     "tokens": {"USDT": nodes.token_address}},
        "assets": REGTEST_ASSETS,
        "wallets": {chain: {tier: xpubs[chain][tier] for tier in ("deposit", "hot")} for chain in ("bitcoin", "ethereum")},
        "signer": {"endpoint": f"unix:{socket_path}", "client": "worker", "auth_key_file": str(client_keys["worker"])},
        "approvers": approver_entries,
        "jobs": {"scale": job_scale},
        # [events]: nats_url, else NATS_URL, else the worker's embedded server; `events` adds other keys
        # (a stream and subject prefix of its own, for a second deployment on a shared server)
        **({"events": {**(events or {}), **({"nats_url": nats_url} if nats_url else {})}} if nats_url or events else {}),
    }
    _write_toml(root / "custody.toml", custody_cfg)
    processes.env.update({"CUSTODY_API_DATABASE_URL": role_url(owner_url, "custody_api"),  # read by the api only
                          "CUSTODY_API_SIGNER_CLIENT": "api",
                          "CUSTODY_API_SIGNER_AUTH_KEY_FILE": str(client_keys["api"])})
    try:
        processes.start("custody-worker")
        bases = {"custody-api": base}
        processes.start("custody-api", ready=lambda: httpx.get(f"{base}/health", timeout=1).status_code == 200)
        for n in range(2, api_processes + 1):
            extra_port = free_port()
            extra = bases[f"custody-api-{n}"] = f"http://127.0.0.1:{extra_port}"
            processes.start("custody-api", instance=f"custody-api-{n}", env={"CUSTODY_API__PORT": str(extra_port)},
                            ready=lambda url=extra: httpx.get(f"{url}/health", timeout=1).status_code == 200)
    except BaseException:
        processes.stop_all()
        raise
    return Deployment(root, owner_url, processes, base, xpubs, approver_keys, client_keys, bases)


def run_demo_topology(*, state_dir: Path, api_port: int | None = None, exit_after_demo: bool = False,
                      mine_every: float = 2.0, pepper: str | None = None) -> int:
    """`python -m custody demo`: the embedded PostgreSQL, fresh regtest nodes, the three processes,
    then the narrated demo over HTTP. Ctrl-C or SIGTERM (or the end of the demo with
    `exit_after_demo`) stops everything it started, the embedded PostgreSQL last."""
    import shutil
    import signal
    import threading

    def interrupted(signum, frame):  # noqa: ANN001, ARG001 - SIGTERM unwinds like Ctrl-C: the finally blocks stop it all
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second SIGTERM must not cut the clean-up short
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)

    from custody.addresses import derive_btc_address
    from custody.auth import create_api_key
    from custody.broker import embedded_nats_url, stop_embedded
    from custody.database import drop_database, embedded_database_url, ensure_database, make_engine
    from custody.demo import DemoWorld, run_demo
    from custody.settings import get_settings
    from regtest.cluster import start_cluster

    root = state_dir / "demo"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    # The database the maintenance CLI uses without DATABASE_URL (custody.database.EMBEDDED_DATABASE),
    # so `create-api-key` / `api-key` act on the running demo.
    owner_url = embedded_database_url(state_dir)
    log.info("the demo serves the embedded database %r (dropped and made again: fresh chains need fresh books)",
             make_url(owner_url).database)
    drop_database(owner_url)
    ensure_database(owner_url)
    log.info("starting bitcoind -regtest and anvil under %s", root / "chains")
    cluster = start_cluster(root / "chains")
    stop_mining = threading.Event()
    deployment = None
    try:
        nodes = Nodes(cluster.bitcoin.rpc_url, cluster.anvil.rpc_url, cluster.token.address)
        pepper = pepper or get_settings().api_key_pepper
        settings = get_settings()
        nats_url = settings.nats_url or embedded_nats_url(state_dir)  # outlives a worker restart
        log.info("events: NATS JetStream at %s (stream CUSTODY, subjects custody.>)", nats_url)
        deployment = deploy(root, owner_url=owner_url, nodes=nodes, api_port=api_port, pepper=pepper, nats_url=nats_url)

        def mine() -> None:
            while not stop_mining.wait(mine_every):
                try:
                    cluster.bitcoin.mine(1)
                    cluster.anvil.mine(1)
                except Exception:  # noqa: BLE001 - the nodes are stopping
                    return

        threading.Thread(target=mine, name="regtest-miner", daemon=True).start()
        engine = make_engine(owner_url, pool_size=1)
        try:
            admin = create_api_key(engine, "demo-admin", "admin", pepper)
            ops = tuple(create_api_key(engine, name, "operator", pepper) for name in deployment.approver_keys)
        finally:
            engine.dispose()
        log.info("processes: %s", ", ".join(f"{n} pid {deployment.processes.pid(n)} (log {deployment.processes.log_path(n)})"
                                          for n in deployment.processes.procs))
        world = DemoWorld(admin, ops, tuple(deployment.approver_keys.values()),
                          fund_btc=cluster.bitcoin.fund,
                          external_btc_address=lambda: cluster.bitcoin.wallet("getnewaddress", "", "bech32"),
                          hot_btc_address=derive_btc_address(deployment.xpubs["bitcoin"]["hot"], "regtest", 0, 0))
        ok = run_demo(deployment.api_base, world)
        if exit_after_demo:
            return 0 if ok else 1
        log.info("demo %s; still serving on %s (OpenAPI at %s/docs); Ctrl-C stops every process started",
                 "passed" if ok else "FAILED", deployment.api_base, deployment.api_base)
        try:
            while all(p.poll() is None for p in deployment.processes.procs.values()):
                stop_mining.wait(1)
            log.error("a process exited: %s", {n: p.returncode for n, p in deployment.processes.procs.items()})
            return 1
        except KeyboardInterrupt:
            return 0 if ok else 1
    finally:
        stop_mining.set()
        if deployment is not None:
            deployment.stop()
        cluster.stop()
        stop_embedded()
