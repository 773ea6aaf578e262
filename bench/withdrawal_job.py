"""The custody withdrawal job, end to end, for 500 bitcoin withdrawals, beside bitcoind's `sendmany`.

    .venv/bin/python bench/withdrawal_job.py              # 500 withdrawals, 3 repetitions
    .venv/bin/python bench/withdrawal_job.py --outputs 200 --reps 5

`bench/withdrawals.py` times the signer's core (coin selection + signing). This one times what the
service really does for a batch: `Payouts.batch_bitcoin()` (take the approved withdrawals under
row locks, rescreen them, create the batch, select and reserve coins) and
`Payouts.sign_open_batches()` (the signer re-checks every withdrawal's decision, quorum, expiry and
live hold, signs, and one database transaction stores the signed transaction and captures all 500
holds into in-flight and fee income). Setup (funding, 500 requests) is untimed. bitcoind's wallet
`sendmany` of the same number of outputs on the same node is timed for comparison; its wallet keeps
no books, so the ratio prices our bookkeeping and checks, not just signing. Not part of the tests.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Callable, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import text  # noqa: E402

from custody.addresses import derive_btc_address  # noqa: E402
from ledger.model import Transfer  # noqa: E402
from bench.regtest_custody import custody_on_regtest  # noqa: E402
from signer.keys import Secret, SignerKeys, seed_from_text  # noqa: E402


T = TypeVar("T")
PAYEE_MNEMONIC = "legal winner thank year wave sausage worth useful legal winner thank yellow"


def _run(step: Callable[[], T], profile: bool) -> T:
    """Run one timed step; with `profile`, under cProfile, printing its top functions."""
    if not profile:
        return step()
    import cProfile
    import pstats

    prof = cProfile.Profile()
    result = prof.runcall(step)
    pstats.Stats(prof).sort_stats(os.environ.get("PROFILE_SORT", "cumulative")).print_stats(int(os.environ.get("PROFILE_N", "30")))
    return result


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _db_cpu(engine) -> dict[int, float]:
    """CPU seconds so far of the PostgreSQL server processes of the bench database's connections."""
    with engine.connect() as c:
        # every connection, this one too: the pool may answer the next call on another one
        pids = c.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")).scalars().all()
    found = {}
    for pid in pids:
        try:
            found[pid] = _cpu_seconds(pid)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return found


def _db_cpu_since(engine, before: dict[int, float]) -> float:
    """The database's CPU since `before` (a connection opened meanwhile counts from its start)."""
    after = _db_cpu(engine)
    for pid in set(before) - set(after):
        try:
            after[pid] = _cpu_seconds(pid)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--outputs", type=int, default=500)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the last repetition's batching and signing steps")
    args = parser.parse_args()
    n = args.outputs
    with custody_on_regtest("wjob", with_signer=True) as (c, node, keys):
        for tier in ("deposit", "hot"):
            c.wallets.register_wallet("bitcoin", tier, "regtest", keys.account_xpub("bitcoin", tier))
        c.wallets.configure_asset("BTC", 8, "bitcoin", finality=1, min_withdrawal=10_000, withdrawal_fee=5_000)
        p = c.payouts
        # the wallet index walks blocks from the scanner's cursor (custody.wallet_index): start it
        # before the funding, or the funding block lies behind it and no hot coin is ever seen
        c.deposits.start_cursor("bitcoin")
        p.signer.warm_up()  # as `signer serve` does at start: the own-address windows, derived once
        for _ in range(args.reps + 1):
            node.wallet("sendtoaddress", p.hot_address("bitcoin"), "10")
        node.mine(1)
        p.sync_hot_wallet()
        pool = c.wallets.location_account("bitcoin", "deposit", "BTC")
        # Payees belong to no wallet on the node (a BIP39 test-vector seed), as real customers' do.
        other = SignerKeys(seed_from_text(Secret(PAYEE_MNEMONIC)), "regtest").account_xpub("bitcoin", "deposit")
        payees = [derive_btc_address(other, "regtest", 0, i) for i in range(n)]
        timings, sendmany, cpu = [], [], []
        for rep in range(args.reps):
            accounts = []
            for i in range(n):
                acct = c.wallets.customer_account(f"bench-{rep}-{i}", "BTC")
                c.ledger.post(f"bench-credit:{rep}:{i}", [Transfer(pool, acct, 1_000_000)], kind="deposit")
                accounts.append(acct)
            for i, acct in enumerate(accounts):
                c.withdrawals.request(client_withdrawal_id=f"b-{rep}-{i}", account_id=acct, amount=20_000 + i,
                                      destination=payees[i], requested_by="bench")
            profile = args.profile and rep == args.reps - 1
            db0, own0 = _db_cpu(c.engine), time.process_time()
            t0 = time.perf_counter()
            batch = _run(p.batch_bitcoin, profile)
            t1 = time.perf_counter()
            [_txid] = _run(p.sign_open_batches, profile)
            t2 = time.perf_counter()
            timings.append((t1 - t0, t2 - t1))
            cpu.append((_db_cpu_since(c.engine, db0), time.process_time() - own0))
            amounts = {a: str(Decimal(20_000 + i) / Decimal(100_000_000)) for i, a in enumerate(payees)}
            t3 = time.perf_counter()
            node.wallet("sendmany", "", amounts)
            sendmany.append(time.perf_counter() - t3)
            p.broadcast()
            node.mine(1)
            p.track()
            p.sync_hot_wallet()
            print(f"rep {rep + 1}: batch {t1 - t0:.3f}s, sign+record+capture {t2 - t1:.3f}s, sendmany {sendmany[-1]:.3f}s "
                  f"(batch {batch}); CPU of both steps: database {cpu[-1][0] * 1000:.0f} ms, this process "
                  f"{cpu[-1][1] * 1000:.0f} ms", flush=True)
        batch_s = statistics.median(t[0] for t in timings)
        sign_s = statistics.median(t[1] for t in timings)
        sm = statistics.median(sendmany)
        print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print(f"custody job for {n} withdrawals: batch {batch_s * 1000:.0f} ms + sign/record/capture {sign_s * 1000:.0f} ms "
              f"= {(batch_s + sign_s) * 1000:.0f} ms (median of {args.reps})")
        print(f"CPU of the job: database {statistics.median(x[0] for x in cpu) * 1000:.0f} ms, this process (worker "
              f"and signer) {statistics.median(x[1] for x in cpu) * 1000:.0f} ms (medians)")
        print(f"bitcoind sendmany of {n} outputs: {sm * 1000:.0f} ms (median)")
        print(f"ratio custody job / sendmany: {(batch_s + sign_s) / sm:.2f}  (issue 20 target: at most 2)")


if __name__ == "__main__":
    main()
