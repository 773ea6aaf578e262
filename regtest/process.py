"""Child-process handling for the nodes: start, stop by PID, and never leave one behind.

Nodes started for tests get PR_SET_PDEATHSIG (Linux) so they die with the test process even when
it is killed; every process started here is also registered with `atexit`. Nodes started by the
CLI (`python -m regtest up`) are detached on purpose and stopped by `regtest down`.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path

_LIVE: dict[int, subprocess.Popen] = {}
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def spawn(cmd: list[str], log_path: Path, *, detached: bool = False, env: dict[str, str] | None = None) -> subprocess.Popen:
    log = open(log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        preexec_fn=None if detached else _die_with_parent, start_new_session=detached)
    log.close()
    if not detached:
        _LIVE[proc.pid] = proc
    return proc


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as gone (and is reaped here)
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        pass
    try:  # someone else's zombie (e.g. a node detached by `regtest up`, reparented) is gone too
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def stop_pid(pid: int, *, timeout: float = 20.0) -> None:
    """SIGTERM, wait, then SIGKILL the one process `pid` (never a process group or a name)."""
    proc = _LIVE.pop(pid, None)
    if not pid_alive(pid):
        if proc:
            proc.poll()
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    if proc is not None:
        try:
            proc.wait(timeout)
            return
        except subprocess.TimeoutExpired:
            pass
    else:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.05)
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
        if proc is not None:
            proc.wait(5)


@atexit.register
def _stop_all() -> None:
    for pid in list(_LIVE):
        stop_pid(pid, timeout=10)
