"""Bitcoin wallet tracking at mainnet-like scale: the block walk, the hot-wallet sync and a
reconciliation pass on a regtest UTXO set of 1,000,000 outputs with 100,000 deposit addresses.

    .venv/bin/python bench/wallet_scale.py                  # 1,000,000- and 10,000-output chains, 100,000 addresses
    .venv/bin/python bench/wallet_scale.py --tiny --fresh   # 2,000 / 1,000 outputs, 1,000 addresses (the smoke test)

What it prints, in one run (with the load average before and after, `os.getloadavg()`):

1. The walk: `Deposits.scan` over the blocks of the large chain that carry the deposits, with the
   first 1,000 deposit addresses watched and with all 100,000 (the same deposits are found: they pay
   addresses 0..999), in ms per block, both as the job runs once caught up (one call per block) and
   catching up (one call for the whole window); and their ratio (target: at most 1.5).
2. On the small and the large chain: one hot-wallet sync (`Payouts.sync_hot_wallet`, once it has
   nothing new to record) and one bitcoin reconciliation pass (`Reconciliation.run(chains=["bitcoin"])`,
   which runs a sync first and cross-checks every line against the node's own watch-only wallet,
   custody.node_view, as the deployed worker does; the first pass creates that wallet), beside one `scantxoutset` call for the hot address on the same node;
   and the ratio large/small of each (target for sync and reconciliation: independent of the UTXO
   set size, i.e. near 1). Under each figure: the node's RPC methods it caused, counted from the
   node's own log (`-debug=rpc`), so the figures say which path they measured.

The chains are built once and cached under the cache directory (`CUSTODY_CACHE_DIR`, default
`~/.cache/custody-service/wallet-scale-<key>`, keyed by `CHAIN_VERSION`, the bitcoind binary, the
output and deposit counts), as the regtest chain template is, and copied for each run. Building:
mine one coinbase per fan-out transaction to a key of the bench, mature them, then spend each into
`OUTPUTS_PER_TX` P2WPKH outputs paying random 20-byte witness programs (signed with
python-bitcoinlib, submitted raw, 10 transactions per block); the last transactions also pay the
deposits. The first build of the 1,000,000-output chain takes minutes (progress is printed).
`--fresh` builds into the run's temporary directory instead and caches nothing.

Deposit addresses are the BIP84 test-vector seed's (regtest only), derived with `custody.addresses`
exactly as `Wallets.issue_address` does, and inserted in batches (10,000 rows a statement) with
`wallet.next_index` set after them (issuing 100,000 one by one through the API path takes minutes;
each issue is O(1) since issue 13, see tests/integration/test_deposit_address_scale.py). The
worker's index verifies each deposit address once (derives it again, custody.wallet_index); the
bench does that before it times anything, so the walk figures are the steady state. Each measurement runs on a database of its own, cloned
(`CREATE DATABASE ... TEMPLATE`) from a prepared one on the configured server (DATABASE_URL, or the
embedded PostgreSQL); all of them are dropped on exit, the nodes stopped, the directories removed.

Exit status 1 (with the reason) when a measured pass is not a valid one: the walk did not record
the deposits, or a reconciliation line did not reconcile to zero, or the ledger does not verify.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import create_engine, text  # noqa: E402

from bench.regtest_custody import bench_keys, bitcoin_container  # noqa: E402
from chain_adapters.base import BlockRef  # noqa: E402
from custody.addresses import derive_btc_address  # noqa: E402
from custody.container import Container  # noqa: E402
from custody.wallet_index import WalletIndex  # noqa: E402
from custody.database import drop_database, ensure_database, make_engine, migrate, server_url, with_database  # noqa: E402
from custody.settings import Settings  # noqa: E402
from ledger.service import Ledger  # noqa: E402
from regtest.bitcoin_node import BitcoinNode, chain_template, start_bitcoind  # noqa: E402
from regtest.install import Tools, cache_root, find_tools  # noqa: E402
from signer.keys import SignerKeys  # noqa: E402
from tests.e2e.txbuild import BtcKey, script_for, spend_p2wpkh_to_scripts  # noqa: E402

CHAIN_VERSION = "1"  # bump when the chain's construction changes: every cached chain is rebuilt
OUTPUTS_PER_TX = 2_900  # 2,900 P2WPKH outputs: ~360,000 weight units, under the 400,000 standard limit
TXS_PER_BLOCK = 10  # ~3.6 M weight units a block, under the 4 M limit
FANOUT_FEE = 150_000  # satoshis per fan-out transaction (~1.7 sat/vB)
DEPOSIT_TXS = 100  # the last (at most) 100 fan-out transactions carry the deposits: the walk window
COINBASE_MATURITY = 100
INSERT_BATCH = 10_000
HOT_FUNDING = 100_000_000  # one coin of 1 BTC paid to the hot receive address before the sync
FINALITY = 3
NODE_ARGS = ("-debug=rpc",)  # every RPC method in debug.log: what each measured call asked of the node


@dataclass(frozen=True)
class Scale:
    large: int  # outputs created on the large chain
    small: int  # ... on the small one
    addresses: int  # deposit addresses of the wallet
    watched_small: int  # the smaller watched set of the walk comparison (its first addresses)
    deposits: int  # deposits paid in the chains, to addresses 0 .. deposits - 1

    def check(self) -> None:
        if not self.deposits <= self.watched_small <= self.addresses:
            raise SystemExit("need deposits <= watched-small <= addresses")


FULL = Scale(large=1_000_000, small=10_000, addresses=100_000, watched_small=1_000, deposits=1_000)
TINY = Scale(large=2_000, small=1_000, addresses=1_000, watched_small=100, deposits=100)


def say(msg: str) -> None:
    print(msg, flush=True)


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


# ---- the chains ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Chain:
    """A stopped node's data directory holding a large UTXO set, and what the bench needs of it."""

    datadir: Path
    outputs: int  # fan-out outputs created
    utxo_set: int  # outputs in the node's UTXO set after the build (gettxoutsetinfo)
    walk_first: int  # the first and last block carrying deposits: the walk window
    walk_last: int
    height: int  # the tip when the build stopped

    @classmethod
    def load(cls, datadir: Path) -> Chain:
        meta = json.loads((datadir / "wallet-scale.json").read_text())
        return cls(datadir, meta["outputs"], meta["utxo_set"], meta["walk_first"], meta["walk_last"], meta["height"])


def cached_chain(tools: Tools, outputs: int, deposits: list[str], seed: int, fresh_root: Path | None) -> Chain:
    """The chain of `outputs` fan-out outputs paying `deposits` too: from the cache (built on first
    use), or built under `fresh_root` when given (nothing cached)."""
    if fresh_root is not None:
        target = fresh_root / f"chain-{outputs}"
        build_chain(tools, target, outputs, deposits, seed)
        return Chain.load(target)
    key = hashlib.sha256(f"{chain_template(tools).name}:{CHAIN_VERSION}:{outputs}:{OUTPUTS_PER_TX}:{seed}:"
                         f"{','.join(deposits)}".encode()).hexdigest()[:16]
    target = cache_root() / f"wallet-scale-{key}"
    if (target / "wallet-scale.json").is_file():
        say(f"chain of {outputs:,} outputs: cached in {target}")
        return Chain.load(target)
    work = Path(tempfile.mkdtemp(dir=cache_root(), prefix="wallet-scale-build-"))
    try:
        build_chain(tools, work, outputs, deposits, seed)
        if target.exists():
            shutil.rmtree(target)
        work.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Chain.load(target)


def build_chain(tools: Tools, target: Path, outputs: int, deposits: list[str], seed: int) -> None:
    """Build the chain into `target` (a stopped node's data directory plus wallet-scale.json)."""
    rng = random.Random(seed)
    funder = BtcKey.from_label("wallet-scale-funder")
    n_txs = math.ceil(outputs / OUTPUTS_PER_TX)
    deposit_txs = min(n_txs, DEPOSIT_TXS)
    deposit_scripts = [script_for(a) for a in deposits]
    say(f"building a chain of {outputs:,} outputs ({n_txs} fan-out transactions of up to {OUTPUTS_PER_TX:,} outputs, "
        f"{len(deposits):,} deposits in the last {deposit_txs}) in {target}")
    started = time.monotonic()
    node = start_bitcoind(tools, target, extra=NODE_ARGS)
    try:
        client = node._client("")
        hashes: list[str] = []
        while len(hashes) < n_txs:
            hashes += node.rpc("generatetoaddress", min(100, n_txs - len(hashes)), funder.address)
        node.rpc("generatetoaddress", COINBASE_MATURITY, funder.address)
        coinbases = []
        for start in range(0, n_txs, 50):
            for block in client.batch([("getblock", (h, 2)) for h in hashes[start:start + 50]]):
                cb = block["tx"][0]
                coinbases.append((cb["txid"], int(cb["vout"][0]["value"] * 100_000_000)))
        say(f"  {n_txs} coinbases mined and matured ({time.monotonic() - started:.0f}s)")
        pending: list[tuple[bool, str]] = []  # (pays deposits, raw hex)
        deposit_txids: list[str] = []
        for i, (txid, value) in enumerate(coinbases):
            n_out = min(OUTPUTS_PER_TX, outputs - i * OUTPUTS_PER_TX)
            scripts = [b"\x00\x14" + rng.randbytes(20) for _ in range(n_out)]
            slot = i - (n_txs - deposit_txs)
            if slot >= 0:  # this transaction pays its share of the deposits at random positions
                mine = deposit_scripts[slot::deposit_txs]
                for pos, script in zip(rng.sample(range(n_out), len(mine)), mine):
                    scripts[pos] = script
            each = (value - FANOUT_FEE) // n_out
            raw = spend_p2wpkh_to_scripts(funder, txid, 0, value, [(s, each) for s in scripts])
            pending.append((slot >= 0, raw.hex()))
            if len(pending) == TXS_PER_BLOCK or i == n_txs - 1:
                sent = client.batch([("sendrawtransaction", (r,)) for _, r in pending])
                deposit_txids += [t for (pays, _), t in zip(pending, sent) if pays]
                pending = []
                while node.rpc("getmempoolinfo")["size"]:
                    node.rpc("generatetoaddress", 1, funder.address)
            if (i + 1) % 50 == 0:
                say(f"  {i + 1}/{n_txs} fan-out transactions mined ({time.monotonic() - started:.0f}s)")
        heights = {client.call("getblockheader", client.call("getrawtransaction", t, True)["blockhash"])["height"]
                   for t in deposit_txids}
        utxo_set = node.rpc("gettxoutsetinfo", "none")["txouts"]
        height = node.rpc("getblockcount")
    finally:
        node.stop()
    for junk in ("bitcoind.out", "regtest/debug.log", "regtest/.lock", "regtest/bitcoind.pid"):
        (target / junk).unlink(missing_ok=True)
    meta = {"version": CHAIN_VERSION, "outputs": outputs, "utxo_set": utxo_set, "walk_first": min(heights),
            "walk_last": max(heights), "height": height, "deposits": len(deposits),
            "build_seconds": round(time.monotonic() - started)}
    (target / "wallet-scale.json").write_text(json.dumps(meta, indent=1))
    say(f"  built in {meta['build_seconds']}s: UTXO set {utxo_set:,} outputs, deposits in blocks "
        f"{meta['walk_first']}..{meta['walk_last']}, tip {height}")


class RpcLog:
    """The node's RPC methods called since the last mark, read from its debug.log (-debug=rpc)."""

    _LINE = re.compile(r"ThreadRPCServer method=(\w+)")

    def __init__(self, node: BitcoinNode) -> None:
        self.path = node.datadir / "regtest" / "debug.log"
        self.offset = self.path.stat().st_size

    def mark(self) -> None:
        self.offset = self.path.stat().st_size

    def since(self) -> Counter:
        with self.path.open("rb") as f:
            f.seek(self.offset)
            return Counter(self._LINE.findall(f.read().decode(errors="replace")))


def describe(methods: Counter) -> str:
    return ", ".join(f"{m} x{n}" for m, n in sorted(methods.items(), key=lambda kv: (-kv[1], kv[0]))) or "none"


def deposit_addresses(keys: SignerKeys, n: int, *, cache: bool) -> list[str]:
    """The deposit wallet's receive addresses 0..n-1 (custody.addresses, as Wallets.issue_address
    derives them); kept in the cache directory, since 100,000 derivations take 20 s or more."""
    xpub = keys.account_xpub("bitcoin", "deposit")
    path = cache_root() / f"wallet-scale-addresses-{hashlib.sha256(xpub.encode()).hexdigest()[:16]}.txt"
    if cache and path.is_file():
        known = path.read_text().split()
        if len(known) >= n:
            say(f"{n:,} deposit addresses: cached in {path}")
            return known[:n]
    t0 = time.perf_counter()
    addresses = [derive_btc_address(xpub, "regtest", 0, i) for i in range(n)]
    say(f"{n:,} deposit addresses derived in {time.perf_counter() - t0:.1f}s")
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text("\n".join(addresses))
        partial.replace(path)
    return addresses


# ---- the databases ---------------------------------------------------------------------------

class Databases:
    """Template databases (migrated, wallets and addresses in) and per-measurement clones of them."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.prefix = f"bench_wscale_{os.getpid()}"
        self.names: list[str] = []
        self.admin = create_engine(with_database(server, "postgres"), isolation_level="AUTOCOMMIT")

    def template(self, tag: str, keys: SignerKeys, addresses: list[str]) -> str:
        """A database with the deposit and hot wallets, BTC, and `addresses` issued (indices 0..n-1)."""
        name = self._name(tag)
        url = with_database(self.server, name)
        ensure_database(url)
        migrate(url)
        engine = make_engine(url)
        try:
            wallets = Container(settings=Settings(environment="test"), engine=engine, ledger=Ledger(engine)).wallets
            wallet_id = wallets.register_wallet("bitcoin", "deposit", "regtest", keys.account_xpub("bitcoin", "deposit"),
                                                gap_limit=len(addresses) + 1)
            wallets.register_wallet("bitcoin", "hot", "regtest", keys.account_xpub("bitcoin", "hot"))
            wallets.configure_asset("BTC", 8, "bitcoin", finality=FINALITY, dust_minimum=1_000)
            owners = [f"bench-{i}" for i in range(min(1_000, len(addresses)))]
            accounts = [wallets.customer_account(o, "BTC") for o in owners]
            sql = text("INSERT INTO deposit_address (wallet_id, chain, address, derivation_index, account_id, owner, "
                       "idempotency_key) VALUES (:w, 'bitcoin', :a, :i, :acc, :o, :k)")
            for start in range(0, len(addresses), INSERT_BATCH):
                with engine.begin() as c:
                    c.execute(sql, [{"w": wallet_id, "a": addresses[i], "i": i, "acc": accounts[i % len(accounts)],
                                     "o": owners[i % len(owners)], "k": f"bench:{i}"}
                                    for i in range(start, min(len(addresses), start + INSERT_BATCH))])
            with engine.begin() as c:
                # the bench's own bulk set-up: `wallet_next_index_by_one` (migration 0028) lets next_index
                # move by one per update, as issue_address does; the owner sets the triggers aside here
                c.execute(text("SET LOCAL session_replication_role = replica"))
                c.execute(text("UPDATE wallet SET next_index = :n WHERE id = :w"), {"n": len(addresses), "w": wallet_id})
            t0 = time.perf_counter()
            with engine.begin() as c:  # the index's one-off check of every deposit address (custody.wallet_index)
                WalletIndex("bitcoin").refresh(c)
            say(f"  the wallet index verified {len(addresses):,} deposit addresses (derived again, once) in "
                f"{time.perf_counter() - t0:.1f}s; clones of this database keep the verdicts")
            with engine.begin() as c:
                c.execute(text("ANALYZE"))
        finally:
            engine.dispose()
        return name

    @contextmanager
    def clone(self, template: str, tag: str) -> Iterator[str]:
        """A fresh copy of `template` for one measurement (dropped afterwards): its URL."""
        name = self._name(tag)
        with self.admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
        try:
            yield with_database(self.server, name)
        finally:
            drop_database(with_database(self.server, name))

    def _name(self, tag: str) -> str:
        name = f"{self.prefix}_{tag}_{len(self.names)}"
        self.names.append(name)
        return name

    def drop_all(self) -> None:
        for name in self.names:
            drop_database(with_database(self.server, name))
        self.admin.dispose()


# ---- the measurements ------------------------------------------------------------------------

def block_ref(node: BitcoinNode, height: int) -> BlockRef:
    return BlockRef(height, node.rpc("getblockhash", height))


def walk(container: Container, node: BitcoinNode, chain: Chain, per_call: int) -> tuple[float, int]:
    """Time Deposits.scan over the walk window, `per_call` blocks a call: (seconds, recorded)."""
    deposits = container.deposits
    deposits.start_cursor("bitcoin", block_ref(node, chain.walk_first - 1))
    recorded = 0
    t0 = time.perf_counter()
    height = chain.walk_first - 1
    while height < chain.walk_last:
        summary = deposits.scan("bitcoin", max_blocks=min(per_call, chain.walk_last - height))
        if not summary.blocks:
            raise Invalid(f"the scanner stopped at block {summary.cursor.height}, before {chain.walk_last}")
        recorded += summary.recorded
        height = summary.cursor.height
    return time.perf_counter() - t0, recorded


def timed(fn: Callable[[], object], log: RpcLog, repeat: int) -> tuple[list[float], Counter, object]:
    """Run `fn` `repeat` times: (seconds of each, the RPC methods of the last run, its result)."""
    times, result, methods = [], None, Counter()
    for _ in range(repeat):
        log.mark()
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        methods = log.since()
    return times, methods, result


@dataclass
class Figures:
    """The sync / reconciliation / scantxoutset figures of one chain."""

    utxo_set: int
    sync_first: float = 0.0
    sync: float = 0.0
    sync_rpc: str = ""
    recon_first: float = 0.0
    recon: float = 0.0
    recon_rpc: str = ""
    scan: float = 0.0


class Invalid(Exception):
    """A measured pass that is not a valid one (the figures would mean nothing)."""


def steady_state(dbs: Databases, template: str, tools: Tools, chain: Chain, root: Path, keys: SignerKeys,
                 scale: Scale, repeat: int) -> Figures:
    """Start a node on a copy of `chain`, bring a database to its tip (deposits scanned and
    credited, the hot wallet funded and synced), then time sync, reconciliation and scantxoutset."""
    node = start_bitcoind(tools, root / f"node-{chain.outputs}", template=chain.datadir, extra=NODE_ARGS)
    try:
        utxo_set = node.rpc("gettxoutsetinfo", "none")["txouts"]
        with dbs.clone(template, f"steady{chain.outputs}") as url:
            container = bitcoin_container(url, node, keys, node_view=True)  # reconciliation as deployed
            try:
                figures = Figures(utxo_set)
                hot = container.payouts.hot_address("bitcoin")
                node.fund(hot, HOT_FUNDING)
                node.mine(FINALITY)
                deposits = container.deposits
                deposits.start_cursor("bitcoin", block_ref(node, chain.walk_first - 1))
                recorded = 0
                while (s := deposits.scan("bitcoin")).blocks:
                    recorded += s.recorded
                deposits.confirm("bitcoin")
                credited = 0
                while (n := deposits.credit("bitcoin").credited):
                    credited += n
                if recorded != scale.deposits:
                    raise Invalid(f"the scanner recorded {recorded} deposits on the {chain.outputs:,}-output chain, "
                                  f"expected {scale.deposits}")
                say(f"  {chain.outputs:,}-output chain: UTXO set {utxo_set:,}; {recorded} deposits scanned, "
                    f"{credited} credited; the hot wallet holds one coin")
                log = RpcLog(node)
                sync = container.payouts.sync_hot_wallet
                times, _, added = timed(sync, log, 1)
                if added != 1:
                    raise Invalid(f"the first hot-wallet sync recorded {added} coins, expected the 1 funding coin")
                figures.sync_first = times[0]
                times, methods, added = timed(sync, log, repeat)
                figures.sync, figures.sync_rpc = statistics.median(times), describe(methods)
                recon = container.reconciliation
                times, _, lines = timed(lambda: recon.run(chains=["bitcoin"]), log, 1)
                figures.recon_first = times[0]
                check_lines(lines, chain)
                times, methods, lines = timed(lambda: recon.run(chains=["bitcoin"]), log, repeat)
                check_lines(lines, chain)
                figures.recon, figures.recon_rpc = statistics.median(times), describe(methods)
                scans = timed(lambda: node.rpc("scantxoutset", "start", [f"addr({hot})"]), log, repeat)[0]
                figures.scan = min(scans)
                container.ledger.assert_verified()
            finally:
                container.engine.dispose()
        return figures
    finally:
        node.stop()


def check_lines(lines, chain: Chain) -> None:
    tiers = sorted(line.tier for line in lines)
    if tiers != ["deposit", "hot"]:
        raise Invalid(f"reconciliation on the {chain.outputs:,}-output chain compared {tiers}, expected deposit and hot")
    for line in lines:
        if line.node != line.on_chain:
            raise Invalid(f"reconciliation on the {chain.outputs:,}-output chain: the node's own view of {line.tier} "
                          f"({line.node}) is not the index's ({line.on_chain})")
        if line.difference != 0:
            raise Invalid(f"reconciliation on the {chain.outputs:,}-output chain: {line.tier} differs by "
                          f"{line.difference} (chain {line.on_chain}, books {line.books}, in transit {line.in_transit})")


def walks(dbs: Databases, templates: dict[int, str], tools: Tools, chain: Chain, root: Path, keys: SignerKeys,
          scale: Scale, rounds: int) -> dict[tuple[int, str], list[float]]:
    """Per (watched count, mode): seconds per block of each round, rounds alternating the sets."""
    node = start_bitcoind(tools, root / "node-walk", template=chain.datadir, extra=NODE_ARGS)
    blocks = chain.walk_last - chain.walk_first + 1
    out: dict[tuple[int, str], list[float]] = {}
    try:
        outs = sum(node.rpc("getblockstats", h, ["outs"])["outs"] for h in range(chain.walk_first, chain.walk_last + 1))
        say(f"  {blocks} blocks, {outs:,} outputs ({outs / blocks:,.0f} a block)")
        for r in range(rounds):
            for watched, template in templates.items():
                for mode, per_call in (("one call per block", 1), (f"one call for {blocks} blocks", blocks)):
                    with dbs.clone(template, f"walk{watched}") as url:
                        container = bitcoin_container(url, node, None)
                        try:
                            seconds, recorded = walk(container, node, chain, per_call)
                            container.ledger.assert_verified()
                        finally:
                            container.engine.dispose()
                    if recorded != scale.deposits:
                        raise Invalid(f"the walk with {watched:,} watched recorded {recorded} deposits, "
                                      f"expected {scale.deposits}")
                    out.setdefault((watched, mode), []).append(seconds / blocks)
                    say(f"  round {r + 1}: {watched:>7,} watched, {mode}: {1000 * seconds / blocks:,.1f} ms/block")
        return out
    finally:
        node.stop()


# ---- main ------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="2,000 / 1,000 outputs, 1,000 addresses (smoke test)")
    parser.add_argument("--fresh", action="store_true", help="build the chains in the run's directory, cache nothing")
    parser.add_argument("--large", type=int, help="outputs of the large chain")
    parser.add_argument("--small", type=int, help="outputs of the small chain")
    parser.add_argument("--addresses", type=int, help="deposit addresses (the larger watched set)")
    parser.add_argument("--watched-small", type=int, help="the smaller watched set of the walk")
    parser.add_argument("--deposits", type=int, help="deposits paid in the chains")
    parser.add_argument("--rounds", type=int, default=2, help="walk rounds (best of)")
    parser.add_argument("--repeat", type=int, default=3, help="sync, reconciliation and scantxoutset runs (median)")
    parser.add_argument("--seed", type=int, default=int(os.environ.get("BENCH_SEED", 1)))
    args = parser.parse_args()
    base = TINY if args.tiny else FULL
    scale = Scale(args.large or base.large, args.small or base.small, args.addresses or base.addresses,
                  args.watched_small or base.watched_small, args.deposits or base.deposits)
    scale.check()
    load_start = load()
    say(f"load average at start: {load_start}")

    tools = find_tools()
    keys = bench_keys()
    addresses = deposit_addresses(keys, scale.addresses, cache=not args.fresh)

    root = Path(tempfile.mkdtemp(prefix="bench-wallet-scale-"))
    dbs = Databases(server_url(Settings()))
    try:
        fresh = root if args.fresh else None
        paid = addresses[:scale.deposits]
        large = cached_chain(tools, scale.large, paid, args.seed, fresh)
        small = cached_chain(tools, scale.small, paid, args.seed, fresh)

        t0 = time.perf_counter()
        templates = {scale.watched_small: dbs.template("small", keys, addresses[:scale.watched_small]),
                     scale.addresses: dbs.template("large", keys, addresses)}
        say(f"template databases with {scale.watched_small:,} and {scale.addresses:,} addresses issued "
            f"(batched inserts) in {time.perf_counter() - t0:.1f}s")

        say(f"walk: blocks {large.walk_first}..{large.walk_last} of the {large.outputs:,}-output chain")
        per_block = walks(dbs, templates, tools, large, root, keys, scale, args.rounds)
        say("sync, reconciliation and scantxoutset:")
        figures = {c.outputs: steady_state(dbs, templates[scale.addresses], tools, c, root, keys, scale, args.repeat)
                   for c in (small, large)}
    except Invalid as exc:
        say(f"INVALID: {exc}")
        return 1
    finally:
        dbs.drop_all()
        shutil.rmtree(root, ignore_errors=True)

    blocks = large.walk_last - large.walk_first + 1
    say("")
    say(f"== walk: Deposits.scan over blocks {large.walk_first}..{large.walk_last} of the {large.outputs:,}-output chain "
        f"({scale.deposits:,} deposits found; best of {args.rounds} rounds)")
    modes = sorted({mode for _, mode in per_block}, key=lambda m: "one call per block" != m)
    for mode in modes:
        few = min(per_block[(scale.watched_small, mode)])
        many = min(per_block[(scale.addresses, mode)])
        say(f"  {mode}:")
        say(f"    {scale.watched_small:>9,} watched addresses: {1000 * few:10,.1f} ms/block")
        say(f"    {scale.addresses:>9,} watched addresses: {1000 * many:10,.1f} ms/block")
        say(f"    ratio {scale.addresses:,}/{scale.watched_small:,}: {many / few:.2f} (target <= 1.5)")
    s, big = figures[small.outputs], figures[large.outputs]
    say(f"== sync, reconciliation, scantxoutset ({scale.addresses:,} deposit addresses; median of {args.repeat})")
    say(f"  {'':32}{'UTXO set ' + format(s.utxo_set, ','):>22}{'UTXO set ' + format(big.utxo_set, ','):>22}{'ratio':>8}")
    rows = [("hot-wallet sync (nothing new)", s.sync, big.sync),
            ("reconciliation pass (bitcoin)", s.recon, big.recon),
            ("scantxoutset, 1 address (best)", s.scan, big.scan),
            ("first sync (records 1 coin)", s.sync_first, big.sync_first),
            ("first reconciliation pass", s.recon_first, big.recon_first)]
    for label, a, b in rows:
        say(f"  {label:32}{1000 * a:19,.1f} ms{1000 * b:19,.1f} ms{b / a:8.2f}")
    say("  targets: sync and reconciliation independent of the UTXO set size (ratio near 1)")
    for outputs, f in ((small.outputs, s), (large.outputs, big)):
        say(f"  node RPC methods, {outputs:,}-output chain: one sync: {f.sync_rpc}; "
            f"one reconciliation pass: {f.recon_rpc}")
    say(f"load average (1/5/15 min) at start: {load_start}, at end: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
