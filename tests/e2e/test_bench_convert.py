"""Smoke test of bench/convert.py (issue 17): one second with 16 clients starts the deployed
topology on fresh regtest nodes and the suite's database server, converts over HTTP (quote, then
accept) and prints its figure line; the bench exits 1 when a request gets anything but 201 or the
ledger does not verify afterwards, so this fails then too. Figures are never asserted here.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/<db> .venv/bin/python -m pytest tests/e2e/test_bench_convert.py
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_convert_bench_prints_its_figures_and_the_ledger_verifies() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "convert.py"), "--seconds", "1"],
                          cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{proc.stderr[-3000:]}"
    assert re.search(r"^convert +16 clients +[\d,]+ accepted quotes/s +p50 +[\d.]+ ms +p99 +[\d.]+ ms "
                     r"+api CPU +[\d.]+ ms/req +load +[\d.]+", out, re.M), out
    assert "ledger verify: all checks ok" in out, out
