"""`matching.sequencer.GroupCommitter`, the queue in front of one market's writer: commands queued
while a group commit runs form the next group, each caller gets its own outcome in order, and a
group that fails is run again one command at a time so only the culprit fails."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import pytest

from matching.sequencer import GroupCommitter


class Writer:
    """A commit function that blocks its first group until released, records every group and
    fails any group holding a command named 'bad'."""

    def __init__(self) -> None:
        self.groups: list[list[str]] = []
        self.release = threading.Event()
        self.started = threading.Event()

    def __call__(self, commands):
        if not self.groups:
            self.started.set()
            assert self.release.wait(10)
        self.groups.append(list(commands))
        if "bad" in commands:
            raise ValueError("bad command")
        return [f"done:{c}" for c in commands]


@contextmanager
def busy(max_group: int = 512) -> Iterator[tuple[Writer, GroupCommitter]]:
    """A committer whose first group ('c0') is under way and held until `writer.release` is set."""
    writer = Writer()
    committer = GroupCommitter(writer, "t", max_group=max_group)
    try:
        first = committer.submit("c0")
        assert writer.started.wait(10)
        yield writer, committer
        assert first.result(10) == "done:c0"
    finally:
        writer.release.set()
        committer.shutdown()


def test_commands_queued_during_a_commit_form_one_group_answered_in_order():
    with busy() as (writer, committer):
        rest = [committer.submit(f"c{i}") for i in range(1, 8)]
        assert not any(f.done() for f in rest), "answered before its group committed"
        writer.release.set()
        assert [f.result(10) for f in rest] == [f"done:c{i}" for i in range(1, 8)]
        assert writer.groups == [["c0"], [f"c{i}" for i in range(1, 8)]]
        assert (committer.groups, committer.commands) == (2, 8)


def test_a_failing_group_is_run_again_command_by_command_and_only_the_culprit_fails():
    with busy() as (writer, committer):
        futures = [committer.submit(c) for c in ("a", "bad", "b")]
        writer.release.set()
        assert futures[0].result(10) == "done:a" and futures[2].result(10) == "done:b"
        with pytest.raises(ValueError, match="bad command"):
            futures[1].result(10)
        assert writer.groups == [["c0"], ["a", "bad", "b"], ["a"], ["bad"], ["b"]]
        assert (committer.groups, committer.commands) == (3, 3)  # c0, a, b committed


def test_a_caller_that_gave_up_before_its_group_started_is_left_out():
    with busy() as (writer, committer):
        gone, kept = committer.submit("gone"), committer.submit("kept")
        assert gone.cancel()
        writer.release.set()
        assert kept.result(10) == "done:kept"
        assert writer.groups == [["c0"], ["kept"]]


def test_a_group_never_exceeds_max_group():
    with busy(max_group=3) as (writer, committer):
        futures = [committer.submit(f"c{i}") for i in range(1, 8)]
        writer.release.set()
        for f in futures:
            f.result(10)
        assert [len(g) for g in writer.groups] == [1, 3, 3, 1]
