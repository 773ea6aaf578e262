"""Proof-of-reserves benchmark: build the liabilities tree of a report for 1,000,000 customer
accounts and serve inclusion proofs from it.

    .venv/bin/python bench/reserves.py                       # 1,000,000 accounts, 4 leaves each
    .venv/bin/python bench/reserves.py --accounts 100000     # smaller
    DATABASE_URL=postgresql://... .venv/bin/python bench/reserves.py --database   # also store and prove through PostgreSQL

The accounts are generated in memory (ids 1..N, balances uniform in 0..10^10 minor units); the
build is what the worker's `reserves` job (`Reserves.build`) does per asset once the balances are
read: custody.merkle_sum.place (split every balance into random pieces, pad, shuffle, the
closed-subtree check, hash; a progress callback between chunks, as the job records its progress). Proofs are
`Tree.proof` (the account's chunk of 16 leaves rebuilt + the stored upper path) and the customer's
check (`merkle_sum.verify` per leaf), timed separately, for random accounts (each 4 leaves).

With --database, a scratch database beside DATABASE_URL is migrated (no account rows are needed:
leaves name accounts without a foreign key, migration 0036), and the report's leaves and upper nodes are written as
`Reserves._store` writes them (leaves by COPY, upper nodes by INSERT ... unnest); then proofs are served
through `Reserves.proof` (what `GET /v1/reserves/reports/{id}/proof` calls). The scratch database
is dropped at the end. Prints the figures and the load average.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from custody.merkle_sum import place, verify  # noqa: E402


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--accounts", type=int, default=1_000_000)
    parser.add_argument("--parts", type=int, default=4, help="leaves per account (RESERVES_LEAVES_PER_ACCOUNT)")
    parser.add_argument("--proofs", type=int, default=2_000)
    parser.add_argument("--database", action="store_true", help="also store the report and prove through PostgreSQL")
    args = parser.parse_args()
    gen = random.Random(1)
    balances = [(i + 1, gen.randrange(10**10)) for i in range(args.accounts)]
    print(f"load before: {_load()}  (cores: {os.cpu_count()})")
    t0 = time.perf_counter()
    tree = place(balances, args.parts, progress=lambda done: None)
    build = time.perf_counter() - t0
    leaves = len(tree.leaves)
    stored = sum(1 for _ in tree.stored_nodes())
    print(f"build: {args.accounts:,} accounts -> {leaves:,} leaves, {stored:,} stored upper nodes, "
          f"root sum {tree.root.sum:,} == {sum(b for _, b in balances):,}: {build:.1f} s "
          f"({args.accounts / build:,.0f} accounts/s)  load {_load()}")
    positions: dict[int, list[int]] = {}
    wanted = set(gen.sample(range(1, args.accounts + 1), args.proofs))
    for i, account in enumerate(tree.leaves.accounts):
        if account in wanted:
            positions.setdefault(account, []).append(i)
    t0 = time.perf_counter()
    proofs = [[(i, tree.proof(i)) for i in positions[a]] for a in wanted]
    prove_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ok = all(verify(tree.leaves.node(i), steps, tree.root) for proof in proofs for i, steps in proof)
    verify_s = time.perf_counter() - t0
    print(f"proofs (in memory): {args.proofs / prove_s:,.0f} accounts/s ({args.parts} leaves each, "
          f"{len(proofs[0][0][1])} steps a leaf); customer-side verification {args.proofs / verify_s:,.0f} accounts/s, "
          f"all valid: {ok}  load {_load()}")
    if args.database:
        _through_database(tree, balances, sorted(wanted), args.parts)


def _through_database(tree, balances, accounts, parts) -> None:  # noqa: ANN001
    from sqlalchemy import text

    from custody.database import drop_database, ensure_database, make_engine, migrate, with_database
    from custody.reserves import AssetInput, Reserves
    from chain_adapters.base import BlockRef

    url = with_database(os.environ["DATABASE_URL"], f"bench_reserves_{uuid.uuid4().hex[:8]}")
    ensure_database(url)
    try:
        migrate(url)
        engine = make_engine(url, pool_size=2)
        with engine.begin() as c:
            c.execute(text("INSERT INTO asset (code, decimals) VALUES ('BTC', 8) ON CONFLICT DO NOTHING"))
        reserves = Reserves(engine, {}, None, network="regtest", parts=parts)  # type: ignore[arg-type] - no signing here
        asset = AssetInput("BTC", "bitcoin", None, BlockRef(1, "00" * 32), balances, [])
        checkpoint = {"last_transaction_id": 0, "transactions": 0, "journal_digest": "", "checks_passed": []}
        with engine.begin() as c:  # the request the worker's job builds (migration 0043): its id is the report's
            report_id = c.execute(text("INSERT INTO reserve_job (request_key, asset, requested_by) "
                                       "VALUES ('bench', 'BTC', 'bench') RETURNING id")).scalar_one()
        t0 = time.perf_counter()
        with engine.begin() as c:
            report = reserves._store(c, report_id, asset, tree, checkpoint)
            c.execute(text("UPDATE reserve_job SET state = 'published', published_at = now() WHERE id = :i"), {"i": report_id})
        print(f"store: {len(tree.leaves):,} leaves + upper nodes in {time.perf_counter() - t0:.1f} s  load {_load()}")
        t0 = time.perf_counter()
        for a in accounts:
            reserves.proof(report["report_id"], a)
        took = time.perf_counter() - t0
        print(f"proofs (through PostgreSQL, Reserves.proof): {len(accounts) / took:,.0f} accounts/s  load {_load()}")
        with engine.connect() as c:
            size = c.execute(text("SELECT pg_size_pretty(pg_total_relation_size('reserve_leaf') "
                                  "+ pg_total_relation_size('reserve_node'))")).scalar_one()
        print(f"storage of one report's tree: {size}")
        engine.dispose()
    finally:
        drop_database(url)


if __name__ == "__main__":
    main()
