"""Ethereum adapter over web3 (any EIP-1559 node: anvil in tests, geth/reth/erigon in production).

    adapter = EthereumAdapter("http://127.0.0.1:8545", network="regtest",
                              tokens={"0xToken...": "USDT"})
    result = adapter.scan(cursor, Watch(frozenset(addresses), tokens=adapter.tokens))

What is observed, per block:
- ether: top-level transactions with `to` in the watched set, value > 0 and a successful receipt
  (index 0; value moved by internal calls is not seen: deposit addresses are plain accounts);
- ERC-20: `Transfer(from, to, value)` logs of the configured token contracts whose `to` is
  watched (index = the log's index in its block).
Addresses are compared case-insensitively and reported checksummed; hashes are `0x` + lowercase
hex. Anvil forgets abandoned blocks after a reorg; the walker's memory of recently scanned blocks
(base.BlockWalker) still reports their observations as orphaned, so keep one adapter per scanner.

`tx_status` for ethereum: REPLACED means another pending transaction holds the same sender and
nonce; CONFLICTED means the nonce was consumed by a different mined transaction. A mined
transaction whose execution reverted is CONFIRMED with `reverted=True`; `mined()` adds what it cost
(gas used x effective gas price: what left the sender besides the value).

Holdings for reconciliation are read at a pinned block number: `balance(address, block=n)` (wei)
and `token_balance(contract, address, block=n)` (ERC-20 `balanceOf` by `eth_call` at that block).

`transfers(txid)` reads one mined transaction as value moved: its sender, recipient and ether value,
its block, confirmations and status, and every ERC-20 `Transfer` log in its receipt (any contract;
the caller decides which contracts it knows). Custody books treasury funding of the hot address
from it (custody.payouts `book_ethereum_funding`).

`estimate_gas(sender, to, value=, data=)` is the node's gas estimate for a call (custody.eth_sweeps
sizes a token sweep's gas limit, and so the gas the hot address funds, from it).

Before paying a destination, custody asks `has_code(address)` (eth_getCode: a contract, or an
account delegated to code) and `simulate(sender, to, value=, data=, gas=)` (eth_call at the tip with
the payout's exact value, calldata and gas limit): `CallResult.OK`, `REVERTED` (the execution would
revert or run out of gas: mined, it would burn the gas and move nothing) or `UNFUNDED` (the sender
cannot cover the value: the simulation says nothing about the destination).

`connection_serial` is the serial number of the newest TCP connection web3's HTTP session opened
(0: none yet), in any thread, as `chain_adapters.rpc.JsonRpcClient.connection_serial` is for
bitcoin: the session's pooled keep-alive connection is re-opened silently when the node cut it (a
restart), so custody.roots.guards.NetworkGate compares it before and after each call and verifies
the node's chain id again when it moved. Cost: a counter bumped per connect; no extra round trip
until a reconnect, then one `eth_chainId`.
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from eth_account import Account
from eth_account.typed_transactions import TypedTransaction
from eth_utils import keccak, to_checksum_address
from hexbytes import HexBytes
from web3 import HTTPProvider, Web3
from web3.exceptions import BlockNotFound, TransactionNotFound, Web3RPCError

from chain_adapters.base import (
    BlockRef,
    BlockWalker,
    BroadcastResult,
    EthereumFee,
    Observation,
    ScannedBlock,
    TxState,
    TxStatus,
    Watch,
)
from chain_adapters.errors import (
    ChainError,
    Conflict,
    InsufficientFee,
    InsufficientFunds,
    InvalidTransaction,
    NodeUnavailable,
    NotFound,
    WrongNetwork,
)

TRANSFER_TOPIC = "0x" + keccak(text="Transfer(address,address,uint256)").hex()
BALANCE_OF_SELECTOR = keccak(text="balanceOf(address)")[:4]
NETWORKS = {"mainnet": 1, "sepolia": 11155111, "holesky": 17000, "regtest": 31337}

_FEE_ERRORS = ("underpriced", "max fee per gas less than block base fee", "fee cap",
               "feecap", "gas price too low", "tip higher than")
_FUNDS_ERRORS = ("insufficient funds",)
_KNOWN_ERRORS = ("already known", "already imported", "known transaction")
# eth_call errors that mean "this execution fails" (geth, reth, erigon and anvil wordings)
_REVERT_ERRORS = ("revert", "out of gas", "outofgas", "invalid opcode", "invalidfeopcode", "opcodenotfound",
                  "invalid jump", "stack underflow", "stack overflow", "gas required exceeds", "write protection")


@dataclass(frozen=True, slots=True)
class MinedTx:
    """A transaction in the main chain: its block, the ether it cost its sender in gas (gas used x
    effective gas price, in wei) and whether its execution reverted (then only the gas moved)."""

    txid: str
    block: BlockRef
    fee: int
    reverted: bool


@dataclass(frozen=True, slots=True)
class TokenTransfer:
    """One ERC-20 `Transfer(from, to, value)` log: the emitting contract, both parties (checksummed),
    the amount in the token's base units and the log's index in its block."""

    contract: str
    sender: str
    to: str
    amount: int
    log_index: int


@dataclass(frozen=True, slots=True)
class TxTransfers:
    """A mined transaction as value moved: `to` is None for a contract creation; `value` is the
    ether (wei) the transaction itself carried, which moved only if it did not revert."""

    txid: str
    sender: str
    to: str | None
    value: int
    block: BlockRef
    confirmations: int
    reverted: bool
    token_transfers: tuple[TokenTransfer, ...]


class CallResult(StrEnum):
    OK = "ok"  # the call would succeed
    REVERTED = "reverted"  # the execution would revert (or run out of the gas given)
    UNFUNDED = "unfunded"  # the sender cannot cover the value: nothing learned about the callee


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """What one transaction would do if it were mined on top of the tip (from `simulate`); `detail`
    is the node's message (with the revert reason when it gives one), empty when it succeeds."""

    result: CallResult
    detail: str = ""


def _hex(value: bytes | str) -> str:
    return value if isinstance(value, str) else "0x" + bytes(value).hex()


def _topic_for(address: str) -> str:
    return "0x" + "0" * 24 + address.lower()[2:]


class _Connects:
    """Counts the TCP connects of one session's connections (a new connection, or a pooled one
    re-opened after the server closed it): `serial` is the newest one's number."""

    def __init__(self) -> None:
        self._serials = itertools.count(1)
        self.serial = 0

    def session(self) -> requests.Session:
        """A requests session whose every connect bumps `serial`."""
        counter = self

        def counting(base: type) -> type:
            class Counting(base):  # type: ignore[misc, valid-type]
                def connect(self) -> None:
                    counter.serial = next(counter._serials)
                    super().connect()
            return Counting

        pools = {"http": type("CountingPool", (HTTPConnectionPool,), {"ConnectionCls": counting(HTTPConnection)}),
                 "https": type("CountingHTTPSPool", (HTTPSConnectionPool,), {"ConnectionCls": counting(HTTPSConnection)})}

        class Adapter(HTTPAdapter):
            def init_poolmanager(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
                super().init_poolmanager(*args, **kwargs)
                self.poolmanager.pool_classes_by_scheme = pools

        session = requests.Session()
        for prefix in ("http://", "https://"):
            session.mount(prefix, Adapter())
        return session


class EthereumAdapter(BlockWalker):
    chain = "ethereum"
    native_asset = "ETH"

    def __init__(self, rpc_url: str, *, network: str, tokens: Mapping[str, str] | None = None,
                 timeout: float = 30.0) -> None:
        super().__init__()
        if network not in NETWORKS:
            raise ValueError(f"unknown ethereum network {network!r}")
        self.network = network
        self.chain_id = NETWORKS[network]
        self.tokens = {to_checksum_address(a): code for a, code in (tokens or {}).items()}
        self._connects = _Connects()
        self._session = self._connects.session()
        self.w3 = Web3(HTTPProvider(rpc_url, request_kwargs={"timeout": timeout}, session=self._session))

    @property
    def connection_serial(self) -> int:
        """The newest connection's serial (module docstring)."""
        return self._connects.serial

    def close(self) -> None:
        self._session.close()

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ConnectionError, OSError) as exc:
            raise NodeUnavailable(str(exc)) from exc

    def verify_network(self) -> None:
        """WrongNetwork unless the node's `eth_chainId` is this adapter's chain id."""
        got = self._call(lambda: self.w3.eth.chain_id)
        if got != self.chain_id:
            raise WrongNetwork(f"node chain id {got}, adapter configured for {self.network} ({self.chain_id})")

    # -- blocks ---------------------------------------------------------------------------------
    def tip(self) -> BlockRef:
        block = self._call(self.w3.eth.get_block, "latest")
        return BlockRef(block["number"], _hex(block["hash"]))

    def block_at(self, height: int) -> BlockRef:
        block_hash = self._hash_at(height)
        if block_hash is None:
            raise NotFound(f"no block at height {height}")
        return BlockRef(height, block_hash)

    def _tip_height(self) -> int:
        return self._call(lambda: self.w3.eth.block_number)

    def _hash_at(self, height: int) -> str | None:
        if height < 0:
            return None
        try:
            return _hex(self._call(self.w3.eth.get_block, height)["hash"])
        except BlockNotFound:
            return None

    def _token_logs(self, selector: dict, watch: Watch) -> list:
        tokens = [to_checksum_address(a) for a in watch.tokens]
        if not tokens or not watch.addresses:
            return []
        flt = {**selector, "address": tokens,
               "topics": [TRANSFER_TOPIC, None, [_topic_for(a) for a in sorted(watch.addresses)]]}
        return self._call(self.w3.eth.get_logs, flt)

    def _parse_block(self, block, logs: list, watch: Watch) -> ScannedBlock:
        ref = BlockRef(block["number"], _hex(block["hash"]))
        watched = {a.lower() for a in watch.addresses}
        found: list[Observation] = []
        for tx in block["transactions"]:
            to = tx.get("to")
            if to and to.lower() in watched and tx["value"] > 0:
                receipt = self._call(self.w3.eth.get_transaction_receipt, tx["hash"])
                if receipt["status"] == 1:
                    found.append(Observation("ETH", _hex(tx["hash"]), 0, to_checksum_address(to),
                                             int(tx["value"]), ref, (to_checksum_address(tx["from"]),)))
        token_codes = {to_checksum_address(a): code for a, code in watch.tokens.items()}
        for log in logs:
            if log.get("removed"):
                continue
            to = to_checksum_address("0x" + _hex(log["topics"][2])[-40:])
            sender = to_checksum_address("0x" + _hex(log["topics"][1])[-40:])
            found.append(Observation(token_codes[to_checksum_address(log["address"])],
                                     _hex(log["transactionHash"]), log["logIndex"], to,
                                     int.from_bytes(bytes(log["data"]), "big"), ref, (sender,)))
        return ScannedBlock(ref, _hex(block["parentHash"]), tuple(found))

    def _blocks(self, first: int, last: int, watch: Watch) -> list[ScannedBlock]:
        logs_by_block: dict[str, list] = {}
        for log in self._token_logs({"fromBlock": first, "toBlock": last}, watch):
            logs_by_block.setdefault(_hex(log["blockHash"]), []).append(log)
        out = []
        for height in range(first, last + 1):
            try:
                block = self._call(self.w3.eth.get_block, height, True)
            except BlockNotFound:
                break
            block_hash = _hex(block["hash"])
            out.append(self._parse_block(block, logs_by_block.pop(block_hash, []), watch))
        if logs_by_block:  # logs from blocks we did not fetch: the chain moved; keep a clean prefix
            moved = {log["blockNumber"] for logs in logs_by_block.values() for log in logs}
            out = [b for b in out if b.ref.height < min(moved)]
        return out

    def _block_by_hash(self, block_hash: str, watch: Watch) -> ScannedBlock | None:
        try:
            block = self._call(self.w3.eth.get_block, block_hash, True)
        except BlockNotFound:
            return None
        return self._parse_block(block, self._token_logs({"blockHash": block_hash}, watch), watch)

    # -- transactions ---------------------------------------------------------------------------
    @staticmethod
    def _sender_nonce(raw: bytes) -> tuple[str, int]:
        sender = Account.recover_transaction(raw)
        if raw[0] >= 0xC0:  # legacy RLP list
            import rlp  # eth-account's own dependency
            nonce = int.from_bytes(rlp.decode(raw)[0], "big")
        else:
            nonce = TypedTransaction.from_bytes(HexBytes(raw)).as_dict()["nonce"]
        return sender, nonce

    def tx_status(self, txid: str, *, raw: bytes | None = None) -> TxStatus:
        try:
            receipt = self._call(self.w3.eth.get_transaction_receipt, txid)
        except TransactionNotFound:
            receipt = None
        if receipt is not None and receipt.get("blockNumber") is not None:
            tip = self._tip_height()
            height = receipt["blockNumber"]
            return TxStatus(txid, TxState.CONFIRMED, tip - height + 1,
                            BlockRef(height, _hex(receipt["blockHash"])), reverted=receipt["status"] != 1)
        try:
            self._call(self.w3.eth.get_transaction, txid)
            return TxStatus(txid, TxState.MEMPOOL)
        except TransactionNotFound:
            pass
        if raw is None:
            return TxStatus(txid, TxState.UNKNOWN)
        sender, nonce = self._sender_nonce(raw)
        if self._call(self.w3.eth.get_transaction_count, sender, "latest") > nonce:
            return TxStatus(txid, TxState.CONFLICTED)
        if self._call(self.w3.eth.get_transaction_count, sender, "pending") > nonce:
            return TxStatus(txid, TxState.REPLACED)
        return TxStatus(txid, TxState.UNKNOWN)

    def broadcast(self, raw: bytes) -> BroadcastResult:
        txid = "0x" + keccak(raw).hex()
        before = self.tx_status(txid)
        if before.state in (TxState.CONFIRMED, TxState.MEMPOOL):
            return BroadcastResult(txid, already_known=True)
        try:
            sent = _hex(self._call(self.w3.eth.send_raw_transaction, raw))
        except Web3RPCError as exc:
            message = str(exc.message or exc).lower()
            if any(k in message for k in _KNOWN_ERRORS):
                return BroadcastResult(txid, already_known=True)
            if self.tx_status(txid).state in (TxState.CONFIRMED, TxState.MEMPOOL):
                return BroadcastResult(txid, already_known=True)
            raise self._map_reject(message) from exc
        assert sent == txid, (sent, txid)
        return BroadcastResult(txid, already_known=False)

    @staticmethod
    def _map_reject(message: str) -> ChainError:
        if any(k in message for k in _FEE_ERRORS):
            return InsufficientFee(message)
        if any(k in message for k in _FUNDS_ERRORS):
            return InsufficientFunds(message)
        if "nonce too low" in message or "nonce" in message and "used" in message:
            return Conflict(message)
        return InvalidTransaction(message)

    # -- fees and nonces ------------------------------------------------------------------------
    def estimate_fee(self, target_blocks: int = 6) -> EthereumFee:
        history = self._call(self.w3.eth.fee_history, 1, "latest", [])
        base = int(history["baseFeePerGas"][-1])  # the next block's base fee
        tip = int(self._call(lambda: self.w3.eth.max_priority_fee))
        return EthereumFee(base, tip, 2 * base + tip)

    def nonce(self, address: str, *, pending: bool = True) -> int:
        """Next nonce for `address` (counting its pending transactions unless pending=False)."""
        return self._call(self.w3.eth.get_transaction_count, to_checksum_address(address),
                          "pending" if pending else "latest")

    # -- holdings at a pinned block ----------------------------------------------------------------
    def balance(self, address: str, *, block: int | None = None) -> int:
        """Ether held by `address` (wei) after block number `block` (default: the tip)."""
        return self._call(self.w3.eth.get_balance, to_checksum_address(address), "latest" if block is None else block)

    def token_balance(self, contract: str, address: str, *, block: int | None = None) -> int:
        """ERC-20 `balanceOf(address)` of `contract` (token base units) after block number `block`
        (default: the tip). A contract that does not answer one 32-byte word is refused."""
        data = BALANCE_OF_SELECTOR + bytes.fromhex(_topic_for(address)[2:])
        out = bytes(self._call(self.w3.eth.call, {"to": to_checksum_address(contract), "data": "0x" + data.hex()},
                               "latest" if block is None else block))
        if len(out) != 32:
            raise ChainError(f"balanceOf on {contract} answered {len(out)} bytes, not one word")
        return int.from_bytes(out, "big")

    def estimate_gas(self, sender: str, to: str, *, value: int = 0, data: bytes = b"") -> int:
        """The node's `eth_estimateGas` for `sender` -> `to` (value in wei, calldata) at the tip: the gas
        the execution needs. An execution that would fail raises ChainError (never a guess)."""
        call = {"from": to_checksum_address(sender), "to": to_checksum_address(to), "value": hex(value),
                "data": "0x" + bytes(data).hex()}
        reply = self._call(self.w3.provider.make_request, "eth_estimateGas", [call])
        if reply.get("error") is not None or "result" not in reply:
            raise ChainError(f"eth_estimateGas from {sender} to {to} failed: {reply.get('error')}")
        return int(reply["result"], 16)

    def has_code(self, address: str) -> bool:
        """True when `address` carries code at the tip (a contract, or an account delegated to one):
        paying it runs that code."""
        return len(bytes(self._call(self.w3.eth.get_code, to_checksum_address(address), "latest"))) > 0

    def simulate(self, sender: str, to: str, *, value: int, data: bytes, gas: int) -> CallOutcome:
        """Execute the transaction `sender` -> `to` (value in wei, calldata, gas limit) with eth_call on
        top of the tip, without sending it. A node error that is neither a failed execution nor the
        sender's missing funds raises ChainError: an unknown answer is never read as success."""
        for name, number in (("value", value), ("gas", gas)):
            if type(number) is not int or number < 0:
                raise ValueError(f"{name} must be a non-negative int, got {number!r}")
        call = {"from": to_checksum_address(sender), "to": to_checksum_address(to), "value": hex(value),
                "gas": hex(gas), "data": "0x" + bytes(data).hex()}
        reply = self._call(self.w3.provider.make_request, "eth_call", [call, "latest"])
        error = reply.get("error")
        if error is None:
            return CallOutcome(CallResult.OK)
        message = str(error.get("message", "")) if isinstance(error, dict) else str(error)
        lowered = message.lower()
        if any(k in lowered for k in _FUNDS_ERRORS):
            return CallOutcome(CallResult.UNFUNDED, message)
        if any(k in lowered for k in _REVERT_ERRORS):
            return CallOutcome(CallResult.REVERTED, message)
        raise ChainError(f"eth_call from {sender} to {to} failed: {message}")

    def mined(self, txid: str) -> MinedTx | None:
        """Where and at what cost `txid` was mined (None while it is not in the main chain)."""
        try:
            receipt = self._call(self.w3.eth.get_transaction_receipt, txid)
        except TransactionNotFound:
            return None
        if receipt is None or receipt.get("blockNumber") is None:
            return None
        return MinedTx(txid, BlockRef(receipt["blockNumber"], _hex(receipt["blockHash"])),
                       int(receipt["gasUsed"]) * int(receipt["effectiveGasPrice"]), receipt["status"] != 1)

    def transfers(self, txid: str) -> TxTransfers | None:
        """What mined transaction `txid` moved (None while it is not in the main chain): its ether
        value and every well-formed ERC-20 `Transfer` log of its receipt (three topics, one data word).
        Confirmations count as in `tx_status` (1 = in the tip block)."""
        try:
            receipt = self._call(self.w3.eth.get_transaction_receipt, txid)
            tx = self._call(self.w3.eth.get_transaction, txid)
        except TransactionNotFound:
            return None
        if receipt is None or receipt.get("blockNumber") is None:
            return None
        if _hex(tx.get("blockHash") or b"") != _hex(receipt["blockHash"]):
            raise ChainError(f"{txid} moved between blocks while being read; read it again")
        tip = self._tip_height()
        found = []
        for log in receipt["logs"]:
            topics = [_hex(t).lower() for t in log["topics"]]
            data = bytes(log["data"])
            if log.get("removed") or len(topics) != 3 or topics[0] != TRANSFER_TOPIC or len(data) != 32:
                continue
            found.append(TokenTransfer(to_checksum_address(log["address"]), to_checksum_address("0x" + topics[1][-40:]),
                                       to_checksum_address("0x" + topics[2][-40:]), int.from_bytes(data, "big"),
                                       int(log["logIndex"])))
        to = tx.get("to")
        return TxTransfers(_hex(tx["hash"]).lower(), to_checksum_address(tx["from"]), to_checksum_address(to) if to else None,
                           int(tx["value"]), BlockRef(receipt["blockNumber"], _hex(receipt["blockHash"])),
                           tip - receipt["blockNumber"] + 1, receipt["status"] != 1, tuple(found))
