"""regtest_cli: `python -m regtest up | status | mine N | down` starts detached nodes, reports
them, mines on both chains, and stops them by PID leaving nothing running.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from regtest.process import pid_alive
from regtest.util import assert_equal

REPO = Path(__file__).resolve().parents[2]


def _cli(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "regtest", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)


def test_cli_up_status_mine_down(tmp_path, log, cluster):  # `cluster`: installed tools are present
    env = {**os.environ, "REGTEST_STATE_DIR": str(tmp_path / "state")}
    up = _cli(env, "up")
    assert up.returncode == 0, up.stderr
    state = json.loads(up.stdout)
    pids = [state["bitcoind"]["pid"], state["anvil"]["pid"]]
    log.info("up: bitcoind pid %s, anvil pid %s", *pids)
    try:
        assert all(pid_alive(p) for p in pids)
        status = _cli(env, "status")
        assert_equal(status.returncode, 0)
        assert "bitcoind" in status.stdout and "running" in status.stdout
        mined = _cli(env, "mine", "3")
        assert mined.returncode == 0, mined.stderr
        assert "bitcoin: mined 3 blocks" in mined.stdout and "ethereum: mined 3 blocks" in mined.stdout
    finally:
        down = _cli(env, "down")
    assert down.returncode == 0, down.stderr
    assert not any(pid_alive(p) for p in pids), "a node outlived `regtest down`"
    assert_equal(_cli(env, "status").stdout.strip(), "down")
