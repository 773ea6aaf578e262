"""bootstrap(): the one place where settings, database, ledger, wallets, chain adapters and jobs are
wired together. The HTTP app, the CLI, the scheduler and the tests all get their services here."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

from sqlalchemy import Engine

from chain_adapters.base import ChainAdapter
from chain_adapters.errors import ChainError
from custody.adjustments import TreasuryAdjustments
from custody.convert.prices import PriceChanges
from custody.database import make_engine, migrate, server_url
from custody.deposits import Deposits, ExternalScreener
from custody.destinations import DestinationGuard
from custody.settings import Settings, get_settings
from custody.wallets import Wallets
from custody.webhooks.endpoints import Webhooks
from ledger.service import Ledger
from signer.approvals import ApproverRegistry, QuorumTable, quorum_table_from_policy
from signer.assets import SignerAsset

log = logging.getLogger(__name__)


@dataclass
class Container:
    settings: Settings
    engine: Engine
    ledger: Ledger
    wallets: Wallets | None = None
    adapters: Mapping[str, ChainAdapter] = field(default_factory=dict)
    deposits: Deposits | None = None
    trading: Any = None  # custody.trading.Trading, attached by custody.trading.attach()
    convert: Any = None  # custody.convert.service.Convert, built by the convert routes on first use
    withdrawals: Any = None  # custody.withdrawals.Withdrawals, with chains and a signer
    payouts: Any = None  # custody.payouts.Payouts
    reconciliation: Any = None  # custody.reconciliation.Reconciliation (every attached chain)
    sweeps: Any = None  # custody.sweeps.Sweeps (bitcoin, with a signer)
    eth_sweeps: Any = None  # custody.eth_sweeps.EthSweeps (ethereum deposits -> hot, with gas funding and a signer)
    rebalances: Any = None  # custody.rebalances.Rebalances (bitcoin hot -> cold, with a signer)
    eth_rebalances: Any = None  # custody.eth_rebalances.EthRebalances (ethereum hot -> warm/cold, with a signer)
    reserves: Any = None  # custody.reserves.Reserves (with bitcoin and a signer; ethereum assets too)
    node_view: Any = None  # custody.node_view.NodeView (bitcoin, with_chains(node_view=True))
    approvers: ApproverRegistry | None = None  # approver public keys approvals (withdrawals, refills, adjustments) must verify against
    adjustments: TreasuryAdjustments = field(init=False)
    price_changes: PriceChanges = field(init=False)  # convert's operator prices: signed, set by the worker's job
    webhooks: Webhooks = field(init=False)  # webhook endpoints (admin API) and the worker's delivery job

    def __post_init__(self) -> None:
        if self.wallets is None:
            self.wallets = Wallets(self.engine, self.ledger)
        self.adjustments = TreasuryAdjustments(self.engine, self.ledger, quorum=self.settings.treasury_adjustment_quorum,
                                               approvers=self.approvers)
        self.price_changes = PriceChanges(self.engine, self.ledger, approvers=self.approvers)
        self.webhooks = Webhooks(self.engine, self.settings)

    def with_chains(self, adapters: Mapping[str, ChainAdapter], *, external_screener: ExternalScreener | None = None,
                    signer_keys: Any = None, bitcoin_network: str = "regtest", policy: Any = None,
                    payout_config: Any = None, rebalance_config: Any = None, approvers: ApproverRegistry | None = None,
                    quorum: QuorumTable | None = None, signer_assets: Mapping[str, SignerAsset] | None = None,
                    ethereum_chain_id: int | None = None, cold_xpubs: Mapping[str, str] | None = None,
                    node_view: bool = False, eth_rebalance_config: Any = None,
                    cold_addresses: Mapping[str, str] | None = None) -> "Container":
        """Attach chain adapters and build the pipelines that need them. With `signer_keys` (a
        signer.keys.SignerKeys) the withdrawal side is built too: request/approval, the signer, payouts,
        sweeps and rebalances (thresholds: `rebalance_config`, a custody.rebalances.RebalanceConfig;
        ethereum sweeps: each asset's `sweep_threshold` of `policy`).
        `approvers` (kept as `self.approvers` when given) are the approver keys custody verifies an
        approval against and, in this in-process wiring, the signer too; `quorum` is the signer's own
        quorum table (default: the amount tiers of `policy`, or of the default policy). The in-process
        signer's own boundary settings (signer.config's `assets`, `ethereum_chain_id`, `cold_xpubs`)
        are `signer_assets` (default: BTC only), `ethereum_chain_id` (default: none, so no ethereum
        payment is signed) and `cold_xpubs` (default: none, so no rebalance is signed); tests give
        them as a deployment's signer.toml would (custody.devchains.signer_assets). `node_view`
        (bitcoin): reconciliation cross-checks the wallet index against a watch-only wallet in the
        node (custody.node_view); each pass first runs `self.node_view.ensure()` (creates the wallet,
        widens its ranges), which the deployed worker does in its `node-view` job instead.
        `eth_rebalance_config` (custody.eth_rebalances.EthRebalanceConfig) builds the ethereum
        rebalances (and reconciliation's ethereum warm and cold lines); `cold_addresses` is the
        in-process signer's pinned ethereum cold address (signer.config `cold_addresses`)."""
        from custody.payouts import PayoutConfig, Payouts
        from custody.policy_config import PolicyProvider, default_policy, sweep_minimums
        from custody.withdrawals import Withdrawals
        from signer.service import Signer

        self.adapters = dict(adapters)
        if approvers is not None:
            self.approvers = self.adjustments.approvers = approvers
        self.deposits = Deposits(self.engine, self.ledger, self.wallets, self.adapters, external_screener=external_screener)
        networks = {"bitcoin": bitcoin_network, "ethereum": bitcoin_network}
        self.withdrawals = Withdrawals(self.engine, self.ledger, self.wallets, PolicyProvider(policy), networks=networks,
                                       destinations=DestinationGuard(self.engine, self.wallets, self.adapters),
                                       approvers=self.approvers)
        if signer_keys is not None:
            signer = Signer(self.engine, signer_keys, bitcoin_network=bitcoin_network, approvers=self.approvers,
                            quorum=quorum or quorum_table_from_policy(policy or default_policy()), assets=signer_assets,
                            ethereum_chain_id=ethereum_chain_id, cold_xpubs=cold_xpubs, cold_addresses=cold_addresses)
            config = payout_config or PayoutConfig(bitcoin_network=bitcoin_network)
            self.payouts = Payouts(self.engine, self.ledger, self.wallets, self.adapters, signer, config)
            self.payouts.withdrawals = self.withdrawals
            if "ethereum" in self.adapters:
                from custody.addresses import derive_eth_address
                from custody.destinations import HOT_RECEIVE_INDEX
                from custody.eth_sweeps import EthSweeps

                thresholds = {a: p.sweep_threshold for a, p in (policy or default_policy()).assets.items()
                              if p.sweep_threshold is not None}
                self.eth_sweeps = EthSweeps(self.engine, self.ledger, self.wallets, self.adapters["ethereum"], signer,  # type: ignore[arg-type]
                                            hot_address=derive_eth_address(signer_keys.account_xpub("ethereum", "hot"), HOT_RECEIVE_INDEX),
                                            thresholds=thresholds, min_per_address=sweep_minimums(policy or default_policy()),
                                            max_fee_wei=config.max_fee_wei)
                if eth_rebalance_config is not None:
                    from custody.eth_rebalances import EthRebalances

                    self.eth_rebalances = EthRebalances(
                        self.engine, self.ledger, self.wallets, self.adapters["ethereum"], signer,  # type: ignore[arg-type]
                        hot_address=derive_eth_address(signer_keys.account_xpub("ethereum", "hot"), HOT_RECEIVE_INDEX),
                        warm_address=derive_eth_address(signer_keys.account_xpub("ethereum", "warm"), 0),
                        config=eth_rebalance_config, approvers=self.approvers)
            if "bitcoin" in self.adapters:  # the hot wallet sync reads the wallet index: bring it to the tip first
                deposits = self.deposits
                self.payouts.catch_up = lambda: deposits.catch_up("bitcoin")
            if "bitcoin" in self.adapters:
                from custody.addresses import derive_btc_address
                from custody.sweeps import Sweeps

                hot = derive_btc_address(signer_keys.account_xpub("bitcoin", "hot"), bitcoin_network, 0, 0)
                self.sweeps = Sweeps(self.engine, self.ledger, self.wallets, self.adapters["bitcoin"], signer,
                                     hot_address=hot, network=bitcoin_network)
                from custody.rebalances import RebalanceConfig, Rebalances

                self.rebalances = Rebalances(self.engine, self.ledger, self.wallets, self.adapters["bitcoin"], signer,
                                             hot_address=hot, approvers=self.approvers,
                                             config=rebalance_config or RebalanceConfig(
                                                 bitcoin_network=bitcoin_network,
                                                 refill_ttl=(policy or default_policy()).refill_ttl))
                from custody.reserves import Reserves

                self.reserves = Reserves(self.engine, self.adapters, signer, network=bitcoin_network,
                                         parts=self.settings.reserves_leaves_per_account)
        if self.adapters:
            from custody.reconciliation import Reconciliation

            sync = self.payouts.sync_hot_wallet if self.payouts and "bitcoin" in self.adapters else None
            if node_view and "bitcoin" in self.adapters:
                from custody.node_view import NodeView

                self.node_view = view = NodeView(self.engine, self.adapters["bitcoin"], network=bitcoin_network)  # type: ignore[arg-type]
                synced = sync

                def before() -> None:  # the worker's `node-view` job, run here before each pass instead
                    if synced is not None:
                        synced()
                    try:
                        view.ensure()
                    except ChainError as exc:  # recorded and reported by ensure; the pass runs blind and counts it
                        log.warning("node view not ensured: %s", exc)
                sync = before
            self.reconciliation = Reconciliation(self.engine, self.ledger, self.wallets, self.adapters,
                                                 network=bitcoin_network, before=sync, node_view=self.node_view,
                                                 blind_warn_after=self.settings.node_view_warn_after_seconds,
                                                 blind_critical_after=self.settings.node_view_critical_after_seconds)
            if self.eth_rebalances is not None:
                self.reconciliation.eth_outer = self.eth_rebalances.destinations()
        return self


def bootstrap(settings: Settings | None = None, *, url: str | None = None, run_migrations: bool = True) -> Container:
    settings = settings or get_settings()
    url = url or server_url(settings)
    if run_migrations:
        migrate(url)
    engine = make_engine(url)
    return Container(settings=settings, engine=engine, ledger=Ledger(engine))
