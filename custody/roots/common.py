"""What the api and worker roots share: the database engine (checked to be at the schema head), the
ledger and wallets, the chain adapters and the signer client built from the deployment config, the
reference data the file describes, and the custody pipelines both processes call.

`build_services(config)` does it in this order, and every step fails at start with `StartupError`
(never later) when the configuration and the world disagree:

| step | fails when |
| --- | --- |
| engine | the database does not answer, or its schema is not at head (run `python -m custody migrate`) |
| adapters | a node answers but is on another chain than configured (unreachable: a warning; jobs retry) |
| signer client | `signer.client` is missing from this build, or the auth key file is unusable |
| reference data | the database holds another xpub for a configured wallet, another chain, contract or decimals for an asset |

Reference data is applied idempotently and writes only what differs from the file: a wallet is
registered once (`Wallets.register_wallet`; a key is never replaced in place, since addresses were
issued from it), an asset created or its fees/finality/dust updated (`Wallets.configure_asset`),
a chain's deposit cursor started at the node's tip when it has none (`Deposits.start_cursor`). So
two processes starting at once are safe, and a restart with an unchanged file writes nothing.

Nothing here imports `signer.keys` or `signer.service`: the api and worker hold no key material
(the test suite checks the modules each process has loaded; see `install_module_dump`).
"""
from __future__ import annotations

import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from chain_adapters.base import ChainAdapter
from chain_adapters.bitcoin import BitcoinAdapter
from chain_adapters.errors import ChainError, NodeUnavailable
from chain_adapters.ethereum import EthereumAdapter
from custody.addresses import canonical_btc_account_key, derive_btc_address
from custody.adjustments import TreasuryAdjustments
from custody.config import DeploymentConfig
from custody.database import make_engine, to_sqlalchemy_url
from custody.deposits import Deposits
from custody.destinations import DestinationGuard
from custody.payouts import PayoutConfig, Payouts
from custody.policy_config import PolicyProvider
from custody.rebalances import RebalanceConfig, Rebalances
from custody.reconciliation import Reconciliation
from custody.reserves import Reserves
from custody.settings import REPO_ROOT, Settings
from custody.sweeps import Sweeps
from custody.wallets import Wallets
from custody.withdrawals import Withdrawals
from ledger.errors import ErrorCode, LedgerError
from ledger.service import Ledger
from signer.approvals import ApproverRegistry
from signer.protocol import SignerPort

log = logging.getLogger(__name__)


class StartupError(Exception):
    """The process cannot start with this configuration against this database and these nodes."""


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
    sweeps: Sweeps | None  # bitcoin only
    rebalances: Rebalances | None  # bitcoin only
    reserves: Reserves | None  # bitcoin only

    def close(self) -> None:
        for adapter in self.adapters.values():
            adapter.close()
        self.engine.dispose()


# ---- the steps -----------------------------------------------------------------------------------

def open_engine(config: DeploymentConfig) -> Engine:
    """A pooled engine on the configured database, whose schema must be at head."""
    engine = make_engine(to_sqlalchemy_url(config.database_url))
    try:
        current, head = schema_revision(engine)
    except SQLAlchemyError as exc:
        engine.dispose()
        raise StartupError(f"database: {_db_reason(exc)}") from None
    if current != head:
        engine.dispose()
        raise StartupError(f"database: the schema is at {current or 'no revision'}, this code needs {head}: "
                           "run `python -m custody migrate` with the schema owner's DATABASE_URL")
    return engine


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
    """A node on another chain stops the start; an unreachable one is only logged (jobs retry)."""
    for chain, adapter in adapters.items():
        try:
            adapter.verify_network()  # type: ignore[attr-defined]
        except NodeUnavailable as exc:
            log.warning("%s node unreachable at start (%s); the jobs retry on their next run", chain, exc)
        except ChainError as exc:
            raise StartupError(f"{chain}: {exc}") from None


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


def apply_reference_data(config: DeploymentConfig, wallets: Wallets, deposits: Deposits) -> list[str]:
    """Make the database's wallets, assets and cursors agree with the file, writing only what
    differs; returns what was written (empty on a restart with an unchanged file)."""
    written: list[str] = []
    networks = wallet_networks(config)
    for chain, section in config.wallets.items():
        network = networks[chain]
        for tier, xpub in section.tiers().items():
            key = canonical_btc_account_key(xpub, network) if chain == "bitcoin" else xpub.strip()
            with wallets.engine.connect() as c:
                row = c.execute(text("SELECT xpub, network FROM wallet WHERE chain = :c AND tier = :t"),
                                {"c": chain, "t": tier}).first()
            if row is not None and (row.xpub, row.network) == (key, network):
                continue
            if row is not None:
                raise StartupError(f"wallets.{chain}.{tier}: the database has another key (or network {row.network}) "
                                   f"registered for {chain}/{tier}; a wallet's key is never replaced in place "
                                   "(addresses were issued from it)")
            wallets.register_wallet(chain, tier, network, key)
            written.append(f"wallet {chain}/{tier}")
    tokens = config.ethereum.tokens if config.ethereum else {}
    for symbol, asset in config.assets.items():
        contract = tokens.get(symbol)
        fast = asset.withdrawal_fee if asset.withdrawal_fee_fast is None else asset.withdrawal_fee_fast
        try:
            have = wallets.chain_asset(symbol)
            decimals = wallets.ledger.get_asset(symbol).decimals
        except LedgerError as exc:
            if exc.code is not ErrorCode.asset_not_found:
                raise
            have, decimals = None, asset.decimals
        if have is not None:
            if have.chain != asset.chain or (have.contract_address or "").lower() != (contract or "").lower():
                raise StartupError(f"assets.{symbol}: the database has it on {have.chain} "
                                   f"(contract {have.contract_address or 'none'}); the file says {asset.chain} "
                                   f"(contract {contract or 'none'}): an asset's chain and contract never change")
            if decimals != asset.decimals:
                raise StartupError(f"assets.{symbol}.decimals: the database has {decimals}, the file {asset.decimals}; "
                                   "an asset's decimals never change")
            if (have.finality_confirmations, have.dust_minimum, have.min_withdrawal, have.withdrawal_fee,
                    have.withdrawal_fee_fast) == (asset.finality, asset.dust_minimum, asset.min_withdrawal,
                                                  asset.withdrawal_fee, fast):
                continue
        try:
            wallets.configure_asset(symbol, asset.decimals, asset.chain, finality=asset.finality,
                                    dust_minimum=asset.dust_minimum, contract_address=contract,
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


def build_services(config: DeploymentConfig, *, adapters: Mapping[str, ChainAdapter] | None = None,
                   signer: SignerPort | None = None, engine: Engine | None = None) -> CustodyServices:
    """Everything both roots need, from `config` (tests may pass their own adapters, signer or
    engine; production passes none)."""
    engine = engine or open_engine(config)
    adapters = dict(adapters) if adapters is not None else build_adapters(config)
    verify_networks(adapters)
    signer = signer if signer is not None else signer_client(config)
    settings = config.settings
    ledger = Ledger(engine)
    wallets = Wallets(engine, ledger)
    deposits = Deposits(engine, ledger, wallets, adapters)
    apply_reference_data(config, wallets, deposits)
    networks = wallet_networks(config)
    btc_network = networks.get("bitcoin", "mainnet")  # with no bitcoin, nothing derives a bitcoin address
    approvers = config.approver_registry()
    withdrawals = Withdrawals(engine, ledger, wallets, PolicyProvider(), networks=networks,
                              destinations=DestinationGuard(engine, wallets, adapters), approvers=approvers)
    payouts = Payouts(engine, ledger, wallets, adapters, signer, PayoutConfig(bitcoin_network=btc_network))
    payouts.withdrawals = withdrawals
    sweeps = rebalances = reserves = None
    if "bitcoin" in adapters:
        hot = derive_btc_address(config.wallets["bitcoin"].hot, btc_network, 0, 0)
        sweeps = Sweeps(engine, ledger, wallets, adapters["bitcoin"], signer, hot_address=hot, network=btc_network)
        rebalances = Rebalances(engine, ledger, wallets, adapters["bitcoin"], signer, hot_address=hot,
                                config=RebalanceConfig(bitcoin_network=btc_network))
        reserves = Reserves(engine, adapters["bitcoin"], signer, network=btc_network)
    reconciliation = Reconciliation(engine, ledger, wallets, adapters, network=btc_network,
                                    before=payouts.sync_hot_wallet if "bitcoin" in adapters else None)
    adjustments = TreasuryAdjustments(engine, ledger, quorum=settings.treasury_adjustment_quorum)
    return CustodyServices(config=config, settings=settings, engine=engine, ledger=ledger, wallets=wallets,
                           adapters=adapters, signer=signer, deposits=deposits, withdrawals=withdrawals,
                           payouts=payouts, reconciliation=reconciliation, adjustments=adjustments,
                           approvers=approvers, sweeps=sweeps,
                           rebalances=rebalances, reserves=reserves)


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


__all__ = ["CustodyServices", "StartupError", "apply_reference_data", "build_adapters", "build_services",
           "dump_modules", "install_module_dump", "modules_file", "open_engine", "schema_revision", "signer_client"]
