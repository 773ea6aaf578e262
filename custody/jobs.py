"""Scheduled jobs: APScheduler runs each pipeline step on an interval; every step is also a plain
method that tests and the demo call directly, so time is driven deterministically there.

| job | what it calls | default interval |
| --- | --- | --- |
| deposits:<chain> | Deposits.run_once([chain]) (scan -> confirm -> screen/credit) | 2 s |
| payouts | sync hot wallet, batch, sign, broadcast, track, bump fees | 3 s |
| sweeps | Sweeps.run_once(): booked deposit coins -> hot wallet (bitcoin), fee bumps of stuck sweeps | 30 s |
| eth-sweeps | EthSweeps plan, sign, broadcast, track: booked ether and token deposits -> hot address, token addresses funded with gas first (custody.eth_sweeps) | 30 s |
| rebalances | Rebalances.run_once(): hot -> warm/cold above the ceiling, approved warm -> hot refills below the floor, cold -> hot PSBTs once imported (bitcoin), fee bumps | 30 s |
| eth-rebalances | EthRebalances decide, sign, broadcast, track: ether and tokens over the hot address's ceiling -> warm or cold (custody.eth_rebalances; only when configured) | 30 s |
| expire-holds | Ledger.expire_holds() | 10 s |
| adjustments | TreasuryAdjustments.post_approved(): each approved treasury adjustment whose stored approval signatures still verify against the worker's own approver keys and make its quorum is posted (as custody_worker, the only role the liquidity guard lets post one); one short of it goes back to proposed (custody.adjustments) | 5 s |
| convert-prices | PriceChanges.apply_signed(): each signed convert price change whose signature verifies against the worker's own approver keys (the signer's own, live key) is set through `convert_price_set` (custody_api may not call it, migration 0056), in id order; expired, superseded or unverifiable ones are refused (custody.convert.prices) | 2 s |
| outbox | OutboxDispatcher.dispatch(): outbox -> NATS JetStream in the worker (custody.broker) | 1 s |
| webhooks | Webhooks.run_once(): outbox events -> signed POSTs to registered endpoints, retried with backoff, dead-lettered (custody.webhooks.delivery) | 1 s |
| reserves | Reserves.run_once(): builds the oldest requested proof-of-reserves reports (progress recorded) and publishes them (custody.reserves) | 10 s |
| reconcile | Reconciliation.run() (bitcoin, ethereum: chain holdings = books + in transit, exactly) | 60 s |
| node-view | NodeView.ensure(): the node's watch-only wallet loaded, its ranges ahead of the issued addresses (bitcoin) | 30 s |
| verify | verify_books(): Ledger.verify(); any failed check opens a critical incident (kill switch) | 60 s |
| matching-snapshots | Trading.snapshot_markets(): a snapshot of each market 10,000 commands or 300 s after its last, so a rebuild replays only the journal since | 10 s |

Each job runs at most one instance at a time, across every worker process on the database: a run
first takes the job's PostgreSQL session advisory lock (`JobLocks`: `pg_try_advisory_lock(
JOB_LOCK_NAMESPACE, crc32(job name))` on a connection of its own, held for the run) and is skipped
when another worker holds it; the lock is released after the run. A worker killed mid-run (SIGKILL,
a crash) loses its connection and with it the lock, so another worker takes the job on its next
tick; what the dead one left half-done is finished by the idempotent steps (a batch made is not
made again; a signed transaction is stored before broadcast). Within one process a slow run is
skipped, not stacked (APScheduler's max_instances=1). A run logs its exceptions instead of dying; a
failed run is retried on the next tick, which is safe because every step is idempotent. A node that
is unreachable (`NodeUnavailable`) or busy with a call it runs once at a time (`NodeBusy`: an
operator's `scantxoutset`, a wallet rescan) costs one warning line and the tick, never a traceback.
APScheduler's own log lines name the job (`Running job "payouts (trigger: ...)"`) and are written
at DEBUG (custody.observability); every log line written during a run carries the job's name
(`job` in the JSON line). Each run is counted in `job_stat` (runs, failures, skips, seconds; one
upsert on the lock's own connection after the run), which the api's `/metrics` reads
(custody.metrics): a run fails when it raised, or when one of its steps raised. Within a job,
each step runs even when an earlier one failed (`run_steps`: a node error while batching never
stops broadcast and tracking), and within a step one batch, sweep or rebalance that fails is set
aside and the others go on (custody.containment).
"""
from __future__ import annotations

import json
import logging
import time
import zlib
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from apscheduler.events import EVENT_SCHEDULER_SHUTDOWN
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError

from chain_adapters.errors import NodeBusy, NodeUnavailable
from custody.observability import job_context

log = logging.getLogger(__name__)


class OutboxDispatcher:
    """Delivers outbox events at least once, in id order, to `sink(topic, envelope)`: the worker's
    sink is custody.broker.JetStreamSink (NATS JetStream), the default one writes a log line.

    The envelope is custody.events' (type, version, event_key, aggregate, aggregate_seq,
    outbox_id, occurred_at, data). An event is marked delivered only after the sink returned (for
    JetStream: after the stream acknowledged it). A broker that cannot be reached or does not
    answer in time (`BrokerUnavailable`) stops the run: every event waits for the next one, one
    warning, no traceback. Any other failure holds back only the event's own aggregate until the
    next run (the attempt is counted), so nothing overtakes it in its aggregate and no other
    aggregate waits. An event the broker refuses for good (`EventRefused`: larger than its
    max_payload, ...) is dead-lettered (`outbox.dead_lettered_at`, `dead_letter_reason`;
    migration 0032) with a warning incident `event_dead_lettered`; its aggregate's later events
    wait behind it until it is re-queued (the owner clears `dead_lettered_at`).

    Order: rows are read in id order. Per aggregate, id order is commit order and the rows
    visible to a reader are always a prefix of the aggregate's sequence (custody_emit takes the
    aggregate's row lock before the row gets its id; migration 0026), so each aggregate's events
    are published in commit order, 1, 2, 3, ... Across aggregates, a row with a lower id may
    commit (and be published) after a higher one: consumers must not assume a global order."""

    def __init__(self, engine: Engine, sink: Callable[[str, dict], None] | None = None) -> None:
        self.engine = engine
        self.sink = sink or (lambda topic, envelope: log.info("event %s %s", topic, json.dumps(envelope, default=str)))

    def dispatch(self, limit: int = 500) -> int:
        from custody.broker import BrokerUnavailable, EventRefused
        from custody.controls import open_incident

        with self.engine.connect() as c:
            rows = c.execute(text(
                "SELECT o.id, o.topic, o.event_key, o.aggregate, o.aggregate_seq, o.version, o.payload, o.created_at "
                "FROM outbox o WHERE o.delivered_at IS NULL AND o.dead_lettered_at IS NULL "
                # an aggregate with a dead-lettered event waits behind it (per-aggregate order)
                "AND NOT EXISTS (SELECT 1 FROM outbox d WHERE d.aggregate = o.aggregate AND d.dead_lettered_at IS NOT NULL "
                "                AND d.delivered_at IS NULL AND d.aggregate_seq < o.aggregate_seq) "
                "ORDER BY o.id LIMIT :l"), {"l": limit}).all()
        delivered = 0
        blocked: set[str] = set()  # aggregates with an event that failed in this run
        for r in rows:
            if r.aggregate in blocked:
                continue  # keep order: no later event of an aggregate before an earlier one
            try:
                self.sink(r.topic, envelope(r))
            except BrokerUnavailable as exc:  # nothing can be delivered now: retry everything next run
                log.warning("outbox: broker unavailable (%s); %d event(s) wait in the outbox, retrying next run",
                            exc, len(rows) - delivered)
                with self.engine.begin() as c:
                    c.execute(text("UPDATE outbox SET attempts = attempts + 1 WHERE id = :i"), {"i": r.id})
                break
            except EventRefused as exc:  # this event can never be delivered: set it aside, open an incident
                blocked.add(r.aggregate)
                log.error("outbox event %s refused by the broker (%s): dead-lettered; aggregate %s waits behind it",
                          r.event_key, exc, r.aggregate)
                with self.engine.begin() as c:
                    c.execute(text("UPDATE outbox SET attempts = attempts + 1, dead_lettered_at = now(), "
                                   "dead_letter_reason = :why WHERE id = :i"), {"i": r.id, "why": str(exc)[:500]})
                    open_incident(c, "event_dead_lettered", f"event_dead_lettered:{r.event_key}",
                                  {"outbox_id": r.id, "event_key": r.event_key, "aggregate": r.aggregate,
                                   "reason": str(exc)[:500]}, severity="warning")
                continue
            except Exception:  # noqa: BLE001 - the sink is outside our control: this aggregate retries next run
                blocked.add(r.aggregate)
                log.exception("outbox event %s not delivered; aggregate %s retries next run", r.event_key, r.aggregate)
                with self.engine.begin() as c:
                    c.execute(text("UPDATE outbox SET attempts = attempts + 1 WHERE id = :i"), {"i": r.id})
                continue
            with self.engine.begin() as c:
                c.execute(text("UPDATE outbox SET delivered_at = now(), attempts = attempts + 1 WHERE id = :i"), {"i": r.id})
            delivered += 1
        return delivered


def envelope(row: Any) -> dict:
    """The delivered form of an outbox row (custody.events)."""
    return {"type": row.topic, "version": row.version, "event_key": row.event_key, "aggregate": row.aggregate,
            "aggregate_seq": row.aggregate_seq, "outbox_id": row.id, "occurred_at": row.created_at.isoformat(),
            "data": row.payload}


def verify_books(container: Any) -> list[str]:
    """Run the ledger's self-checks; a failure halts withdrawals first (critical incident)."""
    from custody.controls import open_incident

    failed = [c for c in container.ledger.verify() if not c.ok]
    if failed:
        with container.engine.begin() as conn:
            open_incident(conn, "ledger_verification_failed", "verify:" + ",".join(sorted(c.name for c in failed)),
                          {c.name: [str(p) for p in c.problems[:5]] for c in failed})
    return [c.name for c in failed]


class StepsFailed(Exception):
    """One or more steps of a scheduled job raised (each was logged when it did): the run counts
    as failed in job_stat."""


def run_steps(name: str, steps: list[Callable[[], object]]) -> list[str]:
    """Run every step in order; one that raises is logged and the next one still runs. Returns
    the names of the steps that raised."""
    return [label for step in steps if not _guard(label := f"{name}:{getattr(step, '__name__', 'step')}", step)()]


def failing_when_steps_fail(fn: Callable[[], list[str] | None]) -> Callable[[], None]:
    """The scheduled form of a job made of steps: raises StepsFailed when any step raised."""
    def run() -> None:
        failed = fn()
        if failed:
            raise StepsFailed(", ".join(failed))
    return run


def payouts_once(container: Any) -> list[str]:
    p = container.payouts
    steps: list[Callable[[], object]] = []
    if "bitcoin" in container.adapters:
        steps += [p.sync_hot_wallet, p.batch_bitcoin]
    if "ethereum" in container.adapters:
        steps.append(p.batch_ethereum)
    return run_steps("payouts", steps + [p.sign_open_batches, p.broadcast, p.track, p.bump_fees])


def _guard(name: str, fn: Callable[[], object]) -> Callable[[], bool]:
    """`fn` with its failures logged: True when it returned, False when it raised."""
    def run() -> bool:
        try:
            fn()
            return True
        except NodeUnavailable as exc:  # a node restarting or stopping: expected, retried next tick
            log.warning("job %s: node unavailable (%s); retrying next run", name, exc)
        except NodeBusy as exc:  # the node runs a one-at-a-time call (a scan, a rescan): skip this tick
            log.warning("job %s: node busy (%s); skipped, retrying next run", name, exc.detail)
        except StepsFailed as exc:  # each step's failure is logged already
            log.warning("job %s: steps failed: %s", name, exc)
        except Exception:  # noqa: BLE001 - logged; the next tick retries an idempotent step
            log.exception("job %s failed", name)
        return False
    return run


# ---- one worker per job at a time -----------------------------------------------------------

JOB_LOCK_NAMESPACE = 0x4A4F4253  # "JOBS": the first key of every job lock (pg_locks.classid)


def job_lock_key(name: str) -> tuple[int, int]:
    """The job's advisory lock key: (JOB_LOCK_NAMESPACE, CRC-32 of its name as a signed int4).
    The same in every process, release and host (unlike Python's hash()); the two-key form never
    meets the one-bigint locks others take (custody.withdrawals' per-owner locks)."""
    crc = zlib.crc32(name.encode())
    return JOB_LOCK_NAMESPACE, crc - (1 << 32) if crc >= 1 << 31 else crc


class JobLocks:
    """Session advisory locks, one per job name, each taken on a connection of its own (an
    autocommit engine beside the jobs' own, so a run never waits for a pool slot to hold its lock)
    and held for the run. The server drops a dead client's session, and its locks with it: at once
    for a killed process (its socket closes), within ~25 s for a vanished host (TCP keepalives set
    on these sessions)."""

    def __init__(self, bind: Engine | str) -> None:
        url = bind.url if isinstance(bind, Engine) else bind
        self.engine = create_engine(url, isolation_level="AUTOCOMMIT", pool_size=2, max_overflow=16, pool_pre_ping=True)

        @event.listens_for(self.engine, "connect")
        def _keepalives(dbapi_connection, _record) -> None:  # noqa: ANN001 - DBAPI objects
            with dbapi_connection.cursor() as cur:  # ignored on a Unix socket (the embedded server)
                cur.execute("SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3")
            dbapi_connection.commit()

    @contextmanager
    def hold(self, name: str) -> Iterator[bool]:
        """Try the job's lock: yields True (held until the block ends) or False (another session
        holds it; nothing to do). A database that cannot be reached raises (the run is retried)."""
        namespace, key = job_lock_key(name)
        conn = self.engine.connect()
        try:
            got = conn.execute(text("SELECT pg_try_advisory_lock(:n, :k)"), {"n": namespace, "k": key}).scalar_one()
            if not got:
                yield False
                return
            try:
                yield True
            finally:
                try:
                    released = conn.execute(text("SELECT pg_advisory_unlock(:n, :k)"), {"n": namespace, "k": key}).scalar_one()
                except DBAPIError as exc:
                    released = False
                    log.warning("job %s: its lock's session was lost during the run (%s); another worker may have run it "
                                "meanwhile, which the idempotent steps allow", name, exc)
                if not released:
                    conn.invalidate()  # never hand a session that may still hold the lock back to the pool
        finally:
            conn.close()

    def dispose(self) -> None:
        self.engine.dispose()


def exclusive_job(name: str, fn: Callable[[], object], locks: JobLocks) -> Callable[[], bool | None]:
    """The scheduled form of a job: `fn` under the job's lock, failures logged. Returns True when
    it ran and returned, False when another worker holds the job, None when it (or taking the
    lock) failed."""
    body = _guard(name, fn)

    def run() -> bool | None:
        with job_context(name):
            try:
                with locks.hold(name) as got:
                    if not got:
                        log.debug("job %s: held by another worker; skipped", name)
                        record_run(locks.engine, name, skipped=True)
                        return False
                    started = time.perf_counter()
                    ok = body()
                    record_run(locks.engine, name, failed=not ok, seconds=time.perf_counter() - started)
                    return True if ok else None
            except Exception:  # noqa: BLE001 - the database is unreachable: the next tick tries again
                log.exception("job %s: could not take its lock", name)
                return None

    run.__name__ = run.__qualname__ = name  # what APScheduler and tracebacks call it
    return run


_RECORD_SQL = text("""
INSERT INTO job_stat AS s (name, runs, failures, skipped, seconds_total, last_seconds, last_run_at, last_failure_at)
VALUES (:n, :runs, :failures, :skipped, :seconds, :last_seconds,
        CASE WHEN :runs = 1 THEN now() END, CASE WHEN :failures = 1 THEN now() END)
ON CONFLICT (name) DO UPDATE SET
    runs = s.runs + EXCLUDED.runs,
    failures = s.failures + EXCLUDED.failures,
    skipped = s.skipped + EXCLUDED.skipped,
    seconds_total = s.seconds_total + EXCLUDED.seconds_total,
    last_seconds = coalesce(EXCLUDED.last_seconds, s.last_seconds),
    last_run_at = coalesce(EXCLUDED.last_run_at, s.last_run_at),
    last_failure_at = coalesce(EXCLUDED.last_failure_at, s.last_failure_at)
""")


def record_run(engine: Engine, name: str, *, failed: bool = False, skipped: bool = False, seconds: float = 0.0) -> None:
    """Count one run (or skip) of job `name` in `job_stat`; a failure to count is logged, never
    raised (the count is for watching; the job's work is done)."""
    ran = 0 if skipped else 1
    try:
        with engine.begin() as conn:
            conn.execute(_RECORD_SQL, {"n": name, "runs": ran, "failures": int(failed and ran == 1),
                                       "skipped": int(skipped), "seconds": seconds if ran else 0.0,
                                       "last_seconds": seconds if ran else None})
    except Exception as exc:  # noqa: BLE001
        log.warning("job %s: its run was not counted in job_stat (%s)", name, exc)


def build_scheduler(container: Any, *, sink: Callable[[str, dict], None] | None = None, scale: float = 1.0,
                    locks: JobLocks | None = None) -> BackgroundScheduler:
    """A scheduler with every job of the container's configured subsystems (not started), each run
    under its job lock (`locks`, or locks on the container's database released at shutdown).
    `container` is any object with custody.container.Container's attributes (engine, ledger,
    adapters, deposits, payouts, sweeps, rebalances, reconciliation, trading); a missing or None
    subsystem has no job."""
    scheduler = BackgroundScheduler(job_defaults={"max_instances": 1, "coalesce": True})
    if locks is None:
        locks = JobLocks(container.engine)
        scheduler.add_listener(lambda _event: locks.dispose(), EVENT_SCHEDULER_SHUTDOWN)
    dispatcher = OutboxDispatcher(container.engine, sink)

    def add(name: str, fn: Callable[[], object], seconds: float) -> None:
        scheduler.add_job(exclusive_job(name, fn, locks), "interval", seconds=seconds * scale, id=name, name=name)

    deposits, payouts = getattr(container, "deposits", None), getattr(container, "payouts", None)
    sweeps, rebalances = getattr(container, "sweeps", None), getattr(container, "rebalances", None)
    reconciliation, trading = getattr(container, "reconciliation", None), getattr(container, "trading", None)
    if deposits is not None:
        for chain in getattr(container, "adapters", {}):
            add(f"deposits:{chain}", lambda ch=chain: deposits.run_once([ch]), 2)
    if payouts is not None:
        add("payouts", failing_when_steps_fail(lambda: payouts_once(container)), 3)
    if sweeps is not None:
        add("sweeps", failing_when_steps_fail(lambda: run_steps("sweeps", [sweeps.sweep_bitcoin, sweeps.broadcast,
                                                                         sweeps.track, sweeps.bump_fees])), 30)
    eth_sweeps = getattr(container, "eth_sweeps", None)
    if eth_sweeps is not None:
        add("eth-sweeps", failing_when_steps_fail(lambda: run_steps("eth-sweeps", [
            eth_sweeps.plan, eth_sweeps.sign, eth_sweeps.broadcast, eth_sweeps.bump_fees, eth_sweeps.track])), 30)
    if rebalances is not None:
        add("rebalances", failing_when_steps_fail(lambda: run_steps("rebalances", [
            rebalances.rebalance_bitcoin, rebalances.broadcast, rebalances.track, rebalances.bump_fees,
            rebalances.cpfp.bump_fees, rebalances.cpfp.broadcast, rebalances.cpfp.track])), 30)
    eth_rebalances = getattr(container, "eth_rebalances", None)
    if eth_rebalances is not None:
        add("eth-rebalances", failing_when_steps_fail(lambda: run_steps("eth-rebalances", [
            eth_rebalances.decide, eth_rebalances.sign, eth_rebalances.broadcast, eth_rebalances.bump_fees,
            eth_rebalances.track])), 30)
    add("expire-holds", container.ledger.expire_holds, 10)
    adjustments = getattr(container, "adjustments", None)
    if adjustments is not None:
        add("adjustments", adjustments.post_approved, 5)
    price_changes = getattr(container, "price_changes", None)
    if price_changes is not None:
        add("convert-prices", price_changes.apply_signed, 2)
    add("outbox", dispatcher.dispatch, 1)
    webhooks = getattr(container, "webhooks", None)
    if webhooks is not None:
        add("webhooks", webhooks.run_once, 1)
    add("verify", failing_when_steps_fail(lambda: verify_books(container)), 60)  # a failed check fails the run
    if reconciliation is not None:
        add("reconcile", reconciliation.run, 60)
    if getattr(container, "reserves", None) is not None:
        add("reserves", container.reserves.run_once, 10)
    node_view = getattr(container, "node_view", None)
    if node_view is not None:
        add("node-view", node_view.ensure, 30)
    if trading is not None:
        add("matching-snapshots", trading.snapshot_markets, 10)
    return scheduler
