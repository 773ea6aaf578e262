"""`python -m custody api` and `python -m custody worker` as separate OS processes, wired only by a
config file, against the real regtest nodes and the session database:

- the api answers /health on the configured port (asked through the typed custody.client); the
  worker runs its jobs;
- on SIGUSR1 each writes its loaded modules to `<STATE_DIR>/modules-custody-<api|worker>-<pid>.txt`: neither
  has loaded signer.keys or signer.service (custody holds no key material);
- SIGTERM stops each cleanly (exit 0; the worker after its running jobs);
- an invalid file, or a database whose schema is behind, stops a process at start (exit 2) with
  the reason, before it serves anything.

A signer process (`python -m signer serve`, the BIP84 test seed) listens: each process compares
[wallets] with its xpubs at start, and the worker registers the wallets the api waits for only once
the signer has confirmed them. The api connects as custody_api (the file's URL), the worker as
custody_worker (CUSTODY_WORKER_DATABASE_URL), each refused as any other role.
"""
from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from sqlalchemy import make_url

from custody.client import CustodyApiError, CustodyClient
from custody.database import drop_database, ensure_database, with_database, with_user
from regtest.util import free_port, wait_until
from tests.e2e.deployment import REPO, clean_env, custody, custody_config
from tests.integration.test_signer_process import start_signer

log = logging.getLogger(__name__)
KEY_MODULES = {"signer.keys", "signer.service"}


def start(process: str, config: Path, state: Path, logs: Path, **env: str) -> subprocess.Popen:
    out = open(logs / f"{process}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "custody", process, "--config", str(config)], cwd=REPO,
                            env=clean_env(STATE_DIR=str(state), **env), stdout=out, stderr=subprocess.STDOUT)


def modules_of(proc: subprocess.Popen, process: str, state: Path) -> set[str]:
    path = state / f"modules-custody-{process}-{proc.pid}.txt"
    proc.send_signal(signal.SIGUSR1)
    wait_until(path.exists, timeout=30, what=f"{path}")
    return set(path.read_text().split())


def test_api_and_worker_run_as_processes_without_key_code(tmp_path, cluster, database_url, request):
    port = free_port()
    short = Path(tempfile.mkdtemp(prefix="cp-", dir="/tmp"))  # a unix socket path is limited to ~100 bytes
    signer = start_signer(short, with_user(database_url, "custody_signer"), f"unix:{short / 'signer.sock'}")
    request.addfinalizer(signer.stop)  # stopped even when the set-up below fails (stop() is safe twice)
    key_file = tmp_path / "signer-worker.key"  # custody_config names the worker client's key file
    key_file.write_text(signer.keys["worker"].hex() + "\n")
    key_file.chmod(0o600)
    config = custody_config(tmp_path, cluster, with_user(database_url, "custody_api"), endpoint=signer.listen,
                            extra=f"\n[api]\nhost = \"127.0.0.1\"\nport = {port}\n\n[jobs]\nscale = 0.5\n")
    state = tmp_path / "state"
    procs = {"worker": start("worker", config, state, tmp_path,
                             CUSTODY_WORKER_DATABASE_URL=with_user(database_url, "custody_worker")),
             "api": start("api", config, state, tmp_path)}
    probe = CustodyClient(f"http://127.0.0.1:{port}", None, timeout=1, retries=0)
    try:
        def api_up() -> bool:
            assert procs["api"].poll() is None, (tmp_path / "api.log").read_text()
            try:
                return probe.health().status == "ok" and probe.last_response.status_code == 200
            except CustodyApiError:  # not listening yet (CustodyConnectionError) or not serving yet
                return False

        wait_until(api_up, timeout=90, what="the api's /health")
        wait_until(lambda: "custody worker running" in (tmp_path / "worker.log").read_text(), timeout=90,
                   what="the worker's jobs")
        assert "holds the configured wallets' deposit and hot keys" in (tmp_path / "worker.log").read_text()
        for name, proc in procs.items():
            loaded = modules_of(proc, name, state)
            log.info("%s (pid %d): %d modules loaded", name, proc.pid, len(loaded))
            assert f"custody.roots.{name}" in loaded and "signer.client" in loaded
            assert loaded & KEY_MODULES == set(), f"{name} loaded {loaded & KEY_MODULES}"
        assert "uvicorn" in modules_of(procs["api"], "api", state)
        assert "apscheduler" in modules_of(procs["worker"], "worker", state)

        for name, proc in procs.items():
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0, (tmp_path / f"{name}.log").read_text()
        assert "custody worker stopped" in (tmp_path / "worker.log").read_text()
    finally:
        probe.close()
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        signer.stop()
        shutil.rmtree(short, ignore_errors=True)


def test_a_process_refuses_to_start_on_a_bad_file_or_an_old_schema(tmp_path, cluster, database_url):
    config = custody_config(tmp_path, cluster, database_url, extra="\n[jobs]\nscael = 2\n")
    run = custody("worker", "--config", str(config))
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-2:] == [
        "custody worker: invalid configuration:",
        f"  {config}: jobs.scael: unknown setting (a typo? see deploy/custody.example.toml)"]

    empty = with_database(database_url, f"{make_url(database_url).database}_behind")
    ensure_database(empty)
    try:
        config = custody_config(tmp_path, cluster, empty)
        run = custody("api", "--config", str(config))
    finally:
        drop_database(empty)
    assert run.returncode == 2
    assert "custody api: cannot start: database: the schema is at no revision, this code needs" in run.stderr
