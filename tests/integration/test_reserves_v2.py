"""Proof of reserves v2 on PostgreSQL with the real signer and fake chain nodes (custody/reserves.py).

A database of this module's own holds ten BTC customers with balances that a v1 tree would have
shown as sibling sums, ETH and USDT customers, bitcoin coins in the wallet index (a deposit address
and the hot address) and ethereum balances the fake node answers at the scanner's block. One
publish writes a report per asset from one verified ledger snapshot; each report and every
customer's proof pass the standalone verifier (also as `python -m custody.reserves verify`); a
served proof shows no other customer's balance nor any sum of whole balances; and the verifier
rejects a tampered leaf, sum, root, amount, message or signature. A ledger that fails its own
checks gets no report.

Publishing off the request path: a request records its reports `building`; the worker's job
(`Reserves.run_once`) builds them chunk by chunk, recording its progress, and publishes them; a
proof of a report still building is refused with `reserves_report_building`; a crash injected
between chunks leaves nothing stored or published and the next run completes; the database refuses
a request inserted as published, a published report set back, or one published without its report.
"""
from __future__ import annotations

import copy
import itertools
import json
import logging
import subprocess
import threading
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import text

from fastapi.testclient import TestClient

from chain_adapters.base import BlockRef
from custody.api.app import create_app
from custody.auth import Role, create_api_key
from custody.container import Container
from custody.settings import Settings
from chain_adapters.errors import NotFound
from custody.addresses import derive_btc_address, derive_eth_address
from custody.errors import CustodyError, CustodyErrorCode
from custody.reserves import Reserves, check_proof, check_report, main, publish_command
from custody.wallets import Wallets
from ledger.model import Transfer
from ledger.service import Ledger
from regtest.util import assert_equal
from signer import bip322, eip191
from signer.keys import Secret, SignerKeys, seed_from_text
from signer.service import Signer
from tests.integration.own_database import own_database

log = logging.getLogger(__name__)
KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
USDT = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
BTC_BLOCK = BlockRef(812, "ab" * 32)
ETH_BLOCK = BlockRef(96, "0x" + "cd" * 32)
# the unit test's ten balances: far apart, so a sum of random pieces equals a sum of them only if exposed
BTC_BALANCES = [7_300_000_017, 1_250_000_003, 48_000_000_029, 990_000_041, 5_555_555_561, 12_000_000_073, 310_000_081,
                27_000_000_097, 3_000_000_113, 64_000_000_127]


class FakeNode:
    """A chain node that knows one main chain (its block hashes) and, for ethereum, balances at a block."""

    def __init__(self, network: str, blocks: dict[int, str], balances: dict[tuple[str | None, str], int] | None = None):
        self.network = network
        self.blocks = blocks
        self.balances = balances or {}
        self.read_at: set[int] = set()

    def block_at(self, height: int) -> BlockRef:
        if height not in self.blocks:
            raise NotFound(f"no block {height}")
        return BlockRef(height, self.blocks[height])

    def balance(self, address: str, *, block: int | None = None) -> int:
        self.read_at.add(block)
        return self.balances.get((None, address.lower()), 0)

    def token_balance(self, contract: str, address: str, *, block: int | None = None) -> int:
        self.read_at.add(block)
        return self.balances.get((contract.lower(), address.lower()), 0)


@pytest.fixture(scope="module")
def world(database_url):
    with own_database(database_url, "reserves_v2") as engine:
        ledger = Ledger(engine)
        wallets = Wallets(engine, ledger)
        wallets.configure_asset("BTC", 8, "bitcoin", finality=3)
        wallets.configure_asset("ETH", 18, "ethereum", finality=2)
        wallets.configure_asset("USDT", 6, "ethereum", finality=2, contract_address=USDT)
        for chain, tier in (("bitcoin", "deposit"), ("bitcoin", "hot"), ("ethereum", "deposit"), ("ethereum", "hot")):
            wallets.register_wallet(chain, tier, "regtest", KEYS.account_xpub(chain, tier))
        run = uuid.uuid4().hex[:6]
        customers: dict[str, dict[int, int]] = {"BTC": {}, "ETH": {}, "USDT": {}}
        for asset, balances in (("BTC", BTC_BALANCES), ("ETH", [3 * 10**18, 12 * 10**17, 10**30]), ("USDT", [250_000_000, 7])):
            equity = wallets.firm_account("equity", asset)
            for n, balance in enumerate(balances):
                account = wallets.customer_account(f"c{run}{n}", asset)
                ledger.post(f"fund:{run}:{asset}:{n}", [Transfer(equity, account, balance)], kind="treasury_credit")
                customers[asset][account] = balance
        btc_deposit = wallets.issue_address(f"addr:{run}:btc", next(iter(customers["BTC"])))
        eth_deposit = wallets.issue_address(f"addr:{run}:eth", next(iter(customers["ETH"])))
        btc_hot = derive_btc_address(KEYS.account_xpub("bitcoin", "hot"), "regtest", 0, 0)
        eth_hot = derive_eth_address(KEYS.account_xpub("ethereum", "hot"), 0)
        with engine.begin() as c:
            for chain, block in (("bitcoin", BTC_BLOCK), ("ethereum", ETH_BLOCK)):
                c.execute(text("INSERT INTO chain_cursor (chain, height, hash) VALUES (:c, :h, :x)"),
                          {"c": chain, "h": block.height, "x": block.hash})
            for n, (address, tier, amount) in enumerate([(btc_deposit.address, "deposit", 60_000_000_000),
                                                         (btc_deposit.address, "deposit", 9_000_000_000),
                                                         (btc_hot, "hot", 100_000_000_000)]):
                c.execute(text(
                    "INSERT INTO btc_wallet_output (txid, vout, address, tier, derivation_change, derivation_index, amount, "
                    "block_height, block_hash) VALUES (:t, 0, :a, :tier, 0, :i, :m, 800, :b)"),
                    {"t": f"{n:064x}", "a": address, "tier": tier, "i": btc_deposit.derivation_index if tier == "deposit" else 0,
                     "m": amount, "b": "ee" * 32})
        eth = FakeNode("regtest", {ETH_BLOCK.height: ETH_BLOCK.hash}, {
            (None, eth_deposit.address.lower()): 5 * 10**18, (None, eth_hot.lower()): 10**30,
            (USDT.lower(), eth_hot.lower()): 300_000_000})
        adapters = {"bitcoin": FakeNode("regtest", {BTC_BLOCK.height: BTC_BLOCK.hash}), "ethereum": eth}
        reserves = Reserves(engine, adapters, Signer(engine, KEYS, bitcoin_network="regtest"), network="regtest")
        yield engine, reserves, customers, adapters
        ledger.assert_verified()


@pytest.fixture(scope="module")
def published(world):
    _, reserves, _, _ = world
    reports = {r["asset"]: r for r in reserves.publish()}
    for r in reports.values():
        log.info("report %d %s: liabilities %s in %d leaves, holdings %s at %d addresses", r["report_id"], r["asset"],
                 r["liabilities"]["total"], r["liabilities"]["leaves"], r["holdings"]["total"], len(r["holdings"]["addresses"]))
    return reports


def test_one_snapshot_gives_a_report_per_asset_that_verifies(world, published):
    engine, _, customers, adapters = world
    assert_equal(sorted(published), ["BTC", "ETH", "USDT"])
    with engine.connect() as c:
        journal = c.execute(text("SELECT count(*), max(id) FROM journal_transaction")).one()
    for asset, report in published.items():
        assert_equal(check_report(report), [])
        assert_equal(int(report["liabilities"]["total"]), sum(customers[asset].values()))
        assert_equal(report["liabilities"]["accounts"], len(customers[asset]))
        assert_equal((report["ledger"]["transactions"], report["ledger"]["last_transaction_id"]), tuple(journal))
        assert "not a proof of solvency" in report["disclaimer"]
    assert_equal(len({json.dumps(r["ledger"]) for r in published.values()}), 1)  # one checkpoint for the set
    btc, eth, usdt = published["BTC"], published["ETH"], published["USDT"]
    assert_equal((btc["height"], btc["block_hash"], eth["height"], eth["block_hash"]),
                 (BTC_BLOCK.height, BTC_BLOCK.hash, ETH_BLOCK.height, ETH_BLOCK.hash))
    assert_equal(btc["holdings"]["total"], str(169_000_000_000))
    assert_equal(eth["holdings"]["total"], str(10**30 + 5 * 10**18))
    assert_equal((usdt["contract"], usdt["holdings"]["total"], len(usdt["holdings"]["addresses"])), (USDT, "300000000", 1))
    assert_equal(adapters["ethereum"].read_at, {ETH_BLOCK.height})  # balances read at the stated block only
    for entry in btc["holdings"]["addresses"]:
        assert entry["signature"].startswith("smp") and bip322.verify_simple(entry["address"], entry["message"], entry["signature"])
    for entry in eth["holdings"]["addresses"]:
        assert eip191.verify_personal(entry["address"], entry["message"], entry["signature"])


def test_every_customer_gets_a_proof_that_verifies(world, published):
    _, reserves, customers, _ = world
    for asset, balances in customers.items():
        for account, balance in balances.items():
            proof = reserves.proof(published[asset]["report_id"], account)
            assert_equal(proof["balance"], str(balance))
            assert_equal(len(proof["leaves"]), 4)
            assert_equal(check_proof(published[asset], proof), [])
            assert check_proof(published["ETH" if asset != "ETH" else "USDT"], proof)  # another report's root


def test_a_served_proof_reveals_no_other_customers_balance_nor_a_sum_of_whole_balances(world, published):
    _, reserves, customers, _ = world
    balances = customers["BTC"]
    for account, balance in balances.items():
        others = [b for a, b in balances.items() if a != account]
        whole = {sum(c) for r in range(1, len(others)) for c in itertools.combinations(others, r)}
        proof = reserves.proof(published["BTC"]["report_id"], account)
        siblings = {int(s["sum"]) for x in proof["leaves"] for s in x["steps"]}
        assert_equal(siblings & whole, set())


def test_the_verifier_rejects_tampering(world, published):
    _, reserves, customers, _ = world
    report = published["BTC"]
    account = next(iter(customers["BTC"]))
    proof = reserves.proof(report["report_id"], account)

    def tampered(obj, change):
        obj = copy.deepcopy(obj)
        change(obj)
        return obj

    def bump(entry: dict, key: str, by: int = 1) -> None:
        entry[key] = str(int(entry[key]) + by)

    bad_proofs = {
        "a leaf's amount": lambda p: bump(p["leaves"][0], "amount"),
        "the balance": lambda p: bump(p, "balance"),
        "a leaf's nonce": lambda p: p["leaves"][0].update(nonce="00" * 16),
        "a sibling sum": lambda p: bump(p["leaves"][1]["steps"][3], "sum", -1),
        "a sibling hash": lambda p: p["leaves"][1]["steps"][0].update(hash="11" * 32),
        "the account": lambda p: p.update(account_id=p["account_id"] + 1),
        "one leaf twice": lambda p: p["leaves"].__setitem__(1, p["leaves"][0]),
        "a leaf moved": lambda p: p["leaves"][0].update(index=p["leaves"][0]["index"] ^ 1),
    }
    for what, change in bad_proofs.items():
        assert check_proof(report, tampered(proof, change)), what
    bad_reports = {
        "the liabilities total": lambda r: bump(r["liabilities"], "total", -1),
        "the root": lambda r: r["liabilities"].update(root_hash="22" * 32),
        "an address's amount": lambda r: bump(r["holdings"]["addresses"][0], "amount"),
        "the holdings total": lambda r: bump(r["holdings"], "total"),
        "a signature": lambda r: r["holdings"]["addresses"][0].update(
            signature=r["holdings"]["addresses"][1]["signature"]),
        "a message": lambda r: r["holdings"]["addresses"][0].update(message=r["holdings"]["addresses"][1]["message"]),
        "the block": lambda r: r.update(height=r["height"] + 1),
    }
    for what, change in bad_reports.items():
        bad = tampered(report, change)
        assert check_report(bad) or check_proof(bad, proof), what
    eth = published["ETH"]
    forged = tampered(eth, lambda r: r["holdings"]["addresses"][0].update(signature="0x" + "ab" * 65))
    assert check_report(forged)


def test_the_command_line_verifier(world, published, tmp_path: Path):
    _, reserves, customers, _ = world
    report = published["USDT"]
    account = next(iter(customers["USDT"]))
    (tmp_path / "report.json").write_text(json.dumps(report))
    (tmp_path / "proof.json").write_text(json.dumps(reserves.proof(report["report_id"], account)))
    done = subprocess.run([sys.executable, "-m", "custody.reserves", "verify", str(tmp_path / "report.json"),
                           str(tmp_path / "proof.json")], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK account" in done.stdout
    report["liabilities"]["total"] = str(int(report["liabilities"]["total"]) + 1)
    (tmp_path / "report.json").write_text(json.dumps(report))
    assert_equal(main(["verify", str(tmp_path / "report.json"), str(tmp_path / "proof.json")]), 1)


def test_unknown_and_absent_proofs_are_lookup_errors(world, published):
    _, reserves, customers, _ = world
    with pytest.raises(LookupError):
        reserves.proof(published["BTC"]["report_id"], next(iter(customers["ETH"])))
    with pytest.raises(LookupError):
        reserves.proof(10**12, next(iter(customers["ETH"])))


def test_a_ledger_that_fails_its_checks_gets_no_report(world, published):
    engine, reserves, customers, _ = world
    account = next(iter(customers["USDT"]))
    with engine.connect() as c:
        before = c.execute(text("SELECT count(*) FROM reserve_report")).scalar_one()
    with engine.begin() as c:  # the projection no longer matches the journal
        c.execute(text("UPDATE account_balance SET posted = posted + 1 WHERE account_id = :a AND shard = 0"), {"a": account})
    try:
        with pytest.raises(CustodyError) as err:
            reserves.publish()
        assert_equal(err.value.code, CustodyErrorCode.reserves_ledger_unverified)
    finally:
        with engine.begin() as c:
            c.execute(text("UPDATE account_balance SET posted = posted - 1 WHERE account_id = :a AND shard = 0"), {"a": account})
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT count(*) FROM reserve_report")).scalar_one(), before)


def test_a_scanner_off_the_main_chain_gets_no_report(world, published):
    _, reserves, _, adapters = world
    adapters["ethereum"].blocks[ETH_BLOCK.height] = "0x" + "ef" * 32  # reorged: the cursor's block is gone
    try:
        with pytest.raises(CustodyError) as err:
            reserves.publish()
        assert_equal(err.value.code, CustodyErrorCode.reserves_index_behind)
        assert_equal(len(reserves.publish(["BTC"])), 1)  # bitcoin alone is fine
    finally:
        adapters["ethereum"].blocks[ETH_BLOCK.height] = ETH_BLOCK.hash
    log.info("the refused request stays building (a reorg passes); once the scanner is back the job publishes it")
    assert_equal(len(reserves.run_once()), 3)


def test_no_customer_account_of_the_asset(world):
    _, reserves, _, _ = world
    with pytest.raises(CustodyError) as err:
        reserves.publish(["DOGE"])
    assert_equal(err.value.code, CustodyErrorCode.no_customer_accounts)


# ---- publishing off the request path (migration 0043_reserves_jobs) ---------------------------------


class Crash(Exception):
    """Injected between two chunks of a build."""


def _state(engine, ids):
    with engine.connect() as c:
        jobs = c.execute(text("SELECT id, state, leaves_built, leaves_total, attempts, error_code FROM reserve_job "
                              "WHERE id = ANY(:i) ORDER BY id"), {"i": ids}).all()
        reports = c.execute(text("SELECT count(*) FROM reserve_report WHERE id = ANY(:i)"), {"i": ids}).scalar_one()
        leaves = c.execute(text("SELECT count(*) FROM reserve_leaf WHERE report_id = ANY(:i)"), {"i": ids}).scalar_one()
    return jobs, reports, leaves


def test_a_request_is_building_until_the_job_publishes_it(world, published, monkeypatch):
    engine, reserves, customers, _ = world
    key = f"req:{uuid.uuid4()}"
    jobs, created = reserves.request(key, "test", ["BTC", "USDT"])
    assert created
    assert_equal([(j.asset, j.state, j.leaves_built, j.attempts) for j in jobs], [("BTC", "building", 0, 0), ("USDT", "building", 0, 0)])
    again, created = reserves.request(key, "test", ["USDT", "BTC"])
    assert_equal(([j.report_id for j in again], created), ([j.report_id for j in jobs], False))
    with pytest.raises(CustodyError) as err:
        reserves.request(key, "test", ["BTC"])
    assert_equal(err.value.code, CustodyErrorCode.reserves_request_exists_with_different_assets)
    btc = jobs[0].report_id
    account = next(iter(customers["BTC"]))
    log.info("a proof of a report still building is refused with its code")
    with pytest.raises(CustodyError) as err:
        reserves.proof(btc, account)
    assert_equal(err.value.code, CustodyErrorCode.reserves_report_building)
    assert reserves.report(btc) is None

    log.info("the worker's job builds the request in chunks, recording its progress, and publishes it")
    monkeypatch.setattr("custody.merkle_sum.PROGRESS_LEAVES", 16)  # a progress record after every chunk
    seen: list[tuple[str, int, int]] = []
    assert_equal(sorted(reserves.run_once(between_chunks=lambda *step: seen.append(step))), [j.report_id for j in jobs])
    btc_steps = [s for s in seen if s[0] == "BTC"]
    assert_equal([done for _, done, _ in btc_steps], list(range(16, 49, 16)))  # 10 accounts x 4 = 40 -> 48 leaves
    assert_equal(btc_steps[0][2], 48)
    rows, reports, _ = _state(engine, [j.report_id for j in jobs])
    assert_equal([(r.state, r.leaves_built, r.leaves_total, r.attempts) for r in rows],
                 [("published", 48, 48, 1), ("published", 16, 16, 1)])
    assert_equal(reports, 2)
    body = reserves.report(btc)
    assert_equal(check_report(body), [])
    assert_equal(check_proof(body, reserves.proof(btc, account)), [])
    assert_equal(reserves.run_once(), [])  # nothing waits any more
    _, created = reserves.request(key, "test", ["BTC", "USDT"])
    assert not created


def test_a_crash_between_chunks_publishes_nothing_and_the_rerun_completes(world, published, monkeypatch):
    engine, reserves, customers, _ = world
    jobs, _ = reserves.request(f"crash:{uuid.uuid4()}", "test", ["BTC", "ETH"])
    ids = [j.report_id for j in jobs]
    monkeypatch.setattr("custody.merkle_sum.PROGRESS_LEAVES", 16)

    def crash(asset: str, done: int, total: int) -> None:
        if asset == "ETH" and done == 16:  # BTC's tree is built, ETH's has its first chunk
            raise Crash("killed between chunks")

    log.info("a build crashes between two chunks: nothing is stored, nothing published, the rows stay building")
    with pytest.raises(Crash):
        reserves.run_once(between_chunks=crash)
    rows, reports, leaves = _state(engine, ids)
    assert_equal([(r.state, r.attempts, r.error_code) for r in rows], [("building", 1, "Crash")] * 2)
    assert_equal((reports, leaves), (0, 0))
    with pytest.raises(CustodyError) as err:
        reserves.proof(ids[0], next(iter(customers["BTC"])))
    assert_equal(err.value.code, CustodyErrorCode.reserves_report_building)

    log.info("the next run starts the build again from nothing and publishes both")
    progress: list[int] = []
    assert_equal(sorted(reserves.run_once(between_chunks=lambda asset, done, total: progress.append(done))), ids)
    assert_equal(progress[0], 16)  # counted again from the start
    rows, reports, leaves = _state(engine, ids)
    assert_equal([(r.state, r.attempts, r.error_code) for r in rows], [("published", 2, None)] * 2)
    assert_equal((reports, leaves), (2, 48 + 16))
    for report_id, asset in zip(ids, ("BTC", "ETH")):
        body = reserves.report(report_id)
        assert_equal(check_report(body), [])
        for account in customers[asset]:
            assert_equal(check_proof(body, reserves.proof(report_id, account)), [])


def test_a_published_report_cannot_be_unpublished_nor_a_request_forged_as_published(world, published):
    engine, reserves, _, _ = world
    report_id = published["BTC"]["report_id"]
    with engine.connect() as c:
        for sql in (f"UPDATE reserve_job SET state = 'building', published_at = NULL WHERE id = {report_id}",
                    "INSERT INTO reserve_job (request_key, asset, requested_by, state, published_at) "
                    "VALUES ('forged', 'BTC', 'x', 'published', now())"):
            with pytest.raises(Exception, match="reserve_job"):
                c.execute(text(sql))
            c.rollback()
        jobs, _ = reserves.request(f"forge:{uuid.uuid4()}", "test", ["USDT"])
        with pytest.raises(Exception, match="published without its report"):
            c.execute(text("UPDATE reserve_job SET state = 'published', published_at = now() WHERE id = :i"),
                      {"i": jobs[0].report_id})
        c.rollback()
    reserves.run_once()  # leave nothing building for the tests after


def test_the_api_answers_202_then_the_job_publishes(world, published):
    engine, reserves, customers, _ = world
    settings = Settings(environment="test")
    container = Container(settings=settings, engine=engine, ledger=Ledger(engine)).with_chains({})
    container.reserves = reserves
    run = uuid.uuid4().hex[:6]
    keys = {role: create_api_key(engine, f"reserves-{role.value}-{run}", role, settings.api_key_pepper)
            for role in (Role.operator, Role.backend, Role.auditor)}
    client = TestClient(create_app(container), raise_server_exceptions=False)

    def call(role: Role, method: str, path: str, **kw):
        return client.request(method, path, headers={"X-API-Key": keys[role]}, **kw)

    log.info("POST /v1/reserves/reports: 202 at once, the report ids building")
    r = call(Role.operator, "POST", "/v1/reserves/reports", json={"idempotency_key": "monthly", "assets": ["BTC"]})
    assert_equal(r.status_code, 202)
    (job,) = r.json()["reports"]
    assert_equal((job["asset"], job["state"], job["leaves_built"], job["report"], r.json()["created"]),
                 ("BTC", "building", 0, None, True))
    again = call(Role.operator, "POST", "/v1/reserves/reports", json={"idempotency_key": "monthly", "assets": ["BTC"]})
    assert_equal((again.status_code, again.json()["created"], again.json()["reports"][0]["report_id"]),
                 (202, False, job["report_id"]))
    other = call(Role.operator, "POST", "/v1/reserves/reports", json={"idempotency_key": "monthly", "assets": ["ETH"]})
    assert_equal((other.status_code, other.json()["error"]["code"]), (409, "reserves_request_exists_with_different_assets"))
    assert_equal(call(Role.auditor, "POST", "/v1/reserves/reports", json={"idempotency_key": "a"}).status_code, 403)
    account = next(iter(customers["BTC"]))
    proof = call(Role.backend, "GET", f"/v1/reserves/reports/{job['report_id']}/proof", params={"account_id": account})
    assert_equal((proof.status_code, proof.json()["error"]["code"]), (409, "reserves_report_building"))
    assert_equal(call(Role.auditor, "GET", f"/v1/reserves/reports/{job['report_id']}").json()["state"], "building")

    log.info("the worker's job publishes it; GET shows the report and its progress complete")
    assert_equal(reserves.run_once(), [job["report_id"]])
    done = call(Role.auditor, "GET", f"/v1/reserves/reports/{job['report_id']}").json()
    assert_equal((done["state"], done["leaves_built"], done["leaves_total"], done["attempts"]), ("published", 48, 48, 1))
    report = done["report"]
    body = reserves.report(job["report_id"])
    assert_equal(report["liabilities"]["root_hash"], body["liabilities"]["root_hash"])
    proof = call(Role.backend, "GET", f"/v1/reserves/reports/{job['report_id']}/proof", params={"account_id": account})
    assert_equal(proof.status_code, 200)
    assert_equal(check_proof(body, proof.json()), [])
    assert_equal(check_report(body), [])
    assert_equal(call(Role.auditor, "GET", "/v1/reserves/reports/999999999").status_code, 404)


def test_the_operators_command_builds_a_request_printing_its_progress(world, published, monkeypatch):
    """`python -m custody reserves publish` (custody.reserves.publish_command) on this module's
    services: it records the request, builds it under the job's lock printing the progress, and
    exits 0 once published; the same key again answers the published reports."""
    engine, reserves, _, _ = world

    class Services:  # what build_services gives the command: the worker's reserves and engine
        def __init__(self) -> None:
            self.reserves, self.engine = reserves, engine

        def close(self) -> None:  # the module's engine outlives the command
            pass

    monkeypatch.setattr("custody.config.DeploymentConfig.load", lambda path, process: None)
    monkeypatch.setattr("custody.roots.common.build_services", lambda config, process: Services())
    monkeypatch.setattr("custody.merkle_sum.PROGRESS_LEAVES", 16)
    lines: list[str] = []
    assert_equal(publish_command(None, ["BTC"], "monthly", out=lines.append), 0)
    log.info("the command printed: %s", lines)
    assert lines[0].startswith("requested under cli:monthly: report ")
    assert_equal([line for line in lines if "leaves hashed" in line],
                 ["BTC: 16 of 48 leaves hashed", "BTC: 32 of 48 leaves hashed", "BTC: 48 of 48 leaves hashed"])
    assert lines[-1].endswith("(BTC): published"), lines[-1]
    again: list[str] = []
    assert_equal(publish_command(None, ["BTC"], "monthly", out=again.append), 0)
    assert again[0].startswith("already requested under cli:monthly"), again


def test_one_key_requested_at_once_from_several_connections_makes_one_request(world, published):
    _, reserves, _, _ = world
    key = f"race:{uuid.uuid4()}"
    barrier = threading.Barrier(4)

    def ask():
        barrier.wait()
        return reserves.request(key, "test", ["BTC", "ETH"])

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: ask(), range(4)))
    assert_equal(sorted(created for _, created in answers), [False, False, False, True])
    assert_equal(len({tuple(j.report_id for j in jobs) for jobs, _ in answers}), 1)
    assert_equal(len(reserves.run_once()), 2)
