"""Scheduled jobs: APScheduler runs each pipeline step on an interval; every step is also a plain
method that tests and the demo call directly, so time is driven deterministically there.

| job | what it calls | default interval |
| --- | --- | --- |
| deposits:<chain> | Deposits.run_once([chain]) (scan -> confirm -> screen/credit) | 2 s |
| payouts | sync hot wallet, batch, sign, broadcast, track, bump fees | 3 s |
| sweeps | Sweeps.run_once(): booked deposit coins -> hot wallet (bitcoin) | 30 s |
| rebalances | Rebalances.run_once(): hot -> cold above the ceiling (bitcoin; needs a registered cold wallet) | 30 s |
| expire-holds | Ledger.expire_holds() | 10 s |
| outbox | OutboxDispatcher.dispatch() | 1 s |
| reconcile | Reconciliation.run() (bitcoin, ethereum: chain holdings = books + in transit, exactly) | 60 s |
| verify | verify_books(): Ledger.verify(); any failed check opens a critical incident (kill switch) | 60 s |
| matching-snapshots | Trading.snapshot_markets(): a snapshot of each market 10,000 commands or 300 s after its last, so a rebuild replays only the journal since | 10 s |

Each job runs at most one instance at a time (a slow run is skipped, not stacked) and logs its
exceptions instead of dying; a failed run is retried on the next tick, which is safe because every
step is idempotent. Within a job, each step runs even when an earlier one failed (`run_steps`: a
node error while batching never stops broadcast and tracking), and within a step one batch, sweep
or rebalance that fails is set aside and the others go on (custody.containment).
"""
from __future__ import annotations

import json
import logging
from typing import Callable

from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import Engine, text

from chain_adapters.errors import NodeUnavailable
from custody.container import Container

log = logging.getLogger(__name__)


class OutboxDispatcher:
    """Delivers outbox events at least once, in id order, to `sink(topic, payload)`. An event is
    marked delivered only after the sink returned; a sink failure leaves it for the next run (the
    attempt is counted). Consumers must be idempotent: the event key is in the payload envelope."""

    def __init__(self, engine: Engine, sink: Callable[[str, dict], None] | None = None) -> None:
        self.engine = engine
        self.sink = sink or (lambda topic, payload: log.info("event %s %s", topic, json.dumps(payload, default=str)))

    def dispatch(self, limit: int = 500) -> int:
        with self.engine.connect() as c:
            rows = c.execute(text("SELECT id, topic, event_key, payload FROM outbox WHERE delivered_at IS NULL "
                                  "ORDER BY id LIMIT :l"), {"l": limit}).all()
        delivered = 0
        for r in rows:
            try:
                self.sink(r.topic, {"event_key": r.event_key, **r.payload})
            except Exception:  # noqa: BLE001 - the sink is outside our control; retry next run
                log.exception("outbox event %s not delivered", r.event_key)
                with self.engine.begin() as c:
                    c.execute(text("UPDATE outbox SET attempts = attempts + 1 WHERE id = :i"), {"i": r.id})
                break  # keep order: do not deliver later events before this one
            with self.engine.begin() as c:
                c.execute(text("UPDATE outbox SET delivered_at = now(), attempts = attempts + 1 WHERE id = :i"), {"i": r.id})
            delivered += 1
        return delivered


def verify_books(container: Container) -> list[str]:
    """Run the ledger's self-checks; a failure halts withdrawals first (critical incident)."""
    from custody.controls import open_incident

    failed = [c for c in container.ledger.verify() if not c.ok]
    if failed:
        with container.engine.begin() as conn:
            open_incident(conn, "ledger_verification_failed", "verify:" + ",".join(sorted(c.name for c in failed)),
                          {c.name: [str(p) for p in c.problems[:5]] for c in failed})
    return [c.name for c in failed]


def run_steps(name: str, steps: list[Callable[[], object]]) -> None:
    """Run every step in order; one that raises is logged and the next one still runs."""
    for step in steps:
        _guard(f"{name}:{getattr(step, '__name__', 'step')}", step)()


def payouts_once(container: Container) -> None:
    p = container.payouts
    steps: list[Callable[[], object]] = []
    if "bitcoin" in container.adapters:
        steps += [p.sync_hot_wallet, p.batch_bitcoin]
    if "ethereum" in container.adapters:
        steps.append(p.batch_ethereum)
    run_steps("payouts", steps + [p.sign_open_batches, p.broadcast, p.track, p.bump_fees])


def _guard(name: str, fn: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        except NodeUnavailable as exc:  # a node restarting or stopping: expected, retried next tick
            log.warning("job %s: node unavailable (%s); retrying next run", name, exc)
        except Exception:  # noqa: BLE001 - logged; the next tick retries an idempotent step
            log.exception("job %s failed", name)
    return run


def build_scheduler(container: Container, *, sink: Callable[[str, dict], None] | None = None,
                    scale: float = 1.0) -> BackgroundScheduler:
    """A scheduler with every job of the container's configured subsystems (not started)."""
    scheduler = BackgroundScheduler(job_defaults={"max_instances": 1, "coalesce": True})
    dispatcher = OutboxDispatcher(container.engine, sink)
    if container.deposits is not None:
        for chain in container.adapters:
            scheduler.add_job(_guard(f"deposits:{chain}", lambda ch=chain: container.deposits.run_once([ch])),
                              "interval", seconds=2 * scale, id=f"deposits:{chain}")
    if container.payouts is not None:
        scheduler.add_job(_guard("payouts", lambda: payouts_once(container)), "interval", seconds=3 * scale, id="payouts")
    if container.sweeps is not None:
        sw = container.sweeps
        scheduler.add_job(lambda: run_steps("sweeps", [sw.sweep_bitcoin, sw.broadcast, sw.track]), "interval",
                          seconds=30 * scale, id="sweeps")
    if container.rebalances is not None:
        rb = container.rebalances
        scheduler.add_job(lambda: run_steps("rebalances", [rb.rebalance_bitcoin, rb.broadcast, rb.track]), "interval",
                          seconds=30 * scale, id="rebalances")
    scheduler.add_job(_guard("expire-holds", container.ledger.expire_holds), "interval", seconds=10 * scale, id="expire-holds")
    scheduler.add_job(_guard("outbox", dispatcher.dispatch), "interval", seconds=1 * scale, id="outbox")
    scheduler.add_job(_guard("verify", lambda: verify_books(container)), "interval", seconds=60 * scale, id="verify")
    if container.reconciliation is not None:
        scheduler.add_job(_guard("reconcile", container.reconciliation.run), "interval", seconds=60 * scale, id="reconcile")
    if container.trading is not None:
        scheduler.add_job(_guard("matching-snapshots", container.trading.snapshot_markets), "interval",
                          seconds=10 * scale, id="matching-snapshots")
    return scheduler
