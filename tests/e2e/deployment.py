"""Helpers for the deployment e2e tests: a custody config file for the session's regtest nodes
and database (the way an operator would write one), and running `python -m custody ...` as a
separate OS process with a clean environment."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from regtest.bitcoin_node import RPC_PASSWORD, RPC_USER
from regtest.cluster import Cluster
from signer.keys import Secret, SignerKeys, seed_from_text
from tests.approvers import entry

REPO = Path(__file__).resolve().parents[2]
TEST_MNEMONIC = "abandon " * 11 + "about"
APPROVERS = ("op-alice", "op-bob")  # tests.approvers' deterministic test keys, in [[approvers]]


def regtest_keys() -> SignerKeys:
    """The BIP84 test mnemonic's keys (regtest only; the signer under test would hold this seed)."""
    return SignerKeys(seed_from_text(Secret(TEST_MNEMONIC)), "regtest")


def custody_config(directory: Path, cluster: Cluster, database_url: str, *, endpoint: str | None = None,
                   network: str = "regtest", chain_id: int = 31337, token: str | None = None,
                   usdt_decimals: int = 6, extra: str = "") -> Path:
    """Write `directory/custody.toml` (and its signer client's auth key, `worker`) for the session's nodes."""
    keys = regtest_keys()
    key_file = directory / "signer-worker.key"
    if not key_file.exists():
        key_file.write_text(os.urandom(32).hex() + "\n")
        key_file.chmod(0o600)
    endpoint = endpoint or f"unix:{directory / 'signer.sock'}"
    approvers = "".join("\n[[approvers]]\n" + "".join(f'{k} = "{v}"\n' for k, v in entry(op).items())
                        for op in APPROVERS)
    text = f"""
[database]
url = "{database_url}"

[bitcoin]
rpc_url = "http://127.0.0.1:{cluster.bitcoin.rpc_port}"
network = "{network}"
rpc_user = "{RPC_USER}"
rpc_password = "{RPC_PASSWORD}"

[ethereum]
rpc_url = "{cluster.anvil.rpc_url}"
chain_id = {chain_id}

[ethereum.tokens]
USDT = "{token or cluster.token.address}"

[assets.BTC]
chain = "bitcoin"
decimals = 8
finality = 3
dust_minimum = 1000
min_withdrawal = 10000
withdrawal_fee = 5000
withdrawal_fee_fast = 20000

[assets.ETH]
chain = "ethereum"
decimals = 18
finality = 12
dust_minimum = 1000000000
min_withdrawal = 1000000000000000
withdrawal_fee = 1000000000000000

[assets.USDT]
chain = "ethereum"
decimals = {usdt_decimals}
finality = 12
dust_minimum = 10000
min_withdrawal = 1000000
withdrawal_fee = 1000000

[wallets.bitcoin]
deposit = "{keys.account_xpub('bitcoin', 'deposit')}"
hot = "{keys.account_xpub('bitcoin', 'hot')}"
cold = "{keys.account_xpub('bitcoin', 'cold')}"

[wallets.ethereum]
deposit = "{keys.account_xpub('ethereum', 'deposit')}"
hot = "{keys.account_xpub('ethereum', 'hot')}"

[signer]
endpoint = "{endpoint}"
client = "worker"
auth_key_file = "signer-worker.key"
{approvers}
{extra}"""
    path = directory / "custody.toml"
    path.write_text(text)
    return path


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without custody's own settings, plus `extra`."""
    drop = ("CUSTODY_", "DATABASE_URL", "API_HOST", "API_PORT", "STATE_DIR", "ENVIRONMENT")
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(drop)}
    return {**env, **extra}


def custody(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "custody", *args], cwd=REPO, env=env or clean_env(),
                          capture_output=True, text=True, timeout=timeout)
