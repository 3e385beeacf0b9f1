"""Deadlines (issue 32 item 4): commands that are data, scheduled for a moment, fired once in
effect by the scheduler group, cancelled never, no earlier than their moment."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import ClassVar

import pytest
from attrs import frozen
from sched_app import Alarm, AlarmCleared, AlarmSet, Rang, Ring, app

from eventlane import Aggregate
from eventlane.app.schedules import Scheduler
from eventlane.domain import Command, command
from eventlane.errors import ConfigError, SerializationError
from eventlane.testing import FakeClock, ProjectorFixture
from eventlane.testing.clock import T0_MS


@command("Unregistered")
@frozen
class Unregistered(Command[Alarm]):
    alarm_id: str
    aggregate: ClassVar[type[Aggregate]] = Alarm


def rings(runtime, alarm_id: str) -> list:  # type: ignore[no-untyped-def]
    try:
        return [e for e in runtime.store.read("alarms", alarm_id) if isinstance(e.event, Rang)]
    except Exception:
        return []


def test_due_schedules_fire_once_cancelled_never_and_not_early(tmp_path: Path) -> None:
    clock = FakeClock()
    with app.open(tmp_path / "d") as runtime:
        runtime.schedule(Ring("a1", "k1"), at=T0_MS + 1000, key="k1")
        runtime.schedule(Ring("a2", "k2"), at=T0_MS + 2000, key="k2")
        runtime.schedule(Ring("a3", "k3"), at=T0_MS + 1500, key="k3")
        assert runtime.cancel_schedule("k3") is True
        assert runtime.cancel_schedule("k3") is False  # nothing pending any more
        scheduler = Scheduler(runtime, clock=clock, poll_interval=0.05, session_timeout_ms=3000)
        try:
            for _ in range(5):
                scheduler.run_once()
            assert (rings(runtime, "a1"), rings(runtime, "a2")) == ([], [])  # not yet due
            clock.advance(1000)
            for _ in range(5):
                scheduler.run_once()
            [rang] = rings(runtime, "a1")
            assert rang.causation_id == runtime.schedules.entries()["k1"].id
            assert rings(runtime, "a2") == []
            clock.advance(5000)
            for _ in range(5):
                scheduler.run_once()
            assert len(rings(runtime, "a2")) == 1 and rings(runtime, "a3") == []
            states = {k: e.state for k, e in runtime.schedules.entries().items()}
            assert states == {"k1": "fired", "k2": "fired", "k3": "cancelled"}
        finally:
            scheduler.close()


def test_firing_again_after_a_crash_changes_nothing(tmp_path: Path) -> None:
    """A scheduler killed between the command and its ``fired`` record fires again after the
    restart: the causation check (the schedule id) makes the second firing a no-op."""
    with app.open(tmp_path / "d") as runtime:
        runtime.schedule(Ring("a1", "k1"), at=T0_MS, key="k1")
        entry = runtime.schedules.entries()["k1"]
        cmd = runtime.schedules.codec.decode(entry.command, entry.data)
        runtime.issue(Alarm, "a1", cmd, caused_by=entry.id)  # the effect, then "the crash"
        scheduler = Scheduler(runtime, clock=FakeClock(T0_MS + 10), poll_interval=0.05)
        try:
            for _ in range(5):
                scheduler.run_once()
        finally:
            scheduler.close()
        assert len(rings(runtime, "a1")) == 1
        assert runtime.schedules.entries()["k1"].state == "fired"


def test_a_policy_schedules_and_cancels_deadlines_idempotently(tmp_path: Path) -> None:
    with ProjectorFixture(app, "alarm_policy", directory=tmp_path / "fx") as fx:
        fx.given(Alarm, "x", AlarmSet(T0_MS + 5))
        fx.given(Alarm, "y", AlarmSet(T0_MS + 6), AlarmCleared())
        entries = fx.runtime.schedules.entries()
        assert {k: e.state for k, e in entries.items()} == {
            "alarm-x": "scheduled",
            "alarm-y": "cancelled",
        }
        assert entries["alarm-x"].data == {"alarm_id": "ring-x", "key": "x"}
        # a redelivered handler derives the same schedule id: nothing new is scheduled
        event_id = entries["alarm-x"].caused_by
        again = fx.runtime.schedule(
            Ring("ring-x", "x"), at=T0_MS + 5, key="alarm-x", caused_by=event_id
        )
        assert again == entries["alarm-x"].id


def test_bad_schedules_are_refused_with_a_clear_error(tmp_path: Path) -> None:
    with app.open(tmp_path / "d") as runtime:
        with pytest.raises(ConfigError, match="non-empty key"):
            runtime.schedule(Ring("a", "k"), at=T0_MS, key="")
        with pytest.raises(ConfigError, match="timezone-aware"):
            runtime.schedule(Ring("a", "k"), at=datetime(2030, 1, 1), key="k")
        with pytest.raises(ConfigError, match="not registered with the app"):
            runtime.schedule(Unregistered("a"), at=T0_MS, key="k")
        with pytest.raises(SerializationError, match="unknown command 'Nope'"):
            runtime.schedules.codec.decode("Nope", {})
        with pytest.raises(SerializationError, match="cannot decode command 'Ring'"):
            runtime.schedules.codec.decode("Ring", {"alarm_id": 5})


def test_a_keys_latest_record_is_its_whole_state(tmp_path: Path) -> None:
    """``entry(key)`` reads the key's records with ``read_key``, which on a compacted topic
    may return only the last one (compaction keeps only that): a cancelled or fired
    schedule's record must say everything the schedule was, not only its new state."""
    clock = FakeClock()
    with app.open(tmp_path / "d") as runtime:
        runtime.schedule(Ring("a1", "k1"), at=T0_MS + 1000, key="k1")
        runtime.schedule(Ring("a2", "k2"), at=T0_MS + 2000, key="k2")
        assert runtime.cancel_schedule("k2") is True
        scheduler = Scheduler(runtime, clock=clock, poll_interval=0.05, session_timeout_ms=3000)
        try:
            clock.advance(1000)
            for _ in range(5):
                scheduler.run_once()
        finally:
            scheduler.close()
        fired, cancelled = runtime.schedules.entry("k1"), runtime.schedules.entry("k2")
        assert fired is not None and cancelled is not None
        assert (fired.state, fired.at, fired.command, fired.data) == (
            "fired",
            T0_MS + 1000,
            "Ring",
            {"alarm_id": "a1", "key": "k1"},
        )
        assert fired.fired_at == T0_MS + 1000
        assert (cancelled.state, cancelled.at, cancelled.data["alarm_id"]) == (
            "cancelled",
            T0_MS + 2000,
            "a2",
        )
        assert runtime.schedules.entries() == {"k1": fired, "k2": cancelled}


def test_a_cancel_racing_a_fire_never_marks_a_fired_schedule_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A policy cancels a deadline (it read it pending) while the scheduler fires it: the
    scheduler's ``fired`` record lands between the cancel's read and its append. The fired
    schedule stays fired and the cancel reports False."""
    with app.open(tmp_path / "d") as runtime:
        schedules = runtime.schedules
        runtime.schedule(Ring("a1", "k1"), at=T0_MS, key="k1")
        read = schedules.entry

        def read_then_fired_meanwhile(key: str):  # type: ignore[no-untyped-def]
            entry = read(key)
            if entry is not None and entry.state == "scheduled":
                schedules.mark_fired(entry, T0_MS + 1)  # the scheduler, in between
            return entry

        monkeypatch.setattr(schedules, "entry", read_then_fired_meanwhile)
        assert runtime.cancel_schedule("k1") is False
        monkeypatch.undo()
        state = schedules.entry("k1")
        assert state is not None and (state.state, state.fired_at) == ("fired", T0_MS + 1)
        assert schedules.entries()["k1"].state == "fired"
