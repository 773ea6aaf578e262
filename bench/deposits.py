"""Deposit pipeline benchmark: deposits credited per second from scan to credit, on real bitcoind.

    .venv/bin/python bench/deposits.py                    # 1,000 outputs, 200 addresses, 20 blocks
    .venv/bin/python bench/deposits.py --outputs 5000 --addresses 500 --blocks 50

Starts its own regtest nodes and database, pays the outputs, mines to finality, then times each job
(scan, confirm, credit) and prints their rates and the end-to-end figure. Not part of the test suite.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.regtest_custody import custody_on_regtest  # noqa: E402
from regtest.workloads import pay_many_bitcoin  # noqa: E402

FINALITY = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--outputs", type=int, default=1000)
    parser.add_argument("--addresses", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=20)
    args = parser.parse_args()

    with custody_on_regtest("deposits", with_signer=False) as (container, node, keys):
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


if __name__ == "__main__":
    main()
