"""One `anvil` on a free loopback port, and the test ERC-20 compiled from contracts/ and deployed.

Anvil's default dev accounts (the well-known "test test ... junk" mnemonic) are the faucet:
account 0 deploys the token (it is the token's owner and mints) and pays ether.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from web3 import HTTPProvider, Web3

from chain_adapters.errors import ChainError
from regtest.install import Tools, cache_root
from regtest.process import pid_alive, spawn, stop_pid
from regtest.util import free_port, wait_until

CHAIN_ID = 31337
REPO_ROOT = Path(__file__).resolve().parent.parent
TOKEN_SOURCE = REPO_ROOT / "contracts" / "TestToken.sol"
TOKEN_DECIMALS = 6
# anvil's first default account (public test mnemonic; never holds real value)
FAUCET_KEY = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"
FAUCET_ADDRESS = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"


@dataclass
class AnvilNode:
    anvil: Path
    datadir: Path
    rpc_port: int = 0
    pid: int | None = None

    @property
    def rpc_url(self) -> str:
        return f"http://127.0.0.1:{self.rpc_port}"

    @property
    def w3(self) -> Web3:
        return Web3(HTTPProvider(self.rpc_url, request_kwargs={"timeout": 30}))

    def start(self, *, detached: bool = False) -> None:
        self.rpc_port = self.rpc_port or free_port()
        self.datadir.mkdir(parents=True, exist_ok=True)
        proc = spawn([str(self.anvil), "--host", "127.0.0.1", "--port", str(self.rpc_port),
                      "--chain-id", str(CHAIN_ID)], self.datadir / "anvil.out", detached=detached)
        self.pid = proc.pid
        w3 = self.w3

        def ready() -> bool:
            if not pid_alive(proc.pid):
                raise ChainError(f"anvil exited; see {self.datadir / 'anvil.out'}")
            return w3.eth.chain_id == CHAIN_ID

        try:
            wait_until(ready, timeout=30, what="anvil RPC")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.pid is not None:
            pid, self.pid = self.pid, None
            stop_pid(pid)

    def call(self, method: str, *params):
        """A raw JSON-RPC call (anvil_*, evm_* methods)."""
        reply = self.w3.provider.make_request(method, list(params))
        if "error" in reply:
            raise ChainError(f"{method}: {reply['error']}")
        return reply.get("result")

    def mine(self, n: int = 1) -> None:
        self.call("anvil_mine", hex(n))

    def set_automine(self, on: bool) -> None:
        self.call("evm_setAutomine", on)

    def automine(self) -> bool:
        return bool(self.call("anvil_getAutomine"))

    def wait_mined(self, txid: str, timeout: float = 30) -> None:
        """Anvil's automine seals the block just after answering: wait for the receipt."""
        self.w3.eth.wait_for_transaction_receipt(txid, timeout=timeout, poll_latency=0.02)

    def fund(self, address: str, wei: int, *, wait: bool = True) -> str:
        """Send `wei` from the faucet account; returns the transaction hash, mined when automine is
        on and `wait` (the default)."""
        tx = self.w3.eth.send_transaction({"from": FAUCET_ADDRESS, "to": Web3.to_checksum_address(address),
                                           "value": wei})
        txid = "0x" + bytes(tx).hex()
        if wait and self.automine():
            self.wait_mined(txid)
        return txid


@dataclass(frozen=True)
class CompiledContract:
    abi: list
    bytecode: str


def compile_token(tools: Tools) -> CompiledContract:
    """Compile contracts/TestToken.sol with solc-js (cached by source hash)."""
    return compile_contract(tools, TOKEN_SOURCE, "TestToken")


def compile_contract(tools: Tools, source_path: Path, name: str) -> CompiledContract:
    """Compile contract `name` of a file under contracts/ with solc-js (cached by source hash)."""
    source = source_path.read_bytes()
    out = cache_root() / f"solc-{hashlib.sha256(source + str(tools.solcjs).encode()).hexdigest()[:16]}"
    abi_file = out / f"{name}.abi"
    bin_file = out / f"{name}.bin"
    if not bin_file.is_file():
        tmp = Path(tempfile.mkdtemp(prefix="solc-"))
        try:
            subprocess.run([str(tools.solcjs), "--bin", "--abi", "--optimize", "--base-path", str(REPO_ROOT),
                            "-o", str(tmp), str(source_path)], check=True, capture_output=True)
            out.mkdir(parents=True, exist_ok=True)
            shutil.copy(next(tmp.glob(f"*{name}.abi")), abi_file)
            shutil.copy(next(tmp.glob(f"*{name}.bin")), bin_file)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return CompiledContract(json.loads(abi_file.read_text()), "0x" + bin_file.read_text().strip())


def deploy_contract(w3: Web3, compiled: CompiledContract, *args) -> str:
    """Deploy from the faucet account; returns the contract's checksummed address once mined."""
    tx = w3.eth.contract(abi=compiled.abi, bytecode=compiled.bytecode).constructor(*args).transact({"from": FAUCET_ADDRESS})
    return Web3.to_checksum_address(w3.eth.wait_for_transaction_receipt(tx, timeout=30)["contractAddress"])


class TestToken:
    """The deployed test ERC-20 (6 decimals); account 0 owns and mints."""

    __test__ = False  # not a pytest class

    def __init__(self, w3: Web3, address: str, abi: list) -> None:
        self.w3 = w3
        self.address = Web3.to_checksum_address(address)
        self.contract = w3.eth.contract(address=self.address, abi=abi)

    @classmethod
    def deploy(cls, w3: Web3, compiled: CompiledContract, symbol: str = "USDT") -> TestToken:
        factory = w3.eth.contract(abi=compiled.abi, bytecode=compiled.bytecode)
        tx = factory.constructor(f"Test {symbol}", symbol).transact({"from": FAUCET_ADDRESS})
        receipt = w3.eth.wait_for_transaction_receipt(tx, timeout=30)
        return cls(w3, receipt["contractAddress"], compiled.abi)

    def _sent(self, tx, wait: bool) -> str:
        txid = "0x" + bytes(tx).hex()
        if wait and self.w3.provider.make_request("anvil_getAutomine", []).get("result"):
            self.w3.eth.wait_for_transaction_receipt(txid, timeout=30, poll_latency=0.02)
        return txid

    def mint(self, to: str, amount: int, *, wait: bool = True) -> str:
        """Mint to `to`; returns the tx hash, mined when automine is on and `wait` (the default)."""
        tx = self.contract.functions.mint(Web3.to_checksum_address(to), amount).transact({"from": FAUCET_ADDRESS})
        return self._sent(tx, wait)

    def transfer(self, sender: str, to: str, amount: int, *, wait: bool = True) -> str:
        tx = self.contract.functions.transfer(Web3.to_checksum_address(to), amount).transact({"from": sender})
        return self._sent(tx, wait)

    def balance_of(self, address: str) -> int:
        return self.contract.functions.balanceOf(Web3.to_checksum_address(address)).call()


def start_anvil(tools: Tools, datadir: Path, *, detached: bool = False) -> AnvilNode:
    node = AnvilNode(tools.anvil, datadir)
    node.start(detached=detached)
    return node
