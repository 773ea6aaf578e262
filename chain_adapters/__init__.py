"""Chain adapters: one module per chain family (bitcoin via bitcoind JSON-RPC, ethereum via web3).
No database, no ledger: they hand custody plain typed values in minor units.

    base.py      the ChainAdapter protocol, the typed values (BlockRef, Observation, Reorg,
                 ScanResult, Watch, TxState/TxStatus, BroadcastResult, BitcoinFee/EthereumFee, Utxo)
                 and BlockWalker, the chain-neutral cursor walk with reorg detection
    errors.py    ChainError and its subclasses, each with a stable ErrorCode
    rpc.py       a minimal keep-alive JSON-RPC client (Decimal amounts, batches)
    bitcoin.py   BitcoinAdapter(rpc_url, network=...)   (+ unspent(addresses))
    ethereum.py  EthereumAdapter(rpc_url, network=..., tokens={contract: asset})  (+ nonce, balance)

Usage, for a deposit scanner:

    result = adapter.scan(stored_cursor, Watch(frozenset(addresses), tokens=...), max_blocks=100)
    if result.reorg: orphan result.reorg.orphaned (by Observation.key), note result.reorg.fork_point
    record result.observations; store result.cursor
"""
from chain_adapters.base import (
    BitcoinFee,
    BlockRef,
    BroadcastResult,
    ChainAdapter,
    EthereumFee,
    FeeEstimate,
    Observation,
    Reorg,
    ScannedBlock,
    ScanResult,
    TxState,
    TxStatus,
    Utxo,
    Watch,
)
from chain_adapters.errors import ChainError, ErrorCode

__all__ = [
    "BitcoinFee", "BlockRef", "BroadcastResult", "ChainAdapter", "ChainError", "ErrorCode",
    "EthereumFee", "FeeEstimate", "Observation", "Reorg", "ScanResult", "ScannedBlock", "TxState",
    "TxStatus", "Utxo", "Watch",
]
