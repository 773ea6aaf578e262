"""The node's own view of our coins: bitcoind's watch-only descriptor wallet, read over RPC.

`WatchWalletRpc` is a mixin of `BitcoinAdapter` (so its calls pass the same NetworkGate as every
other adapter call). It knows nothing of custody's tables: custody.node_view decides which
descriptors, which ranges and which rescan times; this module only speaks to the node.

    adapter.watch_open("custody-view-1a2b...")              # load it, or create it (no keys)
    adapter.watch_import([WatchImport("wpkh(tpub.../0/*)", 1999, rescan_from=1718000000)])
    adapter.watch_status("custody-view-1a2b...")            # last processed block, scanning?
    adapter.watch_coins("custody-view-1a2b...")             # confirmed coins not spent in a block

The wallet is created with private keys disabled, blank, as a descriptor wallet, and loaded at
node start-up (`load_on_startup`), so a restarted node loads it again by itself; `watch_open`
also loads it when it is on disk but not loaded.

Coins: `listunspent` (minconf 1) hides a confirmed coin that an unconfirmed wallet transaction
spends (our own payouts and sweeps in the mempool). The UTXO set, and so reconciliation, still
counts it, so `watch_coins` adds those back: for each unconfirmed wallet transaction since the tip
(`listsinceblock`), each input still in the node's confirmed UTXO set (`gettxout`, mempool
excluded) that is one of the wallet's addresses (`getaddressinfo`). The cost grows with our own
unconfirmed transactions and the wallet's history, never with the node's UTXO set.

Errors: `NodeBusy` when the wallet is rescanning (bitcoind refuses a second import or rescan);
`ChainError` (code `node_error`) when an import is refused, with the node's words; every other
adapter error as usual. Amounts are integer satoshis (`to_sat`), never floats.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING

from chain_adapters.base import BlockRef
from chain_adapters.errors import ChainError, RpcError

if TYPE_CHECKING:
    from chain_adapters.rpc import JsonRpcClient

RPC_WALLET_NOT_FOUND = -18
RPC_WALLET_ALREADY_LOADED = -35
RPC_WALLET_ALREADY_EXISTS = -36
RPC_WALLET_ERROR = -4

# the key origin bitcoind gives a derived key of a descriptor without an origin of its own:
# `[<fingerprint of the xpub>/<branch>/<index>]`
_ORIGIN = re.compile(r"\[[0-9a-f]{8}/(\d+)/(\d+)\]")


@dataclass(frozen=True)
class WatchImport:
    """One ranged descriptor (without checksum) watched over indices 0..`end`; the wallet rescans
    blocks from `rescan_from` (Unix time; bitcoind itself starts two hours earlier, for block
    timestamps that run ahead of the clock)."""

    descriptor: str
    end: int
    rescan_from: int


@dataclass(frozen=True)
class WatchedRange:
    descriptor: str  # as the wallet lists it, without checksum
    end: int


@dataclass(frozen=True)
class WatchStatus:
    processed: BlockRef | None  # the last block the wallet has processed
    scanning: bool  # a rescan (import, rescanblockchain) is running


@dataclass(frozen=True)
class WatchCoin:
    """A confirmed coin of the wallet that no block spends, at `descriptor`/`branch`/`index`."""

    txid: str
    vout: int
    address: str
    amount: int  # satoshis
    descriptor: str  # the ranged descriptor it belongs to, without checksum
    branch: int
    index: int
    spent_in_mempool: bool  # hidden by listunspent (an unconfirmed transaction spends it): added back


def strip_checksum(descriptor: str) -> str:
    return descriptor.split("#", 1)[0]


def _sat(value: Decimal) -> int:
    from chain_adapters.bitcoin import to_sat  # the adapter's one conversion (bitcoin imports this module)

    return to_sat(value)


class WatchWalletRpc:
    """Watch-only wallet calls of `BitcoinAdapter` (see the module docstring)."""

    rpc: JsonRpcClient
    _wallet_clients: dict[str, JsonRpcClient]

    def _wallet(self, name: str) -> JsonRpcClient:
        clients = self.__dict__.setdefault("_wallet_clients", {})
        if name not in clients:
            clients[name] = self.rpc.at_path(f"/wallet/{name}")
        return clients[name]

    def watch_open(self, name: str) -> bool:
        """Make sure the watch-only wallet `name` is loaded: load it from disk, or create it.
        Returns True when it was created now (it then watches nothing yet)."""
        if name in self.rpc.call("listwallets"):
            return False
        try:
            self.rpc.call("loadwallet", name, True)
            return False
        except RpcError as exc:
            if exc.rpc_code == RPC_WALLET_ALREADY_LOADED:
                return False  # loaded meanwhile by another process
            if exc.rpc_code != RPC_WALLET_NOT_FOUND:
                raise
        try:
            # name, disable_private_keys, blank, passphrase, avoid_reuse, descriptors, load_on_startup
            self.rpc.call("createwallet", name, True, True, "", False, True, True)
            return True
        except RpcError as exc:
            if exc.rpc_code in (RPC_WALLET_ALREADY_EXISTS, RPC_WALLET_ALREADY_LOADED, RPC_WALLET_ERROR) \
                    and name in self.rpc.call("listwallets"):
                return False  # another process created it between our calls
            raise

    def watch_loaded(self, name: str) -> bool:
        return name in self.rpc.call("listwallets")

    def watch_unload(self, name: str) -> None:
        """Unload the wallet (tests; an operator retiring a deployment)."""
        self.rpc.call("unloadwallet", name)

    def watch_checksummed(self, descriptor: str) -> str:
        """`descriptor#checksum` as the node computes it (`getdescriptorinfo`)."""
        info = self.rpc.call("getdescriptorinfo", descriptor)
        return f"{strip_checksum(descriptor)}#{info['checksum']}"

    def watch_import(self, name: str, imports: list[WatchImport]) -> None:
        """Import (or widen: the same descriptor with a larger range) each descriptor, inactive
        (the wallet never hands out addresses), rescanning from the earliest `rescan_from`.
        Blocks until the rescan is done. `NodeBusy` when another rescan runs."""
        if not imports:
            return
        requests = [{"desc": self.watch_checksummed(i.descriptor), "range": [0, i.end], "timestamp": i.rescan_from,
                     "active": False, "internal": False} for i in imports]
        results = self._wallet(name).call("importdescriptors", requests)
        refused = [(i.descriptor, r.get("error", {}).get("message", r)) for i, r in zip(imports, results)
                   if not r.get("success")]
        if refused:
            raise ChainError(f"importdescriptors refused: {refused}")

    def watch_ranges(self, name: str) -> list[WatchedRange]:
        """The wallet's ranged descriptors and the last index each covers."""
        listed = self._wallet(name).call("listdescriptors")["descriptors"]
        return [WatchedRange(strip_checksum(d["desc"]), int(d["range"][1])) for d in listed if "range" in d]

    def watch_status(self, name: str) -> WatchStatus:
        info = self._wallet(name).call("getwalletinfo")
        last = info.get("lastprocessedblock")
        processed = BlockRef(int(last["height"]), last["hash"]) if last else None
        return WatchStatus(processed, bool(info.get("scanning")))

    def watch_coins(self, name: str, tip: BlockRef) -> list[WatchCoin]:
        """Every confirmed coin of the wallet that no block up to the wallet's last processed block
        spends (UTXO-set semantics; see the module docstring). The caller checks `watch_status`
        before and after, and compares with `tip`."""
        wallet = self._wallet(name)
        coins = [self._coin(u["txid"], u["vout"], u["address"], u["amount"], u.get("parent_descs", []), u.get("desc", ""),
                            spent_in_mempool=False)
                 for u in wallet.call("listunspent", 1, 9_999_999, [], True)]
        seen = {(c.txid, c.vout) for c in coins}
        # tip, target_confirmations, include_watchonly, include_removed, include_change
        since = wallet.call("listsinceblock", tip.hash, 1, True, False, True)["transactions"]
        pending = sorted({t["txid"] for t in since if t.get("confirmations", 0) == 0})
        for txid in pending:
            tx = wallet.call("gettransaction", txid, True, True)
            for vin in tx.get("decoded", {}).get("vin", []):
                outpoint = (vin.get("txid"), vin.get("vout"))
                if outpoint[0] is None or outpoint in seen:
                    continue
                out = self.rpc.call("gettxout", outpoint[0], outpoint[1], False)
                if out is None:
                    continue  # spent in a block, or not in the chain
                if out.get("bestblock") != tip.hash:
                    raise ChainError(f"gettxout answered at {out.get('bestblock')}, not at the tip {tip.hash}")
                address = out["scriptPubKey"].get("address", "")
                info = wallet.call("getaddressinfo", address) if address else {}
                if not info.get("ismine"):
                    continue
                seen.add(outpoint)
                parent = [info["parent_desc"]] if info.get("parent_desc") else []
                coins.append(self._coin(outpoint[0], outpoint[1], address, out["value"], parent, info.get("desc", ""),
                                        spent_in_mempool=True))
        return coins

    @staticmethod
    def _coin(txid: str, vout: int, address: str, amount: Decimal, parents: list[str], desc: str, *,
              spent_in_mempool: bool) -> WatchCoin:
        if len(parents) != 1:
            raise ChainError(f"coin {txid}:{vout} at {address} belongs to {len(parents)} of the wallet's descriptors")
        origin = _ORIGIN.search(desc)
        if origin is None:
            raise ChainError(f"coin {txid}:{vout}: no derivation path in {desc!r}")
        return WatchCoin(txid, int(vout), address, _sat(amount), strip_checksum(parents[0]), int(origin.group(1)),
                         int(origin.group(2)), spent_in_mempool)
