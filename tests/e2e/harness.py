"""One face for both chains so a test body can run against bitcoind and anvil alike.

A ChainHarness knows how to make a fresh watched address, pay it from the faucet, build a
Python-signed payment, and mine; the adapter under test is `harness.adapter`.
"""
from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

from chain_adapters.base import ChainAdapter, Utxo
from chain_adapters.bitcoin import BitcoinAdapter
from chain_adapters.ethereum import EthereumAdapter
from regtest.cluster import Cluster
from regtest.util import wait_until
from tests.e2e import txbuild

_counter = itertools.count()


class ChainHarness:
    name: str
    asset: str
    amount: int  # a test-sized payment, deliberately not round
    adapter: ChainAdapter

    def new_address(self, label: str = "") -> str: raise NotImplementedError
    def pay(self, address: str, amount: int) -> str: raise NotImplementedError
    def signed_payment(self, address: str, amount: int) -> bytes: raise NotImplementedError
    def mine(self, n: int = 1) -> None: raise NotImplementedError
    def balance(self, address: str) -> int: raise NotImplementedError

    @contextlib.contextmanager
    def hold_mining(self) -> Iterator[None]:
        """Transactions sent inside stay in the mempool; on exit one block mines them."""
        yield
        self.mine(1)


class BitcoinHarness(ChainHarness):
    name, asset, amount = "bitcoin", "BTC", 12_345_678

    def __init__(self, cluster: Cluster, adapter: BitcoinAdapter) -> None:
        self.node = cluster.bitcoin
        self.adapter = adapter

    def new_address(self, label: str = "") -> str:
        return txbuild.BtcKey.from_label(f"{label}-{next(_counter)}-{id(self)}").address

    def pay(self, address: str, amount: int) -> str:
        return self.node.fund(address, amount)

    def mine(self, n: int = 1) -> None:
        self.node.mine(n)

    def funded_key(self, amount: int) -> tuple[txbuild.BtcKey, Utxo]:
        """A fresh Python-held key with one confirmed output of `amount` satoshis."""
        key = txbuild.BtcKey.from_label(f"funded-{next(_counter)}-{id(self)}")
        self.node.fund(key.address, amount)
        self.mine(1)
        [utxo] = wait_until(lambda: self.adapter.unspent([key.address]), what="funding output")
        return key, utxo

    def signed_payment(self, address: str, amount: int, fee: int = 2_000) -> bytes:
        key, utxo = self.funded_key(amount + fee + 100_000)
        return txbuild.spend_p2wpkh(key, utxo.txid, utxo.index, utxo.amount,
                                    [(address, amount), (key.address, utxo.amount - amount - fee)])

    def balance(self, address: str) -> int:
        return sum(u.amount for u in self.adapter.unspent([address]))


class EthereumHarness(ChainHarness):
    name, asset, amount = "ethereum", "ETH", 1_234_567_890_123_456_789

    def __init__(self, cluster: Cluster, adapter: EthereumAdapter) -> None:
        self.node = cluster.anvil
        self.adapter = adapter

    def new_address(self, label: str = "") -> str:
        return txbuild.eth_new_address(f"{label}-{next(_counter)}-{id(self)}")

    def pay(self, address: str, amount: int) -> str:
        return self.node.fund(address, amount)

    def mine(self, n: int = 1) -> None:
        self.node.mine(n)

    @contextlib.contextmanager
    def hold_mining(self) -> Iterator[None]:
        self.node.set_automine(False)
        try:
            yield
            self.node.mine(1)  # explicitly: re-enabling automine would mine them asynchronously
        finally:
            self.node.set_automine(True)

    def signed_payment(self, address: str, amount: int) -> bytes:
        adapter = self.adapter
        assert isinstance(adapter, EthereumAdapter)
        sender = txbuild.eth_address(txbuild.ETH_DEV_KEY_1)
        fee = adapter.estimate_fee()
        return txbuild.eip1559_transfer(txbuild.ETH_DEV_KEY_1, to=address, value=amount,
                                        nonce=adapter.nonce(sender), chain_id=adapter.chain_id,
                                        max_fee=fee.max_fee_wei, priority_fee=max(fee.priority_fee_wei, 1))

    def balance(self, address: str) -> int:
        adapter = self.adapter
        assert isinstance(adapter, EthereumAdapter)
        return adapter.balance(address)
