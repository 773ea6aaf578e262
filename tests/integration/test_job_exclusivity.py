"""Several workers on one database: each job runs on exactly one of them at a time (custody.jobs).

- Two schedulers (each with its own lock sessions, as two worker processes have) run the same
  slow job on a short interval: the intervals the job records in a table never overlap, and both
  workers get to run it over time.
- A real process takes the payout job's lock and sleeps: the guard here skips while it lives; it
  is SIGKILLed and the next guarded run goes ahead within seconds (the dead session's lock is gone).
- Two workers race the real payouts job (ethereum batches, a recording stand-in signer, a node that
  refuses every broadcast) on a database of the test's own: each withdrawal is batched once, the
  signer is asked once per batch and never twice at a time, each hold is captured once, and the
  books verify. What the lead's e2e test must add: the same with two `custody worker` processes
  against regtest nodes and the signer process, SIGKILLing the one holding `payouts` mid-run.
"""
from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text

from chain_adapters.base import EthereumFee
from chain_adapters.errors import NodeUnavailable
from chain_adapters.ethereum import EthereumAdapter
from custody.container import Container
from custody.jobs import JobLocks, build_scheduler, exclusive_job, job_lock_key, payouts_once
from custody.settings import Settings
from ledger.model import AccountKind, Transfer
from ledger.service import Ledger
from signer.ethereum_tx import SignedEthTx
from signer.keys import Secret, SignerKeys, seed_from_text
from regtest.util import assert_equal, wait_until
from tests.integration.own_database import own_database

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")


def test_the_lock_key_is_stable_and_per_job():
    assert job_lock_key("payouts") == job_lock_key("payouts")
    assert job_lock_key("payouts") != job_lock_key("deposits:bitcoin")
    assert all(-(1 << 31) <= k < (1 << 31) for name in ("payouts", "outbox", "x" * 500) for k in job_lock_key(name))


def test_every_scheduled_job_is_named_and_guarded(engine):
    """APScheduler's log lines name the job (not `_guard.<locals>.run`), and each run takes its lock."""
    container = Container(settings=Settings(environment="test"), engine=engine, ledger=Ledger(engine))
    locks = JobLocks(engine)
    try:
        scheduler = build_scheduler(container, locks=locks)
        jobs = scheduler.get_jobs()
        assert {j.id for j in jobs} >= {"expire-holds", "outbox", "verify"}
        assert [(j.id, j.name) for j in jobs] == [(j.id, j.id) for j in jobs]
        other = JobLocks(engine)
        try:
            with other.hold("verify") as got:  # another worker runs `verify` now
                assert got
                assert scheduler.get_job("verify").func() is False
            assert scheduler.get_job("verify").func() is True
        finally:
            other.dispose()
    finally:
        locks.dispose()


def test_two_schedulers_never_run_a_job_at_once(engine):
    name = f"probe-{uuid.uuid4().hex[:8]}"
    table = f"job_probe_{uuid.uuid4().hex[:8]}"
    with engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, worker text NOT NULL, "
                       "started timestamptz NOT NULL, ended timestamptz)"))

    def work(worker: str) -> None:
        with engine.begin() as c:
            run = c.execute(text(f"INSERT INTO {table} (worker, started) VALUES (:w, clock_timestamp()) RETURNING id"),
                            {"w": worker}).scalar_one()
        time.sleep(0.25)
        with engine.begin() as c:
            c.execute(text(f"UPDATE {table} SET ended = clock_timestamp() WHERE id = :i"), {"i": run})

    from apscheduler.schedulers.background import BackgroundScheduler

    workers = {w: (BackgroundScheduler(job_defaults={"max_instances": 1, "coalesce": True}), JobLocks(engine)) for w in "AB"}
    try:
        # jitter: without it the ticks phase-lock and one worker wins every time (correct, but then
        # "both ran it" would show nothing about the other one)
        log.info("two workers schedule the same 0.25 s job every 0.1 s (+ up to 0.1 s jitter)")
        for w, (scheduler, locks) in workers.items():
            scheduler.add_job(exclusive_job(name, lambda w=w: work(w), locks), "interval", seconds=0.1, jitter=0.1,
                              id=name, name=name)
            scheduler.start()

        def each_ran_three_times() -> bool:
            with engine.connect() as c:
                counts = dict(c.execute(text(f"SELECT worker, count(*) FROM {table} WHERE ended IS NOT NULL GROUP BY worker")).all())
            return counts.get("A", 0) >= 3 and counts.get("B", 0) >= 3

        wait_until(each_ran_three_times, timeout=20, interval=0.5, what="both workers running the job")
    finally:
        for scheduler, locks in workers.values():
            scheduler.shutdown(wait=True)
            locks.dispose()
    with engine.begin() as c:
        runs = c.execute(text(f"SELECT worker, started, ended FROM {table} ORDER BY started")).all()
        c.execute(text(f"DROP TABLE {table}"))
    log.info("%d runs: %s", len(runs), "".join(r.worker for r in runs))
    assert all(r.ended is not None for r in runs)
    assert_equal([(a, b) for a, b in zip(runs, runs[1:]) if b.started < a.ended], [])  # no two runs overlap
    assert_equal({r.worker for r in runs}, {"A", "B"})


def test_a_sigkilled_holder_releases_the_payout_job(database_url, engine):
    """A separate process holds `payouts` (through JobLocks, as a worker mid-run does); the guard
    here skips the job; SIGKILL; the next guarded run goes ahead within a few seconds."""
    code = ("import sys, time\n"
            "from custody.jobs import JobLocks\n"
            "with JobLocks(sys.argv[1]).hold('payouts') as got:\n"
            "    print('held' if got else 'busy', flush=True)\n"
            "    time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, database_url], cwd=REPO, stdout=subprocess.PIPE, text=True)
    locks = JobLocks(engine)
    ran: list[float] = []
    try:
        assert_equal(proc.stdout.readline().strip(), "held")
        log.info("process %d holds the payout job's lock; the guard here skips", proc.pid)
        job = exclusive_job("payouts", lambda: ran.append(time.monotonic()), locks)
        assert_equal(job(), False)
        assert_equal(ran, [])
        log.info("SIGKILL it mid-run")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        killed = time.monotonic()
        wait_until(lambda: job() is True, timeout=5, what="the payout job to run after its holder died")
        log.info("the job ran %.2f s after the kill", ran[0] - killed)
        assert_equal(len(ran), 1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        locks.dispose()


# ---- two workers racing the real payouts job --------------------------------------------------------

DESTINATION = "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"  # EIP-55 test vector: not ours


class OfflineEthereum(EthereumAdapter):
    """An ethereum adapter whose node answers what batching and signing ask (no code at the
    destination, nonce 0, a fee) and refuses every broadcast: signed payments stay `signed`."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9", network="regtest")

    def has_code(self, address: str) -> bool:
        return False

    def nonce(self, address: str, *, pending: bool = True) -> int:
        return 0

    def estimate_fee(self, target_blocks: int = 6) -> EthereumFee:
        return EthereumFee(10**9, 10**9, 3 * 10**9)

    def broadcast(self, raw: bytes):  # noqa: ANN201 - never returns
        raise NodeUnavailable("offline: nothing is sent in this test")


class RecordingSigner:
    """Stands in for the signer process: records every signing request with its start and end,
    takes a while (as a remote signer does), and returns a distinct signed payment per call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, float, float]] = []
        self._lock = threading.Lock()

    def sign_ethereum_payment(self, batch_id: int, output, *, nonce: int, **_kw) -> SignedEthTx:  # noqa: ANN001
        start = time.monotonic()
        time.sleep(0.2)
        with self._lock:
            self.calls.append((batch_id, start, time.monotonic()))
            n = len(self.calls)
        return SignedEthTx(raw=b"\x02" + batch_id.to_bytes(8, "big") + n.to_bytes(4, "big"),
                           txid="0x" + f"{batch_id:032x}{n:032x}", sender=DESTINATION, nonce=nonce)


def test_two_workers_racing_the_payouts_job_batch_and_sign_each_withdrawal_once(database_url):
    from custody.payouts import PayoutConfig, Payouts

    with own_database(database_url, "jobs_race") as eng:
        ledger = Ledger(eng)
        container = Container(settings=Settings(environment="test"), engine=eng, ledger=ledger)
        adapters = {"ethereum": OfflineEthereum()}
        container.with_chains(adapters)  # withdrawals (request, policy); no signer keys here
        container.wallets.configure_asset("ETH", 18, "ethereum", finality=2, min_withdrawal=10**15, withdrawal_fee=10**15)
        container.wallets.register_wallet("ethereum", "hot", "regtest", KEYS.account_xpub("ethereum", "hot"))
        signer = RecordingSigner()
        payouts = Payouts(eng, ledger, container.wallets, adapters, signer, PayoutConfig())
        payouts.withdrawals = container.withdrawals
        container.payouts = payouts

        equity = container.wallets.firm_account("equity", "ETH")
        ids = []
        for i in range(4):
            acct = ledger.open_account("ETH", AccountKind.customer, f"race:{i}", owner=f"race-{i}").id
            ledger.post(f"race-fund:{i}", [Transfer(equity, acct, 10**18)], kind="treasury_credit")
            w = container.withdrawals.request(client_withdrawal_id=f"race-{i}", account_id=acct, amount=10**17,
                                              destination=DESTINATION, requested_by="backend-test")
            assert w.state == "approved", w
            ids.append(w.id)

        results: dict[str, list] = {"A": [], "B": []}
        start = threading.Barrier(2)

        def worker(name: str) -> None:
            locks = JobLocks(eng)  # a worker process's own lock sessions
            try:
                job = exclusive_job("payouts", lambda: payouts_once(container), locks)
                start.wait()
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and not (results["A"].count(True) and results["B"].count(True)):
                    results[name].append(job())
                    time.sleep(0.01)
            finally:
                locks.dispose()

        log.info("four approved ether withdrawals; two workers run the payouts job at once, again and again")
        threads = [threading.Thread(target=worker, args=(n,)) for n in "AB"]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)

        with eng.connect() as c:
            batched = c.execute(text("SELECT withdrawal_id, count(*) FROM batch_output GROUP BY withdrawal_id ORDER BY 1")).all()
            batches = c.execute(text("SELECT id FROM withdrawal_batch ORDER BY id")).scalars().all()
            states = c.execute(text("SELECT DISTINCT state FROM withdrawal_request")).scalars().all()
            captures = c.execute(text("SELECT count(*) FROM journal_transaction WHERE kind = 'withdrawal_capture'")).scalar_one()
            holds = c.execute(text("SELECT DISTINCT h.state FROM withdrawal_request w JOIN hold h ON h.id = w.hold_id")).scalars().all()
            signed_rows = c.execute(text("SELECT batch_id, count(*) FROM chain_transaction GROUP BY batch_id ORDER BY 1")).all()
        asked = sorted(b for b, _, _ in signer.calls)
        spans = sorted((s, e) for _, s, e in signer.calls)
        ledger.assert_verified()

    log.info("worker A: %s; worker B: %s; signer asked for batches %s", results["A"], results["B"], asked)
    assert True in results["A"] and True in results["B"], results  # both workers ran it over time
    assert_equal([tuple(r) for r in batched], [(w, 1) for w in sorted(ids)])  # each withdrawal batched once
    assert_equal(len(batches), len(ids))  # ethereum: one batch per withdrawal, none made twice
    assert_equal(asked, batches)  # the signer was asked once per batch, never again (twice each without the lock)
    assert_equal([b for (_, e), (b, _) in zip(spans, spans[1:]) if b < e], [])  # never two requests at once
    assert_equal([tuple(r) for r in signed_rows], [(b, 1) for b in batches])
    assert_equal(states, ["signed"])
    assert_equal((captures, holds), (len(batches), ["captured"]))  # one capture per batch, every hold captured once
