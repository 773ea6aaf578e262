"""Local regtest chains for `python -m custody serve --demo`: start bitcoind and anvil (with the
test ERC-20) under STATE_DIR, derive the wallets from a development seed, and wire the chain side
of the container. Development only: the seed is generated once into STATE_DIR/dev-seed.txt
(owner-only permissions) and never used outside regtest. The demo's scripted approver gets a fresh
Ed25519 key per run (`DevChains.approver_key`, in memory only), registered as the one approver
custody and its in-process signer trust, under the operator name `approver_name`.
"""
from __future__ import annotations

import logging
import os
import secrets
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from bip_utils import Bip39MnemonicGenerator, Bip39WordsNum
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from chain_adapters.bitcoin import BitcoinAdapter
from chain_adapters.ethereum import EthereumAdapter
from custody.approve_cli import key_id_of
from custody.container import Container
from regtest.cluster import Cluster, start_cluster
from signer.approvals import ApproverKey, ApproverRegistry
from signer.keys import SignerKeys

log = logging.getLogger(__name__)
BTC_FINALITY, ETH_FINALITY = 3, 12


@dataclass
class DevChains:
    cluster: Cluster
    keys: SignerKeys
    miner: threading.Event
    approver_name: str  # the demo approver's operator (and API key) name
    approver_key: Ed25519PrivateKey

    def stop(self) -> None:
        self.miner.set()
        self.cluster.stop()


def dev_seed_file(state_dir: Path) -> Path:
    path = state_dir / "dev-seed.txt"
    if not path.exists():
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(str(Bip39MnemonicGenerator().FromWordsNumber(Bip39WordsNum.WORDS_NUM_24)) + "\n")
        log.info("generated a development seed in %s (regtest only)", path)
    return path


def configure_regtest(container: Container, keys: SignerKeys, token_address: str) -> None:
    """Regtest reference data, shared by the demo and the e2e suites: deposit and hot wallets from
    the signer's xpubs; BTC (finality 3), ETH and the test USDT (finality 12) with their dust
    minimums, minimum withdrawals and quoted fees; each chain's scan cursor at the node's tip."""
    w = container.wallets
    for chain in ("bitcoin", "ethereum"):
        for tier in ("deposit", "hot"):
            w.register_wallet(chain, tier, "regtest", keys.account_xpub(chain, tier))
    w.configure_asset("BTC", 8, "bitcoin", finality=BTC_FINALITY, dust_minimum=1_000, min_withdrawal=10_000,
                      withdrawal_fee=5_000, withdrawal_fee_fast=20_000)
    w.configure_asset("ETH", 18, "ethereum", finality=ETH_FINALITY, dust_minimum=10**9, min_withdrawal=10**15,
                      withdrawal_fee=10**15)
    w.configure_asset("USDT", 6, "ethereum", finality=ETH_FINALITY, dust_minimum=10_000,
                      contract_address=token_address, min_withdrawal=10**6, withdrawal_fee=10**6)
    for chain in ("bitcoin", "ethereum"):
        container.deposits.start_cursor(chain)


def start_dev_chains(container: Container, *, mine_every: float = 2.0) -> DevChains:
    """Start both nodes, configure wallets and assets, attach adapters, and mine a block every
    `mine_every` seconds (regtest has no miners of its own)."""
    root = container.settings.state_dir / "demo-chains"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    log.info("starting bitcoind -regtest and anvil under %s", root)
    cluster = start_cluster(root)
    keys = SignerKeys.load("regtest", path=dev_seed_file(container.settings.state_dir))
    btc = BitcoinAdapter(cluster.bitcoin.rpc_url, network="regtest")
    eth = EthereumAdapter(cluster.anvil.rpc_url, network="regtest", tokens={cluster.token.address: "USDT"})
    approver_name, approver_key = f"demo-approver-{secrets.token_hex(4)}", Ed25519PrivateKey.generate()
    public = approver_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    approvers = ApproverRegistry([ApproverKey(key_id_of(approver_key), approver_name, "ed25519", public)])
    container.with_chains({"bitcoin": btc, "ethereum": eth}, signer_keys=keys, approvers=approvers)
    configure_regtest(container, keys, cluster.token.address)
    stop = threading.Event()

    def mine() -> None:
        while not stop.wait(mine_every):
            try:
                cluster.bitcoin.mine(1)
                cluster.anvil.mine(1)
            except Exception:  # noqa: BLE001 - the nodes are stopping
                return

    threading.Thread(target=mine, name="regtest-miner", daemon=True).start()
    return DevChains(cluster, keys, stop, approver_name, approver_key)
