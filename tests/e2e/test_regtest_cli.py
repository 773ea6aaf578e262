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


def state_pid(env, node: str) -> int | None:
    """The pid `python -m regtest` recorded for `node` in its state file."""
    return json.loads((Path(env["REGTEST_STATE_DIR"]) / "state.json").read_text())[node]["pid"]


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


def test_cli_chain_control(tmp_path, cluster):  # `cluster`: installed tools are present
    """The chain-control commands on the nodes of `up`: faucet + mine until confirmed, a reorg that
    drops that payment, mining to an address, an ethereum reorg keeping one of two transfers, a fee
    spike, hang/resume, stop/start (bitcoind keeps its chain), anvil's clock, an ERC-20 deployed and
    minted."""
    from regtest import control
    from regtest.cluster import cluster_from_state
    from regtest.install import find_tools

    env = {**os.environ, "REGTEST_STATE_DIR": str(tmp_path / "state")}
    up = _cli(env, "up")
    assert up.returncode == 0, up.stderr
    nodes = cluster_from_state(json.loads(up.stdout), find_tools())
    try:
        addr = nodes.bitcoin.wallet("getnewaddress", "", "bech32")
        paid = _cli(env, "faucet", "bitcoin", addr, "150000", "--confirm")
        assert paid.returncode == 0, paid.stderr
        txid = paid.stdout.strip()
        assert_equal(control.confirmations(nodes.bitcoin, txid), 1)
        reorg = _cli(env, "reorg", "--chain", "bitcoin", "--depth", "1", "--drop", txid)
        assert reorg.returncode == 0, reorg.stderr
        assert_equal(control.confirmations(nodes.bitcoin, txid), 0)
        assert txid not in nodes.bitcoin.rpc("getrawmempool")
        refused = _cli(env, "reorg", "--chain", "bitcoin", "--depth", "1", "--drop", txid)  # no longer in a block
        assert refused.returncode == 1 and "not in the last 1 blocks" in refused.stderr
        miner = nodes.bitcoin.wallet("getnewaddress", "", "bech32")
        assert _cli(env, "mine", "2", "--chain", "bitcoin", "--to", miner).returncode == 0
        tip = nodes.bitcoin.rpc("getblock", nodes.bitcoin.rpc("getbestblockhash"), 2)
        assert_equal(tip["tx"][0]["vout"][0]["scriptPubKey"]["address"], miner)  # the coinbase pays --to

        kept, dropped = "0x" + "11" * 20, "0x" + "22" * 20
        with control.hold_mining(nodes.anvil):  # both transfers in one block
            keep_tx, drop_tx = control.pay(nodes.anvil, kept, 1_000), control.pay(nodes.anvil, dropped, 2_000)
        eth_reorg = _cli(env, "reorg", "--chain", "ethereum", "--depth", "1", "--keep", keep_tx)
        assert eth_reorg.returncode == 0, eth_reorg.stderr
        nodes.anvil.mine(1)
        assert_equal((control.confirmations(nodes.anvil, keep_tx) >= 1, control.confirmations(nodes.anvil, drop_tx)),
                     (True, 0))
        assert_equal((nodes.anvil.w3.eth.get_balance(nodes.anvil.w3.to_checksum_address(kept)),
                      nodes.anvil.w3.eth.get_balance(nodes.anvil.w3.to_checksum_address(dropped))), (1_000, 0))
        spike = _cli(env, "fee-spike", "40", "--blocks", "3")
        assert spike.returncode == 0, spike.stderr
        assert int(spike.stdout.split("estimatesmartfee now ")[1].split()[0]) >= 40, spike.stdout
        assert _cli(env, "hang", "anvil").returncode == 0
        assert_equal(control._state(nodes.anvil.pid), "T")
        assert _cli(env, "resume", "anvil").returncode == 0
        height, old = nodes.bitcoin.rpc("getblockcount"), state_pid(env, "bitcoind")
        assert _cli(env, "stop", "bitcoind").returncode == 0
        assert not pid_alive(old) and state_pid(env, "bitcoind") is None
        started = _cli(env, "start", "bitcoind")
        assert started.returncode == 0, started.stderr
        assert pid_alive(state_pid(env, "bitcoind"))
        nodes = cluster_from_state(json.loads((Path(env["REGTEST_STATE_DIR"]) / "state.json").read_text()), find_tools())
        assert_equal(nodes.bitcoin.rpc("getblockcount"), height)  # the chain kept
        after = _cli(env, "faucet", "bitcoin", miner, "10000", "--confirm")  # the faucet wallet loaded again
        assert after.returncode == 0, after.stderr
        before = nodes.anvil.w3.eth.get_block("latest")["timestamp"]
        assert _cli(env, "advance-time", "86400").returncode == 0
        assert nodes.anvil.w3.eth.get_block("latest")["timestamp"] >= before + 86400
        token = _cli(env, "deploy-erc20", "DAI").stdout.strip()
        dead = "0x000000000000000000000000000000000000dEaD"
        assert _cli(env, "mint", dead, "1234567", "--token", token).returncode == 0
        from regtest.anvil_node import TestToken, compile_token
        assert_equal(TestToken(nodes.anvil.w3, token, compile_token(find_tools()).abi).balance_of(dead), 1234567)
    finally:
        down = _cli(env, "down")
    assert down.returncode == 0, down.stderr
