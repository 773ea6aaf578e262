"""What the process boundary costs: the signer's calls over its authenticated unix socket beside the
same calls in-process, measured in one run.

    .venv/bin/python bench/signer_socket.py [--n 300]

Starts `python -m signer serve` (the BIP84 test seed, regtest, a throwaway auth key) in a temporary
directory and times, with one client thread:
- `ping`: a round trip (connect, HMAC both ways, JSON) and nothing else;
- `sign_reserves_message`: a real BIP-322 signature of a reserves statement with a derived key (no database), over the socket
  and by an in-process `signer.service.Signer` built from the same seed.
Prints median / p99 per call, calls per second and the ratio socket / in-process, with the load
average, so the figures can be read against what else the machine was doing. The signer never
connects to its database for these calls (DATABASE_URL, or a placeholder, fills the setting).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from custody.policy_config import default_policy  # noqa: E402
from signer.client import SignerClient  # noqa: E402
from signer.config import DEPLOYED_CLIENTS, quorum_entries  # noqa: E402
from signer.keys import Secret, SignerKeys, seed_from_text  # noqa: E402
from custody.addresses import derive_btc_address  # noqa: E402
from signer.protocol import ReservesStatement  # noqa: E402
from signer.service import Signer  # noqa: E402
from signer.wire import write_auth_key  # noqa: E402

MNEMONIC = "abandon " * 11 + "about"


def timed(fn, n: int) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t)
    return out


def describe(name: str, samples: list[float]) -> float:
    med = statistics.median(samples)
    p99 = sorted(samples)[int(len(samples) * 0.99) - 1]
    print(f"{name:<44} median {med * 1e3:7.3f} ms   p99 {p99 * 1e3:7.3f} ms   {1 / med:9.0f} calls/s")
    return med


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=300, help="calls per measurement")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-signer-", dir="/tmp") as tmp:
        d = Path(tmp)
        seed = d / "seed.txt"
        fd = os.open(seed, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(MNEMONIC + "\n")
        clients, keys = [], {}
        for name, methods in DEPLOYED_CLIENTS.items():
            keys[name] = write_auth_key(d / f"{name}.key")
            clients.append({"name": name, "auth_key_file": str(d / f"{name}.key"), "methods": list(methods)})
        listen = f"unix:{d / 'signer.sock'}"
        config = d / "signer.toml"
        config.write_text(tomli_w.dumps({
            "network": "regtest", "seed_file": str(seed), "listen": listen, "clients": clients,
            "database_url": os.environ.get("DATABASE_URL") or "postgresql://custody_signer@127.0.0.1:5432/unused",
            "quorum": quorum_entries(default_policy())}))
        log = open(d / "signer.log", "w")
        proc = subprocess.Popen([sys.executable, "-m", "signer", "serve", "--config", str(config)], cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            client = SignerClient(listen, keys["worker"], client="worker")
            deadline = time.monotonic() + 30
            while True:
                try:
                    client.ping()
                    break
                except Exception:  # noqa: BLE001 - not up yet
                    if time.monotonic() > deadline or proc.poll() is not None:
                        print((d / "signer.log").read_text())
                        return 1
                    time.sleep(0.1)
            keys = SignerKeys(seed_from_text(Secret(MNEMONIC)), "regtest")
            local = Signer(None, keys, bitcoin_network="regtest")
            hot = derive_btc_address(keys.account_xpub("bitcoin", "hot"), "regtest", 0, 0)

            def message(i: int) -> str:  # a BIP-322 statement for the hot address (what a report signs)
                return ReservesStatement(i + 1, "BTC", "bitcoin", 1, "00" * 32, hot, i, "11" * 32).message()

            for i in range(20):  # warm both (key derivation caches, connections)
                client.sign_reserves_message("bitcoin", "hot", 0, 0, message(i))
                local.sign_reserves_message("bitcoin", "hot", 0, 0, message(i))
            print(f"signer over unix socket vs in-process, {args.n} calls each, one client; "
                  f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
            describe("ping over the socket", timed(lambda i: client.ping(), args.n))
            sock = describe("sign_reserves_message over the socket", timed(
                lambda i: client.sign_reserves_message("bitcoin", "hot", 0, 0, message(i)), args.n))
            inproc = describe("sign_reserves_message in-process", timed(
                lambda i: local.sign_reserves_message("bitcoin", "hot", 0, 0, message(i)), args.n))
            print(f"socket / in-process (median): {sock / inproc:.1f}x; the boundary adds {(sock - inproc) * 1e3:.2f} ms "
                  f"per signing call; load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        finally:
            proc.terminate()
            proc.wait(20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
