"""The one interface custody uses to talk to any chain, and the typed values it returns.

Guarantees (every adapter, checked by tests/e2e/test_adapter_conformance.py):
- amounts are `int` minor units (satoshi, wei, token base unit); no float, no Decimal, no hex;
- a block is named by `BlockRef(height, hash)`; `scan()` walks forward from a stored cursor and
  detects a reorg by parent-hash mismatch: it then reports the fork point, the blocks undone (old
  tip first) and the observations they carried, and carries on from the fork point, so outputs
  re-mined in the new chain are reported again with their new block;
- an observation is identified by `(asset, txid, index)`; `index` is the bitcoin output number,
  the ERC-20 log index, or 0 for an ether transfer (the transaction's value);
- `broadcast()` is idempotent: a transaction the node already has (mempool or chain) is success
  with `already_known=True`; refusals raise a `ChainError` with a stable code (errors.py);
- `tx_status()` answers unknown / mempool / confirmed (+confirmations) / replaced / conflicted;
  pass the signed raw transaction when you have it, so a transaction the node has forgotten can
  still be told apart from one that never existed.

The node's wire formats (JSON decimals, hex quantities, scripts) never leave the adapters.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, Protocol, runtime_checkable

from chain_adapters.errors import ReorgTooDeep


@dataclass(frozen=True, slots=True)
class BlockRef:
    """A block named by height and hash; a scan cursor is one of these."""

    height: int
    hash: str


@dataclass(frozen=True, slots=True)
class Observation:
    """Value paid to a watched address, as seen in one block."""

    asset: str
    txid: str
    index: int
    address: str
    amount: int
    block: BlockRef
    senders: tuple[str, ...] = ()  # ethereum: the sender; bitcoin: empty here, see BitcoinAdapter.senders()

    @property
    def key(self) -> tuple[str, str, int]:
        """Identity across reorgs: the same output re-mined keeps its key, changes its block."""
        return (self.asset, self.txid, self.index)


@dataclass(frozen=True, slots=True)
class Spend:
    """An input of a block's transaction `txid` spending a watched outpoint (`prev_txid`, `prev_index`)."""

    txid: str
    prev_txid: str
    prev_index: int


@dataclass(frozen=True, slots=True)
class ScannedBlock:
    ref: BlockRef
    parent_hash: str
    observations: tuple[Observation, ...] = ()
    spends: tuple[Spend, ...] = ()  # bitcoin: inputs spending watched outpoints, in block order; ethereum: none


@dataclass(frozen=True, slots=True)
class Reorg:
    """Blocks the node no longer considers main chain, down to (excluding) `fork_point`."""

    fork_point: BlockRef
    undone: tuple[BlockRef, ...]  # old tip first
    orphaned: tuple[Observation, ...]


@dataclass(frozen=True, slots=True)
class ScanResult:
    reorg: Reorg | None
    blocks: tuple[ScannedBlock, ...]
    cursor: BlockRef  # store this; pass it to the next scan()

    @property
    def observations(self) -> list[Observation]:
        return [o for b in self.blocks for o in b.observations]


@dataclass(frozen=True)
class Watch:
    """What to look for: our addresses, (ethereum) token contracts -> asset code, and (bitcoin)
    the outpoints `(txid, vout)` whose spends to report. Any container with `in` will do for
    `addresses` and `outpoints` (the caller may pass its own live sets; the adapter only reads
    them). A bitcoin scan also reports spends of outputs it observed earlier in the same scan
    (same block or an earlier one), so the caller need not know them in advance."""

    addresses: Set[str] | Mapping[str, object]
    tokens: Mapping[str, str] = field(default_factory=dict)
    outpoints: Set[tuple[str, int]] = frozenset()


class TxState(StrEnum):
    UNKNOWN = "unknown"        # the node knows nothing of it
    MEMPOOL = "mempool"        # waiting to be mined
    CONFIRMED = "confirmed"    # in the main chain; see confirmations
    REPLACED = "replaced"      # a different pending transaction spends its inputs / uses its nonce
    CONFLICTED = "conflicted"  # a different transaction spending its inputs / nonce is mined


@dataclass(frozen=True, slots=True)
class TxStatus:
    txid: str
    state: TxState
    confirmations: int = 0
    block: BlockRef | None = None
    replaced_by: str | None = None  # the live transaction, when the node can name it
    reverted: bool = False  # ethereum: mined, but execution failed (value did not move)


@dataclass(frozen=True, slots=True)
class BroadcastResult:
    txid: str
    already_known: bool  # True: the node had it (mempool or chain); nothing new happened


@dataclass(frozen=True, slots=True)
class BitcoinFee:
    sat_per_kvb: int
    target_blocks: int
    source: Literal["node", "fallback"]


@dataclass(frozen=True, slots=True)
class EthereumFee:
    base_fee_wei: int       # of the next block
    priority_fee_wei: int   # tip suggested by the node
    max_fee_wei: int        # 2 * base fee + tip: survives six full blocks of base-fee rise


FeeEstimate = BitcoinFee | EthereumFee


@dataclass(frozen=True, slots=True)
class Utxo:
    txid: str
    index: int
    address: str
    amount: int
    height: int
    script_pubkey: bytes


@runtime_checkable
class ChainAdapter(Protocol):
    chain: str          # "bitcoin" | "ethereum"
    network: str        # "regtest", "mainnet", ...
    native_asset: str   # "BTC" | "ETH"

    def tip(self) -> BlockRef: ...
    def block_at(self, height: int) -> BlockRef: ...
    def scan(self, cursor: BlockRef, watch: Watch, *, max_blocks: int = 100) -> ScanResult: ...
    def tx_status(self, txid: str, *, raw: bytes | None = None) -> TxStatus: ...
    def broadcast(self, raw: bytes) -> BroadcastResult: ...
    def estimate_fee(self, target_blocks: int = 6) -> FeeEstimate: ...
    def close(self) -> None: ...


class BlockWalker:
    """Cursor walking and reorg detection shared by every adapter (chain-neutral).

    Subclasses supply four node reads; the walker owns the algorithm. It remembers the blocks it
    scanned recently (bounded) so a reorg can be reported even by a node that forgets the blocks
    it abandoned (anvil); bitcoind still serves stale blocks by hash.
    """

    MEMO_BLOCKS = 4096

    def __init__(self) -> None:
        self._memo: OrderedDict[str, ScannedBlock] = OrderedDict()

    # -- node reads, chain-specific ---------------------------------------------------------
    def _tip_height(self) -> int: raise NotImplementedError
    def _hash_at(self, height: int) -> str | None: raise NotImplementedError
    def _blocks(self, first: int, last: int, watch: Watch) -> list[ScannedBlock]:
        """Main-chain blocks first..last (inclusive), in order; may stop short."""
        raise NotImplementedError
    def _block_by_hash(self, block_hash: str, watch: Watch) -> ScannedBlock | None:
        raise NotImplementedError

    # -- the algorithm ----------------------------------------------------------------------
    def _remember(self, block: ScannedBlock) -> None:
        self._memo[block.ref.hash] = block
        if len(self._memo) > self.MEMO_BLOCKS:
            self._memo.popitem(last=False)

    def _old_block(self, block_hash: str, watch: Watch) -> ScannedBlock | None:
        return self._memo.get(block_hash) or self._block_by_hash(block_hash, watch)

    def _find_fork(self, cursor: BlockRef, watch: Watch) -> Reorg:
        undone: list[ScannedBlock] = []
        block_hash, height = cursor.hash, cursor.height
        while height >= 0:
            old = self._old_block(block_hash, watch)
            if old is None:
                raise ReorgTooDeep(f"block {block_hash} at height {height} is unknown")
            undone.append(old)
            height -= 1
            if self._hash_at(height) == old.parent_hash:
                return Reorg(fork_point=BlockRef(height, old.parent_hash),
                             undone=tuple(b.ref for b in undone),
                             orphaned=tuple(o for b in undone for o in b.observations))
            block_hash = old.parent_hash
        raise ReorgTooDeep("no common ancestor")

    def scan(self, cursor: BlockRef, watch: Watch, *, max_blocks: int = 100) -> ScanResult:
        reorg = None
        if self._hash_at(cursor.height) != cursor.hash:
            reorg = self._find_fork(cursor, watch)
            cursor = reorg.fork_point
        last = min(self._tip_height(), cursor.height + max_blocks)
        blocks: list[ScannedBlock] = []
        parent = cursor.hash
        if last > cursor.height:
            for block in self._blocks(cursor.height + 1, last, watch):
                if block.parent_hash != parent:
                    break  # the chain moved under us; the next scan sees the reorg
                self._remember(block)
                blocks.append(block)
                parent = block.ref.hash
        new_cursor = blocks[-1].ref if blocks else cursor
        return ScanResult(reorg=reorg, blocks=tuple(blocks), cursor=new_cursor)
