"""The log's seams (issue 10 item 4): segment-list ownership, compaction that merges small
segments, maintenance progress and scheduling owned by the log, and the one flock helper."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import eventlane.log
from eventlane._locks import FileLock
from eventlane.cli import main
from eventlane.log import LogStore
from eventlane.log.embedded.cleaner import plan_groups
from eventlane.log.embedded.segment import Segment, list_segments


def _segments(store: LogStore, topic: str) -> list[int]:
    return [s.base for s in list_segments(store.path / "topics" / topic / "0")]


def _values(store: LogStore, topic: str) -> dict[bytes, bytes | None]:
    out: dict[bytes, bytes | None] = {}
    offset = store.offsets(topic, 0).lwm
    while True:
        records, _ = store.read(topic, 0, offset)
        if not records:
            return out
        for r in records:
            assert r.key is not None
            out[r.key] = r.value
        offset = records[-1].offset + 1


def _tiny_segments(store: LogStore, topic: str, count: int) -> None:
    """``count`` closed one-batch segments (rolled by hand) and an active one."""
    for i in range(count):
        store.append(topic, 0, [(b"k%d" % (i % 3), b"v%d" % i, (), None)])
        store.partition(topic, 0).roll()
    store.append(topic, 0, [(b"k0", b"active", (), None)])


def test_cli_compact_merges_tiny_segments(data_dir: Path) -> None:
    with LogStore(data_dir) as store:
        store.create_topic("c", 1, {"cleanup_policy": "compact", "min_compaction_lag_ms": 0})
        _tiny_segments(store, "c", 9)
        assert len(_segments(store, "c")) == 10
        before = _values(store, "c")
    runner = CliRunner(env={"EVENTLANE_DATA": None, "EVENTLANE_LOG_LEVEL": None})
    result = runner.invoke(
        main, ["--data", str(data_dir), "compact", "c", "--json"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert '"segments_before": 9' in result.stdout and '"segments_after": 1' in result.stdout
    with LogStore(data_dir) as store:
        assert len(_segments(store, "c")) == 2  # one cleaned segment + the active one
        assert _values(store, "c") == before


def test_cleaner_groups_by_pre_cleaning_size_so_small_results_merge_next_pass(
    store: LogStore,
) -> None:
    """A full segment cleaned small cannot merge in the pass that shrank it (groups are
    planned from pre-cleaning sizes, so a group always fits), only in the next one."""
    store.create_topic(
        "g", 1, {"cleanup_policy": "compact", "min_compaction_lag_ms": 0, "segment_bytes": 600}
    )
    for i in range(40):  # one key rewritten: every full segment cleans down to <= 1 record
        store.append("g", 0, [(b"same", b"x" * 40 + b"%d" % i, (), None)])
    closed_before = len(_segments(store, "g")) - 1
    assert closed_before >= 4
    first = store.compact("g")[0]
    assert first.segments_before == closed_before
    assert first.segments_after == closed_before - 0  # none merged: each was full before
    second = store.compact("g")[0]
    assert second.segments_after == 1  # the now tiny segments merge
    assert _values(store, "g") == {b"same": b"x" * 40 + b"39"}
    assert plan_groups([(0, 600), (10, 600)], 600) == [[0], [10]]
    assert plan_groups([(0, 60), (10, 60)], 600) == [[0, 10]]


def test_maintenance_progress_callback(store: LogStore) -> None:
    store.create_topic("p", 3, {"cleanup_policy": "compact,delete", "retention_ms": 1})
    calls: list[tuple[int, int, int]] = []
    store.compact("p", progress=lambda *args: calls.append(args))
    assert calls == [(1, 3, 0), (2, 3, 1), (3, 3, 2)]
    calls.clear()
    store.cleanup("p", progress=lambda *args: calls.append(args))
    assert calls == [(1, 3, 0), (2, 3, 1), (3, 3, 2)]


def test_request_compaction_runs_in_the_background(store: LogStore) -> None:
    store.create_topic("r", 1, {"cleanup_policy": "compact", "min_compaction_lag_ms": 0})
    _tiny_segments(store, "r", 6)
    store.request_compaction("r", 0)
    store.request_compaction("r", 0)  # coalesces with the queued one
    assert store._cleaner.idle(30.0)
    assert len(_segments(store, "r")) == 2
    assert _values(store, "r") == {b"k0": b"active", b"k1": b"v4", b"k2": b"v5"}


def test_segment_owns_its_three_files(tmp_path: Path) -> None:
    seg = Segment(tmp_path, 42)
    seg.create()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "00000000000000000042.index",
        "00000000000000000042.log",
        "00000000000000000042.timeindex",
    ]
    for staged in seg.files(".cleaned"):
        staged.write_bytes(b"new")
    seg.install(".cleaned")
    assert seg.log.read_bytes() == b"new" and not any(tmp_path.glob("*.cleaned"))
    seg.delete()
    assert list(tmp_path.iterdir()) == []


def test_log_modules_form_no_cycle() -> None:
    """partition -> recovery -> segment; cleaner and retention import partition, never the
    reverse, and nothing hides an import under TYPE_CHECKING."""
    root = Path(eventlane.log.__file__).parent / "embedded"
    for name in ("partition", "recovery", "segment", "state", "../files", "batch"):
        text = (root / f"{name}.py").read_text()
        assert "eventlane.log.embedded.cleaner" not in text, name
        assert "eventlane.log.embedded.retention" not in text, name
    for name in ("cleaner", "retention", "partition", "recovery"):
        assert "TYPE_CHECKING" not in (root / f"{name}.py").read_text(), name


# ------------------------------------------------------------------------------ FileLock
_HOLD = """
import sys, time
from pathlib import Path
from eventlane._locks import FileLock
lock = FileLock(Path(sys.argv[1]))
lock.acquire()
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _holder(path: Path, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_file_lock_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    lock = FileLock(path)
    proc = _holder(path, 30)
    try:
        assert not lock.acquire(blocking=False)
        started = time.monotonic()
        assert not lock.acquire(timeout=0.2)
        assert time.monotonic() - started >= 0.2
        proc.kill()  # a flock dies with its process
        proc.wait()
        assert lock.acquire(timeout=10)
        lock.release()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        lock.close()


def test_file_lock_is_reentrant_per_object_and_exclusive_between_threads(tmp_path: Path) -> None:
    lock = FileLock(tmp_path / "lock")
    with lock:
        with lock.hold() as held:  # the same thread again
            assert held
        assert lock.held
        got: list[bool] = []
        t = threading.Thread(target=lambda: got.append(lock.acquire(blocking=False)))
        t.start()
        t.join()
        assert got == [False]
        other = FileLock(tmp_path / "lock")  # another open file description: excluded
        assert not other.acquire(blocking=False)
        other.close()
    assert not lock.held
    assert lock.release_fd()
    with lock.hold(blocking=False) as held:
        assert held


def test_file_lock_follows_a_replaced_file(tmp_path: Path) -> None:
    path = tmp_path / "d" / "lock"
    lock = FileLock(path, follow_replacement=True)
    with lock:
        pass
    path.unlink()  # the directory was deleted and re-created meanwhile
    path.write_bytes(b"")
    with lock:
        assert path.stat().st_ino == os.fstat(lock._fd).st_ino
    lock.close()


@pytest.mark.parametrize("timeout", [0.0, 0.05])
def test_file_lock_timeout_zero_or_small_when_free(tmp_path: Path, timeout: float) -> None:
    lock = FileLock(tmp_path / "lock")
    assert lock.acquire(timeout=timeout)
    lock.release()
    lock.close()
