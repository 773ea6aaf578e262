"""The signer's configuration (signer.config): a typo, a float, a non-loopback socket or a missing
quorum fails at load with a message naming the key; env overrides the file; relative paths are the
file's; build_signer hands the configured approvers and quorum to the Signer. Each client of the
signer has its own key and its own list of methods; a method name the wire does not know, a
client without methods, two clients of one name or one key fail at load."""
from __future__ import annotations

import base64
from pathlib import Path

import pytest

from regtest.util import assert_equal
from signer.config import DEPLOYED_CLIENTS, ConfigError, approval_arguments, load_config, quorum_entries
from signer.wire import METHODS, write_auth_key
from tests.approvers import SoftAuthenticator

ED25519_PUB = base64.b64encode(bytes(32)).decode()
BASE = """
network = "regtest"
seed_file = "seed.txt"
database_url = "postgresql://custody_signer@127.0.0.1:5432/custody"
listen = "unix:/run/custody/signer.sock"
clients = [
  {name = "worker", auth_key_file = "worker.key", methods = ["ping", "xpubs", "sign_bitcoin_batch", "sign_bitcoin_replacement", "sign_bitcoin_sweep", "sign_bitcoin_rebalance", "sign_reserves_message", "sign_ethereum_payment"]},
  {name = "api", auth_key_file = "/etc/custody/api.key", methods = ["ping", "xpubs", "sign_reserves_message"]},
]
"""
QUORUM = """
[quorum]
BTC = [[50000000, 0], [200000000, 1], [100000000000, 2]]
"""
WEBAUTHN_PUB = base64.b64encode(SoftAuthenticator("bob", rp_id="custody.example").public_key_cose).decode()
APPROVERS = f"""
[[approvers]]
key_id = "alice-1"
operator = "alice"
scheme = "ed25519"
public_key = "{ED25519_PUB}"

[[approvers]]
key_id = "bob-yubikey"
operator = "bob"
scheme = "webauthn"
public_key = "{WEBAUTHN_PUB}"
rp_id = "custody.example"
origin = "https://custody.example"
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "signer.toml"
    p.write_text(text)
    return p


def test_a_complete_file_loads_with_paths_relative_to_it(tmp_path: Path):
    cfg = load_config(write(tmp_path, BASE + APPROVERS + QUORUM))
    assert_equal(cfg.seed_file, tmp_path / "seed.txt")
    assert_equal([(c.name, c.auth_key_file) for c in cfg.clients],
                 [("worker", tmp_path / "worker.key"), ("api", Path("/etc/custody/api.key"))])
    assert_equal(cfg.clients[1].methods, ["ping", "xpubs", "sign_reserves_message"])
    assert_equal(cfg.endpoint.path, "/run/custody/signer.sock")
    assert_equal([a.operator for a in cfg.approvers], ["alice", "bob"])
    assert_equal(cfg.quorum["BTC"][1], (200_000_000, 1))
    assert_equal(cfg.sqlalchemy_url, "postgresql+psycopg://custody_signer@127.0.0.1:5432/custody")
    assert_equal((cfg.deposit_window, cfg.receive_window, cfg.change_window), (10_000, 20, 1_000))


@pytest.mark.parametrize("extra, key, why", [
    ('listn = "unix:/x.sock"\n', "listn", "unknown key"),
    ('max_fee_rate_sat_per_kvb = 1000.0\n', "max_fee_rate_sat_per_kvb", "never a float"),
    ('deposit_window = 0\n', "deposit_window", "greater than or equal to 1"),
    ('[quorum]\nBTC = [[100, 1], [50, 2]]\n', "quorum", "strictly increasing"),
    ('[quorum]\nBTC = [[100.5, 1]]\n', "quorum.BTC.0.0", "never a float"),
    ('[[approvers]]\nkey_id = "k"\noperator = "o"\nscheme = "rsa"\npublic_key = "AA=="\n', "approvers.0.scheme", "ed25519"),
    ('[[approvers]]\nkey_id = "k"\noperator = "o"\nscheme = "webauthn"\npublic_key = "AA=="\n', "approvers.0", "rp_id and origin"),
    ('[[approvers]]\nkey_id = "k"\noperator = "o"\nscheme = "ed25519"\npublic_key = "not base64!"\n', "approvers.0.public_key", "base64"),
    ('[[approvers]]\nkey_id = "k"\noperator = "o"\nscheme = "ed25519"\npublic_key = "AA=="\nkeyid = "x"\n',
     "approvers.0.keyid", "unknown key"),
])
def test_a_bad_key_fails_at_load_naming_it(tmp_path: Path, extra: str, key: str, why: str):
    with pytest.raises(ConfigError, match=why) as info:
        load_config(write(tmp_path, BASE + extra + ("" if "[quorum]" in extra else QUORUM)))
    assert f"{key}:" in str(info.value), str(info.value)


@pytest.mark.parametrize("listen", ["tcp:0.0.0.0:7100", "tcp:192.168.1.4:7100", "tcp:localhost:7100"])
def test_a_non_loopback_listen_address_is_refused(tmp_path: Path, listen: str):
    with pytest.raises(ConfigError, match="listen"):
        load_config(write(tmp_path, BASE.replace('"unix:/run/custody/signer.sock"', f'"{listen}"') + QUORUM))


@pytest.mark.parametrize("network", ["regtest", "testnet", "signet", "mainnet"])
def test_the_quorum_is_required_on_every_network(tmp_path: Path, network: str):
    with pytest.raises(ConfigError, match="quorum: Field required"):
        load_config(write(tmp_path, BASE.replace('"regtest"', f'"{network}"')))
    with pytest.raises(ConfigError, match="quorum: at least one asset"):
        load_config(write(tmp_path, BASE.replace('"regtest"', f'"{network}"') + "[quorum]\n"))
    cfg = load_config(write(tmp_path, BASE.replace('"regtest"', f'"{network}"') + APPROVERS + QUORUM))
    assert_equal(cfg.bitcoin_network, {"signet": "testnet"}.get(network, network))


def test_the_quorum_table_is_written_from_a_policy_set(tmp_path: Path):
    from custody.policy_config import default_policy  # the test may import custody; signer.config does not

    entries = quorum_entries(default_policy())
    assert_equal(entries["BTC"], [[50_000_000, 0], [200_000_000, 1], [100_000_000_000, 2]])
    assert_equal(sorted(entries), ["BTC", "ETH", "USDT"])
    toml = "[quorum]\n" + "".join(f"{asset} = {tiers}\n" for asset, tiers in entries.items())
    cfg = load_config(write(tmp_path, BASE + toml))
    assert_equal(cfg.quorum["ETH"][2], (10_000 * 10**18, 2))


def test_missing_keys_and_bad_files_are_config_errors(tmp_path: Path):
    with pytest.raises(ConfigError, match="listen: Field required"):
        load_config(write(tmp_path, BASE.replace('listen = "unix:/run/custody/signer.sock"', "") + QUORUM))
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "network = \n"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match="database_url: .*PostgreSQL"):
        load_config(write(tmp_path, BASE.replace("postgresql://", "mysql://") + QUORUM))


def test_the_environment_overrides_the_file(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("SIGNER_LISTEN", "tcp:127.0.0.1:7444")
    monkeypatch.setenv("SIGNER_MAX_ETH_FEE_WEI", "5000")
    cfg = load_config(write(tmp_path, BASE + QUORUM))
    assert_equal((str(cfg.endpoint), cfg.max_eth_fee_wei), ("tcp:127.0.0.1:7444", 5000))
    monkeypatch.setenv("SIGNER_QUORUM", '{"BTC": [[1000, 2]]}')
    assert_equal(load_config(write(tmp_path, BASE + QUORUM)).quorum, {"BTC": [(1000, 2)]})
    monkeypatch.setenv("SIGNER_LISTEN", "tcp:10.1.1.1:7444")
    with pytest.raises(ConfigError, match="loopback"):
        load_config(write(tmp_path, BASE + QUORUM))


def _clients(*entries: str) -> str:
    return BASE.split("clients = [")[0] + "clients = [\n" + "".join(f"  {e},\n" for e in entries) + "]\n"


def test_each_clients_key_is_read_from_its_owner_only_file(tmp_path: Path):
    text = _clients('{name = "worker", auth_key_file = "worker.key", methods = ["ping", "sign_bitcoin_batch"]}',
                    '{name = "api", auth_key_file = "api.key", methods = ["ping"]}')
    cfg = load_config(write(tmp_path, text + QUORUM))
    with pytest.raises(ConfigError, match="clients.worker.auth_key_file: .*cannot read"):
        cfg.client_grants()
    worker, api = write_auth_key(tmp_path / "worker.key"), write_auth_key(tmp_path / "api.key")
    grants = cfg.client_grants()
    assert_equal([(g.name, g.key, g.methods) for g in grants],
                 [("worker", worker, frozenset({"ping", "sign_bitcoin_batch"})), ("api", api, frozenset({"ping"}))])
    (tmp_path / "api.key").chmod(0o644)
    with pytest.raises(ConfigError, match="clients.api.auth_key_file: .*chmod 600"):
        cfg.client_grants()


def test_two_clients_with_one_key_are_refused(tmp_path: Path):
    """A key is the client's identity: the api holding the worker's key could call the worker's methods."""
    write_auth_key(tmp_path / "one.key")
    (tmp_path / "same.key").write_text((tmp_path / "one.key").read_text())
    (tmp_path / "same.key").chmod(0o600)
    text = _clients('{name = "worker", auth_key_file = "one.key", methods = ["sign_bitcoin_batch"]}',
                    '{name = "api", auth_key_file = "same.key", methods = ["ping"]}')
    with pytest.raises(ConfigError, match="clients.api.auth_key_file: the same key as client worker's"):
        load_config(write(tmp_path, text + QUORUM)).client_grants()


@pytest.mark.parametrize("entries, key, why", [
    (['{name = "worker", auth_key_file = "w.key", methods = ["ping", "sign_batch"]}'], "clients.0.methods",
     "unknown methods \\['sign_batch'\\]"),
    (['{name = "worker", auth_key_file = "w.key", methods = []}'], "clients.0.methods", "at least 1 item"),
    (['{name = "worker", auth_key_file = "w.key"}'], "clients.0.methods", "Field required"),
    (['{name = "worker", auth_key_file = "w.key", methods = ["ping", "ping"]}'], "clients.0.methods", "listed twice"),
    (['{name = "Worker!", auth_key_file = "w.key", methods = ["ping"]}'], "clients.0.name", "client name"),
    (['{name = "worker", auth_key_file = "w.key", methods = ["ping"], role = "admin"}'], "clients.0.role", "unknown key"),
    (['{name = "worker", auth_key_file = "a.key", methods = ["ping"]}',
      '{name = "worker", auth_key_file = "b.key", methods = ["ping"]}'], "clients", "distinct"),
    ([], "clients", "at least 1 item"),
])
def test_a_bad_client_fails_at_load_naming_it(tmp_path: Path, entries: list[str], key: str, why: str):
    with pytest.raises(ConfigError, match=why) as info:
        load_config(write(tmp_path, _clients(*entries) + QUORUM))
    assert f"{key}:" in str(info.value), str(info.value)


def test_the_one_shared_key_of_old_files_is_refused_with_the_way_forward(tmp_path: Path):
    old = BASE.split("clients = [")[0] + 'auth_key_file = "auth.key"\n'
    with pytest.raises(ConfigError, match="auth_key_file: the one shared key is replaced by one key per client"):
        load_config(write(tmp_path, old + QUORUM))
    with pytest.raises(ConfigError, match="clients: Field required"):
        load_config(write(tmp_path, BASE.split("clients = [")[0] + QUORUM))


def test_the_deployed_clients_name_real_methods_and_the_api_signs_no_money_movement():
    assert_equal(set(DEPLOYED_CLIENTS["worker"]), set(METHODS))
    assert_equal(set(DEPLOYED_CLIENTS["api"]), {"ping", "xpubs", "sign_reserves_message"})


def test_clients_come_from_the_environment_as_json(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("SIGNER_CLIENTS", '[{"name": "solo", "auth_key_file": "/k", "methods": ["ping"]}]')
    cfg = load_config(write(tmp_path, BASE + QUORUM))
    assert_equal([(c.name, c.methods) for c in cfg.clients], [("solo", ["ping"])])




def test_the_configured_approvers_and_quorum_reach_the_signer(tmp_path: Path):
    args = approval_arguments(load_config(write(tmp_path, BASE + APPROVERS + QUORUM)))
    assert_equal(args["approvers"].get("alice-1").operator, "alice")
    assert_equal(args["approvers"].get("bob-yubikey").scheme, "webauthn")
    assert_equal(args["quorum"].required("BTC", 200_000_000), 1)
    assert_equal(args["quorum"].required("BTC", 200_000_001), 2)
    assert_equal(args["quorum"].required("BTC", 50_000_000), 0)
