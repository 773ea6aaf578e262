"""Chain control for end-to-end suites: what a test does to the regtest chains to put the service
under the conditions of a real network (blocks, reorgs, fee spikes, slow or dead nodes).

Every helper takes the node objects of `regtest.cluster` (`BitcoinNode`, `AnvilNode`, a `Cluster`),
so it works on nodes started by the pytest plugin (`custody_regtest`), by our own e2e fixtures or by
`python -m regtest up` (the CLI commands of `regtest.__main__` call these functions). Amounts are
integers in minor units (satoshis, wei, token units), never floats.

- `mine(node, n, address=None)` / `mine_until_confirmed(node, txid)`: blocks on either chain.
- `hold_mining(node)`: transactions sent inside the `with` block wait in the mempool; one block mines
  them on exit. `manual_mining(anvil)`: anvil's automine off for the block (the test mines), restored
  on exit even when the block raises.
- `reorg_bitcoin(node, depth, drop=(), replace={})`: undo the last `depth` blocks and mine a longer
  competing chain without the `drop` transactions (each double-spent, by `replace`'s raw transaction
  or back to the faucet, so it can never be re-mined); `reorg_ethereum(node, depth, keep=())`:
  `anvil_reorg`, the new blocks holding only the `keep` raw transactions (`raw_transaction(txid)`).
- `FeeSpike(node, sat_per_vb)`: while active, the mempool is filled with faucet payments paying
  `sat_per_vb` and `spike.mine(n)` mines blocks holding only transactions whose fee rate reaches
  the spike's (full blocks: anything cheaper waits), which also teaches bitcoind's fee estimator
  the new rate (`estimatesmartfee` rises).
- `stop_node` / `start_node` / `hang_node` (SIGSTOP, a context manager that SIGCONTs on exit).
- `advance_time(anvil, seconds)`: anvil's clock (the next block's timestamp moves on).
- `deploy_erc20(anvil, tools, symbol)` / `mint(token, to, amount)`; `faucet_bitcoin` /
  `faucet_ether` pay from the nodes' funded dev accounts, `pay(node, address, amount)` from either
  in its minor unit (the chain-agnostic form a conformance test uses).

Errors: a node that refuses a call raises `chain_adapters.errors.ChainError` (or `RpcError`, its
subclass, with bitcoind's code); `ControlError` means the helper's own precondition failed (e.g. a
transaction to drop is not in the blocks being undone, a reorg deeper than the chain).
"""
from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Iterator, Mapping
from decimal import Decimal

from chain_adapters.errors import ChainError
from regtest.anvil_node import AnvilNode, TestToken, compile_token
from regtest.bitcoin_node import BitcoinNode
from regtest.install import Tools
from regtest.util import wait_until

SAT = 100_000_000


class ControlError(AssertionError):
    """A chain-control precondition failed (the chain is not in the state the helper needs)."""


# ---- mining -----------------------------------------------------------------------------------

def mine(node: BitcoinNode | AnvilNode, n: int = 1, address: str | None = None) -> None:
    """Mine `n` blocks; on bitcoind to `address` (default: the faucet wallet)."""
    if n < 1:
        raise ControlError(f"mine: n must be at least 1, got {n}")
    if isinstance(node, BitcoinNode):
        node.mine(n, address=address)
    else:
        node.mine(n)


@contextlib.contextmanager
def manual_mining(node: AnvilNode) -> Iterator[None]:
    """Anvil's automine off inside the `with` block (transactions wait until the test mines), back
    on at exit, even when the block raises."""
    node.set_automine(False)
    try:
        yield
    finally:
        node.set_automine(True)


@contextlib.contextmanager
def hold_mining(node: BitcoinNode | AnvilNode) -> Iterator[None]:
    """Transactions sent inside the `with` block stay in the mempool; on a normal exit one block
    mines them. (bitcoind mines only when asked; anvil's automine is off meanwhile: `manual_mining`.
    The block is mined explicitly: turning automine back on would mine them asynchronously.)"""
    if isinstance(node, BitcoinNode):
        yield
        node.mine(1)
        return
    with manual_mining(node):
        yield
        node.mine(1)


def confirmations(node: BitcoinNode | AnvilNode, txid: str) -> int:
    """How many blocks confirm `txid` (0 while in the mempool or unknown)."""
    if isinstance(node, BitcoinNode):
        try:
            tx = node.rpc("getrawtransaction", txid, True)
        except ChainError:
            return 0
        return int(tx.get("confirmations", 0))
    receipt = node.call("eth_getTransactionReceipt", txid)
    if not receipt or receipt.get("blockNumber") is None:
        return 0
    return node.w3.eth.block_number - int(receipt["blockNumber"], 16) + 1


def mine_until_confirmed(node: BitcoinNode | AnvilNode, txid: str, *, confirmations_wanted: int = 1,
                         max_blocks: int = 50) -> int:
    """Mine one block at a time until `txid` has `confirmations_wanted`; the blocks mined. Raises
    ControlError when `max_blocks` did not confirm it (it is not in the mempool, or pays too little)."""
    for mined in range(max_blocks + 1):
        if confirmations(node, txid) >= confirmations_wanted:
            return mined
        mine(node, 1)
    raise ControlError(f"{txid} has {confirmations(node, txid)} confirmations after {max_blocks} blocks")


# ---- reorgs -----------------------------------------------------------------------------------

def reorg_bitcoin(node: BitcoinNode, depth: int, *, drop: Iterable[str] = (),
                  replace: Mapping[str, bytes] | None = None, extra_blocks: int = 1,
                  address: str | None = None) -> list[str]:
    """Undo the last `depth` blocks (invalidateblock) and mine `depth + extra_blocks` competing blocks
    that hold every transaction the undone blocks returned to the mempool except those in `drop`.

    `replace` maps a dropped txid to a raw transaction (bytes) spending one of its inputs: it is sent
    first, so the dropped one is double-spent and can never confirm. A dropped transaction with no
    replacement is double-spent back to the faucet when the faucet signed it, else kept out of this
    node's blocks (`_evict`).
    Returns the new blocks' hashes. The undone blocks stay invalid on this node."""
    drop, replace = set(drop), dict(replace or {})
    if not set(replace) <= drop:
        raise ControlError(f"replace names transactions not dropped: {sorted(set(replace) - drop)}")
    height = node.rpc("getblockcount")
    if not 1 <= depth <= height:
        raise ControlError(f"reorg depth {depth} outside 1..{height}")
    fork_hash = node.rpc("getblockhash", height - depth + 1)
    undone: set[str] = set()
    for h in range(height - depth + 1, height + 1):
        undone.update(node.rpc("getblock", node.rpc("getblockhash", h), 1)["tx"][1:])  # not the coinbase
    missing = drop - undone
    if missing:
        raise ControlError(f"not in the last {depth} blocks: {sorted(missing)}")
    node.rpc("invalidateblock", fork_hash)
    for raw in replace.values():
        node.rpc("sendrawtransaction", raw.hex(), 0)
    for txid in drop - set(replace):
        _evict(node, txid)
    keep: list[str] = []
    mempool = node.rpc("getrawmempool", True)
    for txid in sorted(mempool, key=lambda t: mempool[t]["ancestorcount"]):  # parents first
        if txid in drop or set(mempool[txid]["depends"]) & drop:
            continue
        keep.append(txid)
    target = address or node.wallet("getnewaddress")
    hashes = [node.rpc("generateblock", target, keep)["hash"]]
    if depth + extra_blocks > 1:
        hashes += node.rpc("generatetoaddress", depth + extra_blocks - 1, target)
    return hashes


def _evict(node: BitcoinNode, txid: str) -> None:
    """Make sure a dropped transaction never confirms. When the faucet wallet can sign its inputs
    (a faucet payment: the usual deposit a test drops), it is double-spent back to the faucet at a
    higher fee; otherwise it is prioritised to a negative fee so no block template of this node
    takes it (it stays valid: a peer could still mine it)."""
    if txid not in node.rpc("getrawmempool"):
        return
    tx = node.rpc("getrawtransaction", txid, True)
    entry = node.rpc("getmempoolentry", txid)
    spent = sum(Decimal(str(node.rpc("getrawtransaction", i["txid"], True)["vout"][i["vout"]]["value"]))
                for i in tx["vin"])
    fee = Decimal(str(entry["fees"]["base"]))
    back = spent - 2 * fee - Decimal("0.00001")
    if back > Decimal("0.00001"):
        raw = node.rpc("createrawtransaction", [{"txid": i["txid"], "vout": i["vout"]} for i in tx["vin"]],
                       [{node.wallet("getnewaddress"): str(back)}])
        signed = node.wallet("signrawtransactionwithwallet", raw)
        if signed.get("complete"):
            node.rpc("sendrawtransaction", signed["hex"], 0)
            return
    node.rpc("prioritisetransaction", txid, 0, -10 * SAT)


def reorg_ethereum(node: AnvilNode, depth: int, *, keep: Iterable[tuple[bytes, int]] = ()) -> None:
    """`anvil_reorg`: replace the last `depth` blocks with as many new ones holding only the signed
    raw transactions of `keep` (each with the index, from 0, of the new block it goes into); every
    transaction of the undone blocks not re-sent in `keep` is dropped."""
    height = node.w3.eth.block_number
    if not 1 <= depth <= height:
        raise ControlError(f"reorg depth {depth} outside 1..{height}")
    node.call("anvil_reorg", depth, [["0x" + raw.hex(), index] for raw, index in keep])


def raw_transaction(node: AnvilNode, txid: str) -> bytes:
    """The signed raw bytes of a mined or pending ethereum transaction (to re-send in a reorg)."""
    raw = node.call("eth_getRawTransactionByHash", txid)
    if not raw:
        raise ControlError(f"{txid} unknown to anvil")
    return bytes.fromhex(raw.removeprefix("0x"))


# ---- fees -------------------------------------------------------------------------------------

class FeeSpike:
    """A bitcoin fee spike at `sat_per_vb`: blocks are full of transactions paying that much, so a
    transaction paying less is not mined while the spike lasts.

    `start()` fills the mempool with `fill` faucet payments at the spike's rate; `mine(n)` mines `n`
    blocks holding only the mempool transactions whose fee rate (with their ancestors) reaches the
    spike's, and tops the fill up again; `end()` (or leaving the `with` block) stops filtering:
    everything left is mined by the next ordinary block. bitcoind's fee estimator learns from the
    spike's confirmed transactions, so `estimatesmartfee` answers near the spike rate after a few
    blocks."""

    def __init__(self, node: BitcoinNode, sat_per_vb: int, *, fill: int = 20, amount_sat: int = 20_000) -> None:
        if sat_per_vb < 1:
            raise ControlError("a fee spike needs a rate of at least 1 sat/vB")
        self.node, self.rate, self.fill, self.amount = node, sat_per_vb, fill, amount_sat
        self.active = False
        self.spike_txids: list[str] = []

    def __enter__(self) -> FeeSpike:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()

    def start(self) -> None:
        self.active = True
        self._top_up()

    def _top_up(self) -> None:
        target = self.node.wallet("getnewaddress", "", "bech32")
        for _ in range(self.fill):
            txid = self.node.wallet("sendtoaddress", target, str(Decimal(self.amount) / SAT), "", "", False, True,
                                    None, "unset", None, self.rate)
            self.spike_txids.append(txid)

    def paying(self) -> list[str]:
        """Mempool transactions whose ancestor fee rate reaches the spike's, parents first."""
        mempool = self.node.rpc("getrawmempool", True)
        chosen = [t for t, e in mempool.items()
                  if Decimal(str(e["fees"]["ancestor"])) * SAT >= self.rate * e["ancestorsize"]]
        return sorted(chosen, key=lambda t: mempool[t]["ancestorcount"])

    def mine(self, n: int = 1) -> list[str]:
        """Mine `n` spike blocks (only transactions paying the spike's rate); their hashes."""
        if not self.active:
            raise ControlError("the fee spike has ended: mine ordinary blocks instead")
        target = self.node.wallet("getnewaddress")
        hashes = []
        for _ in range(n):
            hashes.append(self.node.rpc("generateblock", target, self.paying())["hash"])
            self._top_up()
        return hashes

    def end(self) -> None:
        self.active = False


def estimated_fee_rate(node: BitcoinNode, target_blocks: int = 2) -> int | None:
    """bitcoind's `estimatesmartfee` in sat/vB (rounded down), None while it has no estimate."""
    est = node.rpc("estimatesmartfee", target_blocks)
    return int(Decimal(str(est["feerate"])) * SAT // 1000) if "feerate" in est else None


# ---- node faults ------------------------------------------------------------------------------

def stop_node(node: BitcoinNode | AnvilNode) -> None:
    """Stop the node (its data directory is kept; `start_node` brings it back on the same port)."""
    node.stop()


def start_node(node: BitcoinNode | AnvilNode, *, detached: bool = False) -> None:
    """Start a stopped node again on its port. bitcoind keeps its chain and reloads the faucet
    wallet; anvil starts a fresh chain (it keeps no state), so redeploy anything a test needs.
    `detached`: the node outlives this process (as `python -m regtest start` needs); by default it
    dies with it."""
    node.start(detached=detached)
    if isinstance(node, BitcoinNode):
        node.ensure_faucet()


@contextlib.contextmanager
def hang_node(node: BitcoinNode | AnvilNode) -> Iterator[None]:
    """SIGSTOP the node for the `with` block: its port accepts connections and nothing answers (what
    an overloaded or wedged node looks like). SIGCONT on exit, even when the block raises."""
    if node.pid is None:
        raise ControlError("the node is not running")
    pid = node.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(lambda: _state(pid) == "T", timeout=10, what=f"pid {pid} to stop")
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _state(pid: int) -> str:
    """The process's state letter from /proc (T: stopped)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


# ---- ethereum ---------------------------------------------------------------------------------

def advance_time(node: AnvilNode, seconds: int, *, mine_block: bool = True) -> int:
    """Move anvil's clock `seconds` ahead (`evm_increaseTime`); by default mine a block so the chain
    shows it. Returns the latest block's timestamp."""
    if seconds < 0:
        raise ControlError("anvil's clock only moves forward")
    node.call("evm_increaseTime", seconds)
    if mine_block:
        node.mine(1)
    return int(node.w3.eth.get_block("latest")["timestamp"])


def deploy_erc20(node: AnvilNode, tools: Tools, symbol: str = "TOK") -> TestToken:
    """Deploy another test ERC-20 (6 decimals, owned by the faucet account, which may mint)."""
    return TestToken.deploy(node.w3, compile_token(tools), symbol)


def mint(token: TestToken, to: str, amount: int) -> str:
    """Mint `amount` token units to `to`; the mined transaction's hash."""
    if amount <= 0:
        raise ControlError("mint a positive amount")
    return token.mint(to, amount)


def faucet_bitcoin(node: BitcoinNode, address: str, sat: int, *, confirm: bool = False) -> str:
    """Pay `sat` satoshis from the faucet wallet; with `confirm`, mine until it confirms."""
    if sat <= 0:
        raise ControlError("pay a positive amount")
    txid = node.fund(address, sat)
    if confirm:
        mine_until_confirmed(node, txid)
    return txid


def faucet_ether(node: AnvilNode, address: str, wei: int) -> str:
    """Pay `wei` from anvil's first dev account (mined at once under automine)."""
    if wei <= 0:
        raise ControlError("pay a positive amount")
    return node.fund(address, wei)


def pay(node: BitcoinNode | AnvilNode, address: str, amount: int) -> str:
    """A faucet payment of `amount` in the node's minor unit (satoshis on bitcoind, wei on anvil);
    the transaction id. Mined at once on anvil under automine, in the mempool on bitcoind."""
    if isinstance(node, BitcoinNode):
        return faucet_bitcoin(node, address, amount)
    return faucet_ether(node, address, amount)


def wait_answering(node: BitcoinNode | AnvilNode, timeout: float = 30) -> None:
    """Wait until the node answers RPC again (after `hang_node` or `start_node`)."""
    if isinstance(node, BitcoinNode):
        wait_until(lambda: node.rpc("getblockcount") is not None, timeout=timeout, what="bitcoind to answer")
    else:
        wait_until(lambda: node.w3.eth.block_number is not None, timeout=timeout, what="anvil to answer")


class ChainControl:
    """The helpers above bound to one cluster's nodes (what the `custody_chain` fixture returns):
    `chain.mine("bitcoin", 3)`, `chain.reorg_bitcoin(2, drop=[txid])`, `with chain.hang("bitcoind"):`."""

    def __init__(self, cluster, tools: Tools) -> None:  # cluster: regtest.cluster.Cluster
        self.cluster, self.tools = cluster, tools
        self.bitcoin, self.anvil, self.token = cluster.bitcoin, cluster.anvil, cluster.token

    def node(self, name: str) -> BitcoinNode | AnvilNode:
        """"bitcoin"/"bitcoind" or "ethereum"/"anvil"."""
        if name in ("bitcoin", "bitcoind"):
            return self.bitcoin
        if name in ("ethereum", "anvil"):
            return self.anvil
        raise ControlError(f"no node {name!r}: bitcoin or ethereum")

    def mine(self, chain: str, n: int = 1, address: str | None = None) -> None:
        mine(self.node(chain), n, address)

    def hold_mining(self, chain: str):
        return hold_mining(self.node(chain))

    def mine_until_confirmed(self, chain: str, txid: str, confirmations_wanted: int = 1) -> int:
        return mine_until_confirmed(self.node(chain), txid, confirmations_wanted=confirmations_wanted)

    def confirmations(self, chain: str, txid: str) -> int:
        return confirmations(self.node(chain), txid)

    def reorg_bitcoin(self, depth: int, *, drop: Iterable[str] = (), replace: Mapping[str, bytes] | None = None,
                      extra_blocks: int = 1) -> list[str]:
        return reorg_bitcoin(self.bitcoin, depth, drop=drop, replace=replace, extra_blocks=extra_blocks)

    def reorg_ethereum(self, depth: int, *, keep: Iterable[tuple[bytes, int]] = ()) -> None:
        reorg_ethereum(self.anvil, depth, keep=keep)

    def fee_spike(self, sat_per_vb: int, *, fill: int = 20) -> FeeSpike:
        return FeeSpike(self.bitcoin, sat_per_vb, fill=fill)

    def stop(self, chain: str) -> None:
        stop_node(self.node(chain))

    def start(self, chain: str) -> None:
        start_node(self.node(chain))

    def hang(self, chain: str):
        return hang_node(self.node(chain))

    def advance_time(self, seconds: int) -> int:
        return advance_time(self.anvil, seconds)

    def deploy_erc20(self, symbol: str = "TOK") -> TestToken:
        return deploy_erc20(self.anvil, self.tools, symbol)

    def mint(self, to: str, amount: int, token: TestToken | None = None) -> str:
        return mint(token or self.token, to, amount)

    def faucet_bitcoin(self, address: str, sat: int, *, confirm: bool = False) -> str:
        return faucet_bitcoin(self.bitcoin, address, sat, confirm=confirm)

    def faucet_ether(self, address: str, wei: int) -> str:
        return faucet_ether(self.anvil, address, wei)
