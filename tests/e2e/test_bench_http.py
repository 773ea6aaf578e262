"""Smoke test of bench/http_api.py, the HTTP API's benchmark of record: its `--quick` mode with one
second per case starts the deployed topology (signer, worker until the reference data is applied,
api) on fresh regtest nodes and the suite's database server, drives every case over keep-alive
HTTP and prints a figure line per case, then its floors (floor-http: uvicorn alone; floor-db and
floor-db100: ledger_post alone from pgbench) and the ceiling line; the bench itself exits 1 when a
request gets an unexpected answer or the ledger does not verify afterwards, so this fails then too. The figures of a full run
are for the closing note, never asserted here.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/<db> .venv/bin/python -m pytest tests/e2e/test_bench_http.py
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINE = (r"^{case} +{clients} clients +[\d,]+ req/s +p50 +[\d.]+ ms +p99 +[\d.]+ ms +api CPU +[\d.]+ ms/req "
        r"+load +[\d.]+")


def test_http_bench_quick_prints_every_case_and_the_ledger_verifies() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "http_api.py"), "--quick", "--seconds", "1"],
                          cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{proc.stderr[-3000:]}"
    assert re.search(r"^bench/http_api\.py: raw client; custody-signer, custody-api on ", out, re.M), out
    for case, clients in (("health", 16), ("single", 16), ("batch100", 4), ("orders", 16)):
        assert re.search(LINE.format(case=case, clients=clients), out, re.M), out
    assert re.search(r"^batch100 .*\([\d,]+ transfers/s\)$", out, re.M), out
    # the floors of the same run: uvicorn alone, ledger_post alone (pgbench), and the ceiling they give
    for case, clients in (("floor-http", 16), ("floor-db", 16), ("floor-db100", 4)):
        assert re.search(LINE.format(case=case, clients=clients), out, re.M), out
    assert re.search(r"^floor-db100 .*\([\d,]+ transfers/s\)$", out, re.M), out
    assert re.search(r"^ceiling +single postings over HTTP on \d+ cores with a zero-cost framework: +[\d,]+ req/s", out,
                     re.M), out
    assert "ledger verify: all checks ok" in out, out
