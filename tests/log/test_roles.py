"""The port's roles are checked when a layer takes a log: an engine with the core role only
(tests/log/broken_engines.py's :class:`CoreOnly`, as a plain Kafka adapter) is refused by
``App.open`` and the event store with an error naming the engine and the role it lacks,
before anything is created on it; maintenance commands refuse it the same way."""

from __future__ import annotations

from pathlib import Path

import pytest
from attrs import frozen
from broken_engines import CoreOnly

from eventlane.app import App
from eventlane.domain import Aggregate, DomainEvent, applies, event
from eventlane.errors import ConfigError, MissingRoleError
from eventlane.log import KeyedLog, Log, LogStore
from eventlane.log.port import keyed_log, maintained_log
from eventlane.store.event_store import EventStore


@event("Counted")
@frozen
class Counted(DomainEvent):
    n: int


class Counter(Aggregate, topic="counters"):
    @applies
    def _counted(self, e: Counted) -> None:
        pass


def test_app_open_refuses_an_engine_without_the_keyed_role(tmp_path: Path) -> None:
    log = CoreOnly(tmp_path / "log")
    try:
        assert isinstance(log, Log) and not isinstance(log, KeyedLog)
        app = App("roles", aggregates=[Counter])
        with pytest.raises(MissingRoleError) as info:
            app.open(log)  # type: ignore[arg-type]  # mypy refuses it too
        err = info.value
        assert (err.engine, err.role) == ("CoreOnly", "KeyedLog")
        assert "CoreOnly does not implement the KeyedLog role" in str(err)
        assert "per-key reads and conditional appends" in str(err)
        assert "App.open" in str(err) and "read_key" in str(err) and "key_head" in str(err)
        assert isinstance(err, ConfigError) and not err.retriable and not err.indeterminate
        assert log.list_topics() == []  # refused before creating anything
        with pytest.raises(MissingRoleError, match=r"KeyedLog role .* the event store"):
            EventStore(log, app.codec())  # type: ignore[arg-type]
    finally:
        log.close()


def test_role_checks_pass_a_full_engine_through(tmp_path: Path) -> None:
    with LogStore(tmp_path / "log") as log:
        assert keyed_log(log, "x") is log and maintained_log(log, "x") is log
        with pytest.raises(MissingRoleError, match=r"MaintainedLog role .* eventlane compact"):
            maintained_log(CoreOnly(tmp_path / "other"), "eventlane compact")
