"""Convert's benchmark (issue 17): accepted quotes per second over HTTP, 16 concurrent clients.

    .venv/bin/python bench/convert.py                   # 16 clients, 8 s (plus ~30 s start-up)
    .venv/bin/python bench/convert.py --seconds 5 --clients 1 16

It starts the service as deployed with bench/http_api.py's harness (fresh bitcoind -regtest and
anvil, a fresh database, the signer, worker and api processes; the worker is stopped once the api
answers, unless `--with-worker`), then prepares, through the API: an operator's price of 60,000
USDT per BTC (`POST /v1/convert/prices`, signed by the scripted approver, set by the worker), the house's BTC liquidity funded by a treasury adjustment
(one operator proposes `equity:BTC` -> `convert:liquidity:BTC`, a scripted approver of the
deployment signs its approval with its Ed25519 key and the worker posts it), and 200
customer accounts holding USDT (funded by the database owner, as a deposit credit would).

One request of the run is one conversion as a backend makes it: `POST /v1/quotes` (sell 10 USDT
for BTC) then `POST /v1/quotes/{id}/accept` with a new idempotency key; both must answer 201.
Per line: accepted quotes/s, p50 and p99 latency of the pair, the api process's CPU per accepted
quote, and the 1-minute load average (client, server and PostgreSQL share this machine). At the
end the ledger's self-checks run (`Ledger.verify()`); a failed check, or any other answer than
201, exits 1.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling harness
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's packages

import httpx  # noqa: E402

import http_api  # noqa: E402  (bench/http_api.py: deployment, client threads, figures)
from custody.approve_cli import (approve_adjustment_with_client, approve_convert_price_with_client,  # noqa: E402
                                 load_private_key)
from custody.auth import create_api_key  # noqa: E402
from custody.client import CustodyClient  # noqa: E402
from custody.database import make_engine  # noqa: E402
from ledger.model import AccountKind, Transfer  # noqa: E402
from ledger.service import Ledger  # noqa: E402

ACCOUNTS = 200


def _convert(client: httpx.Client, world: http_api.World, rng: random.Random, run: str, n: int) -> int:
    quote = http_api._expect(client.post("/v1/quotes", json={
        "idempotency_key": f"{run}:{n}", "account_id": rng.choice(world.accounts), "to_asset": "BTC",
        "from_amount": "10"}), 201)
    http_api._expect(client.post(f"/v1/quotes/{quote['id']}/accept", json={"idempotency_key": f"{run}:{n}"}), 201)
    return 1


http_api.CASES["convert"] = (_convert, 1)


def prepare(api_base: str, owner_url: str, pepper: str, approver: tuple[str, Path]) -> http_api.World:
    """`approver`: a scripted approver of the deployment (its name, its Ed25519 key file)."""
    engine = make_engine(owner_url, pool_size=2)
    try:
        ledger = Ledger(engine)
        key = create_api_key(engine, "bench-backend", "backend", pepper)
        ops = [create_api_key(engine, "bench-operator-1", "operator", pepper),
               create_api_key(engine, approver[0], "operator", pepper)]  # approves with a key of its own name

        def as_key(k: str) -> httpx.Client:
            return httpx.Client(base_url=api_base, headers={"X-API-Key": k}, timeout=30)

        with as_key(ops[0]) as first:
            change = http_api._expect(first.post("/v1/convert/prices", json={
                "idempotency_key": "bench-price", "base_asset": "BTC", "quote_asset": "USDT", "price": "60000"}), 201)
            liquidity = http_api._expect(first.get("/v1/convert/liquidity/BTC"), 200)["account_id"]
            equity = ledger.open_account("BTC", AccountKind.equity, "equity:BTC").id
            proposal = http_api._expect(first.post("/v1/treasury/adjustments", json={
                "idempotency_key": "bench-liquidity", "reason": "bench: fund the house's BTC liquidity",
                "transfers": [{"debit_account_id": equity, "credit_account_id": liquidity, "amount": "1000"}]}), 201)
        with CustodyClient(api_base, ops[1], timeout=30) as checker:
            approve_convert_price_with_client(checker, change["id"], load_private_key(approver[1]), comment="bench",
                                              show=lambda line: None)  # the worker's convert-prices job sets it
            deadline = time.monotonic() + 60
            while checker.get_convert_price_change(change["id"]).state != "applied":
                if time.monotonic() > deadline:
                    raise http_api.BenchError("the worker did not apply the convert price within 60 s")
                time.sleep(0.5)
            approve_adjustment_with_client(checker, proposal["id"], load_private_key(approver[1]), comment="bench",
                                           show=lambda line: None)
            deadline = time.monotonic() + 60
            while checker.get_adjustment(proposal["id"]).state != "posted":  # the worker's adjustments job
                if time.monotonic() > deadline:
                    raise http_api.BenchError("the worker did not post the liquidity adjustment within 60 s")
                time.sleep(0.5)
        world = ledger.open_account("USDT", AccountKind.equity, "bench:world:USDT").id
        accounts = []
        for i in range(ACCOUNTS):
            owner = f"bench-{i}"
            account = ledger.open_account("USDT", AccountKind.customer, f"customer:{owner}:USDT", owner=owner)
            ledger.post(f"bench:fund:{i}", [Transfer(world, account.id, 10**15)])
            accounts.append(account.id)
        return http_api.World((api_base,), key, tuple(accounts), ())
    finally:
        engine.dispose()


def run(args: argparse.Namespace) -> int:
    try:
        with http_api.deployed("convert") as (deployment, owner_url, pepper):
            api_pid = deployment.processes.pid("custody-api")
            world = prepare(deployment.api_base, owner_url, pepper, next(iter(deployment.approver_keys.items())))
            if not args.with_worker:
                deployment.processes.kill("custody-worker", signal.SIGTERM)
            print(f"bench/convert.py: api pid {api_pid}; {os.cpu_count()} cores; "
                  f"load {os.getloadavg()[0]:.1f} before")
            for clients in args.clients:
                result = http_api.drive(world, [api_pid], "convert", clients, args.seconds)
                print(result.line().replace("req/s", "accepted quotes/s"), flush=True)
            failed = http_api.verify(owner_url)
            print("ledger verify:", "all checks ok" if not failed else "FAILED " + "; ".join(failed))
            return 1 if failed else 0
    except http_api.BenchError as exc:
        print(f"bench/convert.py: invalid run: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="per run (default 8)")
    parser.add_argument("--clients", type=int, nargs="+", default=[16], help="client counts (default 16)")
    parser.add_argument("--with-worker", action="store_true", help="keep the worker running during the runs")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
