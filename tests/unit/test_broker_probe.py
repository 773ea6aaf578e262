"""broker_probe: which NATS server `/health/ready` checks, resolved from a process's configuration
as the worker resolves it (custody.roots.worker.event_sink): [events] nats_url, else NATS_URL, else
the embedded server's port file under STATE_DIR/nats; nothing with `sink = "log"`; without a
deployment file only NATS_URL. An embedded server that was never started fails the check by name."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from custody.broker import BrokerUnavailable
from custody.broker_probe import NO_EMBEDDED, BrokerProbe, broker_url
from custody.config import EventsSection
from custody.settings import Settings
from regtest.util import assert_equal


@dataclass
class Config:
    events: EventsSection


@dataclass
class Root:
    """What broker_url reads of a process's root (custody.roots.common.CustodyServices)."""
    settings: Settings
    config: Config | None = None


def settings(tmp_path: Path, nats_url: str | None = None) -> Settings:
    return Settings(environment="test", state_dir=tmp_path, nats_url=nats_url)


def test_the_url_is_resolved_as_the_worker_resolves_it(tmp_path):
    file_url, env_url = "nats://broker-a:4222", "nats://broker-b:4222"
    deployed = lambda events, env=None: Root(settings(tmp_path, env), Config(events))  # noqa: E731
    assert_equal(broker_url(deployed(EventsSection(nats_url=file_url), env_url)), file_url)
    assert_equal(broker_url(deployed(EventsSection(), env_url)), env_url)
    assert_equal(broker_url(deployed(EventsSection(sink="log", nats_url=file_url), env_url)), None)
    assert_equal(broker_url(deployed(EventsSection())), NO_EMBEDDED)
    (tmp_path / "nats").mkdir()
    (tmp_path / "nats" / "port").write_text("41234\n")
    assert_equal(broker_url(deployed(EventsSection())), "nats://127.0.0.1:41234")
    assert_equal(broker_url(Root(settings(tmp_path, env_url))), env_url)  # no deployment file: NATS_URL only
    assert_equal(broker_url(Root(settings(tmp_path))), None)


def test_an_embedded_server_never_started_fails_by_name():
    with pytest.raises(BrokerUnavailable, match="no embedded server under STATE_DIR/nats"):
        BrokerProbe(NO_EMBEDDED)()
