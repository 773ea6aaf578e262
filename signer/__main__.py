"""Command line of the signer process: the only process that loads seed material.

    python -m signer serve  --config signer.toml   listen on the configured socket until SIGTERM/SIGINT
    python -m signer xpubs  --config signer.toml   print the account xpubs (JSON) custody's config is filled from
    python -m signer check  --config signer.toml   load the seed, read every client's auth key, reach the
                                                   database; print the fingerprint, the listen address and
                                                   each client's methods

Every command exits 1 with one line on stderr (`signer: <why>`) when the configuration, the seed,
a client's auth key or (for `check`) the database is unusable; nothing secret is ever printed. The
configuration keys are tabled in signer.config, the socket protocol, its methods and its error
codes in signer.wire, the refusal codes in signer.service.

`xpubs` prints {"network", "master_fingerprint", "accounts": {chain: {tier: xpub}}}: account-level
extended PUBLIC keys (bitcoin as BIP84 vpub/zpub, ethereum as xpub), cold included.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys

from signer.config import ConfigError, SignerConfig, build_signer, load_config, load_keys
from signer.errors import SignerError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m signer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("serve", "serve signing requests on the configured socket"),
                       ("xpubs", "print the account xpubs as JSON"),
                       ("check", "validate the config, load the seed, reach the database")):
        sub.add_parser(name, help=text).add_argument("--config", required=True, help="the signer's TOML file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg: SignerConfig | None = None
    try:
        cfg = load_config(args.config)
        if args.command == "serve":
            from signer.server import ServeError, serve

            try:
                return serve(cfg)
            except ServeError as exc:
                raise ConfigError(str(exc)) from None
        if args.command == "xpubs":
            from signer.server import xpubs_of

            print(json.dumps(dataclasses.asdict(xpubs_of(load_keys(cfg), cfg.network)), indent=2))
            return 0
        return check(cfg)
    except (ConfigError, SignerError) as exc:
        print(f"signer: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # binding the socket: address in use, permission denied, no such directory
        print(f"signer: cannot listen on {cfg.listen if cfg else '?'}: {exc.strerror or exc}", file=sys.stderr)
        return 1


def check(cfg: SignerConfig) -> int:
    """Everything `serve` needs, without serving: exit 1 with the first problem."""
    from sqlalchemy import text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    keys = load_keys(cfg)
    grants = cfg.client_grants()
    signer = build_signer(cfg, keys=keys)
    shown = make_url(cfg.database_url).render_as_string(hide_password=True)
    try:
        with signer.engine.connect() as c:
            role = c.execute(text("SELECT current_user")).scalar_one()
            halted = c.execute(text("SELECT engaged FROM control_flag WHERE name = 'withdrawals_halted'")).scalar()
            can_audit = c.execute(text("SELECT has_table_privilege(current_user, 'signer_audit', 'INSERT')")).scalar_one()
            can_forge = c.execute(text("SELECT has_table_privilege(current_user, 'withdrawal_request', 'UPDATE')")).scalar_one()
    except SQLAlchemyError as exc:
        raise ConfigError(f"database_url {shown}: {type(getattr(exc, 'orig', None) or exc).__name__}: "
                          f"{str(getattr(exc, 'orig', None) or exc).strip().splitlines()[0]}") from None
    finally:
        signer.engine.dispose()
    if not can_audit:
        raise ConfigError(f"database_url {shown}: role {role} cannot INSERT into signer_audit")
    print(f"network: {cfg.network}")
    print(f"master fingerprint: {keys.master_fingerprint}")
    print(f"listen: {cfg.endpoint}")
    for grant in grants:
        print(f"client {grant.name}: {', '.join(sorted(grant.methods))}")
    print(f"database: {shown} as {role}; kill switch {'ENGAGED' if halted else 'off'}")
    print(f"approvers: {len(cfg.approvers)}; quorum for: {', '.join(sorted(cfg.quorum))}")
    if can_forge:
        print(f"warning: role {role} can UPDATE withdrawal_request; deploy the signer as custody_signer", file=sys.stderr)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
