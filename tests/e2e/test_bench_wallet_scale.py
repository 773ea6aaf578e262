"""Smoke test of bench/wallet_scale.py: its tiny mode (chains of 2,000 and 1,000 outputs built in
the run's own directory, 1,000 deposit addresses) runs end to end on a real bitcoind and PostgreSQL
and prints every figure issue 13 asks for. The bench itself exits 1 when a measured pass is not a
valid one (deposits not found by the walk, a reconciliation line not at zero, a ledger that does not
verify), so this also fails then. The figures of the full run are for the closing note, not CI.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/<db> .venv/bin/python -m pytest tests/e2e/test_bench_wallet_scale.py
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIGURE = r"[\d,]+\.\d"


def test_wallet_scale_bench_prints_every_figure() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "wallet_scale.py"), "--tiny", "--fresh", "--rounds", "1", "--repeat", "2"],
        cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=900)
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{proc.stderr[-3000:]}"
    for mode in ("one call per block", "one call for 1 blocks"):
        section = out.split(f"  {mode}:\n", 1)[1]
        assert re.search(rf"^ +100 watched addresses: +{FIGURE} ms/block$", section, re.M), section
        assert re.search(rf"^ +1,000 watched addresses: +{FIGURE} ms/block$", section, re.M), section
        assert re.search(r"^ +ratio 1,000/100: \d+\.\d\d \(target <= 1\.5\)$", section, re.M), section
    assert re.search(r"UTXO set [\d,]+ +UTXO set [\d,]+ +ratio", out), out
    for label in ("hot-wallet sync (nothing new)", "reconciliation pass (bitcoin)", "scantxoutset, 1 address (best)"):
        assert re.search(rf"^  {re.escape(label)} +{FIGURE} ms +{FIGURE} ms +\d+\.\d\d$", out, re.M), out
    for outputs in ("1,000", "2,000"):
        assert re.search(rf"^  node RPC methods, {outputs}-output chain: one sync: \w+ x\d+.*; one reconciliation pass: "
                         r"\w+ x\d+", out, re.M), out
    assert re.search(r"^load average \(1/5/15 min\) at start: [\d./]+, at end: [\d./]+$", out, re.M), out
