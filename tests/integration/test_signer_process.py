"""`python -m signer serve` as a real OS process, on a unix socket and on loopback TCP.

Each scenario writes a seed file (0600, the BIP84 test mnemonic), two clients' auth key files
(`worker`: every method; `api`: ping, xpubs, sign_reserves_message) and a TOML config pointing at
the session database, starts the signer as a subprocess and talks to it with
`signer.client.SignerClient` only: ping; xpubs equal to the seed's account xpubs; a wrong auth key
is `unauthenticated` (logged, the key never); the api client is refused every other signing method
with `method_not_allowed` before the signer reads or audits anything, and its key cannot speak as
the worker; a signing call for a batch that does not exist comes
back as SigningRefused with the signer's own code and the signer's audit row; SIGTERM stops it and
removes its socket; a stopped signer is SignerUnavailable (a NodeUnavailable: jobs retry). The
`xpubs` and `check` commands are run the same way.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomli_w
from sqlalchemy import text

from chain_adapters.errors import NodeUnavailable
from custody.addresses import derive_btc_address
from custody.controls import kill_switch
from custody.policy_config import default_policy
from regtest.util import assert_equal, assert_raises_code, free_port
from signer.client import SignerClient
from signer.config import DEPLOYED_CLIENTS, quorum_entries
from signer.keys import Chain, Secret, SignerKeys, Tier, seed_from_text
from signer import bip322
from signer.protocol import BatchOutput, RefusalCode, ReservesStatement
from signer.wire import SIGNING_METHODS, SignerInfo, SignerUnavailable, WireErrorCode, write_auth_key

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]
TEST_MNEMONIC = "abandon " * 11 + "about"
KEYS = SignerKeys(seed_from_text(Secret(TEST_MNEMONIC)), "regtest")
REGTEST_ADDRESS = "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080"


@dataclass
class SignerProcess:
    proc: subprocess.Popen
    directory: Path
    config: Path
    listen: str
    keys: dict[str, bytes]  # client name -> its auth key

    @property
    def client(self) -> SignerClient:
        """The worker's client: every method."""
        return self.client_as("worker")

    def client_as(self, name: str) -> SignerClient:
        return SignerClient(self.listen, self.keys[name], client=name, timeout=30)

    def log_text(self) -> str:
        return (self.directory / "signer.log").read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=20)


def write_config(directory: Path, database_url: str, listen: str, **extra: str) -> tuple[Path, dict[str, bytes]]:
    """A seed file (0600), one auth key file per deployed client (signer.config.DEPLOYED_CLIENTS) and
    signer.toml in `directory`; (config path, {client name: auth key})."""
    seed = directory / "seed.txt"
    seed.unlink(missing_ok=True)
    fd = os.open(seed, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(TEST_MNEMONIC + "\n")
    keys, clients = {}, []
    for name, methods in DEPLOYED_CLIENTS.items():
        key_file = directory / f"{name}.key"
        key_file.unlink(missing_ok=True)
        keys[name] = write_auth_key(key_file)
        clients.append({"name": name, "auth_key_file": str(key_file), "methods": list(methods)})
    values = {"network": "regtest", "seed_file": str(seed), "database_url": database_url, "listen": listen,
              **extra, "clients": clients, "quorum": quorum_entries(default_policy())}
    config = directory / "signer.toml"
    config.write_text(tomli_w.dumps(values))
    return config, keys


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SIGNER_", "CUSTODY_SIGNER_"))}


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "signer", *args], cwd=ROOT, env=clean_env(), capture_output=True,
                          text=True, timeout=timeout)


def listen_address(kind: str, directory: Path) -> str:
    return f"unix:{directory / 'signer.sock'}" if kind == "unix" else f"tcp:127.0.0.1:{free_port()}"


def start_signer(directory: Path, database_url: str, listen: str) -> SignerProcess:
    """Start `python -m signer serve --config F` and wait until it answers a ping."""
    config, keys = write_config(directory, database_url, listen)
    logfile = open(directory / "signer.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "signer", "serve", "--config", str(config)], cwd=ROOT,
                            env=clean_env(), stdout=logfile, stderr=subprocess.STDOUT)
    logfile.close()
    sp = SignerProcess(proc, directory, config, listen, keys)
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the signer exited with {proc.returncode}:\n{sp.log_text()}")
        try:
            sp.client.ping()
            return sp
        except SignerUnavailable:
            if time.monotonic() > deadline:
                sp.stop()
                pytest.fail(f"the signer did not answer within 60 s:\n{sp.log_text()}")
            time.sleep(0.1)


@pytest.fixture
def short_dir():
    """A directory with a short path (a unix socket path is limited to ~100 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="sg-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def launch(database_url):
    """start_signer for one test; whatever it started is stopped at teardown, even on a failure."""
    started: list[SignerProcess] = []

    def start(directory: Path, listen: str) -> SignerProcess:
        started.append(start_signer(directory, database_url, listen))
        return started[-1]

    yield start
    for sp in started:
        if sp.proc.poll() is None:
            sp.proc.kill()
            sp.proc.wait(timeout=10)


@pytest.fixture(scope="module", params=["unix", "tcp"])
def running(request, database_url):
    directory = Path(tempfile.mkdtemp(prefix="sg-", dir="/tmp"))
    sp = start_signer(directory, database_url, listen_address(request.param, directory))
    log.info("signer started on %s (pid %d)", sp.listen, sp.proc.pid)
    try:
        yield sp
        assert_equal(sp.stop(), 0)
    finally:
        if sp.proc.poll() is None:
            sp.proc.kill()
            sp.proc.wait(timeout=10)
        shutil.rmtree(directory, ignore_errors=True)


def test_ping_answers_the_network_and_the_master_fingerprint(running):
    assert_equal(running.client.ping(), SignerInfo("regtest", KEYS.master_fingerprint))
    time.sleep(0.2)  # the log line is written after the answer
    assert re.search(r"request id=[0-9a-f]{16} client=worker method=ping outcome=ok ms=[0-9.]+", running.log_text())


def test_xpubs_are_the_seed_account_xpubs_public_only(running):
    xpubs = running.client.xpubs()
    assert_equal(xpubs.master_fingerprint, KEYS.master_fingerprint)
    for chain in Chain:
        for tier in Tier:
            assert_equal(xpubs.get(chain.value, tier.value), KEYS.account_xpub(chain.value, tier.value))
    assert not any(x[1:4] == "prv" for tiers in xpubs.accounts.values() for x in tiers.values())


def test_a_wrong_auth_key_is_unauthenticated_and_logged_without_any_key(running):
    other = os.urandom(32)
    assert_raises_code(WireErrorCode.unauthenticated, SignerClient(running.listen, other).ping)
    time.sleep(0.2)  # the log line is written after the answer
    text_ = running.log_text()
    assert "unauthenticated request" in text_ and "bad mac" in text_
    for secret in (other.hex(), *(k.hex() for k in running.keys.values()), "abandon"):
        assert secret not in text_


def test_the_api_client_may_publish_reserves_and_read_keys_and_nothing_else(running, engine):
    """Least privilege: the api's key calls ping, xpubs and sign_reserves_message; every other
    signing method is method_not_allowed before the signer reads the database (no audit row), and
    the api's key cannot speak as the worker."""
    api = running.client_as("api")
    assert_equal(api.ping(), SignerInfo("regtest", KEYS.master_fingerprint))
    assert_equal(api.xpubs().get("bitcoin", "hot"), KEYS.account_xpub("bitcoin", "hot"))
    hot = derive_btc_address(KEYS.account_xpub("bitcoin", "hot"), "regtest", 0, 0)
    message = ReservesStatement(1, "BTC", "bitcoin", 7, "ab" * 32, hot, 5_000, "cd" * 32).message()
    signed = api.sign_reserves_message("bitcoin", "hot", 0, 0, message)
    assert_equal(signed.address, hot)
    assert bip322.verify_simple(hot, message, signed.signature)
    batch_id = 2**62 + uuid.uuid4().int % 2**40  # no such batch: a call that got through would be refused and audited
    output = BatchOutput(batch_id, REGTEST_ADDRESS, 100_000)
    calls = {
        "sign_bitcoin_batch": lambda: api.sign_bitcoin_batch(batch_id, [], [output], None),
        "sign_bitcoin_replacement": lambda: api.sign_bitcoin_replacement(batch_id, "ab" * 32, [], [output], None),
        "sign_bitcoin_sweep": lambda: api.sign_bitcoin_sweep(batch_id, [], REGTEST_ADDRESS, 1_000),
        "sign_bitcoin_rebalance": lambda: api.sign_bitcoin_rebalance(batch_id, [], REGTEST_ADDRESS, 1_000, None),
        "sign_bitcoin_cpfp": lambda: api.sign_bitcoin_cpfp(batch_id, b"\x02\x00", 0, REGTEST_ADDRESS, 1_000),
        "sign_ethereum_payment": lambda: api.sign_ethereum_payment(
            batch_id, output, hot_index=0, chain_id=31337, nonce=0, to="0x" + "22" * 20, value=1, data=b"", gas=21_000,
            max_fee_wei=10**9, priority_fee_wei=10**9),
        "sign_ethereum_gas_funding": lambda: api.sign_ethereum_gas_funding(
            batch_id, deposit_index=0, chain_id=31337, nonce=0, value=1, gas=21_000, max_fee_wei=10**9, priority_fee_wei=1),
        "sign_ethereum_sweep": lambda: api.sign_ethereum_sweep(
            batch_id, deposit_index=0, asset="ETH", amount=1, chain_id=31337, nonce=0, gas=21_000, max_fee_wei=10**9,
            priority_fee_wei=1),
        "sign_ethereum_rebalance": lambda: api.sign_ethereum_rebalance(
            batch_id, asset="ETH", amount=1, destination_tier="warm", chain_id=31337, nonce=0, gas=21_000, max_fee_wei=10**9,
            priority_fee_wei=1),
    }
    assert_equal(set(calls), SIGNING_METHODS - set(DEPLOYED_CLIENTS["api"]))
    for method, call in calls.items():
        err = assert_raises_code(WireErrorCode.method_not_allowed, call)
        assert method in err.message
    impostor = SignerClient(running.listen, running.keys["api"], client="worker")
    assert_raises_code(WireErrorCode.unauthenticated, impostor.sign_bitcoin_batch, batch_id, [], [output], None)
    with engine.connect() as c:
        audited = c.execute(text("SELECT count(*) FROM signer_audit WHERE batch_id = :b"), {"b": batch_id}).scalar_one()
    assert_equal(audited, 0)
    time.sleep(0.2)  # the log lines are written after the answers
    text_ = running.log_text()
    for method in calls:
        assert f"client=api method={method} outcome=error:method_not_allowed" in text_
        assert "method_not_allowed: client api" in text_


def test_a_refusal_comes_back_with_its_code_and_the_signer_audits_it(running, engine):
    batch_id = 2**62 + uuid.uuid4().int % 2**40  # no such batch
    expected = RefusalCode.kill_switch_on if kill_switch(engine).engaged else RefusalCode.output_mismatch
    refused = assert_raises_code(expected, running.client.sign_bitcoin_batch, batch_id, [],
                                 [BatchOutput(batch_id, REGTEST_ADDRESS, 100_000)], None)
    log.info("refused as expected: %s", refused)
    with engine.connect() as c:
        rows = c.execute(text("SELECT outcome, code, txid FROM signer_audit WHERE batch_id = :b"), {"b": batch_id}).all()
    assert_equal([tuple(r) for r in rows], [("refused", expected.value, None)])
    assert f"outcome=refused:{expected.value}" in running.log_text()


def test_a_second_signer_on_the_same_address_refuses_to_start(running, database_url, short_dir):
    config, _ = write_config(short_dir, database_url, running.listen)
    done = run_cli("serve", "--config", str(config))
    assert_equal(done.returncode, 1)
    why = "another process is listening" if running.listen.startswith("unix:") else "Address already in use"
    assert "signer: " in done.stderr and why in done.stderr, done.stderr
    running.client.ping()  # the first one still serves


@pytest.mark.parametrize("kind", ["unix", "tcp"])
def test_sigterm_stops_the_signer_removes_its_socket_and_it_is_then_unavailable(kind, launch, short_dir):
    sp = launch(short_dir, listen_address(kind, short_dir))
    client = sp.client
    if kind == "unix":
        assert_equal(oct((short_dir / "signer.sock").stat().st_mode & 0o777), "0o600")
    client.ping()
    sp.proc.send_signal(signal.SIGTERM)
    assert_equal(sp.proc.wait(timeout=20), 0)
    assert "signer stopped" in sp.log_text()
    assert not (short_dir / "signer.sock").exists()
    with pytest.raises(SignerUnavailable) as info:
        client.sign_bitcoin_sweep(1, [], REGTEST_ADDRESS, 1_000)
    assert isinstance(info.value, NodeUnavailable)


def test_a_stale_socket_file_left_by_a_killed_signer_is_replaced(launch, short_dir):
    listen = listen_address("unix", short_dir)
    first = launch(short_dir, listen)
    first.proc.kill()
    first.proc.wait(timeout=10)
    assert (short_dir / "signer.sock").exists()
    with pytest.raises(SignerUnavailable):
        first.client.ping()
    second = launch(short_dir, listen)
    assert_equal(second.client.ping().master_fingerprint, KEYS.master_fingerprint)
    assert_equal(second.stop(), 0)


def test_the_xpubs_command_prints_the_account_xpubs(database_url, short_dir):
    config, _ = write_config(short_dir, database_url, listen_address("unix", short_dir))
    done = run_cli("xpubs", "--config", str(config))
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert_equal(printed["accounts"], {c.value: {t.value: KEYS.account_xpub(c.value, t.value) for t in Tier} for c in Chain})
    assert_equal((printed["network"], printed["master_fingerprint"]), ("regtest", KEYS.master_fingerprint))


def test_the_check_command_reaches_the_database_and_names_each_problem(database_url, short_dir):
    listen = listen_address("unix", short_dir)
    config, _ = write_config(short_dir, database_url, listen)
    done = run_cli("check", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert f"master fingerprint: {KEYS.master_fingerprint}" in done.stdout and f"listen: {listen}" in done.stdout
    assert "client api: ping, sign_reserves_message, xpubs" in done.stdout, done.stdout

    (short_dir / "seed.txt").chmod(0o644)
    done = run_cli("check", "--config", str(config))
    assert_equal(done.returncode, 1)
    assert "seed_file_permissions_too_open" in done.stderr and "chmod 600" in done.stderr, done.stderr
    assert "abandon" not in done.stderr + done.stdout

    config, _ = write_config(short_dir, "postgresql://nobody@127.0.0.1:1/none", listen)
    done = run_cli("check", "--config", str(config))
    assert_equal(done.returncode, 1)
    assert "database_url" in done.stderr, done.stderr

    config.write_text('max_fee_rate = 1000\n' + config.read_text())  # a top-level key before the first table
    done = run_cli("check", "--config", str(config))
    assert_equal(done.returncode, 1)
    assert "max_fee_rate: unknown key" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
