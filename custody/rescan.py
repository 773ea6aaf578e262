"""The operator's rescan: one `scantxoutset` over the addresses custody issued, on request only.

    python -m custody rescan --config custody.toml --tier all|deposit|hot|cold

`scantxoutset` walks the node's whole UTXO set (minutes on mainnet) and bitcoind runs one at a time,
so no recurring job or API route calls it (issue 13): reconciliation reads custody's wallet index
and the node's watch-only wallet (custody.node_view). This tool is for an operator who wants the
UTXO set's own word, e.g. while investigating a reconciliation difference.

- Serialised: it first takes a PostgreSQL session advisory lock (`RESCAN_LOCK`, per network), so
  two operators cannot start two scans on one deployment's node; and bitcoind's own refusal
  (`rpc -8 Scan already in progress`: another deployment, or bitcoin-cli) is `NodeBusy`. Either
  way it prints "busy" and exits 3 without scanning.
- Progress: `scantxoutset status`, polled from a second thread while the scan runs, printed as a
  percentage.
- Abortable: Ctrl-C or SIGTERM sends `scantxoutset abort`; the tool then exits 130 and prints
  nothing as a finding.
- Output: per tier, what the UTXO set holds at the scan's block, beside the books (the tier's
  location account) and, when the node's view can be read at that block, the watch-only wallet's
  figure. The scan covers what custody issued: deposit `0/0 .. next_index-1`, hot `0/0` and
  `1/<bitcoin batch ids>` (as `1/0 .. max id`, the rest unissued and reported apart), cold
  `0/0 .. next_index-1`.

Exit status: 0 done; 1 an error (message on stderr); 3 busy; 130 aborted.
"""
from __future__ import annotations

import re
import signal
import sys
import threading
import zlib
from dataclasses import dataclass

from bip_utils import Base58Decoder, Hash160
from sqlalchemy import Engine, text

from chain_adapters.base import BlockRef
from chain_adapters.bitcoin import BitcoinAdapter, UtxoScan
from chain_adapters.errors import NodeBusy
from custody.addresses import descriptor_for
from custody.destinations import HOT_RECEIVE_INDEX
from custody.node_view import NodeView, NodeViewNotReady

RESCAN_LOCK_NAMESPACE = 0x5245534E  # "RESN"
TIER_CHOICES = ("all", "deposit", "hot", "cold")
EXIT_BUSY, EXIT_ABORTED = 3, 130
_ORIGIN = re.compile(r"\[([0-9a-f]{8})/(\d+)/(\d+)\]")


@dataclass(frozen=True)
class ScanPlan:
    """What to scan: (tier, branch, descriptor with checksum, last index) per watched branch."""

    items: tuple[tuple[str, int, str, int], ...]

    def scan_objects(self) -> list[dict]:
        return [{"desc": desc, "range": [0, end]} for _, _, desc, end in self.items if end >= 0]


def rescan_lock_key(network: str) -> tuple[int, int]:
    crc = zlib.crc32(f"rescan:bitcoin:{network}".encode())
    return RESCAN_LOCK_NAMESPACE, crc - (1 << 32) if crc >= 1 << 31 else crc


def plan(engine: Engine, network: str, tier: str) -> ScanPlan:
    with engine.connect() as c:
        wallets = {r.tier: r for r in c.execute(text("SELECT tier, xpub, next_index FROM wallet WHERE chain = 'bitcoin'"))}
        max_batch = int(c.execute(text("SELECT coalesce(max(id), -1) FROM withdrawal_batch WHERE chain = 'bitcoin'")).scalar_one())
    items = []
    for t, branch, end in (("deposit", 0, None), ("hot", 0, HOT_RECEIVE_INDEX), ("hot", 1, max_batch), ("cold", 0, None)):
        if t not in wallets or tier not in ("all", t):
            continue
        last = int(wallets[t].next_index) - 1 if end is None else end
        items.append((t, branch, descriptor_for(wallets[t].xpub, network, branch), last))
    return ScanPlan(tuple(items))


def by_tier(scan: UtxoScan, plan_: ScanPlan, fingerprints: dict[str, str]) -> dict[str, int]:
    """The scan's coins per tier, told apart by the key origin bitcoind reports (`[fpr/branch/i]`,
    the fingerprint being the account key's own): `fingerprints` maps fingerprint -> tier."""
    totals = {t: 0 for t, *_ in plan_.items}
    for desc, _txid, _vout, amount, _height in scan.unspents:
        origin = _ORIGIN.search(desc)
        tier = fingerprints.get(origin.group(1)) if origin else None
        totals[tier or "unknown"] = totals.get(tier or "unknown", 0) + amount
    return totals


def fingerprint_of(descriptor: str) -> str:
    """The BIP32 fingerprint of the descriptor's account key (first 4 bytes of HASH160 of its
    public key), as bitcoind prints it in key origins."""
    key = descriptor[descriptor.index("(") + 1:descriptor.index("/")]
    return Hash160.QuickDigest(Base58Decoder.CheckDecode(key)[45:78])[:4].hex()


def run(engine: Engine, adapter: BitcoinAdapter, network: str, tier: str, books: dict[str, int], *,
        out=sys.stdout, abort: threading.Event | None = None) -> int:  # noqa: ANN001 - a text stream
    """The tool's body (the CLI adds the configuration and the signal handlers)."""
    abort = abort or threading.Event()
    namespace, key = rescan_lock_key(network)
    with engine.connect() as lock_conn:
        if not lock_conn.execute(text("SELECT pg_try_advisory_lock(:n, :k)"), {"n": namespace, "k": key}).scalar_one():
            print("busy: another rescan of this deployment is running", file=out)
            return EXIT_BUSY
        try:
            todo = plan(engine, network, tier)
            if not todo.scan_objects():
                print("nothing to scan: custody has issued no address on that tier", file=out)
                return 0
            print(f"scanning the UTXO set for {', '.join(f'{t}/{b} 0..{e}' for t, b, _, e in todo.items)}", file=out)
            try:
                scan = adapter.operator_scan_utxo_set(
                    todo.scan_objects(), abort=abort,
                    on_progress=lambda pct: print(f"  {pct:.0f}%", file=out, flush=True))
            except NodeBusy as exc:
                print(f"busy: the node already runs a scan ({exc.detail})", file=out)
                return EXIT_BUSY
            if scan.aborted:
                print("aborted", file=out)
                return EXIT_ABORTED
            fingerprints = {fingerprint_of(desc): t for t, _, desc, _ in todo.items}
            found = by_tier(scan, todo, fingerprints)
            try:
                view = NodeView(engine, adapter, network=network).holdings(BlockRef(scan.height, scan.block_hash))
            except NodeViewNotReady as exc:
                view = {}
                print(f"(node view not readable at block {scan.height}: {exc.message})", file=out)
            print(f"at block {scan.height} {scan.block_hash}: {len(scan.unspents)} coins, {scan.total} sat", file=out)
            for t, amount in found.items():
                print(f"  {t:8} utxo set {amount:>16} sat   books {books.get(t, 0):>16} sat   node view "
                      f"{view.get(t, '-')!s:>16}   difference vs books {amount - books.get(t, 0):+d}", file=out)
            return 0
        finally:
            lock_conn.execute(text("SELECT pg_advisory_unlock(:n, :k)"), {"n": namespace, "k": key})


def main(config_path: str | None, tier: str) -> int:
    """`python -m custody rescan`: the configuration's database and bitcoin node; Ctrl-C or
    SIGTERM aborts the scan."""
    from custody.config import DeploymentConfig
    from custody.roots.common import build_adapters, open_engine

    config = DeploymentConfig.load(config_path, process="worker")
    if config.bitcoin is None:
        print("no [bitcoin] section in the configuration", file=sys.stderr)
        return 1
    engine = open_engine(config, "worker")
    adapter = build_adapters(config)["bitcoin"]
    abort = threading.Event()

    def stop(signum: int, _frame: object) -> None:
        print(f"{signal.Signals(signum).name}: aborting the scan", file=sys.stderr)
        abort.set()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    with engine.connect() as c:
        accounts = dict(c.execute(text(
            "SELECT split_part(a.name, ':', 3), -coalesce(sum(e.amount), 0) FROM account a "
            "LEFT JOIN journal_entry e ON e.account_id = a.id WHERE a.name LIKE 'location:bitcoin:%:BTC' "
            "GROUP BY a.name")).all())
    try:
        return run(engine, adapter, config.bitcoin.address_network, tier, {k: int(v) for k, v in accounts.items()},
                   abort=abort)
    finally:
        engine.dispose()
