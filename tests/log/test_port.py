"""The log port's newer surface on the embedded engine: conditional appends (``expect``),
per-key reads, ``wake`` across processes, maintenance progress, the local directory, and the
engine factory (``eventlane.engine``)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from broken_engines import CoreOnly

from eventlane.consumer.coordination import FileCoordination
from eventlane.engine import open_engine, open_log, register_engine
from eventlane.errors import ConcurrencyError, ConfigError, MissingRoleError
from eventlane.log import FencedLog, KeyedLog, Log, LogStore, MaintainedLog
from eventlane.log.local import LocalDir
from eventlane.log.types import Expect


def _rec(key: bytes, value: bytes = b"v") -> tuple[bytes, bytes, tuple[()], None]:
    return (key, value, (), None)


def test_the_port_has_no_path_and_the_store_implements_it(store: LogStore) -> None:
    assert isinstance(store, Log)
    assert "path" not in vars(Log) and "path" not in Log.__annotations__
    assert store.local == LocalDir(store.path)
    assert all(isinstance(store, role) for role in (KeyedLog, MaintainedLog, FencedLog))


def test_expect_appends_only_at_the_expected_offset(store: LogStore) -> None:
    store.create_topic("t", 1)
    assert store.append("t", 0, [_rec(b"a")], expect=Expect(b"a", None)).base_offset == 0
    store.append("t", 0, [_rec(b"b")])  # another key moves the log, not a's head
    before = store.offsets("t", 0)
    with pytest.raises(ConcurrencyError) as info:
        store.append("t", 0, [_rec(b"a"), _rec(b"a")], expect=Expect(b"a", None))
    assert (info.value.expected, info.value.actual) == (None, 0)
    assert "expected last offset None, actual 0" in str(info.value)
    with pytest.raises(ConcurrencyError):
        store.append("t", 0, [_rec(b"a")], expect=Expect(b"a", 1))  # 1 is b's record
    assert store.offsets("t", 0) == before, "a refused append wrote something"
    result = store.append("t", 0, [_rec(b"a"), _rec(b"a")], expect=Expect(b"a", 0), atomic=True)
    assert (result.base_offset, result.last_offset) == (2, 3)
    assert store.key_head("t", 0, b"a") == 3
    assert store.key_head("t", 0, b"b") == 1
    assert store.key_head("t", 0, b"zzz") is None


def test_expect_lets_exactly_one_of_racing_threads_win(store: LogStore) -> None:
    store.create_topic("t", 1)
    winners: list[int] = []
    losers: list[int] = []
    barrier = threading.Barrier(8)

    def contend(n: int) -> None:
        barrier.wait()
        try:
            store.append("t", 0, [_rec(b"k", b"%d" % n)], expect=Expect(b"k", None))
            winners.append(n)
        except ConcurrencyError:
            losers.append(n)

    threads = [threading.Thread(target=contend, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(winners) == 1 and len(losers) == 7
    assert store.offsets("t", 0).hwm == 1


def test_read_key_returns_the_key_records_after_an_offset(store: LogStore) -> None:
    store.create_topic("t", 1)
    for i in range(30):
        store.append("t", 0, [_rec(b"k%d" % (i % 3), b"%d" % i)])
    records = store.read_key("t", 0, b"k1")
    assert [r.offset for r in records] == list(range(1, 30, 3))
    assert {r.key for r in records} == {b"k1"}
    assert [r.offset for r in store.read_key("t", 0, b"k1", after=13)] == [16, 19, 22, 25, 28]
    assert store.read_key("t", 0, b"k1", after=28) == []
    assert store.read_key("t", 0, b"nobody") == []
    # Appended by another log on the same directory (another process): seen as well.
    with LogStore(store.path) as other:
        other.append("t", 0, [_rec(b"k1", b"late")])
    assert store.read_key("t", 0, b"k1", after=28)[0].value == b"late"


def test_read_key_on_a_compacted_topic_gives_the_latest_record(store: LogStore) -> None:
    store.create_topic("c", 1, {"cleanup_policy": "compact"})
    for i in range(5):
        store.append("c", 0, [_rec(b"k", b"%d" % i), _rec(b"j", b"j%d" % i)])
    (latest,) = store.read_key("c", 0, b"k")
    assert (latest.offset, latest.value) == (8, b"4")


def test_wake_from_another_process_ends_a_wait(store: LogStore) -> None:
    seen = store.wait_seq()
    code = (
        f"from eventlane.log.embedded.store import LogStore; LogStore({str(store.path)!r}).wake()"
    )
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        store.wait(seen, timeout=60)
        waited = time.monotonic() - started
    finally:
        assert proc.wait(60) == 0
    assert store.wait_seq() != seen
    assert waited < 30, "the wait ran to its timeout: wake() did not reach it"


def test_maintenance_reports_progress_per_partition(store: LogStore) -> None:
    store.create_topic("c", 3, {"cleanup_policy": "compact,delete"})
    calls: list[tuple[int, int, int]] = []
    reports = store.compact("c", progress=lambda done, total, p: calls.append((done, total, p)))
    assert len(reports) == 3
    assert calls == [(1, 3, 0), (2, 3, 1), (3, 3, 2)]
    calls.clear()
    store.cleanup("c", progress=lambda done, total, p: calls.append((done, total, p)))
    assert calls == [(1, 3, 0), (2, 3, 1), (3, 3, 2)]
    calls.clear()
    assert store.verify("c", progress=lambda done, total, p: calls.append((done, total, p))) == []
    assert calls == [(1, 3, 0), (2, 3, 1), (3, 3, 2)]


def test_factory_opens_paths_and_file_urls(tmp_path: Path) -> None:
    with open_log(tmp_path / "a") as log:  # type: ignore[attr-defined]
        log.create_topic("t", 1)
    with open_log(f"file://{tmp_path / 'a'}") as log:  # type: ignore[attr-defined]
        assert log.list_topics() == ["t"]
    with open_engine(tmp_path / "a") as engine:
        assert engine.local == LocalDir(tmp_path / "a")
        assert isinstance(engine.groups, FileCoordination)
        assert engine.log.list_topics() == ["t"]


def test_factory_refuses_unknown_schemes_and_uses_registered_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no log engine for URL scheme 'bogus'.*file"):
        open_log("bogus://host:1/x")
    with pytest.raises(ConfigError, match="names no directory"):
        open_log("file://")
    opened: list[tuple[str, LocalDir]] = []

    def opener(url: str, local: LocalDir) -> Log:
        opened.append((url, local))
        return LogStore(local.root)

    register_engine("memtest", opener)
    with open_engine(tmp_path / "local", "memtest://somewhere") as engine:
        assert opened == [("memtest://somewhere", LocalDir(tmp_path / "local"))]
        assert engine.local.root == tmp_path / "local"


def test_file_coordination_needs_fenced_appends(tmp_path: Path) -> None:
    log = CoreOnly(tmp_path / "d")
    try:
        with pytest.raises(MissingRoleError, match=r"FencedLog role .*fenced appends") as info:
            FileCoordination(log)
        assert (info.value.engine, info.value.role) == ("CoreOnly", "FencedLog")
    finally:
        log.close()
