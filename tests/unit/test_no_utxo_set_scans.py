"""No recurring job or API route can scan bitcoind's UTXO set (issue 13).

`scantxoutset` walks the node's whole UTXO set (minutes on mainnet, one at a time per node). The
service reads its own wallet index instead (custody.wallet_index) and the node's watch-only wallet
(custody.node_view); the scan is only the operator's `python -m custody rescan` (custody.rescan).
This reads the source of every module the api, worker and signer processes can import and fails
on any call that scans the UTXO set outside custody/rescan.py: the adapter's `unspent(...)` or
`operator_scan_utxo_set(...)`, or an RPC named `scantxoutset`. The e2e test
tests/e2e/custody/test_wallet_index_bitcoin.py records the RPC methods the jobs really call.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("custody", "signer", "ledger", "matching", "policies")
ALLOWED = {Path("custody/rescan.py")}
SCANNING_METHODS = {"unspent", "operator_scan_utxo_set"}


def scans(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in SCANNING_METHODS:
            if isinstance(func.value, ast.Name) and func.value.id == "wallet_index":
                continue  # custody.wallet_index.unspent: our own table
            lines.append(node.lineno)
        if any(isinstance(a, ast.Constant) and a.value == "scantxoutset" for a in node.args):
            lines.append(node.lineno)
    return lines


def test_only_the_operator_rescan_scans_the_utxo_set():
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel in ALLOWED:
                continue
            hits = scans(ast.parse(path.read_text(), str(rel)))
            if hits:
                found[str(rel)] = hits
    assert found == {}, f"UTXO-set scans outside custody/rescan.py: {found}"


def test_the_check_sees_a_scan():
    # the detector itself: each form of a scan is found, the index's own reader is not
    src = ("adapter.unspent(addrs)\nself.bitcoin.operator_scan_utxo_set(x)\nrpc.call('scantxoutset', 'start', [])\n"
           "wallet_index.unspent(c, 'hot')\n")
    assert scans(ast.parse(src)) == [1, 2, 3]
