"""Snapshots: written every N events to a compacted topic, used by loads (which then read
far fewer records), and ignored (never misread) when stale, undecodable or ahead."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
from store_domain import Counter, CountingLog, Incremented, SnapCounter, make_app, raw_streams

from eventlane.app import Runtime
from eventlane.domain import Snapshot, applies
from eventlane.store.repository import snapshot_topic
from eventlane.testing.logs import capture_logs

SNAPSHOTS = snapshot_topic(SnapCounter.topic)


class DoubleCounter(SnapCounter):
    """The "next release" of SnapCounter: same topic and events, but ``value`` now counts
    double, so its snapshot schema version is bumped. A v1 snapshot read as v2 would give a
    wrong value."""

    snapshot_version: ClassVar[int] = 2

    @applies(Incremented)
    def _incremented(self, e: Incremented) -> None:
        self.value += 2 * e.by


def increment(app: Runtime, cls: type[Counter], aggregate_id: str, times: int) -> None:
    for _ in range(times):
        app.execute(cls, aggregate_id, lambda c: c.increment(), create=True)


def snapshot_docs(app: Runtime, aggregate_id: str) -> list[dict[str, object]]:
    return raw_streams(app.log, SNAPSHOTS).get(aggregate_id, [])


@pytest.fixture
def counting(tmp_path: Path) -> CountingLog:
    return CountingLog(tmp_path / "data")


def test_snapshot_every_n_events_and_loads_read_fewer_records(counting: CountingLog) -> None:
    # the stream cache off: it would serve the plain load again without reading anything
    with make_app(counting, cache_events=0) as app:  # type: ignore[arg-type]
        increment(app, SnapCounter, "s", 95)
        increment(app, Counter, "plain", 95)
        assert [d["aggregate_version"] for d in snapshot_docs(app, "s")] == list(range(10, 100, 10))
        assert app.log.topic_config(SNAPSHOTS).cleanup_policy == "compact"

        counting.reset_counts()
        plain = app.load(Counter, "plain")
        plain_records = counting.records_read
        counting.reset_counts()
        snapped = app.load(SnapCounter, "s")
        snapped_records = counting.records_read
    assert (plain.version, plain.value) == (snapped.version, snapped.value) == (95, 95)
    assert plain_records >= 95
    assert snapped_records <= 1 + 5, "a snapshot load reads the snapshot and 5 events"


def test_load_at_a_version_with_snapshots(tmp_path: Path) -> None:
    with make_app(tmp_path / "data") as app:
        increment(app, SnapCounter, "s", 35)
        for version in (1, 9, 10, 11, 20, 29, 30, 35):
            counter = app.load(SnapCounter, "s", version=version)
            assert (counter.version, counter.value) == (version, version)


def test_a_stale_snapshot_schema_is_ignored_and_rebuilt(counting: CountingLog) -> None:
    with make_app(counting, cache_events=0) as app:  # type: ignore[arg-type]
        increment(app, SnapCounter, "s", 25)
        assert app.load(SnapCounter, "s").value == 25
        counter = app.load(DoubleCounter, "s")  # the new release reads the old history
        assert (counter.version, counter.value) == (25, 50)  # never 20 + 2 * 5
        latest = snapshot_docs(app, "s")[-1]
        assert (latest["snapshot_version"], latest["aggregate_version"]) == (2, 25)

        counting.reset_counts()
        again = app.load(DoubleCounter, "s")  # from the rebuilt snapshot
        assert (again.version, again.value, counting.records_read) == (25, 50, 1)
        increment(app, DoubleCounter, "s", 5)
        assert snapshot_docs(app, "s")[-1]["aggregate_version"] == 30
        assert app.load(DoubleCounter, "s").value == 60


def test_an_undecodable_snapshot_is_ignored(tmp_path: Path) -> None:
    with make_app(tmp_path / "data") as app:
        increment(app, SnapCounter, "s", 12)
        partition = app.store.partition_of(SNAPSHOTS, "s")
        app.log.append(SNAPSHOTS, partition, [(b"s", b"{not json", (), None)])
        with capture_logs() as logs:
            counter = app.load(SnapCounter, "s")
        assert (counter.version, counter.value) == (12, 12)
        (warning,) = [e for e in logs if e["event"] == "undecodable snapshot ignored"]
        assert "not valid JSON" in warning["error"]
        assert snapshot_docs_count(app, "s") == 3  # 10, garbage, and a fresh one at 12


def snapshot_docs_count(app: Runtime, aggregate_id: str) -> int:
    total = 0
    for partition in range(app.log.partition_count(SNAPSHOTS)):
        offset, cursor = 0, None
        hwm = app.log.offsets(SNAPSHOTS, partition).hwm
        while offset < hwm:
            records, cursor = app.log.read(SNAPSHOTS, partition, offset, cursor=cursor)
            total += sum(r.key == aggregate_id.encode() for r in records)
            offset = records[-1].offset + 1
    return total


def test_a_snapshot_ahead_of_its_stream_is_ignored(tmp_path: Path) -> None:
    """E.g. the event topic was recreated while its snapshots stayed."""
    with make_app(tmp_path / "data") as app:
        increment(app, SnapCounter, "s", 12)
        ahead = Snapshot("s", 500, 1, {"value": 500})
        record = app.repository.snapshots.encode(SnapCounter, ahead)
        partition = app.store.partition_of(SNAPSHOTS, "s")
        app.log.append(
            SNAPSHOTS, partition, [(record.key, record.value, tuple(record.headers), None)]
        )
        counter = app.load(SnapCounter, "s")
        assert (counter.version, counter.value) == (12, 12)
        assert snapshot_docs(app, "s")[-1]["aggregate_version"] == 12


def test_the_snapshot_topic_is_compacted(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with make_app(data) as app:
        # Small segments so compaction has closed segments to work on.
        app.log.create_topic(SNAPSHOTS, 2, {"cleanup_policy": "compact", "segment_bytes": 2048})
        for name in ("a", "b", "c"):
            increment(app, SnapCounter, name, 100)
        before = sum(len(snapshot_docs(app, n)) for n in "abc")
        assert before == 30
        reports = app.log.compact(SNAPSHOTS)
        after = {n: snapshot_docs(app, n) for n in "abc"}
        assert sum(len(docs) for docs in after.values()) < before
        removed = sum(r.records_scanned - r.records_kept for r in reports)
        assert removed == before - sum(map(len, after.values()))
        for name, docs in after.items():
            assert docs[-1]["aggregate_version"] == 100  # the latest always survives
            counter = app.load(SnapCounter, name)
            assert (counter.version, counter.value) == (100, 100)
        for partition in range(2):
            assert app.store.verify_index(SNAPSHOTS, partition).ok
    with make_app(data) as app:  # reopened after compaction: the index still checks out
        increment(app, SnapCounter, "a", 10)
        assert app.load(SnapCounter, "a").value == 110
        assert snapshot_docs(app, "a")[-1]["aggregate_version"] == 110


def test_a_deleted_snapshot_index_is_rebuilt(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with make_app(data) as app:
        increment(app, SnapCounter, "s", 42)
    for path in (data / "store" / SNAPSHOTS).glob("*.keyindex.sqlite"):
        path.unlink()
    with make_app(data) as app:
        counter = app.load(SnapCounter, "s")
        assert (counter.version, counter.value) == (42, 42)
        increment(app, SnapCounter, "s", 8)
        assert snapshot_docs(app, "s")[-1]["aggregate_version"] == 50
        for partition in range(2):
            assert app.store.verify_index(SNAPSHOTS, partition).ok
