"""Both regtest nodes together: start (fresh data directory), describe, stop; and the CLI state file.

`start_cluster()` is what the e2e fixtures, the CLI and the bench share. The CLI records running
nodes in `state.json` of its state directory so `down`/`status`/`mine` find them; that directory is
read from the environment at each call (not at import), first match wins:

| variable | state directory |
| --- | --- |
| `REGTEST_STATE_DIR` | that directory |
| `STATE_DIR` | `$STATE_DIR/regtest` (the service's state directory, custody/settings.py) |
| neither | `<repo>/.state/regtest` (gitignored) |

The test suite exports both for its own temporary directory (tests/conftest.py), so a test run never
reads or stops the nodes of a developer's `python -m regtest up`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from regtest.anvil_node import AnvilNode, TestToken, compile_token, start_anvil
from regtest.bitcoin_node import BitcoinNode, start_bitcoind
from regtest.install import Tools, find_tools, log
from regtest.process import pid_alive

REPO_ROOT = Path(__file__).resolve().parent.parent


def state_dir() -> Path:
    """Where the CLI keeps its state file and node data (see the table above)."""
    if os.environ.get("REGTEST_STATE_DIR"):
        return Path(os.environ["REGTEST_STATE_DIR"])
    if os.environ.get("STATE_DIR"):
        return Path(os.environ["STATE_DIR"]) / "regtest"
    return REPO_ROOT / ".state" / "regtest"


def state_file() -> Path:
    return state_dir() / "state.json"


@dataclass
class Cluster:
    root: Path
    bitcoin: BitcoinNode
    anvil: AnvilNode
    token: TestToken

    def stop(self) -> None:
        """Stop both nodes by PID; safe to call twice."""
        try:
            self.bitcoin.stop()
        finally:
            self.anvil.stop()

    def describe(self) -> dict:
        return {
            "root": str(self.root),
            "bitcoind": {"pid": self.bitcoin.pid, "rpc_url": self.bitcoin.rpc_url,
                         "rpc_port": self.bitcoin.rpc_port, "datadir": str(self.bitcoin.datadir)},
            "anvil": {"pid": self.anvil.pid, "rpc_url": self.anvil.rpc_url,
                      "rpc_port": self.anvil.rpc_port, "datadir": str(self.anvil.datadir)},
            "token": {"address": self.token.address, "symbol": "USDT", "decimals": 6},
        }


def start_cluster(root: Path, *, tools: Tools | None = None, detached: bool = False) -> Cluster:
    """Start bitcoind (from the chain template) and anvil (with the test ERC-20) under `root`."""
    tools = tools or find_tools()
    bitcoin = start_bitcoind(tools, root / "bitcoind", detached=detached)
    try:
        anvil = start_anvil(tools, root / "anvil", detached=detached)
        try:
            token = TestToken.deploy(anvil.w3, compile_token(tools))
        except BaseException:
            anvil.stop()
            raise
    except BaseException:
        bitcoin.stop()
        raise
    return Cluster(root, bitcoin, anvil, token)


def write_state(cluster: Cluster) -> None:
    state_dir().mkdir(parents=True, exist_ok=True)
    state_file().write_text(json.dumps(cluster.describe(), indent=2) + "\n")


def read_state() -> dict | None:
    path = state_file()
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def cluster_from_state(state: dict, tools: Tools) -> Cluster:
    from regtest.anvil_node import compile_token as _compile

    b, a = state["bitcoind"], state["anvil"]
    bitcoin = BitcoinNode(tools.bitcoind, Path(b["datadir"]), b["rpc_port"], b["pid"])
    anvil = AnvilNode(tools.anvil, Path(a["datadir"]), a["rpc_port"], a["pid"])
    token = TestToken(anvil.w3, state["token"]["address"], _compile(tools).abi)
    return Cluster(Path(state["root"]), bitcoin, anvil, token)


def alive(state: dict) -> dict[str, bool]:
    return {name: bool(state[name]["pid"]) and pid_alive(state[name]["pid"]) for name in ("bitcoind", "anvil")}


__all__ = ["Cluster", "start_cluster", "write_state", "read_state", "cluster_from_state", "alive", "log"]
