"""Deposit pipeline benchmark: deposits credited per second from scan to credit, on real bitcoind.

    .venv/bin/python bench/deposits.py                    # 1,000 outputs, 200 addresses, 20 blocks
    .venv/bin/python bench/deposits.py --outputs 5000 --addresses 500 --blocks 50

Starts its own regtest nodes and database, pays the outputs, mines to finality, then times each job
(scan, confirm, credit) and prints their rates and the end-to-end figure. Not part of the test suite.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chain_adapters.bitcoin import BitcoinAdapter  # noqa: E402
from custody.container import Container  # noqa: E402
from custody.database import drop_database, ensure_database, make_engine, migrate, server_url, with_database  # noqa: E402
from custody.settings import Settings  # noqa: E402
from ledger.service import Ledger  # noqa: E402
from regtest.bitcoin_node import start_bitcoind  # noqa: E402
from regtest.install import find_tools  # noqa: E402
from regtest.workloads import pay_many_bitcoin  # noqa: E402
from signer.keys import Secret, SignerKeys, seed_from_text  # noqa: E402

FINALITY = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--outputs", type=int, default=1000)
    parser.add_argument("--addresses", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=20)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-deposits-"))
    url = with_database(server_url(Settings()), f"bench_deposits_{os.getpid()}")
    node = start_bitcoind(find_tools(), root / "bitcoind")
    try:
        ensure_database(url)
        migrate(url)
        engine = make_engine(url)
        container = Container(settings=Settings(environment="test"), engine=engine, ledger=Ledger(engine))
        container.with_chains({"bitcoin": BitcoinAdapter(node.rpc_url, network="regtest")})
        keys = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
        container.wallets.register_wallet("bitcoin", "deposit", "regtest", keys.account_xpub("bitcoin", "deposit"),
                                          gap_limit=args.addresses + 1)
        container.wallets.configure_asset("BTC", 8, "bitcoin", finality=FINALITY, dust_minimum=1_000)
        container.deposits.start_cursor("bitcoin")
        accounts = [container.wallets.customer_account(f"bench-{i}", "BTC") for i in range(args.addresses)]
        addresses = [container.wallets.issue_address(f"bench:{a}", a).address for a in accounts]
        print(f"paying {args.outputs} outputs to {args.addresses} addresses over {args.blocks} blocks ...", flush=True)
        pay_many_bitcoin(node, addresses, args.outputs, args.blocks, random.Random(1))
        node.mine(FINALITY)

        d = container.deposits
        t0 = time.perf_counter()
        recorded = 0
        while True:
            s = d.scan("bitcoin")
            recorded += s.recorded
            if not s.blocks:
                break
        t1 = time.perf_counter()
        d.confirm("bitcoin")
        t2 = time.perf_counter()
        credited = d.credit("bitcoin").credited
        t3 = time.perf_counter()
        print(f"scan:    {recorded} observations in {t1 - t0:.2f}s ({recorded / (t1 - t0):,.0f}/s)")
        print(f"confirm: {t2 - t1:.2f}s")
        print(f"credit:  {credited} deposits in {t3 - t2:.2f}s ({credited / (t3 - t2):,.0f}/s), 100 deposits per commit, each screened (bitcoin senders looked up)")
        print(f"end to end: {credited} deposits credited in {t3 - t0:.2f}s = {credited / (t3 - t0):,.0f} deposits/s")
        container.ledger.assert_verified()
        print("ledger verified")
        engine.dispose()
    finally:
        node.stop()
        drop_database(url)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
