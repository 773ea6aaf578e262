"""Bitcoin block-scan benchmark: the adapter against the bare RPC calls it makes.

    .venv/bin/python bench/chain_scan.py            # 500 blocks, >= 20,000 txs, 300 watched addresses
    .venv/bin/python bench/chain_scan.py --quick    # 60 blocks, 2,400 txs, 60 watched addresses

Self-contained: starts its own bitcoind -regtest through regtest/ (stopped on exit), builds the
chain with Python-signed P2WPKH transactions (`--lanes` per block, each paying either a watched
or an unwatched address, plus change), then walks the chain

- with `BitcoinAdapter.scan()` (JSON-RPC, Decimal amounts, matching, typed observations), and
- with the same JSON-RPC requests sent bare (http.client + json.loads, no processing),

alternating, `--rounds` times each, and prints the best times: blocks/s, outputs/s, and the
ratio adapter/bare (target: <= 1.25).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bitcoin.segwit_addr import encode as bech32_encode  # noqa: E402

from chain_adapters.base import Watch  # noqa: E402
from chain_adapters.bitcoin import BLOCK_BATCH, BitcoinAdapter  # noqa: E402
from regtest.bitcoin_node import RPC_PASSWORD, RPC_USER, start_bitcoind  # noqa: E402
from regtest.install import find_tools  # noqa: E402
from tests.e2e.txbuild import BtcKey, spend_p2wpkh  # noqa: E402

PAY, FEE = 10_000, 300


def random_address(rng: random.Random) -> str:
    return bech32_encode("bcrt", 0, rng.randbytes(20))


def build_chain(node, blocks: int, lanes: int, watched: list[str], rng: random.Random) -> int:
    """Mine `blocks` blocks of `lanes` transactions each; returns the first new height."""
    keys = [BtcKey.from_label(f"bench-lane-{i}") for i in range(lanes)]
    per_lane = blocks * (PAY + FEE) + 100_000
    node.wallet("sendmany", "", {k.address: f"{per_lane / 1e8:.8f}" for k in keys})
    node.mine(1)
    utxos = {}
    for unspent in node.rpc("scantxoutset", "start", [f"addr({k.address})" for k in keys])["unspents"]:
        utxos[unspent["scriptPubKey"]] = (unspent["txid"], unspent["vout"], int(unspent["amount"] * 100_000_000))
    lanes_state = [(k, *utxos[k.script_pubkey.hex()]) for k in keys]
    first = node.rpc("getblockcount") + 1
    started = time.monotonic()
    for height in range(blocks):
        raws, nxt = [], []
        for key, txid, vout, amount in lanes_state:
            dest = rng.choice(watched) if rng.random() < 0.25 else random_address(rng)
            change = amount - PAY - FEE
            raw = spend_p2wpkh(key, txid, vout, amount, [(key.address, change), (dest, PAY)])
            raws.append(raw)
            nxt.append((key, change))
        txids = node._client("").batch([("sendrawtransaction", (r.hex(),)) for r in raws])
        lanes_state = [(key, t, 0, change) for (key, change), t in zip(nxt, txids)]
        node.mine(1)
        if (height + 1) % 50 == 0:
            print(f"  built {height + 1}/{blocks} blocks ({time.monotonic() - started:.0f}s)", flush=True)
    return first


def bare_scan(port: int, first: int, last: int) -> tuple[float, int]:
    """The adapter's requests, sent and decoded with nothing else: (seconds, outputs seen)."""
    import base64

    auth = "Basic " + base64.b64encode(f"{RPC_USER}:{RPC_PASSWORD}".encode()).decode()
    headers = {"Content-Type": "application/json", "Authorization": auth}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def batch(calls):
        body = json.dumps([{"jsonrpc": "2.0", "id": i, "method": m, "params": p} for i, (m, p) in enumerate(calls)])
        conn.request("POST", "/", body, headers)
        return [r["result"] for r in json.loads(conn.getresponse().read())]

    outputs = 0
    t0 = time.perf_counter()
    conn.request("POST", "/", json.dumps({"jsonrpc": "2.0", "id": 0, "method": "getblockhash",
                                          "params": [first - 1]}), headers)  # cursor check
    conn.getresponse().read()
    for start in range(first, last + 1, BLOCK_BATCH):
        heights = range(start, min(last, start + BLOCK_BATCH - 1) + 1)
        hashes = batch([("getblockhash", [h]) for h in heights])
        for block in batch([("getblock", [h, 2]) for h in hashes]):
            outputs += sum(len(tx["vout"]) for tx in block["tx"])
    elapsed = time.perf_counter() - t0
    conn.close()
    return elapsed, outputs


def adapter_scan(url: str, first: int, last: int, watch: Watch) -> tuple[float, int]:
    adapter = BitcoinAdapter(url, network="regtest")
    cursor = adapter.block_at(first - 1)
    t0 = time.perf_counter()
    result = adapter.scan(cursor, watch, max_blocks=last - first + 1)
    elapsed = time.perf_counter() - t0
    adapter.close()
    assert result.cursor.height == last, result.cursor
    return elapsed, len(result.observations)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--blocks", type=int)
    parser.add_argument("--lanes", type=int, default=40, help="transactions per block")
    parser.add_argument("--watched", type=int)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=int(os.environ.get("BENCH_SEED", 1)))
    args = parser.parse_args()
    blocks = args.blocks or (60 if args.quick else 500)
    n_watched = args.watched or (60 if args.quick else 300)
    rng = random.Random(args.seed)
    watched = [random_address(rng) for _ in range(n_watched)]

    root = Path(tempfile.mkdtemp(prefix="custody-bench-"))
    node = start_bitcoind(find_tools(), root / "bitcoind")
    try:
        print(f"building {blocks} blocks x {args.lanes} txs, {n_watched} watched addresses (seed {args.seed})")
        t0 = time.monotonic()
        first = build_chain(node, blocks, args.lanes, watched, rng)
        last = first + blocks - 1
        n_txs = sum(node.rpc("getblockstats", h, ["txs"])["txs"] for h in range(first, last + 1))
        print(f"chain built in {time.monotonic() - t0:.0f}s: heights {first}..{last}, {n_txs} transactions")
        watch = Watch(frozenset(watched))
        port = node.rpc_port
        bare_times, adapter_times = [], []
        outputs = observations = 0
        for _ in range(args.rounds):
            bt, outputs = bare_scan(port, first, last)
            at, observations = adapter_scan(node.rpc_url, first, last, watch)
            bare_times.append(bt)
            adapter_times.append(at)
        bare, adapter = min(bare_times), min(adapter_times)
        print(f"blocks scanned:       {blocks}")
        print(f"transactions:         {n_txs}")
        print(f"outputs:              {outputs}")
        print(f"watched addresses:    {n_watched}; observations reported: {observations}")
        print(f"bare RPC:             {bare:.3f}s  ({blocks / bare:,.0f} blocks/s, {outputs / bare:,.0f} outputs/s)")
        print(f"adapter:              {adapter:.3f}s  ({blocks / adapter:,.0f} blocks/s, {outputs / adapter:,.0f} outputs/s)")
        print(f"adapter / bare RPC:   {adapter / bare:.3f}  (overhead {100 * (adapter / bare - 1):.1f}%, target <= 25%)")
        print(f"rounds: {args.rounds}; all adapter times {[round(t, 3) for t in adapter_times]}, "
              f"bare {[round(t, 3) for t in bare_times]}")
    finally:
        node.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
