"""`python -m custody config check` against the real regtest nodes and the session database, run as
a separate process the way an operator runs it: a good file (connecting as custody_api) passes the
database, node and token checks and names the signer that does not listen; a file that points at
the wrong network, chain id, contract or an unmigrated database fails each of those lines with its
reason, and one connecting as the schema owner fails the database line (the processes would refuse
to start); an invalid file fails before anything is reached. Exit status 1 on any failure.
"""
from __future__ import annotations

import logging

from sqlalchemy import make_url

from custody.database import drop_database, ensure_database, with_database, with_user
from tests.e2e.deployment import custody, custody_config

log = logging.getLogger(__name__)
ANVIL_ACCOUNT_1 = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"  # a funded account: no code


def lines(out: str) -> dict[str, str]:
    """{check name: its line} from the check's output."""
    found = {}
    for line in out.splitlines():
        if line[:4] in ("ok  ", "FAIL") and ":" in line:
            found[line[5:].split(":", 1)[0]] = line
    return found


def test_a_good_file_reaches_every_node_and_names_the_missing_signer(tmp_path, cluster, database_url):
    path = custody_config(tmp_path, cluster, with_user(database_url, "custody_api"))
    run = custody("config", "check", "--config", str(path))
    log.info("config check:\n%s%s", run.stdout, run.stderr)
    found = lines(run.stdout)
    assert list(found) == ["config", "database", "bitcoin", "ethereum", "token USDT", "signer"], run.stdout
    for name in ("config", "database", "bitcoin", "ethereum", "token USDT"):
        assert found[name].startswith("ok  "), found[name]
    assert f"http://127.0.0.1:{cluster.bitcoin.rpc_port}: chain regtest" in found["bitcoin"]
    assert "txindex on" in found["bitcoin"]
    assert "chain id 31337" in found["ethereum"]
    assert "decimals 6" in found["token USDT"]
    assert "schema at head" in found["database"] and "as custody_api" in found["database"]
    assert found["signer"] == (f"FAIL signer: nothing listens at unix:{tmp_path / 'signer.sock'} (No such file or "
                               "directory): is `python -m signer serve` running?")
    assert run.returncode == 1
    assert run.stdout.splitlines()[-1] == "5 of 6 checks passed; failed: signer"


def test_each_wrong_setting_fails_its_own_line(tmp_path, cluster, database_url):
    empty = with_database(database_url, f"{make_url(database_url).database}_unmigrated")
    ensure_database(empty)
    try:
        path = custody_config(tmp_path, cluster, empty, network="signet", chain_id=1, token=ANVIL_ACCOUNT_1)
        run = custody("config", "check", "--config", str(path))
    finally:
        drop_database(empty)
    log.info("config check:\n%s%s", run.stdout, run.stderr)
    found = lines(run.stdout)
    assert found["config"].startswith("ok  ")  # the file itself is consistent: the world disagrees with it
    assert "schema at no revision, this code needs" in found["database"] and found["database"].startswith("FAIL")
    assert found["bitcoin"] == (f"FAIL bitcoin: http://127.0.0.1:{cluster.bitcoin.rpc_port}: the node is on "
                                "'regtest', the file says signet ('signet')")
    assert found["ethereum"] == f"FAIL ethereum: {cluster.anvil.rpc_url}: eth_chainId is 31337, the file says 1"
    assert found["token USDT"] == (f"FAIL token USDT: {ANVIL_ACCOUNT_1} has no code on chain 1: not a contract "
                                   "(a wrong address, or the wrong chain)")
    assert run.returncode == 1


def test_token_decimals_must_match_the_contract(tmp_path, cluster, database_url):
    path = custody_config(tmp_path, cluster, database_url, usdt_decimals=8)
    found = lines(custody("config", "check", "--config", str(path)).stdout)
    assert found["token USDT"] == f"FAIL token USDT: {cluster.token.address}: decimals() answers 6, [assets.USDT] says 8"


def test_the_schema_owner_fails_the_database_line(tmp_path, cluster, database_url):
    owner = make_url(database_url).username
    path = custody_config(tmp_path, cluster, database_url)
    found = lines(custody("config", "check", "--config", str(path)).stdout)
    assert found["database"].startswith("FAIL database: "), found["database"]
    assert f"connected as {owner}, a superuser" in found["database"] and "custody_api / custody_worker" in found["database"]


def test_an_unreachable_node_is_named(tmp_path, cluster, database_url):
    path = custody_config(tmp_path, cluster, with_user(database_url, "custody_worker"))
    path.write_text(path.read_text().replace(f"127.0.0.1:{cluster.bitcoin.rpc_port}", "127.0.0.1:9")
                    .replace(cluster.anvil.rpc_url, "http://127.0.0.1:9"))
    run = custody("config", "check", "--config", str(path))
    found = lines(run.stdout)
    assert found["bitcoin"].startswith("FAIL bitcoin: node_unavailable: 127.0.0.1:9: "), found["bitcoin"]
    assert found["ethereum"] == "FAIL ethereum: node_unavailable: http://127.0.0.1:9: [Errno 111] Connection refused"
    assert found["token USDT"].startswith("FAIL token USDT: node_unavailable: http://127.0.0.1:9: ")
    assert found["database"].startswith("ok  ")
    assert run.returncode == 1


def test_an_invalid_file_fails_before_reaching_anything(tmp_path, cluster, database_url):
    path = custody_config(tmp_path, cluster, database_url, extra="[jobs]\nscael = 2\n")
    run = custody("config", "check", "--config", str(path))
    assert run.stdout.splitlines() == [
        f"FAIL config: {path}: jobs.scael: unknown setting (a typo? see deploy/custody.example.toml)",
        "0 of 1 checks passed; failed: config"]
    assert run.returncode == 1
