"""`python -m regtest install | up | down | status | mine | reorg | fee-spike | stop | start | hang |
resume | advance-time | deploy-erc20 | mint | faucet` on the nodes of `python -m regtest up`.

The chain-control commands call `regtest.control` (its docstring says what each does); amounts are
integers in minor units (satoshis, wei, token units). Exit status: 0 done, 1 the nodes are down or
a control precondition failed (the message says which), 2 the tools are not installed.
"""
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


def _running():
    state = read_state()
    if not state:
        raise _Down
    return state, cluster_from_state(state, find_tools())


class _Down(Exception):
    pass


def _node(cluster, name: str):
    return cluster.bitcoin if name == "bitcoind" else cluster.anvil


def _control(args) -> int:
    from regtest import control

    state, cluster = _running()
    if args.cmd == "mine" and (args.to or args.until):
        if args.until:
            node = cluster.bitcoin if args.chain != "ethereum" else cluster.anvil
            n = control.mine_until_confirmed(node, args.until, confirmations_wanted=args.n)
            print(f"{args.until}: {args.n} confirmation(s) after {n} block(s)")
        else:
            control.mine(cluster.bitcoin, args.n, address=args.to)
            print(f"bitcoin: mined {args.n} blocks to {args.to}")
    elif args.cmd == "reorg":
        if args.chain == "bitcoin":
            hashes = control.reorg_bitcoin(cluster.bitcoin, args.depth, drop=args.drop)
            print(f"bitcoin: undid {args.depth} block(s), mined {len(hashes)}; dropped {len(args.drop)} tx(s); "
                  f"tip {hashes[-1]}")
        else:
            keep = [(control.raw_transaction(cluster.anvil, t), 0) for t in args.keep]
            control.reorg_ethereum(cluster.anvil, args.depth, keep=keep)
            print(f"ethereum: replaced {args.depth} block(s), kept {len(keep)} tx(s); "
                  f"height {cluster.anvil.w3.eth.block_number}")
    elif args.cmd == "fee-spike":
        spike = control.FeeSpike(cluster.bitcoin, args.rate, fill=args.fill)
        spike.start()
        spike.mine(args.blocks)
        print(f"bitcoin: {args.blocks} block(s) paying at least {args.rate} sat/vB mined; "
              f"estimatesmartfee now {control.estimated_fee_rate(cluster.bitcoin)} sat/vB")
    elif args.cmd in ("stop", "start"):
        node = _node(cluster, args.node)
        if args.cmd == "stop":
            control.stop_node(node)
        else:
            control.start_node(node, detached=True)
        state[args.node]["pid"] = node.pid
        state_file().write_text(json.dumps(state, indent=2) + "\n")
        print(f"{args.node}: {'stopped' if args.cmd == 'stop' else f'started, pid {node.pid}'}")
    elif args.cmd in ("hang", "resume"):
        import os
        import signal

        pid = state[args.node]["pid"]
        os.kill(pid, signal.SIGSTOP if args.cmd == "hang" else signal.SIGCONT)
        print(f"{args.node} pid {pid}: {'hung (SIGSTOP); `resume` continues it' if args.cmd == 'hang' else 'resumed'}")
    elif args.cmd == "advance-time":
        print(f"ethereum: latest block timestamp {control.advance_time(cluster.anvil, args.seconds)}")
    elif args.cmd == "deploy-erc20":
        token = control.deploy_erc20(cluster.anvil, find_tools(), args.symbol)
        print(token.address)
    elif args.cmd == "mint":
        from regtest.anvil_node import TestToken, compile_token

        token = TestToken(cluster.anvil.w3, args.token or state["token"]["address"], compile_token(find_tools()).abi)
        print(control.mint(token, args.to, args.amount))
    elif args.cmd == "faucet":
        if args.chain == "bitcoin":
            print(control.faucet_bitcoin(cluster.bitcoin, args.address, args.amount, confirm=args.confirm))
        else:
            print(control.faucet_ether(cluster.anvil, args.address, args.amount))
    return 0


_CONTROL = ("reorg", "fee-spike", "stop", "start", "hang", "resume", "advance-time", "deploy-erc20", "mint", "faucet")


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
    mine.add_argument("--to", help="bitcoin: mine to this address")
    mine.add_argument("--until", metavar="TXID", help="mine until TXID has N confirmations")
    reorg = sub.add_parser("reorg", help="undo the last D blocks, re-mine without the dropped txs")
    reorg.add_argument("--chain", choices=("bitcoin", "ethereum"), required=True)
    reorg.add_argument("--depth", type=int, required=True)
    reorg.add_argument("--drop", nargs="*", default=[], metavar="TXID", help="bitcoin: txs never to confirm")
    reorg.add_argument("--keep", nargs="*", default=[], metavar="TXID", help="ethereum: txs the new chain keeps")
    spike = sub.add_parser("fee-spike", help="fill the mempool at RATE sat/vB and mine blocks of only such txs")
    spike.add_argument("rate", type=int)
    spike.add_argument("--blocks", type=int, default=3)
    spike.add_argument("--fill", type=int, default=20)
    for name, text in (("stop", "stop a node (data kept)"), ("start", "start a stopped node again"),
                       ("hang", "SIGSTOP a node"), ("resume", "SIGCONT a hung node")):
        sub.add_parser(name, help=text).add_argument("node", choices=("bitcoind", "anvil"))
    sub.add_parser("advance-time", help="move anvil's clock").add_argument("seconds", type=int)
    sub.add_parser("deploy-erc20", help="deploy a test ERC-20; prints its address").add_argument("symbol")
    mint = sub.add_parser("mint", help="mint test tokens (default: the USDT of `up`)")
    mint.add_argument("to")
    mint.add_argument("amount", type=int)
    mint.add_argument("--token")
    faucet = sub.add_parser("faucet", help="pay from the funded dev account")
    faucet.add_argument("chain", choices=("bitcoin", "ethereum"))
    faucet.add_argument("address")
    faucet.add_argument("amount", type=int, help="satoshis or wei")
    faucet.add_argument("--confirm", action="store_true", help="bitcoin: mine until it confirms")
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
        if args.cmd in _CONTROL or (args.cmd == "mine" and (args.to or args.until)):
            return _control(args)
        return _mine(args.n, args.chain)
    except _Down:
        print("down: run `python -m regtest up` first", file=sys.stderr)
        return 1
    except AssertionError as exc:  # regtest.control.ControlError
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except InstallError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
