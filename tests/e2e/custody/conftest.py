"""The custody service wired to the real regtest nodes, for the deposit (and later withdrawal) suites.

- `signer_keys`  SignerKeys from the BIP84 test mnemonic (regtest only; never a real seed)
- `custody`      a Container on the session database with both chain adapters, deposit wallets
                 registered from the signer's xpubs, BTC (finality 3), ETH and USDT (finality 12)
                 configured, and each chain's cursor started at the node's tip
- `customer`     (function) a factory: customer(asset) -> a new customer account id
- `settle`       (function) run the deposit jobs for a chain until nothing moves
"""
from __future__ import annotations

import uuid

import pytest

from custody.container import Container
from custody.settings import Settings
from ledger.service import Ledger
from signer.keys import Secret, SignerKeys, seed_from_text

TEST_MNEMONIC = "abandon " * 11 + "about"
BTC_FINALITY, ETH_FINALITY = 3, 12


@pytest.fixture(scope="session")
def signer_keys() -> SignerKeys:
    return SignerKeys(seed_from_text(Secret(TEST_MNEMONIC)), "regtest")


@pytest.fixture(scope="session")
def custody(engine, btc_adapter, eth_adapter, usdt, signer_keys) -> Container:
    container = Container(settings=Settings(environment="test"), engine=engine, ledger=Ledger(engine))
    container.with_chains({"bitcoin": btc_adapter, "ethereum": eth_adapter})
    w = container.wallets
    w.register_wallet("bitcoin", "deposit", "regtest", signer_keys.account_xpub("bitcoin", "deposit"))
    w.register_wallet("ethereum", "deposit", "regtest", signer_keys.account_xpub("ethereum", "deposit"))
    w.configure_asset("BTC", 8, "bitcoin", finality=BTC_FINALITY, dust_minimum=1_000)
    w.configure_asset("ETH", 18, "ethereum", finality=ETH_FINALITY, dust_minimum=10**9)
    w.configure_asset("USDT", 6, "ethereum", finality=ETH_FINALITY, dust_minimum=10_000, contract_address=usdt.address)
    for chain in ("bitcoin", "ethereum"):
        container.deposits.start_cursor(chain)
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
