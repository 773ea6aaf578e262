"""`python -m custody config check --config F [--process api|worker]`: validate the deployment
file, then reach everything it names, so a deployment learns of a wrong URL, network, key or
contract before it serves. With `--process`, the file is read as that process reads it (its own
`CUSTODY_<PROCESS>_DATABASE_URL` and `CUSTODY_<PROCESS>_SIGNER_*` overrides applied).

One line per check (`ok  ` or `FAIL`, the check's name, what was found or why it failed); exit 1
when any fails. Each check runs even when an earlier one failed.

| check | ok when |
| --- | --- |
| config | the file loads (custody.config: keys, types, integers, cross-section consistency) |
| database | it answers, its schema is at the code's Alembic head, and the configured role is custody_api or custody_worker (not a superuser, nor the tables' owner: the processes refuse to start so) |
| bitcoin | `getblockchaininfo` answers, its `chain` is the configured network, and `-txindex` is on |
| ethereum | `eth_chainId` is the configured chain_id |
| token SYMBOL | the contract has code, and its ERC-20 `decimals()` equals [assets.SYMBOL] decimals |
| signer | something listens at the endpoint, answers `ping` and `xpubs` to [signer] client (authenticated with its auth key; a client the signer does not know, or knows with another key, is `unauthenticated`), and the xpubs equal [wallets.*] deposit and hot (custody.roots.guards.wallet_mismatches, the check each process makes at start; cold is not compared: it may be held outside the signer) |

Nothing secret is printed: URLs are shown without passwords, keys never.
"""
from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Any, Callable

from chain_adapters.errors import ChainError
from custody.config import BITCOIN_CHAIN_NAMES, ConfigError, DeploymentConfig

DECIMALS_SELECTOR = "0x313ce567"  # ERC-20 decimals()
NODE_TIMEOUT = 10.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.name}: {self.detail}"


def run_checks(path: str | None, process: str | None = None) -> list[Check]:
    """Every check for the file at `path` (None: $CUSTODY_CONFIG), as `process` reads it."""
    try:
        config = DeploymentConfig.load(path, process=process)
    except ConfigError as exc:
        return [Check("config", False, "\n     ".join(exc.problems))]
    checks = [Check("config", True, f"{config.source}: {', '.join(config.chains)}; assets "
                                    f"{', '.join(sorted(config.assets))}; {len(config.approvers)} approver key(s)")]
    checks.append(_run("database", lambda: _database(config)))
    adapters: dict[str, Any] = {}
    try:
        from custody.roots.common import build_adapters

        adapters = build_adapters(config, timeout=NODE_TIMEOUT)
    except Exception as exc:  # noqa: BLE001 - reported as the node checks' failure
        checks.append(Check("nodes", False, f"cannot build the chain adapters: {exc}"))
    if config.bitcoin is not None and "bitcoin" in adapters:
        checks.append(_run("bitcoin", lambda: _bitcoin(config, adapters["bitcoin"])))
    if config.ethereum is not None and "ethereum" in adapters:
        where = config.ethereum.rpc_url
        checks.append(_run("ethereum", lambda: _ethereum(config, adapters["ethereum"]), where))
        for symbol, address in sorted(config.ethereum.tokens.items()):
            checks.append(_run(f"token {symbol}", lambda s=symbol, a=address: _token(config, adapters["ethereum"], s, a),
                               where))
    checks.append(_run("signer", lambda: _signer(config)))
    return checks


def _run(name: str, check: Callable[[], str], where: str = "") -> Check:
    try:
        return Check(name, True, check())
    except (CheckFailed, ChainError) as exc:  # a chain error's text starts with its code (node_unavailable: ...)
        return Check(name, False, str(exc))
    except OSError as exc:  # web3's connection errors: keep the reason, not the urllib3 retry story
        errno = re.search(r"\[Errno -?\d+\] [^'\")]+", str(exc))
        return Check(name, False, f"node_unavailable: {where}: {errno.group(0) if errno else type(exc).__name__}")
    except Exception as exc:  # noqa: BLE001 - any failure is this check's answer, with its reason
        return Check(name, False, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")


class CheckFailed(Exception):
    """A check reached its target and found it wrong."""


def _database(config: DeploymentConfig) -> str:
    from sqlalchemy import make_url, text
    from sqlalchemy.exc import SQLAlchemyError

    from custody.database import make_engine, to_sqlalchemy_url
    from custody.roots.common import role_problem, schema_revision

    url = to_sqlalchemy_url(config.database_url)
    shown = make_url(url).render_as_string(hide_password=True)
    engine = make_engine(url, pool_size=1)
    try:
        with engine.connect() as c:
            role = c.execute(text("SELECT current_user")).scalar_one()
        current, head = schema_revision(engine)
        problem = role_problem(engine, None) if current == head else None
    except SQLAlchemyError as exc:
        orig = getattr(exc, "orig", None) or exc
        raise CheckFailed(f"{shown}: {type(orig).__name__}: {str(orig).strip().splitlines()[0]}") from None
    finally:
        engine.dispose()
    if current != head:
        raise CheckFailed(f"{shown} (as {role}): schema at {current or 'no revision'}, this code needs {head} "
                          "(run `python -m custody migrate` as the schema owner)")
    if problem:
        raise CheckFailed(f"{shown}: {problem}")
    return f"{shown} as {role}; schema at head ({head})"


def _bitcoin(config: DeploymentConfig, adapter: Any) -> str:
    assert config.bitcoin is not None
    info = adapter.rpc.call("getblockchaininfo")
    want = BITCOIN_CHAIN_NAMES[config.bitcoin.network]
    where = config.bitcoin.rpc_url
    if info["chain"] != want:
        raise CheckFailed(f"{where}: the node is on {info['chain']!r}, the file says {config.bitcoin.network} ({want!r})")
    indexes = adapter.rpc.call("getindexinfo")
    if "txindex" not in indexes:
        raise CheckFailed(f"{where}: -txindex is off; start bitcoind with -txindex=1 (transaction tracking needs it)")
    return f"{where}: chain {info['chain']}, height {info['blocks']}, txindex on"


def _ethereum(config: DeploymentConfig, adapter: Any) -> str:
    assert config.ethereum is not None
    got = int(adapter.w3.eth.chain_id)
    if got != config.ethereum.chain_id:
        raise CheckFailed(f"{config.ethereum.rpc_url}: eth_chainId is {got}, the file says {config.ethereum.chain_id}")
    return f"{config.ethereum.rpc_url}: chain id {got}, block {adapter.w3.eth.block_number}"


def _token(config: DeploymentConfig, adapter: Any, symbol: str, address: str) -> str:
    code = adapter.w3.eth.get_code(address)
    if not code:
        raise CheckFailed(f"{address} has no code on chain {config.ethereum.chain_id if config.ethereum else '?'}: "
                          "not a contract (a wrong address, or the wrong chain)")
    raw = adapter.w3.eth.call({"to": address, "data": DECIMALS_SELECTOR})
    decimals = int.from_bytes(bytes(raw)[-32:], "big") if len(raw) >= 32 else None
    if decimals != config.assets[symbol].decimals:
        raise CheckFailed(f"{address}: decimals() answers {decimals}, [assets.{symbol}] says {config.assets[symbol].decimals}")
    return f"{address}: contract ({len(code)} bytes of code), decimals {decimals}"


def _listening(endpoint: str) -> None:
    kind, _, rest = endpoint.partition(":")
    if kind == "unix":
        family, address = socket.AF_UNIX, rest
    else:
        host, _, port = rest.rpartition(":")
        host = host.strip("[]")
        family, address = (socket.AF_INET6 if ":" in host else socket.AF_INET), (host, int(port))
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(5.0)
    try:
        sock.connect(address)
    except OSError as exc:
        raise CheckFailed(f"nothing listens at {endpoint} ({exc.strerror or type(exc).__name__}): "
                          "is `python -m signer serve` running?") from None
    finally:
        sock.close()


def _signer(config: DeploymentConfig) -> str:
    from custody.roots.common import StartupError, signer_client
    from custody.roots.guards import wallet_mismatches

    endpoint = config.signer.endpoint
    _listening(endpoint)
    try:
        client: Any = signer_client(config)
    except StartupError as exc:
        raise CheckFailed(str(exc)) from None
    info = client.ping()
    network = getattr(info, "network", None)
    fingerprint = getattr(info, "master_fingerprint", "?")
    if config.bitcoin is not None and network not in (config.bitcoin.network, config.bitcoin.address_network):
        raise CheckFailed(f"{endpoint}: the signer is on {network}, the file's bitcoin network is {config.bitcoin.network}")
    try:
        mismatched = wallet_mismatches(config, client.xpubs())
    except ValueError as exc:
        raise CheckFailed(str(exc)) from None
    if mismatched:
        raise CheckFailed(f"{endpoint}: the signer's xpubs differ from {', '.join(mismatched)} "
                          "(fill them from `python -m signer xpubs`)")
    return (f"{endpoint}: answers client {config.signer.client} (network {network}, master fingerprint {fingerprint}); "
            "xpubs equal the wallets")


def main(path: str | None, process: str | None = None) -> int:
    checks = run_checks(path, process)
    for check in checks:
        print(check.line(), flush=True)
    failed = [c.name for c in checks if not c.ok]
    print(f"{len(checks) - len(failed)} of {len(checks)} checks passed" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
