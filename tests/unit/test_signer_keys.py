"""Signer key custody: seed loading, redaction, tier mapping, private-key refusals."""
from __future__ import annotations

import copy
import logging
import os
import pickle
import traceback
from pathlib import Path

import pytest
from bip_utils import WifDecoder

from signer.errors import SignerError, SignerErrorCode
from signer.keys import (
    PASSPHRASE_ENV,
    SEED_ENV,
    SEED_FILE_ENV,
    SIGNING_TIERS,
    TIER_ACCOUNT,
    Secret,
    SignerKeys,
    Tier,
    load_seed,
    seed_from_text,
)

MNEMONIC = "abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon about"
# BIP39's published seed for this mnemonic with the empty passphrase (the "TREZOR" vector differs).
MNEMONIC_SEED_HEX = (
    "5eb00bbddcf069084889a8ab9155568165f5c453ccb85e70811aaed6f6da5fc1"
    "9a5ac40b389cd370d086206dec8aa6c43daea6690f20ad3d8d48b2d2ce9e38e4"
)
# BIP84 private keys (WIF) for m/84'/0'/0'/{0/0, 0/1, 1/0}.
BIP84_WIFS = {
    (0, 0): "KyZpNDKnfs94vbrwhJneDi77V6jF64PWPF8x5cdJb8ifgg2DUc9d",
    (0, 1): "Kxpf5b8p3qX56DKEe5NqWbNUP9MnqoRFzZwHRtsFqhzuvUJsYZCy",
    (1, 0): "KxuoxufJL5csa1Wieb2kp29VNdn92Us8CoaUG3aGtPtcF3AzeXvF",
}


def _private_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "seed"
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.fixture(scope="module")
def keys() -> SignerKeys:
    return SignerKeys(seed_from_text(Secret(MNEMONIC)), "mainnet")


# --- loading -------------------------------------------------------------------------------------


def test_mnemonic_expands_to_the_bip39_seed() -> None:
    assert seed_from_text(Secret(MNEMONIC)).reveal().hex() == MNEMONIC_SEED_HEX


def test_loads_from_a_private_file_with_untidy_whitespace(tmp_path: Path) -> None:
    path = _private_file(tmp_path, "\n  " + MNEMONIC.replace(" ", "\n", 3) + "  \n")
    assert load_seed(path=path, environ={}).reveal().hex() == MNEMONIC_SEED_HEX


def test_file_from_environment_is_preferred_over_inline_seed(tmp_path: Path) -> None:
    path = _private_file(tmp_path, MNEMONIC)
    env = {SEED_FILE_ENV: str(path), SEED_ENV: "000102030405060708090a0b0c0d0e0f"}
    assert load_seed(environ=env).reveal().hex() == MNEMONIC_SEED_HEX


def test_loads_inline_from_environment() -> None:
    assert load_seed(environ={SEED_ENV: MNEMONIC}).reveal().hex() == MNEMONIC_SEED_HEX


def test_passphrase_changes_the_seed() -> None:
    plain = load_seed(environ={SEED_ENV: MNEMONIC}).reveal()
    salted = load_seed(environ={SEED_ENV: MNEMONIC, PASSPHRASE_ENV: "TREZOR"}).reveal()
    assert plain != salted
    # BIP39 reference vector: this mnemonic with passphrase TREZOR.
    assert salted.hex().startswith("c55257c360c07c72029aebc1b53c05ed0362ada38ead3e3e9efa3708e5349553")


def test_load_uses_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SEED_FILE_ENV, raising=False)
    monkeypatch.delenv(PASSPHRASE_ENV, raising=False)
    monkeypatch.setenv(SEED_ENV, MNEMONIC)
    assert SignerKeys.load("regtest").master_fingerprint == "73c5da0a"


@pytest.mark.parametrize(
    ("environ", "code"),
    [
        ({}, SignerErrorCode.SEED_NOT_CONFIGURED),
        ({SEED_ENV: ""}, SignerErrorCode.SEED_NOT_CONFIGURED),
        ({SEED_ENV: "abandon " * 11 + "abandon"}, SignerErrorCode.SEED_INVALID),  # bad checksum
        ({SEED_ENV: "abandon " * 11 + "notaword"}, SignerErrorCode.SEED_INVALID),
        ({SEED_ENV: "0011"}, SignerErrorCode.SEED_INVALID),  # too short for BIP32
        ({SEED_ENV: "xyz"}, SignerErrorCode.SEED_INVALID),
        ({SEED_FILE_ENV: "/nonexistent/seed"}, SignerErrorCode.SEED_FILE_UNREADABLE),
    ],
)
def test_load_refusals(environ: dict[str, str], code: SignerErrorCode) -> None:
    with pytest.raises(SignerError) as caught:
        load_seed(environ=environ)
    assert caught.value.code is code


def test_group_readable_file_is_refused(tmp_path: Path) -> None:
    path = _private_file(tmp_path, MNEMONIC, mode=0o640)
    with pytest.raises(SignerError) as caught:
        load_seed(path=path, environ={})
    assert caught.value.code is SignerErrorCode.SEED_FILE_PERMISSIONS_TOO_OPEN
    # An explicit opt-out exists for mounts that cannot carry modes (documented, not default).
    assert load_seed(path=path, environ={}, require_owner_only=False).reveal().hex() == MNEMONIC_SEED_HEX


def test_every_error_code_has_a_meaning() -> None:
    for code in SignerErrorCode:
        assert code.meaning and "\n" not in code.meaning


# --- redaction -----------------------------------------------------------------------------------


def _leaks(text: str, seed: bytes) -> bool:
    return any(s in text for s in (MNEMONIC, "abandon", seed.hex(), repr(seed)))


def test_secret_redacts_everywhere(caplog: pytest.LogCaptureFixture) -> None:
    seed = seed_from_text(Secret(MNEMONIC))
    words = Secret(MNEMONIC)
    keys = SignerKeys(seed, "regtest")
    log = logging.getLogger("test.signer")
    with caplog.at_level(logging.DEBUG):
        for thing in (seed, words, keys):
            log.info("value %s %r", thing, thing)
            log.info(f"value {thing} {thing!r}")
            log.info("dict %s", {"seed": thing})
            log.info("list %r", [thing])
    rendered = [repr(seed), str(seed), f"{seed}", f"{seed:>80}", "{!s}".format(seed), repr(words), str(words), repr(keys), str(keys)]
    for text in rendered + [caplog.text]:
        assert not _leaks(text, seed.reveal()), text
    assert "redacted" in repr(seed)


def test_secret_refuses_pickle_and_equality_probing() -> None:
    seed = seed_from_text(Secret(MNEMONIC))
    with pytest.raises(TypeError):
        pickle.dumps(seed)
    with pytest.raises(TypeError):
        copy.deepcopy(seed)
    with pytest.raises(TypeError):
        pickle.dumps(SignerKeys(seed, "regtest"))
    assert seed != Secret(seed.reveal())


def test_invalid_mnemonic_error_does_not_echo_the_words() -> None:
    phrase = "abandon " * 11 + "zebraword"
    with pytest.raises(SignerError) as caught:
        seed_from_text(Secret(phrase))
    text = "".join(traceback.format_exception_only(caught.value))
    assert "zebraword" not in text and "abandon" not in text
    # No chained library exception carrying its own message either.
    error = caught.value
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)


def test_invalid_hex_seed_error_does_not_echo_it() -> None:
    with pytest.raises(SignerError) as caught:
        seed_from_text(Secret("deadbeefcafe"))
    error = caught.value
    assert "deadbeefcafe" not in "".join(traceback.format_exception_only(error))
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)


# --- tiers and private keys ----------------------------------------------------------------------


def test_tier_mapping_is_documented_and_distinct() -> None:
    assert TIER_ACCOUNT == {Tier.DEPOSIT: 0, Tier.HOT: 1, Tier.WARM: 2, Tier.COLD: 3}
    assert Tier.COLD not in SIGNING_TIERS


@pytest.mark.parametrize(
    ("network", "chain", "tier", "path"),
    [
        ("mainnet", "bitcoin", "deposit", "m/84'/0'/0'"),
        ("mainnet", "bitcoin", "hot", "m/84'/0'/1'"),
        ("regtest", "bitcoin", "warm", "m/84'/1'/2'"),
        ("testnet", "bitcoin", "cold", "m/84'/1'/3'"),
        ("regtest", "ethereum", "deposit", "m/44'/60'/0'"),
        ("mainnet", "ethereum", "hot", "m/44'/60'/1'"),
        ("regtest", "ethereum", "cold", "m/44'/60'/3'"),
    ],
)
def test_derivation_paths(network: str, chain: str, tier: str, path: str) -> None:
    keys = SignerKeys(seed_from_text(Secret(MNEMONIC)), network)
    assert keys.derivation_path(chain, tier) == path


@pytest.mark.parametrize(("change", "index"), sorted(BIP84_WIFS))
def test_private_keys_match_bip84_vectors(keys: SignerKeys, change: int, index: int) -> None:
    expected, _ = WifDecoder.Decode(BIP84_WIFS[(change, index)])
    assert keys.private_key_for("bitcoin", "deposit", change, index) == bytes(expected)


def test_cold_tier_is_watch_only(keys: SignerKeys) -> None:
    assert keys.account_xpub("bitcoin", "cold").startswith("zpub")
    for chain in ("bitcoin", "ethereum"):
        with pytest.raises(SignerError) as caught:
            keys.private_key_for(chain, "cold", 0, 0)
        assert caught.value.code is SignerErrorCode.TIER_WATCH_ONLY


@pytest.mark.parametrize(
    ("chain", "tier", "change", "index", "code"),
    [
        ("litecoin", "hot", 0, 0, SignerErrorCode.UNKNOWN_CHAIN),
        ("bitcoin", "lukewarm", 0, 0, SignerErrorCode.UNKNOWN_TIER),
        ("bitcoin", "hot", 2, 0, SignerErrorCode.INVALID_DERIVATION_INDEX),
        ("bitcoin", "hot", 0, 2**31, SignerErrorCode.INVALID_DERIVATION_INDEX),
        ("bitcoin", "hot", 0, -1, SignerErrorCode.INVALID_DERIVATION_INDEX),
        ("bitcoin", "hot", 0, True, SignerErrorCode.INVALID_DERIVATION_INDEX),
        ("ethereum", "hot", 1, 0, SignerErrorCode.INVALID_DERIVATION_INDEX),  # eth uses change 0 only
    ],
)
def test_private_key_refusals(
    keys: SignerKeys, chain: str, tier: str, change: int, index: int, code: SignerErrorCode
) -> None:
    with pytest.raises(SignerError) as caught:
        keys.private_key_for(chain, tier, change, index)
    assert caught.value.code is code


def test_unknown_network_is_refused() -> None:
    with pytest.raises(SignerError) as caught:
        SignerKeys(seed_from_text(Secret(MNEMONIC)), "signet")
    assert caught.value.code is SignerErrorCode.UNKNOWN_NETWORK


def test_account_xpub_is_public(keys: SignerKeys) -> None:
    for chain in ("bitcoin", "ethereum"):
        for tier in Tier:
            xpub = keys.account_xpub(chain, tier.value)
            assert xpub[1:4] == "pub", xpub


def test_signer_module_does_not_touch_the_process_environment_when_given_one() -> None:
    before = dict(os.environ)
    load_seed(environ={SEED_ENV: MNEMONIC})
    assert dict(os.environ) == before


def test_signer_never_imports_custody() -> None:
    # Arrows point one way (DESIGN.md 2): custody -> signer, never back.
    import ast

    package = Path(__file__).resolve().parents[2] / "signer"
    for source in package.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                assert name.split(".")[0] not in {"custody", "ledger", "matching"}, (source.name, name)
