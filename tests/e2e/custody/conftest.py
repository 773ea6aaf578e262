"""The custody service wired to the real regtest nodes, for the deposit (and later withdrawal) suites.

- `signer_keys`  SignerKeys from the BIP84 test mnemonic (regtest only; never a real seed)
- `custody`      a Container on the session database with both chain adapters, deposit wallets
                 registered from the signer's xpubs, BTC (finality 3), ETH and USDT (finality 12)
                 configured, each chain's cursor started at the node's tip, and the approver keys of
                 tests/approvers.py TEST_OPERATORS (op-alice, op-bob, ...) trusted by custody and
                 the in-process signer, which is configured as signer.toml would be: its own asset
                 table (the test token's contract), anvil's chain id and the seed's cold account
                 xpub as the pinned cold wallet; every reconciliation pass cross-checks the wallet
                 index against the node's own watch-only wallet (custody.node_view)
- `customer`     (function) a factory: customer(asset) -> a new customer account id
- `settle`       (function) run the deposit jobs for a chain until nothing moves
- `pay_out`      (function) run the payout jobs once: batch, sign, broadcast, track
"""
from __future__ import annotations

import uuid

import pytest

from custody.container import Container
from custody.devchains import BTC_FINALITY, ETH_FINALITY, configure_regtest, signer_asset_entries
from custody.settings import Settings
from ledger.service import Ledger
from signer.assets import assets_from_entries
from signer.keys import Secret, SignerKeys, seed_from_text
from tests.approvers import registry

TEST_MNEMONIC = "abandon " * 11 + "about"
__all__ = ["BTC_FINALITY", "ETH_FINALITY", "TEST_MNEMONIC"]


@pytest.fixture(scope="session")
def signer_keys() -> SignerKeys:
    return SignerKeys(seed_from_text(Secret(TEST_MNEMONIC)), "regtest")


@pytest.fixture(scope="session")
def custody(engine, btc_adapter, eth_adapter, usdt, signer_keys) -> Container:
    container = Container(settings=Settings(environment="test"), engine=engine, ledger=Ledger(engine))
    container.with_chains({"bitcoin": btc_adapter, "ethereum": eth_adapter}, signer_keys=signer_keys, approvers=registry(),
                          signer_assets=assets_from_entries(signer_asset_entries(usdt.address)),
                          ethereum_chain_id=eth_adapter.chain_id,
                          cold_xpubs={"bitcoin": signer_keys.account_xpub("bitcoin", "cold")}, node_view=True)
    configure_regtest(container, signer_keys, usdt.address)
    return container


@pytest.fixture
def customer(custody):
    def make(asset: str, owner: str | None = None) -> int:
        owner = owner or f"cust-{uuid.uuid4().hex[:10]}"
        return custody.wallets.customer_account(owner, asset)
    return make


@pytest.fixture
def settle(custody):
    def run(chain: str) -> None:
        custody.deposits.run_once([chain])
    return run


@pytest.fixture
def pay_out(custody):
    def run() -> None:
        p = custody.payouts
        p.batch_bitcoin()
        p.batch_ethereum()
        p.sign_open_batches()
        p.broadcast()
        p.track()
    return run
