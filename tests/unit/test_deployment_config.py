"""custody.config.DeploymentConfig: the example file loads; every way a file can be wrong stops the
load with a message naming the file and the key; amounts are integers only; private keys are
refused without being echoed; the environment overrides the file and its typos are refused too.

Each case starts from deploy/custody.example.toml (so the example is checked too) and changes one
thing with `edit(old, new)`.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from custody.config import ConfigError, DeploymentConfig
from signer.keys import Secret, SignerKeys, seed_from_text

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "custody.example.toml"
TEST_MNEMONIC = "abandon " * 11 + "about"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("CUSTODY_") or name.upper() in ("DATABASE_URL", "API_HOST", "API_PORT", "ENVIRONMENT"):
            monkeypatch.delenv(name)


@pytest.fixture
def write(tmp_path: Path):
    """write(edits...) -> the path of the example file with each (old, new) replaced once."""
    key = tmp_path / "signer-worker.key"
    key.write_text("ab" * 32 + "\n")
    key.chmod(0o600)

    def make(*edits: tuple[str, str], name: str = "custody.toml") -> Path:
        text = EXAMPLE.read_text()
        for old, new in edits:
            assert text.count(old) >= 1, f"the example no longer contains {old!r}"
            text = text.replace(old, new, 1)
        path = tmp_path / name
        path.write_text(text)
        return path

    return make


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        DeploymentConfig.load(path)
    assert all(p.startswith(f"{path}: ") for p in info.value.problems), info.value.problems
    return [p.removeprefix(f"{path}: ") for p in info.value.problems]


def keys(network: str = "regtest") -> SignerKeys:
    return SignerKeys(seed_from_text(Secret(TEST_MNEMONIC)), network)


def test_the_example_file_loads_with_integers_and_the_environment_settings(write, monkeypatch):
    monkeypatch.setenv("API_KEY_PEPPER", "p" * 40)
    config = DeploymentConfig.load(write())
    assert config.chains == ["bitcoin", "ethereum"]
    assert config.assets["BTC"].withdrawal_fee == 5000 and type(config.assets["BTC"].withdrawal_fee) is int
    assert config.assets["ETH"].min_withdrawal == 10**15
    assert config.ethereum is not None and config.ethereum.network == "regtest"
    assert config.ethereum.tokens == {"USDT": "0x5FbDB2315678afecb367f032d93F642f64180aa3"}
    assert config.bitcoin is not None and config.bitcoin.address_network == "regtest"
    assert config.settings.database_url == "postgresql://custody_worker@127.0.0.1:5432/custody"
    assert (config.settings.api_host, config.settings.api_port) == ("127.0.0.1", 8000)
    assert config.settings.api_key_pepper == "p" * 40  # the service's own settings still come from the environment
    assert config.wallets["bitcoin"].hot == keys().account_xpub("bitcoin", "hot")
    assert config.signer.auth_key() == bytes.fromhex("ab" * 32) and config.signer.client == "worker"
    assert "regtest" not in repr(config.bitcoin.rpc_password)  # the password is a SecretStr


def test_environment_overrides_win_over_the_file(write, monkeypatch):
    monkeypatch.setenv("CUSTODY_DATABASE__URL", "postgresql://custody_api@db:5432/custody")
    monkeypatch.setenv("CUSTODY_ASSETS__BTC__WITHDRAWAL_FEE", "7000")
    monkeypatch.setenv("CUSTODY_BITCOIN__RPC_PASSWORD", "from-env")
    monkeypatch.setenv("CUSTODY_ETHEREUM__TOKENS__USDT", "0x" + "ab" * 20)
    monkeypatch.setenv("CUSTODY_CONFIG", "ignored: it names the file")
    config = DeploymentConfig.load(write())
    assert config.settings.database_url == "postgresql://custody_api@db:5432/custody"
    assert config.assets["BTC"].withdrawal_fee == 7000
    assert config.assets["BTC"].finality == 3  # the rest of [assets.BTC] still comes from the file
    assert sorted(config.assets) == ["BTC", "ETH", "USDT"]
    assert config.bitcoin.rpc_password.get_secret_value() == "from-env"
    assert config.ethereum.tokens["USDT"].lower() == "0x" + "ab" * 20


def test_config_path_from_the_environment(write, monkeypatch):
    monkeypatch.setenv("CUSTODY_CONFIG", str(write()))
    assert DeploymentConfig.load().source == Path(os.environ["CUSTODY_CONFIG"])
    monkeypatch.delenv("CUSTODY_CONFIG")
    with pytest.raises(ConfigError, match="pass --config FILE or set CUSTODY_CONFIG"):
        DeploymentConfig.load()


@pytest.mark.parametrize("edit, expected", [
    (("[jobs]\n", "[jobs]\nscael = 2\n"), "jobs.scael: unknown setting"),
    (("network = \"regtest\"", "network = \"regtest\"\nrpc_usr = \"x\""), "bitcoin.rpc_usr: unknown setting"),
    (("[assets.ETH]\n", "[assets.ETH]\nwithdrawl_fee = 1\n"), "assets.ETH.withdrawl_fee: unknown setting"),
    (("[database]\n", "[databse]\nurl = \"postgresql://x@y/z\"\n[database]\n"), "databse: unknown setting"),
    (("[wallets.bitcoin]\n", "[wallets.bitcoin]\nwram = \"x\"\n"), "wallets.bitcoin.wram: unknown setting"),
], ids=["section-key", "bitcoin-key", "asset-key", "section", "wallet-key"])
def test_an_unknown_key_is_refused_with_its_path(write, edit, expected):
    assert any(p.startswith(expected) for p in problems(write(edit))), problems(write(edit))


def test_an_unknown_environment_override_is_refused(write, monkeypatch):
    monkeypatch.setenv("CUSTODY_BITCOIN__RPC_PASS", "x")
    assert problems(write()) == ["environment CUSTODY_BITCOIN__RPC_PASS: no such setting ('rpc_pass' is unknown)"]


@pytest.mark.parametrize("value, why", [
    ("0.5", "0.5 is a float"),
    ("5000.0", "5000.0 is a float"),
    ('"5000.5"', "'5000.5' is not a whole number"),
    ('"5e3"', "'5e3' is not a whole number"),
    ("true", "not a boolean"),
    ("-1", "greater than or equal to 0"),
])
def test_amounts_are_integers_of_minor_units(write, value, why):
    found = problems(write(("withdrawal_fee = 5000 ", f"withdrawal_fee = {value} ")))
    assert len(found) == 1 and found[0].startswith("assets.BTC.withdrawal_fee: ") and why in found[0], found


def test_an_amount_beyond_toml_integers_is_written_as_digits(write):
    config = DeploymentConfig.load(write(("withdrawal_fee = 1000000000000000\n", 'withdrawal_fee = "100000000000000000000000"\n')))
    assert config.assets["ETH"].withdrawal_fee == 10**23


def test_other_integers_refuse_floats_too(write):
    assert problems(write(("finality = 3 ", "finality = 3.0 "))) == ["assets.BTC.finality: must be an integer; 3.0 is a float"]
    assert problems(write(("chain_id = 31337", "chain_id = 31337.0"))) == \
        ["ethereum.chain_id: must be an integer; 31337.0 is a float"]


@pytest.mark.parametrize("decimals, ok", [(0, True), (36, True), (37, False), (-1, False)])
def test_decimals_are_0_to_36(write, decimals, ok):
    path = write(("decimals = 8", f"decimals = {decimals}"))
    if ok:
        assert DeploymentConfig.load(path).assets["BTC"].decimals == decimals
    else:
        assert [p.split(":")[0] for p in problems(path)] == ["assets.BTC.decimals"]


def test_cookie_and_user_password_are_exclusive(write):
    both = write(("# cookie_file = ", "cookie_file = "))
    assert problems(both) == ["bitcoin: give cookie_file or rpc_user + rpc_password, not both"]
    neither = write(('rpc_user = "custody"\n', ""), ('rpc_password = "regtest"', ""))
    assert problems(neither) == ["bitcoin: bitcoind needs authentication: cookie_file, or rpc_user + rpc_password"]
    half = write(('rpc_password = "regtest"', ""))
    assert problems(half) == ["bitcoin: rpc_user and rpc_password go together"]
    cookie = DeploymentConfig.load(write(("# cookie_file = ", "cookie_file = "), ('rpc_user = "custody"\n', ""),
                                         ('rpc_password = "regtest"', "")))
    assert cookie.bitcoin.cookie_file == Path("/var/lib/bitcoind/regtest/.cookie")
    assert cookie.bitcoin.rpc_user is None


def test_credentials_in_the_rpc_url_count_as_user_and_password(write):
    plain = ('rpc_user = "custody"\n', ""), ('rpc_password = "regtest"', "")
    config = DeploymentConfig.load(write(('rpc_url = "http://127.0.0.1:18443"', 'rpc_url = "http://custody:re%40g@127.0.0.1:18443"'),
                                         *plain))
    assert config.bitcoin.rpc_url == "http://127.0.0.1:18443"  # shown without them
    assert (config.bitcoin.rpc_user, config.bitcoin.rpc_password.get_secret_value()) == ("custody", "re@g")
    twice = write(('rpc_url = "http://127.0.0.1:18443"', 'rpc_url = "http://u:p@127.0.0.1:18443"'))
    assert problems(twice) == ["bitcoin: rpc_url carries a user and password and rpc_user/rpc_password are set too: "
                               "give them once"]
    with_cookie = write(('rpc_url = "http://127.0.0.1:18443"', 'rpc_url = "http://u:p@127.0.0.1:18443"'),
                        ("# cookie_file = ", "cookie_file = "), *plain)
    assert problems(with_cookie) == ["bitcoin: give cookie_file or rpc_user + rpc_password, not both"]


def test_one_file_gives_each_process_its_own_database_role(write, monkeypatch):
    path = write()
    monkeypatch.setenv("CUSTODY_WORKER_DATABASE_URL", "postgresql://custody_worker@db:5432/custody")
    monkeypatch.setenv("CUSTODY_API_DATABASE_URL", "postgresql://custody_api@db:5432/custody")
    assert DeploymentConfig.load(path, process="worker").database_url == "postgresql://custody_worker@db:5432/custody"
    assert DeploymentConfig.load(path, process="api").database_url == "postgresql://custody_api@db:5432/custody"
    assert DeploymentConfig.load(path).database_url == "postgresql://custody_worker@127.0.0.1:5432/custody"
    monkeypatch.setenv("CUSTODY_API_DATABASE_URL", "mysql://nope")
    assert DeploymentConfig.load(path, process="worker").database_url.startswith("postgresql://custody_worker@")  # not the api's
    with pytest.raises(ConfigError, match="environment CUSTODY_API_DATABASE_URL: must be a PostgreSQL URL"):
        DeploymentConfig.load(path, process="api")


@pytest.mark.parametrize("tier", ["deposit", "hot", "cold"])
def test_a_private_key_is_refused_and_never_echoed(write, tier):
    from bip_utils import Bip84, Bip84Coins

    tprv = Bip84.FromSeed(bytes(64), Bip84Coins.BITCOIN_REGTEST).Purpose().Coin().Account(1).PrivateKey().ToExtended()
    assert tprv.startswith("vprv")
    current = getattr(DeploymentConfig.load(write()).wallets["bitcoin"], tier)
    with pytest.raises(ConfigError) as info:
        DeploymentConfig.load(write((current, tprv), name="private.toml"))
    (problem,) = info.value.problems
    assert f"wallets.bitcoin.{tier}: a private extended key (vprv...) was given: custody never holds key material" in problem
    assert tprv not in str(info.value) and tprv[4:20] not in str(info.value)


def test_a_private_ethereum_key_is_refused(write):
    from bip_utils import Bip44, Bip44Coins

    xprv = Bip44.FromSeed(bytes(64), Bip44Coins.ETHEREUM).Purpose().Coin().Account(0).PrivateKey().ToExtended()
    found = problems(write((keys().account_xpub("ethereum", "deposit"), xprv)))
    assert found == ["wallets.ethereum.deposit: a private extended key (xprv...) was given: custody never holds key "
                     "material; configure the account xpub the signer exports (python -m signer xpubs)"]


def test_the_xpub_version_must_match_the_bitcoin_network(write):
    mainnet = keys("mainnet").account_xpub("bitcoin", "hot")
    assert mainnet.startswith("zpub")
    found = problems(write((keys().account_xpub("bitcoin", "hot"), mainnet)))
    assert found == ["wallets.bitcoin.hot: a zpub key does not belong to bitcoin regtest (expected tpub or vpub)"]
    on_mainnet = problems(write(('network = "regtest"', 'network = "mainnet"')))
    assert {p.split(":")[0] for p in on_mainnet} == {"wallets.bitcoin.deposit", "wallets.bitcoin.hot", "wallets.bitcoin.cold"}
    assert all("a vpub key does not belong to bitcoin mainnet (expected xpub or zpub)" in p for p in on_mainnet)


def test_signet_takes_testnet_keys(write):
    config = DeploymentConfig.load(write(('network = "regtest"', 'network = "signet"')))
    assert config.bitcoin.address_network == "testnet"


def test_a_wallet_key_must_be_an_account_key_of_its_own_tier(write):
    deposit = keys().account_xpub("bitcoin", "deposit")
    hot = keys().account_xpub("bitcoin", "hot")
    assert problems(write((hot, deposit))) == \
        ["wallets.bitcoin.hot: the same key as wallets.bitcoin.deposit; each tier has its own account"]
    assert problems(write((hot, "vpub-not-a-key"))) == \
        ["wallets.bitcoin.hot: not an extended public key (base58check, 78 bytes)"]
    btc_on_eth = problems(write((keys().account_xpub("ethereum", "hot"), hot)))
    assert btc_on_eth == ["wallets.ethereum.hot: an ethereum account key is an xpub (BIP44, coin 60)"]


def test_every_asset_chain_needs_its_section(write):
    text = EXAMPLE.read_text()
    ethereum = text[text.index("[ethereum]"):text.index("[assets.BTC]")]
    found = problems(write((ethereum, "")))
    assert "assets.ETH.chain: ethereum has no [ethereum] section" in found
    assert "assets.USDT.chain: ethereum has no [ethereum] section" in found
    assert "wallets.ethereum: there is no [ethereum] section" in found


def test_an_ethereum_token_needs_its_contract_and_its_asset(write):
    assert problems(write(('USDT = "0x5FbDB2315678afecb367f032d93F642f64180aa3"', ""))) == \
        ["assets.USDT: an ethereum asset other than ETH needs its contract in [ethereum.tokens] USDT"]
    assert problems(write(('USDT = "0x5FbDB2315678afecb367f032d93F642f64180aa3"',
                           'USDT = "0x5FbDB2315678afecb367f032d93F642f64180aa3"\nDAI = "0x' + "11" * 20 + '"'))) == \
        ["ethereum.tokens.DAI: no [assets.DAI] describes this token"]
    assert problems(write(("0x5FbDB2315678afecb367f032d93F642f64180aa3", "0x5fbDB2315678afecb367f032d93F642f64180aa3"))) == \
        ["ethereum.tokens: USDT: 0x5fbDB2315678afecb367f032d93F642f64180aa3 fails its EIP-55 checksum (a typo?)"]


def test_each_chain_needs_its_native_asset_and_its_wallets(write):
    text = EXAMPLE.read_text()
    eth = text[text.index("[assets.ETH]"):text.index("[assets.USDT]")]
    assert problems(write((eth, ""))) == ["assets.ETH: the ethereum chain needs its native asset (network fees)"]
    wallets = text[text.index("[wallets.ethereum]"):text.index("[signer]")]
    assert problems(write((wallets, ""))) == ["wallets.ethereum: the ethereum chain needs its wallets (deposit and hot xpubs)"]
    assert problems(write(('[assets.ETH]\nchain = "ethereum"', '[assets.ETH]\nchain = "bitcoin"'))) == \
        ["assets.ETH: the bitcoin chain carries BTC only", "assets.ETH.chain: ETH is the native asset of another chain",
         "assets.ETH: the ethereum chain needs its native asset (network fees)"]


def test_a_missing_wallet_tier_and_missing_sections_are_named(write):
    hot = 'hot = "' + keys().account_xpub("bitcoin", "hot") + '"\n'
    assert problems(write((hot, ""))) == ["wallets.bitcoin.hot: required"]
    text = EXAMPLE.read_text()
    signer = text[text.index("[signer]"):text.index("# The signer's approver keys")]
    assert problems(write((signer, ""))) == ["signer: required"]


def test_ethereum_chain_id_must_be_known(write):
    (found,) = problems(write(("chain_id = 31337", "chain_id = 5")))
    assert found.startswith("ethereum.chain_id: chain id 5 is not one the ethereum adapter knows: 1 (mainnet)")


@pytest.mark.parametrize("endpoint, ok", [
    ("unix:/run/custody/signer.sock", True), ("tcp:127.0.0.1:7000", True), ("tcp:[::1]:7000", True),
    ("tcp:10.0.0.5:7000", False), ("unix:relative.sock", False), ("http://127.0.0.1:7000", False),
    ("tcp:127.0.0.1:99999", False),
])
def test_the_signer_endpoint_is_local(write, endpoint, ok):
    path = write(('endpoint = "unix:/run/custody/signer.sock"', f'endpoint = "{endpoint}"'))
    if ok:
        assert DeploymentConfig.load(path).signer.endpoint == endpoint
    else:
        assert [p.split(":")[0] for p in problems(path)] == ["signer.endpoint"]


def test_one_file_gives_each_process_its_own_signer_client_and_key(write, tmp_path, monkeypatch):
    """The api speaks to the signer as `api` with its own key (the signer lets that client publish
    reserves only); the worker keeps the file's `worker`. A bad override names its variable."""
    path = write()
    api_key = tmp_path / "signer-api.key"
    api_key.write_text("cd" * 32 + "\n")
    api_key.chmod(0o600)
    monkeypatch.setenv("CUSTODY_API_SIGNER_CLIENT", "api")
    monkeypatch.setenv("CUSTODY_API_SIGNER_AUTH_KEY_FILE", str(api_key))
    api = DeploymentConfig.load(path, process="api")
    assert (api.signer.client, api.signer.auth_key(), api.source) == ("api", bytes.fromhex("cd" * 32), path)
    assert api.signer.endpoint == "unix:/run/custody/signer.sock"  # the rest of the section is the file's
    worker = DeploymentConfig.load(path, process="worker")
    assert (worker.signer.client, worker.signer.auth_key()) == ("worker", bytes.fromhex("ab" * 32))
    assert DeploymentConfig.load(path).signer.client == "worker"  # no process: the file as written
    monkeypatch.setenv("CUSTODY_WORKER_SIGNER_CLIENT", "worker-2")
    assert DeploymentConfig.load(path, process="worker").signer.client == "worker-2"
    monkeypatch.setenv("CUSTODY_API_SIGNER_CLIENT", "API!")
    with pytest.raises(ConfigError, match="environment CUSTODY_API_SIGNER_CLIENT: a client name is"):
        DeploymentConfig.load(path, process="api")
    monkeypatch.setenv("CUSTODY_API_SIGNER_CLIENT", "api")
    api_key.chmod(0o644)
    assert problems_of(path, "api") == [f"environment CUSTODY_API_SIGNER_AUTH_KEY_FILE: {api_key} has mode 644; "
                                        "only its owner may read it (chmod 600)"]


def problems_of(path: Path, process: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        DeploymentConfig.load(path, process=process)
    return [p.removeprefix(f"{path}: ") for p in info.value.problems]


def test_the_signer_client_is_required_and_named_as_the_signer_names_it(write):
    assert problems(write(('client = "worker"', ""))) == ["signer.client: required"]
    assert [p.split(":")[0] for p in problems(write(('client = "worker"', 'client = "Worker"')))] == ["signer.client"]


def test_the_signer_auth_key_file_must_be_private_hex(write, tmp_path):
    key = tmp_path / "signer-worker.key"
    path = write()
    key.chmod(0o644)
    assert problems(path) == [f"signer.auth_key_file: {key} has mode 644; only its owner may read it (chmod 600)"]
    key.chmod(0o600)
    key.write_text("not hex\n")
    assert problems(path) == [f"signer.auth_key_file: {key}: the key is written as hex (e.g. `openssl rand -hex 32`)"]
    key.write_text("abcd\n")
    assert problems(path) == [f"signer.auth_key_file: {key}: the key is 2 bytes; at least 32 are required"]
    key.unlink()
    assert problems(path)[0].startswith(f"signer.auth_key_file: {key}: cannot read it")


def test_approvers_are_checked_by_the_signers_own_rules(write):
    assert len(DeploymentConfig.load(write()).approver_registry()) == 1
    entry = 'public_key = "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="'
    assert problems(write((entry, 'public_key = "AAAA"'))) == \
        ["approvers: approver key 'alice-ed25519-1': an ed25519 public key is 32 bytes, not 3"]
    assert problems(write(('scheme = "ed25519"', 'scheme = "webauthn"'))) == \
        ["approvers: approver key 'alice-ed25519-1': a webauthn key needs rp_id and origin"]
    assert problems(write(('scheme = "ed25519"', 'scheme = "rsa"')))[0].startswith("approvers.0.scheme: ")
    twice = EXAMPLE.read_text()
    block = twice[twice.index("[[approvers]]"):twice.index("[jobs]")]
    assert problems(write((block, block + block))) == ["approvers: key_id 'alice-ed25519-1' appears more than once"]


def test_a_database_url_is_required(write, monkeypatch):
    path = write(('url = "postgresql://custody_worker@127.0.0.1:5432/custody"', ""))
    assert problems(path) == ["database.url: required (or DATABASE_URL): the process's own database role"]
    monkeypatch.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1/x")
    assert DeploymentConfig.load(path).database_url == "postgresql://postgres@127.0.0.1/x"


def test_production_settings_still_refuse_the_development_pepper(write, monkeypatch):
    monkeypatch.setenv("ENVIRONMENT", "production")
    assert problems(write()) == ["service settings: API_KEY_PEPPER must be set to a secret of 32+ characters in production"]


def test_a_missing_file_and_bad_toml_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match=f"{tmp_path / 'nope.toml'}: no such file"):
        DeploymentConfig.load(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[bitcoin\n")
    with pytest.raises(ConfigError, match=f"{bad}: not valid TOML"):
        DeploymentConfig.load(bad)


def test_lowercase_symbols_are_refused(write):
    assert problems(write(("[assets.BTC]", "[assets.btc]"))) == ["assets.btc: write asset symbols in capitals (BTC)"]


def test_config_check_reads_the_file_as_the_named_process(write, tmp_path, monkeypatch, capsys):
    """`config check --process api` applies the api's own overrides: its missing key file fails the
    `config` line naming the variable, before anything is reached; the worker's reading is unaffected."""
    from custody.__main__ import main
    from custody.config_check import run_checks

    path = write()
    monkeypatch.setenv("CUSTODY_API_SIGNER_CLIENT", "api")
    monkeypatch.setenv("CUSTODY_API_SIGNER_AUTH_KEY_FILE", str(tmp_path / "absent.key"))
    (check,) = run_checks(str(path), "api")
    assert (check.name, check.ok) == ("config", False)
    assert f"environment CUSTODY_API_SIGNER_AUTH_KEY_FILE: {tmp_path / 'absent.key'}: cannot read it" in check.detail
    assert main(["config", "check", "--config", str(path), "--process", "api"]) == 1
    assert "FAIL config" in capsys.readouterr().out
    assert DeploymentConfig.load(path, process="worker").signer.client == "worker"


def test_the_treasury_thresholds_are_ordered_satoshis(write):
    from custody.rebalances import treasury_config

    config = DeploymentConfig.load(write(("# floor = 500000000", "floor = 500000000"), ('excess_to = "cold"', 'excess_to = "warm"')))
    rebalance, bump = treasury_config(config.treasury, bitcoin_network="regtest")
    threshold = rebalance.thresholds["BTC"]
    assert (threshold.ceiling, threshold.target, threshold.floor, threshold.excess_to) == (5_000_000_000, 2_000_000_000,
                                                                                           500_000_000, "warm")
    assert (rebalance.refill_quorum, bump.stuck_blocks, bump.bump_percent) == (2, 3, 50)
    assert any(p.startswith("treasury") and "floor < target < ceiling" in p
               for p in problems(write(("# floor = 500000000", "floor = 3000000000"))))
    assert any(p.startswith("treasury.excess_to") for p in problems(write(('excess_to = "cold"', 'excess_to = "hot"'))))
    assert any(p.startswith("treasury.ceiling") for p in problems(write(("ceiling = 5000000000", "ceiling = 50.5"))))


def test_the_ethereum_treasury_thresholds_are_ordered_minor_units(write):
    cold = "0x" + "5A" * 20  # not checksummed: refused
    edits = ("# ethereum_cold_address = \"0x...\"", f'ethereum_cold_address = "{cold}"')
    body = "\n[treasury.ethereum.USDT]\nceiling = 5000000000\ntarget = 2000000000\nexcess_to = \"warm\"\n"
    path = write(edits)
    path.write_text(path.read_text() + body)
    assert [p.split(":")[0] for p in problems(path)] == ["treasury.ethereum_cold_address"]
    from eth_utils import to_checksum_address

    path = write(("# ethereum_cold_address = \"0x...\"", f'ethereum_cold_address = "{to_checksum_address(cold)}"'))
    path.write_text(path.read_text() + body)
    treasury = DeploymentConfig.load(path).treasury
    usdt = treasury.ethereum["USDT"]
    assert (usdt.ceiling, usdt.target, usdt.excess_to, treasury.ethereum_cold_address) == (5_000_000_000, 2_000_000_000, "warm",
                                                                                           to_checksum_address(cold))
    path.write_text(path.read_text().replace("target = 2000000000\nexcess_to", "target = 5000000000\nexcess_to"))
    assert any(p.startswith("treasury.ethereum.USDT") and "target < ceiling" in p for p in problems(path))
