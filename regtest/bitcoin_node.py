"""One `bitcoind -regtest` on a free loopback port, with a funded `faucet` wallet.

A fresh node starts from a cached, pre-mined chain template (200 blocks, the faucet owns 100 mature
coinbases), built once per bitcoind binary under the cache directory and copied per session, so
tests never wait for 101 blocks. The faucet is a test convenience only: adapters never use wallet
RPCs.
"""
from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from chain_adapters.errors import ChainError, RpcError
from chain_adapters.rpc import JsonRpcClient
from regtest.install import Tools, cache_root, log
from regtest.process import pid_alive, spawn, stop_pid
from regtest.util import free_port, wait_until

RPC_USER, RPC_PASSWORD = "custody", "regtest"
FAUCET = "faucet"
TEMPLATE_VERSION = "1"
TEMPLATE_BLOCKS = 200
RPC_IN_WARMUP = -28


def _args(datadir: Path, rpc_port: int) -> list[str]:
    return [
        "-regtest", f"-datadir={datadir}", "-listen=0", f"-rpcport={rpc_port}",
        f"-rpcuser={RPC_USER}", f"-rpcpassword={RPC_PASSWORD}", "-server=1", "-txindex=1",
        "-printtoconsole=0", "-fallbackfee=0.0002", "-persistmempool=0", "-dnsseed=0",
        "-fixedseeds=0", "-maxtipage=2000000000", "-rpcthreads=8", "-rpcworkqueue=64",
        "-keypool=20", "-discover=0", "-natpmp=0",
    ]


@dataclass
class BitcoinNode:
    bitcoind: Path
    datadir: Path
    rpc_port: int = 0
    pid: int | None = None
    _rpcs: dict[str, JsonRpcClient] = field(default_factory=dict, repr=False)

    @property
    def rpc_url(self) -> str:
        return f"http://{RPC_USER}:{RPC_PASSWORD}@127.0.0.1:{self.rpc_port}"

    def rpc(self, method: str, *params):
        return self._client("").call(method, *params)

    def wallet(self, method: str, *params):
        return self._client(f"/wallet/{FAUCET}").call(method, *params)

    def _client(self, path: str) -> JsonRpcClient:
        if path not in self._rpcs:
            self._rpcs[path] = JsonRpcClient(self.rpc_url + path, timeout=120)
        return self._rpcs[path]

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self, *, detached: bool = False, extra: tuple[str, ...] = ()) -> None:
        self.rpc_port = self.rpc_port or free_port()
        self.datadir.mkdir(parents=True, exist_ok=True)
        proc = spawn([str(self.bitcoind), *_args(self.datadir, self.rpc_port), *extra],
                     self.datadir / "bitcoind.out", detached=detached)
        self.pid = proc.pid

        def ready() -> bool:
            if not pid_alive(proc.pid):
                raise ChainError(f"bitcoind exited; see {self.datadir / 'bitcoind.out'} and "
                                 f"{self.datadir / 'regtest' / 'debug.log'}")
            try:
                self.rpc("getblockchaininfo")
                return True
            except RpcError as exc:
                if exc.rpc_code == RPC_IN_WARMUP:
                    return False
                raise

        try:
            wait_until(ready, timeout=60, what="bitcoind RPC")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for client in self._rpcs.values():
            client.close()
        self._rpcs.clear()
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        try:
            JsonRpcClient(self.rpc_url, timeout=5).call("stop")
            wait_until(lambda: not pid_alive(pid), timeout=30, what="bitcoind to exit")
        except Exception:  # noqa: BLE001 - fall through to signals
            pass
        stop_pid(pid)

    # -- faucet -------------------------------------------------------------------------------
    def ensure_faucet(self) -> None:
        if FAUCET not in self.rpc("listwallets"):
            try:
                self.rpc("loadwallet", FAUCET)
            except RpcError:
                self.rpc("createwallet", FAUCET)

    def mine(self, n: int = 1, address: str | None = None) -> list[str]:
        """Mine n blocks (to the faucet unless `address` is given); returns their hashes."""
        address = address or self.wallet("getnewaddress")
        return self.rpc("generatetoaddress", n, address)

    def fund(self, address: str, sat: int, *, replaceable: bool = True) -> str:
        """Pay `sat` satoshis from the faucet to `address` (unconfirmed); returns the txid."""
        btc = Decimal(sat) / Decimal(100_000_000)
        return self.wallet("sendtoaddress", address, str(btc), "", "", False, replaceable)


def _template_dir(bitcoind: Path) -> Path:
    stat = bitcoind.stat()
    key = hashlib.sha256(f"{bitcoind}:{stat.st_size}:{stat.st_mtime_ns}:{TEMPLATE_VERSION}"
                         .encode()).hexdigest()[:16]
    return cache_root() / f"chain-template-{key}"


def chain_template(tools: Tools) -> Path:
    """The pre-mined data directory for this bitcoind (built on first use, then reused)."""
    target = _template_dir(tools.bitcoind)
    if (target / "regtest" / "blocks").is_dir():
        return target
    log(f"building the pre-mined regtest chain template ({TEMPLATE_BLOCKS} blocks) in {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=target.parent, prefix="template-build-"))
    node = BitcoinNode(tools.bitcoind, work)
    try:
        node.start()
        node.ensure_faucet()
        node.mine(TEMPLATE_BLOCKS)
    finally:
        node.stop()
    for junk in ("bitcoind.out", "regtest/debug.log", "regtest/.lock", "regtest/bitcoind.pid"):
        (work / junk).unlink(missing_ok=True)
    if target.exists():
        shutil.rmtree(target)
    work.rename(target)
    return target


def start_bitcoind(tools: Tools, datadir: Path, *, detached: bool = False, template: Path | None = None,
                   extra: tuple[str, ...] = ()) -> BitcoinNode:
    """A running node in `datadir` (copied from the chain template, or from `template`: a stopped
    node's data directory made from it, e.g. bench/wallet_scale.py's large chains) with the faucet
    loaded; `extra` are more bitcoind arguments."""
    shutil.copytree(template or chain_template(tools), datadir, dirs_exist_ok=True)
    node = BitcoinNode(tools.bitcoind, datadir)
    node.start(detached=detached, extra=(f"-wallet={FAUCET}", *extra))
    node.mine(1)  # a fresh tip: leaves initial block download whatever the template's age
    return node
