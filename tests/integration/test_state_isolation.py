"""state_isolation: a test run never touches a developer's running demo.

`scripts/run` keeps its state in STATE_DIR (default `<repo>/.state`): the embedded PostgreSQL
(`pgdata`, database `custody`: custody.database.EMBEDDED_DATABASE), the demo's chains (`demo-chains`, wiped at each start) and the
state file of `python -m regtest up` (`regtest/state.json`). tests/conftest.py gives every pytest
session a temporary STATE_DIR and REGTEST_STATE_DIR of its own, exported to every subprocess.

How this is shown:
- a child pytest session is started the way a developer's shell would start `scripts/test` while
  the demo runs: with STATE_DIR and REGTEST_STATE_DIR pointing at a "developer" directory full of
  markers. Its one test does what the demo and the CLI tests do to their state (wipes
  `demo-chains`, writes a regtest state file, asks `python -m regtest status`) and reports the
  paths it saw. With tests/conftest.py loaded the markers survive and the child saw only its own
  temporary directory (removed when it exits); the same child WITHOUT it destroys them, so the
  first run is not vacuous;
- `python -m regtest status` reads the state file that REGTEST_STATE_DIR, else STATE_DIR/regtest,
  names (a marker rpc_url in each tells which file it read);
- this session's own databases are on an embedded PostgreSQL under its STATE_DIR (or on
  DATABASE_URL's server), never on `<repo>/.state/pgdata`.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from regtest.util import assert_equal

ROOT = Path(__file__).resolve().parents[2]
REPO_STATE = ROOT / ".state"
log = logging.getLogger(__name__)

CHILD_TEST = '''
import json, os, shutil
from pathlib import Path

from custody.settings import Settings
from regtest.cluster import read_state, state_dir, state_file


def test_does_what_the_demo_and_the_cli_tests_do():
    state = Settings().state_dir
    report = {"STATE_DIR": os.environ.get("STATE_DIR"), "settings_state_dir": str(state),
              "regtest_state_file": str(state_file()), "pgdata": str(state / "pgdata"),
              "regtest_state": read_state()}
    shutil.rmtree(state / "demo-chains", ignore_errors=True)  # the demo wipes its chains at start
    state_dir().mkdir(parents=True, exist_ok=True)
    state_file().write_text("{}")  # `python -m regtest up` overwrites the state file
    Path(os.environ["CHILD_REPORT"]).write_text(json.dumps(report))
'''


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid  # a process that has just exited


def _regtest_state(marker: str) -> str:
    """A state file of `python -m regtest up` whose nodes are not running (status needs no tools)."""
    node = {"pid": _dead_pid(), "rpc_url": f"http://{marker}:1", "rpc_port": 1, "datadir": "/nonexistent"}
    return json.dumps({"root": "/nonexistent", "bitcoind": node, "anvil": node,
                       "token": {"address": "0x0", "symbol": "USDT", "decimals": 6}})


def _developer_state(root: Path) -> Path:
    dev = root / "developer-state"
    (dev / "demo-chains").mkdir(parents=True)
    (dev / "demo-chains" / "MARKER").write_text("the developer's running demo chains")
    (dev / "regtest").mkdir()
    (dev / "regtest" / "state.json").write_text(_regtest_state("developer-marker"))
    return dev


def _snapshot(path: Path) -> list[str] | None:
    """The top-level names of a directory (a live demo keeps writing inside them), None if absent."""
    return sorted(p.name for p in path.iterdir()) if path.exists() else None


def _run_child(tmp: Path, dev: Path, *, with_conftest: bool) -> tuple[subprocess.CompletedProcess, dict]:
    child = tmp / ("child-with" if with_conftest else "child-without")
    child.mkdir()
    (child / "test_child.py").write_text(CHILD_TEST)
    report = child / "report.json"
    env = {**os.environ, "STATE_DIR": str(dev), "REGTEST_STATE_DIR": str(dev / "regtest"), "CHILD_REPORT": str(report)}
    env.pop("KEEP_TEST_STATE", None)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # a bare session starts faster; the child needs no plugin
    plugins = ["-p", "tests.conftest"] if with_conftest else []
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *plugins, "--rootdir", str(child), str(child / "test_child.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(report.read_text())


def test_a_test_session_leaves_the_developers_state_alone(tmp_path: Path) -> None:
    dev = _developer_state(tmp_path)
    dev_regtest_state = (dev / "regtest" / "state.json").read_bytes()
    repo_state_before = _snapshot(REPO_STATE)

    log.info("a child test session started with the developer's STATE_DIR exported, tests/conftest.py loaded")
    _, seen = _run_child(tmp_path, dev, with_conftest=True)
    child_state = Path(seen["STATE_DIR"])
    log.info("the child session used %s", child_state)
    for key in ("STATE_DIR", "settings_state_dir", "regtest_state_file", "pgdata"):
        path = Path(seen[key]).resolve()
        assert path.is_relative_to(child_state.resolve()), (key, path)
        assert not path.is_relative_to(dev.resolve()), (key, path)
        assert not path.is_relative_to(REPO_STATE.resolve()), (key, path)
    assert_equal(seen["regtest_state"], None)  # the child's own (empty) regtest state, not the developer's
    assert (dev / "demo-chains" / "MARKER").is_file(), "the child wiped the developer's demo chains"
    assert_equal((dev / "regtest" / "state.json").read_bytes(), dev_regtest_state)
    assert not child_state.exists(), "the child's state directory outlived it"
    assert_equal(_snapshot(REPO_STATE), repo_state_before)

    log.info("control: the same child without tests/conftest.py destroys what the first run kept")
    _, seen = _run_child(tmp_path, dev, with_conftest=False)
    assert_equal(Path(seen["settings_state_dir"]), dev)
    assert_equal(seen["regtest_state"]["bitcoind"]["rpc_url"], "http://developer-marker:1")
    assert not (dev / "demo-chains").exists()
    assert (dev / "regtest" / "state.json").read_bytes() != dev_regtest_state


def _status(env: dict[str, str]) -> str:
    proc = subprocess.run([sys.executable, "-m", "regtest", "status"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout


def test_regtest_cli_reads_the_state_file_its_environment_names(tmp_path: Path) -> None:
    dev = _developer_state(tmp_path)
    override = tmp_path / "override"
    override.mkdir()
    (override / "state.json").write_text(_regtest_state("override-marker"))
    base = {k: v for k, v in os.environ.items() if k not in ("STATE_DIR", "REGTEST_STATE_DIR")}

    out = _status({**base, "STATE_DIR": str(dev)})
    log.info("STATE_DIR only: %s", out.splitlines()[0])
    assert f"state: {dev / 'regtest' / 'state.json'}" in out and "developer-marker" in out

    out = _status({**base, "STATE_DIR": str(dev), "REGTEST_STATE_DIR": str(override)})
    log.info("REGTEST_STATE_DIR wins over STATE_DIR: %s", out.splitlines()[0])
    assert "override-marker" in out and "developer-marker" not in out

    session = Path(os.environ["REGTEST_STATE_DIR"])
    assert session.resolve().is_relative_to(Path(os.environ["STATE_DIR"]).resolve())
    session.mkdir(parents=True, exist_ok=True)
    (session / "state.json").write_text(_regtest_state("session-marker"))
    try:
        out = _status(dict(os.environ))  # what every subprocess of this test session inherits
        log.info("this session's environment: %s", out.splitlines()[0])
        assert "session-marker" in out and "developer-marker" not in out
    finally:
        (session / "state.json").unlink()


def test_the_session_database_is_not_on_the_developers_server(database_url: str) -> None:
    from custody import database

    state = Path(os.environ["STATE_DIR"]).resolve()
    assert not state.is_relative_to(REPO_STATE.resolve())
    for pgdata in database._embedded:
        log.info("embedded PostgreSQL of this session: %s", pgdata)
        assert pgdata.is_relative_to(state), pgdata
    if not os.environ.get("DATABASE_URL"):
        assert database._embedded, "no embedded server was started for the session database"
    from sqlalchemy import make_url

    assert make_url(database_url).database != database.EMBEDDED_DATABASE  # the demo's and the CLI's
