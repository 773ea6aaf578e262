"""The deployed topology: three OS processes wired only by configuration.

| process | command | holds |
| --- | --- | --- |
| custody-signer | `python -m signer serve --config SIGNER_CONFIG` | the seed; the only process that signs |
| custody-worker | `python -m custody worker --config CUSTODY_CONFIG` | the scheduled jobs; a signer client |
| custody-api | `python -m custody api --config CUSTODY_CONFIG` | the HTTP API and console |

The api may run as several processes on one database (`Processes.start("custody-api",
instance="custody-api-2", env={"CUSTODY_API__PORT": ...})`, as custody.launch's
`deploy(api_processes=N)` does): each serves postings and reads, and each market's order entry is
owned by one of them (custody.api.market_owners).

`PROCESS_COMMANDS` is the one list of those commands: the demo launcher and the e2e suite start
exactly these, and the test suite checks that docker-compose.yml runs the same ones.
"""
from __future__ import annotations

PROCESS_COMMANDS: dict[str, list[str]] = {
    "custody-signer": ["python", "-m", "signer", "serve", "--config", "{signer_config}"],
    "custody-worker": ["python", "-m", "custody", "worker", "--config", "{custody_config}"],
    "custody-api": ["python", "-m", "custody", "api", "--config", "{custody_config}"],
}


def command(name: str, *, python: str, signer_config: str = "", custody_config: str = "") -> list[str]:
    """The argv of process `name` with its config paths filled in and `python` as the interpreter."""
    argv = [a.format(signer_config=signer_config, custody_config=custody_config) for a in PROCESS_COMMANDS[name]]
    return [python, *argv[1:]]


# ---- running the three processes ---------------------------------------------------------------

import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

from regtest.process import spawn, stop_pid  # noqa: E402

log = logging.getLogger(__name__)
START_ORDER = ("custody-signer", "custody-worker", "custody-api")


class TopologyError(Exception):
    """A process of the topology did not come up (the message names it and its log file)."""


@dataclass
class Processes:
    """Starts, kills, restarts and stops the topology's processes; each writes `logs/<name>.log`
    under `root`. Every process started here dies with this one (PR_SET_PDEATHSIG) and is
    stopped by `stop_all()` (SIGTERM, then SIGKILL after a grace period)."""

    root: Path
    signer_config: Path
    custody_config: Path
    env: dict[str, str] = field(default_factory=dict)
    python: str = sys.executable
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def log_path(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def start(self, name: str, *, ready: Callable[[], bool] | None = None, timeout: float = 60.0,
              env: dict[str, str] | None = None, instance: str | None = None) -> subprocess.Popen:
        """Start process `name` (a key of PROCESS_COMMANDS) as `instance` (default: the name; a
        second worker is e.g. `custody-worker-2`). PGAPPNAME is the instance name, so the
        database shows which process holds a connection or a job's advisory lock."""
        instance = instance or name
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        argv = command(name, python=self.python, signer_config=str(self.signer_config),
                       custody_config=str(self.custody_config))
        env = {**os.environ, **self.env, "PGAPPNAME": instance, **(env or {})}
        proc = spawn(argv, self.log_path(instance), env=env)
        self.procs[instance] = proc
        log.info("started %s (pid %d): %s; log %s", instance, proc.pid, " ".join(argv[1:]), self.log_path(instance))
        if ready is not None:
            self.wait(instance, ready, timeout)
        return proc

    def wait(self, name: str, ready: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise TopologyError(f"{name} exited with {proc.returncode}; see {self.log_path(name)}:\n"
                                    + _tail(self.log_path(name)))
            try:
                if ready():
                    return
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if time.monotonic() > deadline:
                raise TopologyError(f"{name} not ready after {timeout:.0f} s; see {self.log_path(name)}:\n"
                                    + _tail(self.log_path(name)))
            time.sleep(0.2)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[name]
        proc.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            proc.wait(30)

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):
            proc = self.procs.pop(name)
            if proc.poll() is None:
                stop_pid(proc.pid, timeout=15)
                log.info("stopped %s (pid %d)", name, proc.pid)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
