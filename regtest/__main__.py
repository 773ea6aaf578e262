"""`python -m regtest install | up | down | status | mine N [--chain bitcoin|ethereum|both]`."""
from __future__ import annotations

import argparse
import json
import shutil
import sys

from regtest.cluster import alive, cluster_from_state, read_state, start_cluster, state_dir, state_file, write_state
from regtest.install import InstallError, find_tools, install


def _up() -> int:
    state = read_state()
    if state and any(alive(state).values()):
        print(f"already up (see {state_file()}); `python -m regtest down` first", file=sys.stderr)
        print(json.dumps(state, indent=2))
        return 0
    root = state_dir() / "data"
    shutil.rmtree(root, ignore_errors=True)
    cluster = start_cluster(root, detached=True)
    write_state(cluster)
    print(json.dumps(cluster.describe(), indent=2))
    return 0


def _down() -> int:
    state = read_state()
    if not state:
        print("nothing is running (no state file)")
        return 0
    cluster_from_state(state, find_tools()).stop()
    state_file().unlink(missing_ok=True)
    print("stopped bitcoind pid %s and anvil pid %s" % (state["bitcoind"]["pid"], state["anvil"]["pid"]))
    return 0


def _status() -> int:
    state = read_state()
    if not state:
        print("down")
        return 1
    up = alive(state)
    print(f"state: {state_file()}")
    # The tools (and the token's ABI) are needed only to ask a running node for its height.
    cluster = cluster_from_state(state, find_tools()) if any(up.values()) else None
    for name, ok in up.items():
        line = f"{name}: pid {state[name]['pid']} {'running' if ok else 'NOT RUNNING'} {state[name]['rpc_url']}"
        if ok and name == "bitcoind":
            line += f" height {cluster.bitcoin.rpc('getblockcount')}"
        if ok and name == "anvil":
            line += f" height {cluster.anvil.w3.eth.block_number} token {state['token']['address']}"
        print(line)
    return 0 if all(up.values()) else 1


def _mine(n: int, chain: str) -> int:
    state = read_state()
    if not state:
        print("down: run `python -m regtest up` first", file=sys.stderr)
        return 1
    cluster = cluster_from_state(state, find_tools())
    if chain in ("bitcoin", "both"):
        hashes = cluster.bitcoin.mine(n)
        print(f"bitcoin: mined {len(hashes)} blocks, tip {hashes[-1]}")
    if chain in ("ethereum", "both"):
        cluster.anvil.mine(n)
        print(f"ethereum: mined {n} blocks, height {cluster.anvil.w3.eth.block_number}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m regtest", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install", help="find or build bitcoind, install anvil and solc (idempotent)")
    sub.add_parser("up", help="start both nodes in <state dir>/data (detached)")
    sub.add_parser("down", help="stop the nodes started by `up`")
    sub.add_parser("status", help="show the running nodes")
    mine = sub.add_parser("mine", help="mine N blocks")
    mine.add_argument("n", type=int)
    mine.add_argument("--chain", choices=("bitcoin", "ethereum", "both"), default="both")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "install":
            install()
            return 0
        if args.cmd == "up":
            return _up()
        if args.cmd == "down":
            return _down()
        if args.cmd == "status":
            return _status()
        return _mine(args.n, args.chain)
    except InstallError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
