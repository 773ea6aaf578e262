"""The signer's own boundary settings (signer.config): `assets`, `ethereum_chain_id`, `cold_xpubs`,
`unapproved_limit`. Each inconsistency fails at load naming the key; `boundary_arguments` hands
the Signer what it trusts instead of custody's tables, with the documented defaults (BTC only; no
ethereum; no cold wallet; no unapproved cap on regtest, cap 0 elsewhere). The base file is the
config suite's own (tests/unit/test_signer_config.py), so both follow its required keys."""
from __future__ import annotations

from pathlib import Path

import pytest

from regtest.util import assert_equal
from signer.assets import SignerAsset, UnapprovedLimit
from signer.config import ConfigError, boundary_arguments, load_config
from signer.keys import Secret, SignerKeys, seed_from_text
from tests.unit.test_signer_config import BASE, QUORUM, write

KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
USDT = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
ASSETS = f"""
ethereum_chain_id = 31337

[assets.BTC]
chain = "bitcoin"
decimals = 8

[assets.ETH]
chain = "ethereum"

[assets.USDT]
chain = "ethereum"
contract = "{USDT}"
decimals = 6
"""


def load(tmp_path: Path, extra: str, network: str = "regtest"):
    return load_config(write(tmp_path, BASE.replace('"regtest"', f'"{network}"') + extra + QUORUM))


def test_the_defaults_trust_nothing_custody_writes(tmp_path: Path):
    args = boundary_arguments(load(tmp_path, ""))
    assert_equal(args, {"assets": {"BTC": SignerAsset("bitcoin")}, "ethereum_chain_id": None, "cold_xpubs": {},
                        "unapproved_limits": None})
    assert_equal(boundary_arguments(load(tmp_path, "", "mainnet"))["unapproved_limits"], {})  # cap 0: every withdrawal approved


def test_a_complete_table_reaches_the_signer(tmp_path: Path):
    cold = KEYS.account_xpub("bitcoin", "cold")
    args = boundary_arguments(load(tmp_path, f'cold_xpubs = {{bitcoin = "{cold}"}}\n' + ASSETS + """
[unapproved_limit.BTC]
amount = 50000000
window_secs = 86400

[unapproved_limit.ETH]
amount = "100000000000000000000"
window_secs = 3600
"""))
    assert_equal(args["assets"], {"BTC": SignerAsset("bitcoin", None, 8), "ETH": SignerAsset("ethereum"),
                                  "USDT": SignerAsset("ethereum", USDT, 6)})
    assert_equal((args["ethereum_chain_id"], args["cold_xpubs"]), (31337, {"bitcoin": cold}))
    assert_equal(args["unapproved_limits"], {"BTC": UnapprovedLimit(50_000_000, 86_400),
                                             "ETH": UnapprovedLimit(100 * 10**18, 3_600)})  # beyond TOML's 64-bit ints


@pytest.mark.parametrize("extra, key, why", [
    ('[assets.ETH]\nchain = "ethereum"\n', "ethereum_chain_id", "required when assets has an ethereum asset"),
    (f'ethereum_chain_id = 1\n[assets.USDT]\nchain = "ethereum"\ncontract = "{USDT.lower()}"\n', "assets", "EIP-55"),
    (f'[assets.WBTC]\nchain = "bitcoin"\ncontract = "{USDT}"\n', "assets", "only an ethereum asset has a contract"),
    ('ethereum_chain_id = 1\n[assets.ETH]\nchain = "ethereum"\n[assets.ETH2]\nchain = "ethereum"\n', "assets", "one native"),
    ('[assets.BTC]\nchain = "bitcoin"\ndecimal = 8\n', "assets.BTC.decimal", "unknown key"),
    ('[assets.DOGE]\nchain = "dogecoin"\n', "assets.DOGE.chain", "bitcoin"),
    ('ethereum_chain_id = 0\n', "ethereum_chain_id", "greater than 0"),
    (f'cold_xpubs = {{bitcoin = "{KEYS.account_xpub("bitcoin", "cold").replace("vpub", "xpub")}"}}\n', "cold_xpubs.bitcoin",
     "not a BIP84 extended key"),
    ('cold_xpubs = {ethereum = "xpub"}\n', "cold_xpubs.ethereum.[key]", "bitcoin"),
    ('[unapproved_limit.USDT]\namount = 1\nwindow_secs = 60\n', "unapproved_limit", "not in assets"),
    ('[unapproved_limit.BTC]\namount = 1.5\nwindow_secs = 60\n', "unapproved_limit.BTC.amount", "never a float"),
    ('[unapproved_limit.BTC]\namount = 1\nwindow_secs = 0\n', "unapproved_limit.BTC.window_secs", "greater than 0"),
])
def test_an_inconsistent_boundary_fails_at_load_naming_the_key(tmp_path: Path, extra: str, key: str, why: str):
    with pytest.raises(ConfigError, match=why) as info:
        load(tmp_path, extra)
    assert f"{key}:" in str(info.value) or f"{key} " in str(info.value), str(info.value)


def test_a_private_cold_key_is_refused(tmp_path: Path):
    from bip_utils import Bip84, Bip84Coins

    private = Bip84.FromSeed(bytes(range(64)), Bip84Coins.BITCOIN_REGTEST).Purpose().Coin().Account(0).PrivateKey().ToExtended()
    with pytest.raises(ConfigError, match="PRIVATE key"):
        load(tmp_path, f'cold_xpubs = {{bitcoin = "{private}"}}\n')


def test_the_environment_overrides_the_asset_table(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("SIGNER_ASSETS", '{"BTC": {"chain": "bitcoin"}, "ETH": {"chain": "ethereum"}}')
    monkeypatch.setenv("SIGNER_ETHEREUM_CHAIN_ID", "11155111")
    args = boundary_arguments(load(tmp_path, ""))
    assert_equal((sorted(args["assets"]), args["ethereum_chain_id"]), (["BTC", "ETH"], 11_155_111))
