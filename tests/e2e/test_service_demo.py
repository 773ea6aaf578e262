"""service_demo: the README's run command, end to end: `python -m custody demo` starts its own
regtest chains, then the signer, worker and api as separate processes, and the demo (ledger,
deposit -> credit, withdrawals, one signed by two approvers' keys -> final, reconciliation zero)
passes over HTTP; it names each process with its log, and nothing is left running afterwards.

It runs in the test session's own STATE_DIR (tests/conftest.py), never a developer's `.state`: its
`custody_demo` database is on the session's embedded PostgreSQL (DATABASE_URL is removed from its
environment, as in the README's run command), its chains, configs and logs under `$STATE_DIR/demo`."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_demo_passes(tmp_path, log):
    state_dir = Path(os.environ["STATE_DIR"])
    assert state_dir.resolve() != (ROOT / ".state").resolve()
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | {"API_PORT": str(free_port())}
    proc = subprocess.run([sys.executable, "-m", "custody", "demo", "--exit-after-demo"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    (tmp_path / "demo.log").write_text(output)
    for line in output.splitlines():
        if " demo: " in line:
            log.info(line.split(" demo: ", 1)[1])
    assert proc.returncode == 0, output[-4000:]
    assert "demo finished" in output
    assert "Traceback" not in output, output[-4000:]
    for name in ("custody-signer", "custody-worker", "custody-api"):
        log_file = state_dir / "demo" / "logs" / f"{name}.log"
        assert f"{name} pid " in output and str(log_file) in output, name
        assert log_file.stat().st_size > 0, name
    assert "method=sign_bitcoin_batch outcome=ok" in (state_dir / "demo" / "logs" / "custody-signer.log").read_text()
    leftover = subprocess.run(["pgrep", "-f", str(state_dir / "demo")], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", f"processes left running: {leftover.stdout}"
