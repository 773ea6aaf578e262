"""What the api and worker roots share: the database engine (checked to be at the schema head and
to be this process's own role), the ledger and wallets, the chain adapters (each behind a
network gate) and the signer client built from the deployment config, the reference data the file
describes, and the custody pipelines both processes call.

`build_services(config, process=...)` does it in this order, and every step fails at start with
`StartupError` (never later) when the configuration and the world disagree:

| step | fails when |
| --- | --- |
| engine | the database does not answer; its schema is not at head (run `python -m custody migrate`); the process is not connected as its own role (`PROCESS_ROLES`: custody_api, custody_worker), or its role is a superuser or may act as the tables' owner |
| adapters | a node answers but is on another chain than configured (unreachable: a warning; each adapter is behind a `guards.NetworkGate`, which verifies the node on first contact and after reconnects, before any call reads or sends) |
| signer client | `signer.client` is missing from this build, or the auth key file is unusable |
| reference data | the database holds another xpub for a configured wallet, another chain, contract or decimals for an asset |
| signer's keys | the signer answers and its `xpubs()` differ from [wallets.*] deposit or hot (`guards.WalletCheck`); the signer refuses our auth key |
| reference data (api) | the database still differs from this file (a missing wallet or asset, other fees, finality, dust or minimum) after `REFERENCE_WAIT_SECONDS` |

Reference data is written by the worker only (`apply_reference_data`), idempotently and only
what differs from the file: a wallet is registered once (`Wallets.register_wallet`; a key is never
replaced in place, since addresses were issued from it) and only after the signer confirmed it
holds the key (a worker that starts while the signer is down registers the wallets when the
check passes, see guards.WalletCheck); an asset is created or its fees/finality/dust updated
(`Wallets.configure_asset`); a chain's deposit cursor is started at the node's tip when it has none
(`Deposits.start_cursor`). So two workers starting at once are safe, and a restart with an
unchanged file writes nothing. The api writes none of it: it compares the database with its own
file (`reference_differences`) and waits, up to `REFERENCE_WAIT_SECONDS`, for a worker to apply
what is missing or changed; then it refuses to start, naming the keys that differ. Api and worker
may therefore read different files only if their reference data are the same. Since the wallet
rows are written only after a worker's signer check, an api that cannot reach the signer at
start (compose gives it no socket) still serves only keys the signer holds.

Nothing here imports `signer.keys` or `signer.service`: the api and worker hold no key material
(the test suite checks the modules each process has loaded; see `install_module_dump`).
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Mapping

from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from chain_adapters.base import ChainAdapter
from chain_adapters.bitcoin import BitcoinAdapter
from chain_adapters.errors import ChainError, NodeUnavailable, WrongNetwork
from chain_adapters.ethereum import EthereumAdapter
from custody.addresses import canonical_btc_account_key, derive_btc_address, derive_eth_address
from custody.adjustments import TreasuryAdjustments
from custody.convert.prices import PriceChanges
from custody.config import DeploymentConfig
from custody.controls import open_incident
from custody.database import make_engine, to_sqlalchemy_url
from custody.deposits import Deposits
from custody.destinations import HOT_RECEIVE_INDEX, DestinationGuard
from custody.eth_rebalances import EthRebalanceConfig, EthRebalances
from custody.eth_moves import MIN_REPLACEMENT_PERCENT, EthBumpConfig
from custody.eth_sweeps import EthSweeps
from custody.payouts import PayoutConfig, Payouts
from custody.policy_config import PolicyProvider, sweep_minimums
from custody.rebalances import RebalanceThreshold, Rebalances, treasury_config
from custody.node_view import NodeView
from custody.reconciliation import Reconciliation
from custody.reserves import Reserves
from custody.roots.guards import NetworkGate, WalletCheck, gate_adapters
from custody.settings import REPO_ROOT, Settings
from custody.sweeps import Sweeps
from custody.wallets import Wallets
from custody.webhooks.endpoints import Webhooks
from custody.withdrawals import Withdrawals
from ledger.errors import ErrorCode, LedgerError
from ledger.service import Ledger
from signer.approvals import ApproverRegistry
from signer.protocol import SignerPort

log = logging.getLogger(__name__)


class StartupError(Exception):
    """The process cannot start with this configuration against this database and these nodes."""


Process = Literal["api", "worker"]
PROCESS_ROLES: dict[str, str] = {"api": "custody_api", "worker": "custody_worker"}  # migration 0020's roles
REFERENCE_WAIT_SECONDS = 60.0  # how long the api waits for a worker to apply the reference data


@dataclass
class CustodyServices:
    """The services both processes wire the same way. Attribute names are those of
    custody.container.Container, so `create_app` and `build_scheduler` accept a root."""

    config: DeploymentConfig
    settings: Settings
    engine: Engine
    ledger: Ledger
    wallets: Wallets
    adapters: Mapping[str, ChainAdapter]
    signer: SignerPort
    deposits: Deposits
    withdrawals: Withdrawals
    payouts: Payouts
    reconciliation: Reconciliation
    adjustments: TreasuryAdjustments
    approvers: ApproverRegistry  # [[approvers]]: what an approval is verified against at the API (early feedback)
    process: str  # "api" or "worker": what the services were built for
    wallet_check: WalletCheck  # whether the signer holds [wallets]' keys (the worker gates its jobs on it)
    sweeps: Sweeps | None  # bitcoin only
    rebalances: Rebalances | None  # bitcoin only
    reserves: Reserves | None  # with bitcoin configured (then also every ethereum asset)
    node_view: NodeView | None = None  # bitcoin only: the node's watch-only wallet (custody.node_view)
    eth_sweeps: EthSweeps | None = None  # ethereum only: deposits -> hot address, with gas funding (custody.eth_sweeps)
    eth_rebalances: EthRebalances | None = None  # ethereum with [treasury.ethereum]: hot -> warm/cold (custody.eth_rebalances)
    webhooks: Webhooks | None = None  # webhook endpoints (api) and their delivery job (worker)
    price_changes: PriceChanges | None = None  # convert's operator prices: signed (api), set by the worker's job

    def close(self) -> None:
        for adapter in self.adapters.values():
            adapter.close()
        self.engine.dispose()


# ---- the steps -----------------------------------------------------------------------------------

def open_engine(config: DeploymentConfig, process: Process = "worker") -> Engine:
    """A pooled engine on the configured database, whose schema must be at head, connected as the
    process's own role (`role_problem`)."""
    # the api's pool holds a connection for each of its request threads (custody.roots.api.API_THREADS)
    engine = make_engine(to_sqlalchemy_url(config.database_url), pool_size=20 if process == "api" else 10)
    try:
        current, head = schema_revision(engine)
        problem = None if current != head else role_problem(engine, process)
    except SQLAlchemyError as exc:
        engine.dispose()
        raise StartupError(f"database: {_db_reason(exc)}") from None
    if current != head:
        engine.dispose()
        raise StartupError(f"database: the schema is at {current or 'no revision'}, this code needs {head}: "
                           "run `python -m custody migrate` with the schema owner's DATABASE_URL")
    if problem:
        engine.dispose()
        raise StartupError(f"database: {problem}")
    return engine


_ROLE_SQL = text(
    "SELECT current_user AS role, r.rolsuper AS superuser, "
    "       pg_has_role(current_user, t.tableowner, 'MEMBER') AS acts_as_owner, t.tableowner AS owner "
    "FROM pg_roles r, pg_tables t "
    "WHERE r.rolname = current_user AND t.schemaname = current_schema() AND t.tablename = 'alembic_version'")


def role_problem(engine: Engine, process: Process | None) -> str | None:
    """Why the engine's role is not `process`'s own (PROCESS_ROLES; None: either process's), or None.
    The roles of migration 0020 confine each process only if it uses its own: a superuser or the
    tables' owner (or a role that may act as it) could write the signer's audit, rewrite the
    journal's triggers, drop tables. There is no override: the demo, the launcher and the tests
    all connect as the roles."""
    wanted = [PROCESS_ROLES[process]] if process else list(PROCESS_ROLES.values())
    with engine.connect() as c:
        row = c.execute(_ROLE_SQL).first()
    who = f"the {process}" if process else "the api and the worker"
    if row is None:  # no alembic_version in the search path: the schema check reports it first
        return f"the connected role cannot see the schema's alembic_version; {who} connect as {' / '.join(wanted)}"
    env = " / ".join(f"CUSTODY_{p.upper()}_DATABASE_URL" for p, r in PROCESS_ROLES.items() if r in wanted)
    how = (f"set database.url (or {env}) to the database as {' / '.join(wanted)}, the role migration 0020 created "
           f"for {who}")
    if row.superuser:
        return f"connected as {row.role}, a superuser; {who} must not run with every privilege: {how}"
    if row.acts_as_owner:
        return f"connected as {row.role}, which owns the schema (or may act as {row.owner}, its owner): {how}"
    if row.role not in wanted:
        return f"connected as {row.role}, not as {' / '.join(wanted)}: {how}"
    return None


def schema_revision(engine: Engine) -> tuple[str | None, str]:
    """(the database's Alembic revision or None, the code's head revision)."""
    cfg = AlembicConfig(str(REPO_ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(REPO_ROOT / "migrations"))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    with engine.connect() as c:
        current = MigrationContext.configure(c).get_current_revision()
    return current, head or ""


def _db_reason(exc: SQLAlchemyError) -> str:
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    return f"{type(orig).__name__}: {lines[0] if lines else ''}"


def build_adapters(config: DeploymentConfig, *, timeout: float | None = None) -> dict[str, ChainAdapter]:
    """One adapter per configured chain (bitcoind auth: cookie file or user/password)."""
    adapters: dict[str, ChainAdapter] = {}
    extra = {} if timeout is None else {"timeout": timeout}
    if (b := config.bitcoin) is not None:
        adapters["bitcoin"] = BitcoinAdapter(
            b.rpc_url, network=b.network, cookie_file=b.cookie_file, rpc_user=b.rpc_user,
            rpc_password=b.rpc_password.get_secret_value() if b.rpc_password is not None else None, **extra)
    if (e := config.ethereum) is not None:
        adapters["ethereum"] = EthereumAdapter(e.rpc_url, network=e.network,
                                               tokens={address: symbol for symbol, address in e.tokens.items()}, **extra)
    return adapters


def verify_networks(adapters: Mapping[str, ChainAdapter]) -> None:
    """At start: a node on another chain stops the start; an unreachable one is only logged (its
    NetworkGate verifies it on first contact, before any call reads or sends)."""
    for chain, adapter in adapters.items():
        verify = adapter.verify if isinstance(adapter, NetworkGate) else getattr(adapter, "verify_network", None)
        if verify is None:
            continue
        try:
            verify()
        except WrongNetwork as exc:
            raise StartupError(f"{chain}: {exc}") from None
        except NodeUnavailable as exc:
            log.warning("%s node unreachable at start (%s); its network is verified on first contact, before any job "
                        "uses it", chain, exc)
        except ChainError as exc:
            raise StartupError(f"{chain}: {exc}") from None


def wrong_network_incident(engine: Engine):  # noqa: ANN201 - a NetworkGate's on_wrong_network
    """Record a node found on another chain as a critical incident (custody.controls: the kill switch engages)."""

    def report(chain: str, exc: WrongNetwork) -> None:
        with engine.begin() as c:
            open_incident(c, "chain_wrong_network", f"wrong_network:{chain}:{exc.detail}", {"chain": chain, "detail": exc.detail})

    return report


def wallet_mismatch_incident(engine: Engine, endpoint: str):  # noqa: ANN201 - a WalletCheck's on_mismatch
    """Record wallets whose keys the signer does not hold as a critical incident."""

    def report(keys: list[str]) -> None:
        with engine.begin() as c:
            open_incident(c, "wallet_keys_not_the_signers", "wallet_keys_not_the_signers:" + ",".join(keys),
                          {"wallets": keys, "signer": endpoint})

    return report


def signer_client(config: DeploymentConfig) -> SignerPort:
    """The signer process's client as this process's [signer] client, with that client's key
    (signer.client: no key code). Connections are made per call; what the client may call is the
    signer's decision (its [[clients]]): the api's may not sign a batch, sweep or rebalance."""
    try:
        from signer.client import SignerClient
    except ImportError as exc:
        raise StartupError(f"signer: the signer client is not part of this build ({exc})") from None
    try:
        return SignerClient(config.signer.endpoint, config.signer.auth_key(), client=config.signer.client)
    except (OSError, ValueError) as exc:
        raise StartupError(f"signer: {exc}") from None


def wallet_networks(config: DeploymentConfig) -> dict[str, str]:
    """chain -> the network name stored with its wallets and used to check its addresses."""
    out = {}
    if config.bitcoin is not None:
        out["bitcoin"] = config.bitcoin.address_network
    if config.ethereum is not None:
        out["ethereum"] = config.ethereum.network
    return out


@dataclass(frozen=True)
class Difference:
    """One way the database's reference data differs from the file: `key` is the file's key
    (wallets.bitcoin.hot, assets.BTC, assets.BTC.finality), `message` says how; `settles` when a
    worker writes the file's value (a missing row, a fee or finality it updates), not when it never
    changes (a wallet's key, an asset's chain, contract or decimals): a conflict."""

    key: str
    message: str
    settles: bool

    def line(self) -> str:
        return f"{self.key}: {self.message}"


_ASSET_VALUES = ("finality", "dust_minimum", "min_withdrawal", "withdrawal_fee", "withdrawal_fee_fast")


def reference_differences(config: DeploymentConfig, wallets: Wallets) -> list[Difference]:
    """Every difference between the file's [wallets] and [assets] and the database (empty: they agree)."""
    out: list[Difference] = []
    networks = wallet_networks(config)
    with wallets.engine.connect() as c:
        rows = {(r.chain, r.tier): r for r in c.execute(text("SELECT chain, tier, xpub, network FROM wallet"))}
    for chain, section in config.wallets.items():
        network = networks[chain]
        for tier, xpub in section.tiers().items():
            key = canonical_btc_account_key(xpub, network) if chain == "bitcoin" else xpub.strip()
            row = rows.get((chain, tier))
            if row is None:
                out.append(Difference(f"wallets.{chain}.{tier}", "not registered in the database yet", True))
            elif (row.xpub, row.network) != (key, network):
                out.append(Difference(f"wallets.{chain}.{tier}", f"the database has another key (or network {row.network}) "
                                      f"registered for {chain}/{tier}; a wallet's key is never replaced in place "
                                      "(addresses were issued from it)", False))
    tokens = config.ethereum.tokens if config.ethereum else {}
    for symbol, asset in config.assets.items():
        contract = tokens.get(symbol)
        try:
            have = wallets.chain_asset(symbol)
            decimals = wallets.ledger.get_asset(symbol).decimals
        except LedgerError as exc:
            if exc.code is not ErrorCode.asset_not_found:
                raise
            out.append(Difference(f"assets.{symbol}", "not in the database yet", True))
            continue
        if have.chain != asset.chain or (have.contract_address or "").lower() != (contract or "").lower():
            out.append(Difference(f"assets.{symbol}", f"the database has it on {have.chain} (contract "
                                  f"{have.contract_address or 'none'}); the file says {asset.chain} (contract "
                                  f"{contract or 'none'}): an asset's chain and contract never change", False))
        if decimals != asset.decimals:
            out.append(Difference(f"assets.{symbol}.decimals", f"the database has {decimals}, the file {asset.decimals}; "
                                  "an asset's decimals never change", False))
        fast = asset.withdrawal_fee if asset.withdrawal_fee_fast is None else asset.withdrawal_fee_fast
        theirs = (have.finality_confirmations, have.dust_minimum, have.min_withdrawal, have.withdrawal_fee,
                  have.withdrawal_fee_fast)
        mine = (asset.finality, asset.dust_minimum, asset.min_withdrawal, asset.withdrawal_fee, fast)
        out += [Difference(f"assets.{symbol}.{name}", f"the database has {db}, the file {file}", True)
                for name, db, file in zip(_ASSET_VALUES, theirs, mine) if db != file]
    return out


def _refuse_conflicts(differences: list[Difference]) -> None:
    conflicts = [d.line() for d in differences if not d.settles]
    if conflicts:
        raise StartupError("; ".join(conflicts))


def apply_reference_data(config: DeploymentConfig, wallets: Wallets, deposits: Deposits, *,
                         register_wallets: bool = True) -> list[str]:
    """The worker's step: make the database's wallets, assets and cursors agree with the file,
    writing only what differs; returns what was written (empty on a restart with an unchanged
    file). StartupError on a conflict (`Difference.settles` false). `register_wallets=False`
    (the signer has not yet confirmed the keys) writes no wallet row."""
    differences = reference_differences(config, wallets)
    _refuse_conflicts(differences)
    written: list[str] = []
    networks = wallet_networks(config)
    missing_wallets = {d.key for d in differences if d.key.startswith("wallets.")}
    for chain, section in config.wallets.items():
        for tier, xpub in section.tiers().items():
            if not register_wallets or f"wallets.{chain}.{tier}" not in missing_wallets:
                continue
            network = networks[chain]
            key = canonical_btc_account_key(xpub, network) if chain == "bitcoin" else xpub.strip()
            wallets.register_wallet(chain, tier, network, key)
            written.append(f"wallet {chain}/{tier}")
    tokens = config.ethereum.tokens if config.ethereum else {}
    changed = {d.key.split(".")[1] for d in differences if d.key.startswith("assets.")}
    for symbol, asset in config.assets.items():
        if symbol not in changed:
            continue
        try:
            wallets.configure_asset(symbol, asset.decimals, asset.chain, finality=asset.finality,
                                    dust_minimum=asset.dust_minimum, contract_address=tokens.get(symbol),
                                    min_withdrawal=asset.min_withdrawal, withdrawal_fee=asset.withdrawal_fee,
                                    withdrawal_fee_fast=asset.withdrawal_fee_fast)
        except LedgerError as exc:  # a ledger asset of that code with other decimals, made by hand
            raise StartupError(f"assets.{symbol}: {exc}") from None
        written.append(f"asset {symbol}")
    for chain in deposits.adapters:
        if deposits.cursor(chain) is not None:
            continue
        try:
            at = deposits.start_cursor(chain)
        except NodeUnavailable as exc:
            log.warning("%s: no deposit cursor yet and the node is unreachable (%s); the deposit job starts it", chain, exc)
            continue
        written.append(f"cursor {chain} at {at.height}")
    if written:
        log.info("reference data written from %s: %s", config.source, ", ".join(written))
    return written


def await_reference_data(config: DeploymentConfig, wallets: Wallets, *, timeout: float = REFERENCE_WAIT_SECONDS,
                         poll: float = 1.0) -> None:
    """The api's step: return once the database's reference data equal this file's; a conflict is a
    StartupError at once, other differences after waiting `timeout` seconds for a worker to apply
    them (it starts first; compose and custody.launch start the worker before the api)."""
    deadline = time.monotonic() + timeout
    waited = False
    while True:
        differences = reference_differences(config, wallets)
        _refuse_conflicts(differences)
        if not differences:
            if waited:
                log.info("the worker has applied the reference data; they equal %s", config.source)
            return
        if time.monotonic() >= deadline:
            raise StartupError(
                "reference data: the database differs from this file at " + "; ".join(d.line() for d in differences)
                + f" (waited {timeout:.0f} s): only the worker writes wallets and assets; is it running, with the same "
                "[wallets] and [assets] as this file (and has the signer confirmed the wallets)?")
        if not waited:
            log.warning("waiting up to %.0f s for the worker to apply the reference data (%s)", timeout,
                        ", ".join(d.key for d in differences))
            waited = True
        time.sleep(max(0.0, min(poll, deadline - time.monotonic())))


def build_services(config: DeploymentConfig, *, process: Process | None = None,
                   adapters: Mapping[str, ChainAdapter] | None = None, signer: SignerPort | None = None,
                   engine: Engine | None = None, reference_wait: float = REFERENCE_WAIT_SECONDS) -> CustodyServices:
    """Everything both roots need, from `config`, for `process` (default: the one the file was
    loaded for, else the worker). Tests may pass their own adapters, signer or engine (an engine
    given is not role-checked); production passes none. Adapters that can verify their network
    are put behind a NetworkGate either way."""
    process = process or ("api" if config.process == "api" else "worker")
    if engine is not None:
        return _build(config, process, adapters, signer, engine, reference_wait)
    engine = open_engine(config, process)
    try:
        return _build(config, process, adapters, signer, engine, reference_wait)
    except BaseException:
        engine.dispose()
        raise


def _build(config: DeploymentConfig, process: Process, adapters: Mapping[str, ChainAdapter] | None,
           signer: SignerPort | None, engine: Engine, reference_wait: float) -> CustodyServices:
    adapters = gate_adapters(dict(adapters) if adapters is not None else build_adapters(config))
    verify_networks(adapters)
    for adapter in adapters.values():
        if isinstance(adapter, NetworkGate):
            adapter.on_wrong_network = wrong_network_incident(engine)
    signer = signer if signer is not None else signer_client(config)
    settings = config.settings
    ledger = Ledger(engine)
    wallets = Wallets(engine, ledger)
    deposits = Deposits(engine, ledger, wallets, adapters)
    _refuse_conflicts(reference_differences(config, wallets))  # before the signer: the database's keys come first
    check = WalletCheck(config, signer, on_mismatch=wallet_mismatch_incident(engine, config.signer.endpoint))
    try:
        check.at_start()
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    if process == "worker":
        apply_reference_data(config, wallets, deposits, register_wallets=check.passed)
        check.on_pass = lambda: apply_reference_data(config, wallets, deposits)
    else:
        if not check.passed:
            log.warning("the api did not compare [wallets] with the signer's xpubs (unreachable); it serves the wallets "
                        "a worker registered after its own check, which must equal this file")
        await_reference_data(config, wallets, timeout=reference_wait)
    networks = wallet_networks(config)
    btc_network = networks.get("bitcoin", "mainnet")  # with no bitcoin, nothing derives a bitcoin address
    approvers = config.approver_registry()
    policy = PolicyProvider()
    withdrawals = Withdrawals(engine, ledger, wallets, policy, networks=networks,
                              destinations=DestinationGuard(engine, wallets, adapters), approvers=approvers)
    payouts = Payouts(engine, ledger, wallets, adapters, signer, PayoutConfig(bitcoin_network=btc_network))
    payouts.withdrawals = withdrawals
    if "bitcoin" in adapters and process == "worker":  # the index is the worker's to write (custody.wallet_index)
        payouts.catch_up = lambda: deposits.catch_up("bitcoin")
    sweeps = rebalances = reserves = node_view = eth_sweeps = eth_rebalances = None
    if "ethereum" in adapters:
        eth_bump = EthBumpConfig(stuck_blocks=config.treasury.stuck_blocks,
                                 bump_percent=max(config.treasury.bump_percent, MIN_REPLACEMENT_PERCENT),
                                 max_fee_wei=config.treasury.ethereum_bump_max_fee_wei)
        eth_sweeps = EthSweeps(engine, ledger, wallets, adapters["ethereum"], signer,  # type: ignore[arg-type] - gated
                               hot_address=derive_eth_address(config.wallets["ethereum"].hot, HOT_RECEIVE_INDEX),
                               max_fee_wei=payouts.config.max_fee_wei, bump=eth_bump,
                               bump_reserve_percent=config.treasury.ethereum_sweep_bump_reserve_percent,
                               thresholds={a: p.sweep_threshold for a, p in policy.base.assets.items()
                                           if p.sweep_threshold is not None},
                               min_per_address=sweep_minimums(policy.base))
        if config.treasury.ethereum:
            warm = config.wallets["ethereum"].warm
            eth_rebalances = EthRebalances(
                engine, ledger, wallets, adapters["ethereum"], signer,  # type: ignore[arg-type] - gated
                hot_address=derive_eth_address(config.wallets["ethereum"].hot, HOT_RECEIVE_INDEX),
                warm_address=derive_eth_address(warm, 0) if warm else None,
                config=EthRebalanceConfig(
                    thresholds={a: RebalanceThreshold(ceiling=t.ceiling, target=t.target, floor=t.floor, excess_to=t.excess_to)
                                for a, t in config.treasury.ethereum.items()},
                    cold_address=config.treasury.ethereum_cold_address, max_fee_wei=payouts.config.max_fee_wei,
                    refill_quorum=config.treasury.refill_quorum, refill_ttl=policy.base.refill_ttl), approvers=approvers,
                bump=eth_bump)
    if "bitcoin" in adapters:
        hot = derive_btc_address(config.wallets["bitcoin"].hot, btc_network, 0, 0)
        rebalance_config, bump = treasury_config(config.treasury, bitcoin_network=btc_network,
                                                 refill_ttl=policy.base.refill_ttl,
                                                 master_fingerprints=config.wallets["bitcoin"].master_fingerprints())
        sweeps = Sweeps(engine, ledger, wallets, adapters["bitcoin"], signer, hot_address=hot, network=btc_network, bump=bump)
        rebalances = Rebalances(engine, ledger, wallets, adapters["bitcoin"], signer, hot_address=hot, approvers=approvers,
                                config=rebalance_config, bump=bump)
        reserves = Reserves(engine, adapters, signer, network=btc_network, parts=settings.reserves_leaves_per_account)
        node_view = NodeView(engine, adapters["bitcoin"], network=btc_network,  # type: ignore[arg-type] - gated
                             lookahead=config.bitcoin.node_view_lookahead if config.bitcoin else 1000)
    # The worker's passes first record the hot wallet's new coins (and book funding); the api's
    # on-demand pass (POST /v1/reconciliation) does not: recording coins is the worker's (custody_api
    # may not write wallet_utxo rows, migration 0022), whose payouts job syncs every few seconds.
    sync = payouts.sync_hot_wallet if "bitcoin" in adapters and process == "worker" else None
    reconciliation = Reconciliation(engine, ledger, wallets, adapters, network=btc_network, before=sync,
                                    node_view=node_view, blind_warn_after=settings.node_view_warn_after_seconds,
                                    blind_critical_after=settings.node_view_critical_after_seconds)
    if eth_rebalances is not None:
        reconciliation.eth_outer = eth_rebalances.destinations()
    adjustments = TreasuryAdjustments(engine, ledger, quorum=settings.treasury_adjustment_quorum, approvers=approvers)
    price_changes = PriceChanges(engine, ledger, approvers=approvers)
    return CustodyServices(config=config, settings=settings, engine=engine, ledger=ledger, wallets=wallets,
                           adapters=adapters, signer=signer, deposits=deposits, withdrawals=withdrawals,
                           payouts=payouts, reconciliation=reconciliation, adjustments=adjustments,
                           approvers=approvers, process=process, wallet_check=check, sweeps=sweeps,
                           rebalances=rebalances, reserves=reserves, node_view=node_view,
                           webhooks=Webhooks(engine, settings), eth_sweeps=eth_sweeps, eth_rebalances=eth_rebalances,
                           price_changes=price_changes)


# ---- process plumbing --------------------------------------------------------------------------

def modules_file(state_dir: Path, process: str, pid: int | None = None) -> Path:
    return state_dir / f"modules-{process}-{pid if pid is not None else os.getpid()}.txt"


def dump_modules(state_dir: Path, process: str) -> Path:
    """Write the sorted names of the loaded modules (sys.modules) to `modules_file` atomically."""
    path = modules_file(state_dir, process)
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{name}\n" for name in sorted(sys.modules.copy())))
    os.replace(tmp, path)
    return path


def install_module_dump(process: str, state_dir: Path) -> None:
    """On SIGUSR1, write the loaded module names to `<state_dir>/modules-<process>-<pid>.txt`
    (`process`: the topology's name, custody-api or custody-worker) and log where: the e2e suite
    asserts from it that the api and worker never loaded signer.keys or signer.service."""

    def handler(signum: int, frame: object) -> None:
        log.info("SIGUSR1: loaded modules of %s written to %s", process, dump_modules(state_dir, process))

    signal.signal(signal.SIGUSR1, handler)


__all__ = ["PROCESS_ROLES", "REFERENCE_WAIT_SECONDS", "CustodyServices", "Difference", "StartupError",
           "apply_reference_data", "await_reference_data", "build_adapters", "build_services", "dump_modules",
           "install_module_dump", "modules_file", "open_engine", "reference_differences", "role_problem",
           "schema_revision", "signer_client"]
