"""Command line of the service.

Deployment (three processes, each wired only by its configuration file; see the README's
"Deploying against your own nodes" and deploy/custody.example.toml):

    python -m custody api --config F            the HTTP API and console (uvicorn); no jobs
    python -m custody worker --config F         the scheduled jobs; SIGTERM/SIGINT stop it after
                                                the running jobs finish
    python -m custody config check --config F   validate F, then reach the database, each node
                                                and the signer; one line per check, exit 1 on
                                                any failure
    (--config defaults to $CUSTODY_CONFIG)

    python -m custody config check --config F --process api|worker
                                                the same, as that process reads F (its own
                                                overrides below)

One file may serve both processes: `CUSTODY_API_DATABASE_URL` / `CUSTODY_WORKER_DATABASE_URL`
give each its own database role, `CUSTODY_API_SIGNER_CLIENT` / `CUSTODY_API_SIGNER_AUTH_KEY_FILE`
(and `CUSTODY_WORKER_SIGNER_*`) its own signer client and key. Both write their loaded module names to
`$STATE_DIR/modules-custody-<api|worker>-<pid>.txt` on SIGUSR1 (and log the path): proof that they
never import signer.keys or signer.service.

    python -m custody demo [--port P] [--exit-after-demo]
                                                the embedded PostgreSQL, fresh regtest nodes, then
                                                the three processes, and the demo over HTTP
                                                (custody.launch); Ctrl-C stops all it started

Operators:

    python -m custody approve ...              sign a withdrawal approval with an Ed25519 key (its
                                               exit status 3: the API served bytes it will not sign)
    python -m custody approver-key ...         make or show an approver key (custody.approve_cli)
    python -m custody psbt open|export|import ...
                                               cold -> hot through a PSBT signed offline
                                               (custody.psbt_cli)

    python -m custody reserves publish --config F [--assets BTC,ETH] [--key K]
                                               request proof-of-reserves reports and build them
                                               here, printing the progress (or follow the worker's
                                               build); exit 1 unless all are published
                                               (custody.reserves.publish_command)

    python -m custody rescan --config F --tier all|deposit|hot|cold
                                               one `scantxoutset` over the addresses custody issued,
                                               with progress; Ctrl-C aborts; exit 3 when the node
                                               or another operator is already scanning
                                               (custody.rescan; nothing recurring scans)

Development and maintenance (settings from the environment, custody/settings.py):

    python -m custody migrate                                upgrade the schema (Alembic)
    python -m custody create-api-key NAME ROLE               print a new key (roles: backend,
                                                             operator, auditor, admin)
    python -m custody api-key list [--live]                  every key: id, name, role, prefix,
                                                             created, revoked (never the key)
    python -m custody api-key revoke ID                      revoke a key now
    python -m custody api-key rotate ID [--grace-seconds N]  print a new key of the same name and
                                                             role once; the old one stops working
                                                             after N seconds (default 0)

Without DATABASE_URL these use the embedded PostgreSQL's `custody` database, the one
`python -m custody demo` serves (custody.database.EMBEDDED_DATABASE); with it, that database.
    python -m custody verify                                 run the ledger's self-checks
    python -m custody expire-holds                           run the hold-expiry job once

Exit status: 0 ok; 1 a check or command failed; 2 the process could not start (configuration,
database or nodes), with the reason on stderr.
"""
from __future__ import annotations

import argparse
import sys

from custody.observability import configure_logging
from custody.settings import get_settings

APPROVE_COMMANDS = ("approve", "approver-key")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in APPROVE_COMMANDS:
        return _approve(argv)
    if argv and argv[0] == "psbt":
        from custody.psbt_cli import main as psbt_main

        return psbt_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m custody", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("api", "run the HTTP API (no jobs)"), ("worker", "run the scheduled jobs")):
        sub.add_parser(name, help=text).add_argument("--config", default=None, help="the TOML file ($CUSTODY_CONFIG)")
    config = sub.add_parser("config", help="deployment configuration tools")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check_parser = config_sub.add_parser("check", help="validate the file and reach every node, the database and the signer")
    check_parser.add_argument("--config", default=None, help="the TOML file ($CUSTODY_CONFIG)")
    check_parser.add_argument("--process", choices=("api", "worker"), default=None,
                              help="read the file as this process does (its CUSTODY_<PROCESS>_* overrides)")
    demo = sub.add_parser("demo", help="the three processes on fresh regtest nodes, and the demo over HTTP")
    demo.add_argument("--port", type=int, default=None, help="the api's port (default: API_PORT, 8000)")
    demo.add_argument("--exit-after-demo", action="store_true", help="stop everything once the demo has finished")
    rescan = sub.add_parser("rescan", help="operator: one scantxoutset over the issued addresses (custody.rescan)")
    rescan.add_argument("--config", default=None, help="the TOML file ($CUSTODY_CONFIG)")
    rescan.add_argument("--tier", choices=("all", "deposit", "hot", "cold"), default="all")
    reserves = sub.add_parser("reserves", help="operator: proof of reserves").add_subparsers(dest="reserves_command",
                                                                                           required=True)
    publish = reserves.add_parser("publish", help="request reports and build them here, printing the progress")
    publish.add_argument("--config", default=None, help="the TOML file ($CUSTODY_CONFIG)")
    publish.add_argument("--assets", default=None, help="comma-separated assets (default: every asset with customers)")
    publish.add_argument("--key", default=None, help="idempotency key (default: a fresh one); the same key answers the same reports")
    for name in APPROVE_COMMANDS:
        sub.add_parser(name, help="operator approvals (custody.approve_cli)", add_help=False)
    sub.add_parser("psbt", help="cold -> hot through a PSBT (custody.psbt_cli)", add_help=False)
    sub.add_parser("migrate", help="upgrade the database schema")
    key = sub.add_parser("create-api-key", help="create an API key and print it once")
    key.add_argument("name")
    key.add_argument("role", choices=["backend", "operator", "auditor", "admin"])
    keys = sub.add_parser("api-key", help="list, revoke or rotate API keys").add_subparsers(dest="key_command",
                                                                                          required=True)
    keys.add_parser("list", help="every key (never the key itself)").add_argument(
        "--live", action="store_true", help="only the keys that authenticate now")
    keys.add_parser("revoke", help="revoke a key now").add_argument("id", type=int)
    rotate = keys.add_parser("rotate", help="print a new key of the same name and role once; revoke the old one")
    rotate.add_argument("id", type=int)
    rotate.add_argument("--grace-seconds", type=int, default=0,
                        help="the old key keeps working this long (0..604800; default 0)")
    sub.add_parser("verify", help="run the ledger self-checks; exit 1 if any fails")
    sub.add_parser("expire-holds", help="release every hold past its timeout")
    args = parser.parse_args(argv)
    settings = get_settings()
    configure_logging(args.command if args.command in ("api", "worker", "demo") else "cli",
                      fmt=settings.log_format, level=settings.log_level)

    if args.command == "config":
        from custody.config_check import main as check

        return check(args.config, args.process)
    if args.command == "rescan":
        from custody.rescan import main as rescan_main

        return rescan_main(args.config, args.tier)
    if args.command == "reserves":
        from custody.reserves import publish_command

        return publish_command(args.config, args.assets.split(",") if args.assets else None, args.key)
    if args.command in ("api", "worker"):
        return _process(args.command, args.config)
    if args.command == "demo":
        from custody.launch import run_demo_topology

        return run_demo_topology(state_dir=get_settings().state_dir, api_port=args.port or get_settings().api_port,
                                 exit_after_demo=args.exit_after_demo)
    return _maintenance(args)


def _process(process: str, path: str | None) -> int:
    """Load the configuration, build the process's root and run it; exit 2 when it cannot start."""
    from custody.config import ConfigError, DeploymentConfig
    from custody.roots.common import StartupError

    try:
        config = DeploymentConfig.load(path, process=process)
        if process == "api":
            from custody.roots.api import build_api_root, serve_api

            api_root = build_api_root(config)
            return serve_api(api_root)
        from custody.roots.worker import build_worker_root, run_worker

        worker_root = build_worker_root(config)
        return run_worker(worker_root)
    except ConfigError as exc:
        print(f"custody {process}: invalid configuration:\n" + "\n".join(f"  {p}" for p in exc.problems), file=sys.stderr)
        return 2
    except StartupError as exc:
        print(f"custody {process}: cannot start: {exc}", file=sys.stderr)
        return 2


def _approve(argv: list[str]) -> int:
    """`approve` and `approver-key` belong to custody.approve_cli; it gets the whole argv
    (sub-command first)."""
    from custody.approve_cli import main as approve_main

    return approve_main(argv)


def _maintenance(args: argparse.Namespace) -> int:
    from custody.container import bootstrap

    settings = get_settings()
    container = bootstrap(settings)
    if args.command == "migrate":
        print("schema is at the newest revision")
    elif args.command == "create-api-key":
        from custody.auth import create_api_key

        from custody.errors import CustodyError

        try:
            print(create_api_key(container.engine, args.name, args.role, settings.api_key_pepper))
        except (CustodyError, ValueError) as exc:
            print(f"could not create key {args.name!r}: {exc}", file=sys.stderr)
            return 1
    elif args.command == "api-key":
        return _api_keys(args, container.engine, settings.api_key_pepper)
    elif args.command == "verify":
        failed = 0
        for check in container.ledger.verify():
            print(f"{'ok  ' if check.ok else 'FAIL'} {check.name} {check.detail}")
            failed += not check.ok
        return 1 if failed else 0
    elif args.command == "expire-holds":
        print(f"expired {len(container.ledger.expire_holds())} hold(s)")
    return 0


def _api_keys(args: argparse.Namespace, engine, pepper: str) -> int:  # noqa: ANN001 - a SQLAlchemy Engine
    """`api-key list|revoke|rotate`: one line per key; the new key of a rotation on stdout alone."""
    from custody.auth import list_api_keys, revoke_api_key, rotate_api_key
    from custody.errors import CustodyError

    actor = "cli"
    try:
        if args.key_command == "list":
            for k in list_api_keys(engine, include_revoked=not args.live):
                revoked = k.revoked_at.isoformat() if k.revoked_at else "-"
                print(f"{k.id}\t{k.name}\t{k.role.value}\t{k.prefix}...\t{'live' if k.live else 'revoked'}\t"
                      f"created {k.created_at.isoformat()}\trevoked {revoked}\treplaces {k.replaces or '-'}")
        elif args.key_command == "revoke":
            k = revoke_api_key(engine, args.id, by=actor)
            print(f"revoked key {k.id} ({k.name}, {k.role.value}, {k.prefix}...)", file=sys.stderr)
        else:
            k, key = rotate_api_key(engine, args.id, pepper, by=actor, grace_seconds=args.grace_seconds)
            print(f"key {args.id} rotated into key {k.id} ({k.name}, {k.role.value}); the old key stops working "
                  f"{'now' if not args.grace_seconds else f'in {args.grace_seconds} s'}; the new key (shown once):",
                  file=sys.stderr)
            print(key)
    except (CustodyError, ValueError) as exc:
        print(f"api-key {args.key_command}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
