"""One face for both chains so a test body can run against bitcoind and anvil alike.

A ChainHarness names its chain (`name`, `asset`, a test-sized `amount`), holds the adapter under test
(`adapter`) and its node (`node`), and makes what only tests need: fresh addresses of Python-held
keys, Python-signed payments (tests/e2e/txbuild.py), balances as the adapter reports them. What a
test does to the chain itself (faucet payments, mining, holding blocks back, reorgs) is
`regtest.control`'s, on `harness.node`: `control.pay(chain.node, address, amount)`,
`control.mine(chain.node, n)`, `with control.hold_mining(chain.node):`.
"""
from __future__ import annotations

import itertools

from chain_adapters.base import ChainAdapter, Utxo
from chain_adapters.bitcoin import BitcoinAdapter
from chain_adapters.ethereum import EthereumAdapter
from regtest import control
from regtest.anvil_node import AnvilNode
from regtest.bitcoin_node import BitcoinNode
from regtest.util import wait_until
from tests.e2e import txbuild

_counter = itertools.count()


class ChainHarness:
    name: str
    asset: str
    amount: int  # a test-sized payment, deliberately not round
    adapter: ChainAdapter
    node: BitcoinNode | AnvilNode

    def new_address(self, label: str = "") -> str: raise NotImplementedError
    def signed_payment(self, address: str, amount: int) -> bytes: raise NotImplementedError
    def balance(self, address: str) -> int: raise NotImplementedError


class BitcoinHarness(ChainHarness):
    name, asset, amount = "bitcoin", "BTC", 12_345_678

    def __init__(self, node: BitcoinNode, adapter: BitcoinAdapter) -> None:
        self.node = node
        self.adapter = adapter

    def new_address(self, label: str = "") -> str:
        return txbuild.BtcKey.from_label(f"{label}-{next(_counter)}-{id(self)}").address

    def funded_key(self, amount: int) -> tuple[txbuild.BtcKey, Utxo]:
        """A fresh Python-held key with one confirmed output of `amount` satoshis."""
        key = txbuild.BtcKey.from_label(f"funded-{next(_counter)}-{id(self)}")
        control.faucet_bitcoin(self.node, key.address, amount)
        control.mine(self.node, 1)
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

    def __init__(self, node: AnvilNode, adapter: EthereumAdapter) -> None:
        self.node = node
        self.adapter = adapter

    def new_address(self, label: str = "") -> str:
        return txbuild.eth_new_address(f"{label}-{next(_counter)}-{id(self)}")

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
