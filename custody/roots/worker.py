"""The `custody worker` process: the scheduled jobs (custody.jobs), with a signer client and no
HTTP server.

`build_worker_root(config)` wires `WorkerRoot`: custody.roots.common's services, and as `trading`
a `JournalSnapshots` (the matching-snapshots job's only need), never a `Trading`: the API process
is the matching engine's single writer, and a second `Trading` would settle commands beside it.
`run_worker(root)` starts the scheduler, its outbox job publishing to NATS JetStream
(`event_sink`: [events] of the file, NATS_URL, else the embedded server; `sink = "log"` for none),
and waits; SIGTERM or SIGINT stops it after the running
jobs finish (`shutdown(wait=True)`), SIGUSR1 writes the loaded modules (common.install_module_dump).

The worker is the only process that writes reference data (wallets, assets, cursors; see
custody.roots.common). When the signer did not answer at start, the scheduler is given the
services that derive or pay (deposits, payouts, sweeps, rebalances, reconciliation) behind
`guards.signer_gated`: their runs do nothing until the signer's xpubs have been compared with
[wallets] and found equal (then the wallets are registered and they run); the other jobs run
meanwhile.

At start the `node-view` job runs at once (not after its first interval): it loads the node's
watch-only wallet (custody.node_view), or creates it and imports the ranges, under its job lock
and in the scheduler's threads, so a first import's rescan does not hold up the other jobs.
"""
from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Mapping

from sqlalchemy import Engine, text

from chain_adapters.base import ChainAdapter
from custody.broker import JetStreamSink, configured_nats_url, embedded_nats_url
from custody.config import DeploymentConfig
from custody.convert.service import write_config
from custody.jobs import build_scheduler
from custody.roots.common import CustodyServices, build_services, install_module_dump
from custody.roots.guards import signer_gated
from matching import snapshot, store
from matching.compiled import engine_class
from signer.protocol import SignerPort

log = logging.getLogger(__name__)


class JournalSnapshots:
    """The matching snapshot job without a sequencer: for each market whose journal is
    `snapshot.due` past its newest stored snapshot (by commands, or by seconds since that row was
    written), restore the snapshot, replay the journal after it (pure: `Engine.apply`, no
    settlement, no writes) and store the result. Replay is deterministic (DESIGN.md 6), so the
    stored state is the one the API's engine had at that sequence number."""

    def __init__(self, engine: Engine, *, every_commands: int = snapshot.EVERY_COMMANDS,
                 every_seconds: float = snapshot.EVERY_SECONDS) -> None:
        self.engine = engine
        self.snapshot_every_commands = every_commands
        self.snapshot_every_seconds = every_seconds

    def snapshot_markets(self) -> list[snapshot.Snapshot]:
        with self.engine.connect() as c:
            markets = store.load_markets(c)
        return [snap for row in markets if (snap := self._snapshot_if_due(row)) is not None]

    def _snapshot_if_due(self, row: store.MarketRow) -> snapshot.Snapshot | None:
        symbol = row.market.symbol
        with self.engine.connect() as c:
            latest = store.latest_snapshot(c, symbol)
            last = store.last_seq(c, symbol)
            age = float("inf") if latest is None else float(c.execute(text(
                "SELECT extract(epoch FROM now() - created_at) FROM matching_snapshot WHERE market = :m AND seq = :s"),
                {"m": symbol, "s": latest.seq}).scalar_one())
            if not snapshot.due(last, latest.seq if latest else 0, age, every_commands=self.snapshot_every_commands,
                                every_seconds=self.snapshot_every_seconds):
                return None
            book = snapshot.restore(latest) if latest else engine_class()(row.market, row.fees, row.default_stp)
            for seq, command in store.load_commands(c, symbol, book.last_seq):
                if seq > last:
                    break  # appended since we looked: the next run takes them
                book.apply(seq, command)
        snap = snapshot.take(book)
        with self.engine.begin() as c:
            store.save_snapshot(c, symbol, snap)
        log.info("matching snapshot of %s at seq %d", symbol, snap.seq)
        return snap


@dataclass
class WorkerRoot(CustodyServices):
    trading: JournalSnapshots | None = None


def build_worker_root(config: DeploymentConfig, *, adapters: Mapping[str, ChainAdapter] | None = None,
                      signer: SignerPort | None = None, engine: Engine | None = None) -> WorkerRoot:
    services = build_services(config, process="worker", adapters=adapters, signer=signer, engine=engine)
    root = WorkerRoot(**{f: getattr(services, f) for f in services.__dataclass_fields__})
    root.trading = JournalSnapshots(root.engine)
    return root


def event_sink(config: DeploymentConfig) -> JetStreamSink | None:
    """The outbox dispatcher's sink: JetStream at [events] nats_url, else NATS_URL, else the
    embedded server under STATE_DIR; None (the log sink) with `sink = "log"`."""
    events = config.events
    if events.sink == "log":
        return None
    url = configured_nats_url(events, config.settings) or embedded_nats_url(config.settings.state_dir)
    log.info("events: publishing to JetStream stream %s (subjects %s.>) at %s", events.stream, events.subject_prefix, url)
    return JetStreamSink(url, stream=events.stream, subject_prefix=events.subject_prefix,
                         duplicate_window_s=events.duplicate_window_s)


def run_worker(root: WorkerRoot, *, stop: threading.Event | None = None) -> int:
    """Run every job until SIGTERM/SIGINT (or `stop` is set); the running jobs finish first."""
    stop = stop or threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        log.info("%s: stopping after the running jobs", signal.Signals(signum).name)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        install_module_dump("custody-worker", root.settings.state_dir)
    convert = write_config(root.engine, root.settings, by="custody-worker")  # the api and the database read it
    log.info("convert: fee %d ppm, spread %d ppm, price band %d ppm", convert.fee_ppm, convert.spread_ppm, convert.band_ppm)
    sink = event_sink(root.config)
    scheduler = build_scheduler(signer_gated(root, root.wallet_check), scale=root.config.jobs.scale,  # type: ignore[arg-type]
                                sink=sink)
    scheduler.start()
    if scheduler.get_job("node-view") is not None:  # start-up: load or create the node's watch-only wallet now
        scheduler.modify_job("node-view", next_run_time=datetime.now(timezone.utc))
    log.info("custody worker running %d jobs (%s); config %s", len(scheduler.get_jobs()),
             ", ".join(j.id for j in scheduler.get_jobs()), root.config.source)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        scheduler.shutdown(wait=True)
        if sink is not None:
            sink.close()
        root.close()
        log.info("custody worker stopped")
    return 0
