"""Bitcoin adapter over bitcoind's JSON-RPC (no spending wallet: custody owns keys and coins).

    adapter = BitcoinAdapter("http://user:pass@127.0.0.1:18443", network="regtest")
    adapter = BitcoinAdapter("http://127.0.0.1:8332", network="mainnet", cookie_file="/var/lib/bitcoind/.cookie")
    adapter = BitcoinAdapter("http://127.0.0.1:38332", network="signet", rpc_user="u", rpc_password="p")
    result = adapter.scan(cursor, Watch(frozenset(deposit_addresses)))
    result = adapter.scan(cursor, Watch(our_addresses, outpoints=our_unspent_outpoints))  # + spends

`scan` reports, per block, the outputs paying watched addresses (`observations`) and the inputs
spending watched outpoints or outputs observed earlier in the same scan (`spends`), both in block
order: what custody.wallet_index needs to keep its index of our coins without the UTXO set.

Authentication: credentials in the URL, `rpc_user` + `rpc_password`, or `cookie_file` (read when a
connection opens and again after a 401, so a node restart's new cookie is picked up); one of them.

Node requirements: `-txindex=1` so `tx_status` can find confirmed transactions that are not ours
to index; everything else works on a stock node. Amounts arrive as JSON decimals, are parsed as
`Decimal` by the RPC client and converted to integer satoshis once, here.

`tx_status` states for bitcoin: REPLACED means another *mempool* transaction spends one of its
inputs (RBF; `replaced_by` names it); CONFLICTED means one of its inputs is already spent in the
chain by another transaction. Both need the raw transaction when the node has forgotten it.
`unspent()` lists confirmed outputs only (it uses `scantxoutset`, which ignores the mempool and
walks the node's WHOLE UTXO set: minutes on mainnet, one at a time per node). No recurring job or
API route calls it: they read custody.wallet_index. It stays for operator-run rescans.
`operator_scan_utxo_set` is the same scan for the operator's rescan tool only (custody.rescan),
with progress and abort.

The watch-only descriptor wallet (the node's own view of our coins, read by custody.node_view) is
`chain_adapters.bitcoin_watch.WatchWalletRpc`, mixed in here: it holds no key.

Busy node: bitcoind runs some calls once at a time (`scantxoutset`, `scanblocks`, a wallet
rescan) and refuses a second one; `bitcoind_error` turns those refusals into `NodeBusy` for every
call of this adapter (callers wait or skip a tick); every other error reply is an `RpcError`.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from bitcoin.core import CTransaction, b2lx

from chain_adapters.base import (
    BitcoinFee,
    BlockRef,
    BlockWalker,
    BroadcastResult,
    Observation,
    ScannedBlock,
    Spend,
    TxState,
    TxStatus,
    Utxo,
    Watch,
)
from chain_adapters.bitcoin_watch import WatchWalletRpc
from chain_adapters.errors import (
    ChainError,
    Conflict,
    ErrorCode,
    InsufficientFee,
    InvalidTransaction,
    NodeBusy,
    NotFound,
    RpcError,
    WrongNetwork,
)
from chain_adapters.rpc import JsonRpcClient

SAT_PER_BTC = 100_000_000
NETWORKS = {"mainnet": "main", "testnet": "test", "testnet4": "testnet4", "signet": "signet",
            "regtest": "regtest"}

# bitcoind's RPC error numbers (src/rpc/protocol.h) we branch on
RPC_INVALID_ADDRESS_OR_KEY = -5
RPC_INVALID_PARAMETER = -8
RPC_DESERIALIZATION_ERROR = -22
RPC_VERIFY_ERROR = -25
RPC_VERIFY_REJECTED = -26
RPC_VERIFY_ALREADY_IN_UTXO_SET = -27
RPC_WALLET_ERROR = -4

# bitcoind's refusals of a call it runs once at a time: (rpc code, start of the message)
_BUSY = (
    (RPC_INVALID_PARAMETER, "Scan already in progress"),  # scantxoutset, scanblocks
    (RPC_WALLET_ERROR, "Wallet is currently rescanning"),  # importdescriptors, rescanblockchain, ...
)

# mempool reject reasons (the node's stable reason tokens) -> our error class
_FEE_REASONS = ("min relay fee not met", "mempool min fee not met", "insufficient fee",
                "min-fee-not-met", "min-relay-fee-not-met")
_CONFLICT_REASONS = ("txn-mempool-conflict", "bad-txns-inputs-missingorspent", "missing-inputs",
                     "bad-txns-spends-conflicting-tx")
_KNOWN_REASONS = ("txn-already-in-mempool", "txn-already-known")

BLOCK_BATCH = 25  # getblock requests per HTTP round trip


def to_sat(value: Decimal) -> int:
    """BTC as a JSON decimal -> int satoshis, refusing anything finer than a satoshi."""
    sat = value * SAT_PER_BTC
    if sat != sat.to_integral_value():
        raise ChainError(f"amount {value} is not a whole number of satoshis")
    return int(sat)


def bitcoind_error(rpc_code: int, message: str) -> ChainError:
    """The exception for a bitcoind error reply: `NodeBusy` for a one-at-a-time refusal (`_BUSY`),
    else `RpcError` (callers branch on its `rpc_code`)."""
    if any(rpc_code == code and message.startswith(start) for code, start in _BUSY):
        return NodeBusy(f"rpc {rpc_code}: {message}")
    return RpcError(rpc_code, message)


def txid_of(raw: bytes) -> str:
    """The txid of a serialized transaction; InvalidTransaction when it does not parse."""
    try:
        return b2lx(CTransaction.deserialize(raw).GetTxid())
    except Exception as exc:  # python-bitcoinlib raises several types for bad bytes
        raise InvalidTransaction(f"not a transaction: {exc}") from exc


@dataclass(frozen=True)
class MempoolEntry:
    """What the node's mempool says of one of its transactions (`getmempoolentry`): its virtual
    size and its own fee in satoshis (`fees.base`: without descendants' or prioritisation)."""

    txid: str
    vsize: int
    fee: int


@dataclass(frozen=True)
class UtxoScan:
    """What one `scantxoutset` found: at `height`/`block_hash`, `unspents` as (descriptor-derived
    key origin `desc`, txid, vout, amount in satoshis, height); `aborted` when it was stopped."""

    height: int
    block_hash: str
    total: int
    unspents: tuple[tuple[str, str, int, int, int], ...]
    aborted: bool


class BitcoinAdapter(BlockWalker, WatchWalletRpc):
    chain = "bitcoin"
    native_asset = "BTC"

    def __init__(self, rpc_url: str, *, network: str, fallback_fee_sat_per_kvb: int = 10_000,
                 timeout: float = 60.0, cookie_file: str | Path | None = None, rpc_user: str | None = None,
                 rpc_password: str | None = None) -> None:
        super().__init__()
        if network not in NETWORKS:
            raise ValueError(f"unknown bitcoin network {network!r}")
        if (rpc_user is None) != (rpc_password is None):
            raise ValueError("rpc_user and rpc_password go together")
        self.network = network
        self.fallback_fee_sat_per_kvb = fallback_fee_sat_per_kvb
        auth = (rpc_user, rpc_password) if rpc_user is not None and rpc_password is not None else None
        self.rpc = JsonRpcClient(rpc_url, timeout=timeout, auth=auth, cookie_file=cookie_file, error_for=bitcoind_error)

    def close(self) -> None:
        self.rpc.close()

    def verify_network(self) -> None:
        """WrongNetwork unless bitcoind's `getblockchaininfo.chain` is this adapter's network."""
        chain = self.rpc.call("getblockchaininfo")["chain"]
        if chain != NETWORKS[self.network]:
            raise WrongNetwork(f"node is on {chain!r}, adapter configured for {self.network!r}")

    # -- blocks ---------------------------------------------------------------------------------
    def tip(self) -> BlockRef:
        info = self.rpc.call("getblockchaininfo")
        return BlockRef(info["blocks"], info["bestblockhash"])

    def block_at(self, height: int) -> BlockRef:
        block_hash = self._hash_at(height)
        if block_hash is None:
            raise NotFound(f"no block at height {height}")
        return BlockRef(height, block_hash)

    def _tip_height(self) -> int:
        return self.rpc.call("getblockcount")

    def _hash_at(self, height: int) -> str | None:
        if height < 0:
            return None
        try:
            return self.rpc.call("getblockhash", height)
        except RpcError as exc:
            if exc.rpc_code == RPC_INVALID_PARAMETER:
                return None
            raise

    def _parse_block(self, block: dict, watch: Watch, created: set[tuple[str, int]]) -> ScannedBlock:
        """Outputs paying watched addresses, and inputs spending watched outpoints or outputs this
        scan observed before (`created`, updated here), in block order: a transaction's inputs
        are read before its outputs, and transactions in the order the block holds them."""
        ref = BlockRef(block["height"], block["hash"])
        found, spends = [], []
        watched, outpoints = watch.addresses, watch.outpoints
        for tx in block["tx"]:
            txid = tx["txid"]
            for vin in tx["vin"]:
                prev = vin.get("txid")
                if prev is None:  # coinbase
                    continue
                key = (prev, vin["vout"])
                if key in outpoints or key in created:
                    spends.append(Spend(txid, prev, vin["vout"]))
            for out in tx["vout"]:
                address = out["scriptPubKey"].get("address")
                if address is not None and address in watched:
                    found.append(Observation("BTC", txid, out["n"], address, to_sat(out["value"]), ref))
                    created.add((txid, out["n"]))
        return ScannedBlock(ref, block.get("previousblockhash", ""), tuple(found), tuple(spends))

    def senders(self, txid: str) -> tuple[str, ...]:
        """Addresses of the outputs a transaction spends, for the compliance screen. Not part of
        `scan` (it costs a call per transaction); custody asks once per deposit, at screening."""
        try:
            full = self.rpc.call("getrawtransaction", txid, 2)  # verbosity 2 carries each input's prevout
        except RpcError as exc:
            if exc.rpc_code == RPC_INVALID_ADDRESS_OR_KEY:
                raise NotFound(f"no transaction {txid}") from exc
            raise
        found = [v.get("prevout", {}).get("scriptPubKey", {}).get("address") for v in full.get("vin", [])]
        return tuple(sorted({a for a in found if a}))

    def _blocks(self, first: int, last: int, watch: Watch) -> list[ScannedBlock]:
        created: set[tuple[str, int]] = set()  # outputs to watched addresses seen so far in this walk
        return [self._parse_block(b, watch, created) for b in self._raw_blocks(first, last)]

    def _block_by_hash(self, block_hash: str, watch: Watch) -> ScannedBlock | None:
        raw = self._raw_block_by_hash(block_hash)
        return None if raw is None else self._parse_block(raw, watch, set())

    def _raw_blocks(self, first: int, last: int):
        """bitcoind's `getblock <hash> 2` of main-chain blocks first..last, in order."""
        for start in range(first, last + 1, BLOCK_BATCH):
            heights = range(start, min(last, start + BLOCK_BATCH - 1) + 1)
            hashes = self.rpc.batch([("getblockhash", (h,)) for h in heights])
            yield from self.rpc.batch([("getblock", (h, 2)) for h in hashes])

    def _raw_block_by_hash(self, block_hash: str) -> dict | None:
        try:
            return self.rpc.call("getblock", block_hash, 2)
        except RpcError as exc:
            if exc.rpc_code == RPC_INVALID_ADDRESS_OR_KEY:
                return None
            raise

    # -- transactions ---------------------------------------------------------------------------
    def _confirmed(self, txid: str) -> TxStatus | None:
        try:
            info = self.rpc.call("getrawtransaction", txid, 1)
        except RpcError as exc:
            if exc.rpc_code == RPC_INVALID_ADDRESS_OR_KEY:
                return None
            raise
        if info.get("confirmations", 0) <= 0 or "blockhash" not in info:
            return None
        height = self.rpc.call("getblockheader", info["blockhash"])["height"]
        return TxStatus(txid, TxState.CONFIRMED, info["confirmations"], BlockRef(height, info["blockhash"]))

    def _in_mempool(self, txid: str) -> bool:
        try:
            self.rpc.call("getmempoolentry", txid)
            return True
        except RpcError as exc:
            if exc.rpc_code == RPC_INVALID_ADDRESS_OR_KEY:
                return False
            raise

    def mempool_entry(self, txid: str) -> MempoolEntry | None:
        """The node's own figures for a transaction in its mempool (None when it is not there):
        what custody.cpfp sizes a child by, never a database row's."""
        try:
            entry = self.rpc.call("getmempoolentry", txid)
        except RpcError as exc:
            if exc.rpc_code == RPC_INVALID_ADDRESS_OR_KEY:
                return None
            raise
        return MempoolEntry(txid, int(entry["vsize"]), to_sat(entry["fees"]["base"]))

    def raw_transaction(self, txid: str) -> bytes | None:
        """The node's serialisation (with its witness) of a transaction in its mempool or, with
        `-txindex`, in the chain; None when it knows none. Its txid is checked here."""
        try:
            raw = bytes.fromhex(self.rpc.call("getrawtransaction", txid, 0))
        except RpcError as exc:
            if exc.rpc_code == RPC_INVALID_ADDRESS_OR_KEY:
                return None
            raise
        if txid_of(raw) != txid:
            raise ChainError(f"the node answered another transaction for {txid}")
        return raw

    def tx_status(self, txid: str, *, raw: bytes | None = None) -> TxStatus:
        if self._in_mempool(txid):
            return TxStatus(txid, TxState.MEMPOOL)
        confirmed = self._confirmed(txid)
        if confirmed is not None:
            return confirmed
        if raw is None:
            return TxStatus(txid, TxState.UNKNOWN)
        prevouts = [{"txid": b2lx(i.prevout.hash), "vout": i.prevout.n}
                    for i in CTransaction.deserialize(raw).vin]
        for spend in self.rpc.call("gettxspendingprevout", prevouts):
            spender = spend.get("spendingtxid")
            if spender and spender != txid:
                return TxStatus(txid, TxState.REPLACED, replaced_by=spender)
        for prev in prevouts:
            if self.rpc.call("gettxout", prev["txid"], prev["vout"], True) is None:
                if self._confirmed(prev["txid"]) is not None:
                    return TxStatus(txid, TxState.CONFLICTED)  # its input is spent in the chain
        return TxStatus(txid, TxState.UNKNOWN)

    def broadcast(self, raw: bytes) -> BroadcastResult:
        txid = txid_of(raw)
        status = self.tx_status(txid)
        if status.state is TxState.CONFIRMED:
            return BroadcastResult(txid, already_known=True)
        known = status.state is TxState.MEMPOOL
        try:
            sent = self.rpc.call("sendrawtransaction", raw.hex())  # in mempool: rebroadcast only
        except RpcError as exc:
            if exc.rpc_code == RPC_VERIFY_ALREADY_IN_UTXO_SET or any(r in exc.message for r in _KNOWN_REASONS):
                return BroadcastResult(txid, already_known=True)
            if self.tx_status(txid).state in (TxState.MEMPOOL, TxState.CONFIRMED):
                return BroadcastResult(txid, already_known=True)  # lost a race with ourselves
            raise self._map_reject(exc) from exc
        assert sent == txid, (sent, txid)
        return BroadcastResult(txid, already_known=known)

    @staticmethod
    def _map_reject(exc: RpcError) -> ChainError:
        msg = exc.message
        if exc.rpc_code == RPC_DESERIALIZATION_ERROR:
            return InvalidTransaction(msg)
        if any(r in msg for r in _FEE_REASONS):
            return InsufficientFee(msg)
        if any(r in msg for r in _CONFLICT_REASONS):
            return Conflict(msg)
        if exc.rpc_code in (RPC_VERIFY_ERROR, RPC_VERIFY_REJECTED):
            return InvalidTransaction(msg)
        return ChainError(msg, code=ErrorCode.NODE_ERROR)

    # -- fees and coins -------------------------------------------------------------------------
    def estimate_fee(self, target_blocks: int = 6) -> BitcoinFee:
        est = self.rpc.call("estimatesmartfee", target_blocks)
        if "feerate" in est:
            return BitcoinFee(to_sat(est["feerate"]), est.get("blocks", target_blocks), "node")
        return BitcoinFee(self.fallback_fee_sat_per_kvb, target_blocks, "fallback")

    def unspent(self, addresses: Iterable[str]) -> list[Utxo]:
        """Confirmed unspent outputs paying any of `addresses` (scans the UTXO set)."""
        addrs = sorted(set(addresses))
        if not addrs:
            return []
        res = self.rpc.call("scantxoutset", "start", [f"addr({a})" for a in addrs])
        by_script: dict[str, str] = {}
        out = []
        for u in res["unspents"]:
            spk = u["scriptPubKey"]
            if spk not in by_script:
                by_script[spk] = self.rpc.call("decodescript", spk).get("address", "")
            out.append(Utxo(u["txid"], u["vout"], by_script[spk], to_sat(u["amount"]),
                            u["height"], bytes.fromhex(spk)))
        return sorted(out, key=lambda u: (u.height, u.txid, u.index))

    # -- the operator's rescan (custody.rescan): never on a recurring path ----------------------
    def operator_scan_utxo_set(self, scan_objects: list[dict], *, on_progress: Callable[[float], None] | None = None,
                               abort: threading.Event | None = None, poll_seconds: float = 1.0) -> UtxoScan:
        """One `scantxoutset start` over `scan_objects` (`{"desc": ..., "range": [0, n]}`), which
        walks the node's whole UTXO set: minutes on mainnet. While it runs, `scantxoutset status`
        is polled from this thread (`on_progress(percent)`) and the scan itself runs in a second
        thread; setting `abort` sends `scantxoutset abort`. `NodeBusy` when the node already runs a
        scan. For the operator's tool only (custody.rescan)."""
        result: dict = {}

        def run() -> None:
            try:
                result["ok"] = self.rpc.call("scantxoutset", "start", scan_objects)
            except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
                result["error"] = exc

        worker = threading.Thread(target=run, name="scantxoutset", daemon=True)
        worker.start()
        aborted = False
        while worker.is_alive():
            worker.join(poll_seconds)
            if abort is not None and abort.is_set() and not aborted:
                aborted = bool(self.rpc.call("scantxoutset", "abort"))
            elif worker.is_alive() and on_progress is not None:
                status = self.rpc.call("scantxoutset", "status")
                if status is not None:
                    on_progress(float(status.get("progress", 0)))
        if "error" in result:
            raise result["error"]
        res = result["ok"]
        if not res.get("success", True):
            return UtxoScan(0, "", 0, (), aborted=True)
        unspents = tuple((u["desc"], u["txid"], int(u["vout"]), to_sat(u["amount"]), int(u["height"]))
                         for u in res["unspents"])
        return UtxoScan(int(res["height"]), res["bestblock"], to_sat(res["total_amount"]), unspents, aborted=False)
