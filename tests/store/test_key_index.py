"""The key index is derived data: deleted, garbage, truncated, wrong or stale indexes are
rebuilt or detected, and loads stay correct. Also: a writer that died between its append
and its index update, the reader's overlay of an unindexed tail, and ``verify``."""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
from store_domain import Counter, Incremented, make_app
from store_helpers import close, read_line, send, spawn, stderr_of

from eventlane.app import Runtime
from eventlane.codec import Envelope
from eventlane.errors import ConcurrencyError
from eventlane.log.embedded import key_index
from eventlane.log.embedded.key_check import verify_index
from eventlane.log.embedded.key_index import DEFER_OFFSETS, READER_CATCH_UP, KeyIndex, index_path
from eventlane.log.embedded.store import LogStore
from eventlane.testing.logs import capture_logs

TOPIC = Counter.topic
AGGREGATES = 24
EVENTS = 120  # per aggregate: 24 * 120 = 2880 records, > READER_CATCH_UP per partition


def populate(data: Path, aggregates: int = AGGREGATES, events: int = EVENTS) -> None:
    """Counters ``c0..`` with ``events`` events each, saved 10 at a time, interleaved."""
    with make_app(data) as app:
        counters = [Counter(f"c{i}") for i in range(aggregates)]
        for _ in range(events // 10):
            for counter in counters:
                for _ in range(10):
                    counter.increment()
                app.save(counter)


def check_loads(app: Runtime, aggregates: int = AGGREGATES, events: int = EVENTS) -> None:
    for i in range(aggregates):
        counter = app.load(Counter, f"c{i}")
        assert (counter.version, counter.value) == (events, events)
    middle = events // 2 + 1
    assert app.load(Counter, "c0", version=middle).value == middle


def index_files(data: Path, topic: str = TOPIC) -> list[Path]:
    return sorted((data / "store" / topic).glob("*.keyindex.sqlite"))


def index_of(app: Runtime, partition: int) -> KeyIndex:
    """The embedded log's live key index of a partition of TOPIC."""
    assert isinstance(app.log, LogStore)
    return app.log.keys.index(TOPIC, partition)


def open_raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def verify_all(app: Runtime, topic: str = TOPIC) -> list[str]:
    problems: list[str] = []
    for partition in range(app.log.partition_count(topic)):
        problems.extend(app.store.verify_index(topic, partition).problems)
    return problems


def inspect(data: Path, partition: int, topic: str = TOPIC) -> list[str]:
    """``verify`` of an index as it is on disk (no repair on open), as the CLI runs it."""
    with make_app(data) as app:
        index = KeyIndex(
            app.log,
            topic,
            partition,
            index_path(data / "store", topic, partition),
            mode=None,
            auto_repair=False,
        )
        try:
            return list(verify_index(index).problems)
        finally:
            index.close()


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "data"
    populate(path)
    return path


@pytest.fixture
def data(tmp_path: Path, populated: Path) -> Path:
    """A copy of the populated data directory (closed: every index is checkpointed)."""
    path = tmp_path / "data"
    shutil.copytree(populated, path)
    return path


def test_a_healthy_index_verifies_clean(data: Path) -> None:
    with make_app(data) as app:
        reports = [app.store.verify_index(TOPIC, p) for p in range(2)]
        assert all(r.ok and r.unindexed == 0 for r in reports)
        assert sum(r.entries for r in reports) == AGGREGATES * EVENTS
        assert reports[0].next_offset == reports[0].hwm
        check_loads(app)


def test_deleted_index_files_are_rebuilt(data: Path) -> None:
    for path in index_files(data):
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
    with make_app(data) as app:
        check_loads(app)  # the first load catches up: the tail is longer than READER_CATCH_UP
        for partition in range(2):
            marks = app.log.offsets(TOPIC, partition)
            assert index_of(app, partition).next_offset() == marks.hwm
        assert verify_all(app) == []


def test_a_short_unindexed_tail_is_overlaid_then_indexed_by_the_next_save(tmp_path: Path) -> None:
    data = tmp_path / "data"
    populate(data, aggregates=4, events=20)
    for path in index_files(data):
        os.unlink(path)
    with make_app(data) as app:
        partition = app.store.partition_of(TOPIC, "c0")
        index = index_of(app, partition)
        check_loads(app, aggregates=4, events=20)
        assert index.next_offset() == 0  # readers overlaid the tail without writing
        app.execute(Counter, "c0", lambda c: c.increment())
        assert index.next_offset() == app.log.offsets(TOPIC, partition).hwm
        assert verify_all(app) == []


@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped page", "wrong schema"])
def test_an_unreadable_index_is_replaced_and_rebuilt(data: Path, damage: str) -> None:
    for path in index_files(data):
        size = path.stat().st_size
        assert size > 8192 and not Path(str(path) + "-wal").exists()  # closed: checkpointed
        if damage == "garbage":
            path.write_bytes(os.urandom(size))
        elif damage == "truncated":
            os.truncate(path, size // 2)
        elif damage == "flipped page":
            with open(path, "r+b") as f:
                f.seek(size // 2)
                f.write(os.urandom(4096))
        else:
            with open_raw(path) as db:
                db.execute("UPDATE meta SET value = 99 WHERE name = 'schema'")
    with capture_logs() as logs, make_app(data) as app:
        check_loads(app)
        assert verify_all(app) == []
    warnings = [e for e in logs if e["log_level"] == "warning" and "key index" in e["event"]]
    assert warnings, "the damage went unnoticed"


def test_wrong_rows_are_caught_on_open(data: Path) -> None:
    """Rows edited without their meta data: the row count or checksum gives them away."""
    path = index_files(data)[0]
    with open_raw(path) as db:
        db.execute(
            "UPDATE entries SET offset = offset + 1 WHERE key = ?",
            (db.execute("SELECT key FROM entries LIMIT 1").fetchone()[0],),
        )
    assert any("checksum" in p for p in inspect(data, 0))
    with capture_logs() as logs, make_app(data) as app:
        check_loads(app)
        assert verify_all(app) == []
    assert any("checksum" in e.get("reason", "") for e in logs)


def _tamper_consistently(path: Path, statement: str, *args: object) -> None:
    """Edit rows *and* fix the meta data, so the cheap checks on open pass."""
    with open_raw(path) as db:
        db.execute(statement, args)
        count, total = db.execute(
            "SELECT count(*), coalesce(sum(offset + seq), 0) FROM entries"
        ).fetchone()
        db.execute("UPDATE meta SET value = ? WHERE name = 'rows'", (count,))
        db.execute("UPDATE meta SET value = ? WHERE name = 'checksum'", (total,))


def test_wrong_rows_that_pass_the_open_checks_are_caught_by_reads(data: Path) -> None:
    with make_app(data) as app:
        partition = app.store.partition_of(TOPIC, "c5")
    path = index_files(data)[partition]
    # c5's rows now point at the records just after its own (another aggregate's, mostly).
    _tamper_consistently(path, "UPDATE entries SET offset = offset + 1 WHERE key = ?", b"c5")
    problems = inspect(data, partition)
    assert any("b'c5'" in p for p in problems), problems
    with capture_logs() as logs, make_app(data) as app:
        check_loads(app)  # the read sees the wrong records, rebuilds the index, reads again
        assert verify_all(app) == []
    assert any("disagrees with the log" in e["event"] for e in logs)


def test_wrong_rows_never_fool_the_version_check(data: Path) -> None:
    """An index that lost c7's first row and renumbered the rest (meta data fixed, so the
    open checks pass) claims c7 is at version EVENTS - 1. A save expecting that version
    would fork the history; the version check reads c7's last record, sees version EVENTS,
    rebuilds the index and refuses it. The right save is accepted."""
    with make_app(data) as app:
        partition = app.store.partition_of(TOPIC, "c7")
    path = index_files(data)[partition]
    _tamper_consistently(path, "DELETE FROM entries WHERE key = ? AND seq = 1", b"c7")
    _tamper_consistently(path, "UPDATE entries SET seq = seq - 1 WHERE key = ?", b"c7")
    with make_app(data) as app:
        assert index_of(app, partition).head(b"c7") == EVENTS - 1
        envelope = Envelope(Incremented(1), "c7", EVENTS)
        with pytest.raises(ConcurrencyError) as info:
            app.store.append(TOPIC, "c7", EVENTS - 1, [envelope])
        assert (info.value.expected, info.value.actual) == (EVENTS - 1, EVENTS)
        app.execute(Counter, "c7", lambda c: c.increment())
        assert app.load(Counter, "c7").version == EVENTS + 1
        assert verify_all(app) == []


def test_missing_trailing_rows_are_reported_by_verify_and_repaired(data: Path) -> None:
    """The one edit the cheap checks cannot see (rows removed, meta fixed): ``verify``
    reports it, and a rebuild repairs it."""
    with make_app(data) as app:
        partition = app.store.partition_of(TOPIC, "c9")
    path = index_files(data)[partition]
    _tamper_consistently(path, "DELETE FROM entries WHERE key = ? AND seq > ?", b"c9", EVENTS - 5)
    problems = inspect(data, partition)
    assert len([p for p in problems if "missing from the index" in p]) == 5, problems
    with make_app(data) as app:
        assert app.store.rebuild_index(TOPIC, partition) > 0
        assert verify_all(app) == []
        check_loads(app)


def test_an_index_of_another_incarnation_of_the_topic_is_discarded(data: Path) -> None:
    saved = data.parent / "old-store"
    shutil.copytree(data / "store", saved)
    with make_app(data) as app:
        app.log.delete_topic(TOPIC)
    populate(data, aggregates=3, events=10)  # recreates the topic: much shorter partitions
    shutil.rmtree(data / "store" / TOPIC)
    shutil.copytree(saved / TOPIC, data / "store" / TOPIC)  # the old index comes back
    with capture_logs() as logs, make_app(data) as app:
        check_loads(app, aggregates=3, events=10)
        with pytest.raises(LookupError):
            app.load(Counter, "c20")
        assert verify_all(app) == []
    assert any("past the log" in e.get("reason", "") for e in logs)


def test_a_writer_killed_between_append_and_index_update(data: Path) -> None:
    with make_app(data) as app:
        partition = app.store.partition_of(TOPIC, "c2")
        indexed_before = index_of(app, partition).next_offset()
    proc = spawn("die_before_index", data=str(data), aggregate="c2", by=1000)
    try:
        proc.wait(timeout=120)
        assert proc.returncode == -9, stderr_of(proc)
    finally:
        close(proc)
    with make_app(data) as app:
        index = index_of(app, partition)
        hwm = app.log.offsets(TOPIC, partition).hwm
        assert index.next_offset() == indexed_before == hwm - 1  # appended, never indexed
        counter = app.load(Counter, "c2")  # the overlay of the unindexed tail finds it
        assert (counter.version, counter.value) == (EVENTS + 1, EVENTS + 1000)
        assert index.next_offset() == indexed_before
        app.execute(Counter, "c2", lambda c: c.increment())  # the next save indexes it
        assert index.next_offset() == hwm + 1
        assert app.load(Counter, "c2").version == EVENTS + 2
        assert verify_all(app) == []


def test_a_long_unindexed_tail_is_indexed_by_the_reader(tmp_path: Path) -> None:
    """Records appended behind the index's back (by a log that never opened it) beyond
    READER_CATCH_UP: the next load indexes them instead of scanning them on every load."""
    data = tmp_path / "data"
    with make_app(data, partitions=1) as app:
        counter = Counter("seed")
        counter.increment()
        app.save(counter)
        index = index_of(app, 0)
        records = []
        for version in range(1, READER_CATCH_UP + 100):
            key, value, headers = app.codec.encode(Envelope(Incremented(1), "raw", version))
            records.append((key, value, tuple(headers), None))
        with LogStore(data) as other:  # another process's log: it does not index them
            other.append(TOPIC, 0, records)
        assert index.next_offset() == 1
        assert app.load(Counter, "raw").version == READER_CATCH_UP + 99
        assert index.next_offset() == READER_CATCH_UP + 100
        assert app.store.verify_index(TOPIC, 0).ok


def test_two_connections_keep_one_index_right(tmp_path: Path) -> None:
    """Each key index object caches ``next_offset`` and key heads; another connection's
    writes (a second runtime on the same directory, its own SQLite connection) must drop
    that cache, else the first would number its next rows from stale heads. Saves from both,
    interleaved on the same counters: every version check is right and the index verifies
    clean (no row renumbered, none dropped)."""
    data = tmp_path / "data"
    with (
        make_app(data) as first,
        make_app(data) as second,
        capture_logs() as logs,
    ):
        for round_ in range(3):
            for name in ("c1", "c2"):
                for app in (first, second):
                    app.execute(Counter, name, lambda c: c.increment(), create=True)
            stale = first.load(Counter, "c1")
            second.execute(Counter, "c1", lambda c: c.increment())
            stale.increment()
            with pytest.raises(ConcurrencyError):
                first.save(stale)
            assert first.load(Counter, "c1").version == 3 * (round_ + 1)
        for app in (first, second):
            assert verify_all(app) == []
            assert (app.load(Counter, "c2").version, app.load(Counter, "c1").version) == (6, 9)
    # no index reset, no repair (warnings); catching up on the other's writes is info
    assert [e for e in logs if e["log_level"] not in ("debug", "info")] == []


def file_next_offset(data: Path, partition: int = 0) -> int:
    """``next_offset`` as the index file says (not as a live index object knows it)."""
    db = open_raw(index_path(data / "store", TOPIC, partition))
    try:
        return int(db.execute("SELECT value FROM meta WHERE name='next_offset'").fetchone()[0])
    finally:
        db.close()


def test_held_rows_count_for_another_process_and_reach_the_file_on_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An appender with no competitor holds its index rows back (fewer than DEFER_OFFSETS
    offsets; the flusher thread told to wait a minute): the file lags, yet another process's
    version check counts those records (it indexes them from the log), and this runtime's
    next check counts the other's. Closing writes what is still held: the file then covers
    the log and verifies clean."""
    monkeypatch.setattr(key_index, "FLUSH_AFTER_S", 60.0)
    data = tmp_path / "data"
    with make_app(data, partitions=1) as app:
        for _ in range(5):
            app.execute(Counter, "c1", lambda c: c.increment(), create=True)
        hwm = app.log.offsets(TOPIC, 0).hwm
        assert hwm == 5 and file_next_offset(data) < hwm  # held back, in this object only
        assert index_of(app, 0).view(b"c1").offsets == list(range(5))  # ... and seen here
        with make_app(data, partitions=1) as other:  # another connection reads them too
            assert other.load(Counter, "c1").version == 5
        child = spawn("execute", data=str(data), partitions=1, aggregate="c1", count=3, writer="w")
        try:
            assert read_line(child) == "R"
            send(child, "go")
            done = read_line(child).split()
            assert done[:2] == ["D", "3"], stderr_of(child)  # no conflict: it counted ours
            child.wait(timeout=60)
        finally:
            close(child)
        app.execute(Counter, "c1", lambda c: c.increment())  # and ours counts the child's
        counter = app.load(Counter, "c1")
        assert (counter.version, counter.value) == (9, 9)
        for _ in range(DEFER_OFFSETS + 3):  # past the bound: written while the app runs
            app.execute(Counter, "c2", lambda c: c.increment(), create=True)
        assert file_next_offset(data) >= app.log.offsets(TOPIC, 0).hwm - DEFER_OFFSETS
        hwm = app.log.offsets(TOPIC, 0).hwm
    assert file_next_offset(data) == hwm
    with make_app(data, partitions=1) as app:
        assert verify_all(app) == []


def test_an_appender_of_new_keys_holds_its_rows_back_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An appender that writes a new key each time (a web service placing orders: its key
    cache never answers) holds its rows back like one that reuses keys (before, it wrote
    each append's rows in a transaction of their own); another process still counts them,
    and the runtime's own reads and checks see them."""
    monkeypatch.setattr(key_index, "FLUSH_AFTER_S", 60.0)
    data = tmp_path / "data"
    with make_app(data, partitions=1) as app:
        for i in range(6):
            app.execute(Counter, f"n{i}", lambda c: c.increment(), create=True)
        hwm = app.log.offsets(TOPIC, 0).hwm
        assert hwm == 6 and file_next_offset(data) < hwm - 1  # held back after the first
        assert [app.load(Counter, f"n{i}").version for i in range(6)] == [1] * 6
        stale = app.load(Counter, "n3")
        app.execute(Counter, "n3", lambda c: c.increment())
        stale.increment()
        with pytest.raises(ConcurrencyError):
            app.save(stale)
        child = spawn("execute", data=str(data), partitions=1, aggregate="n4", count=2, writer="w")
        try:
            assert read_line(child) == "R"
            send(child, "go")
            done = read_line(child).split()
            assert done[:2] == ["D", "2"], stderr_of(child)  # it counted ours
            child.wait(timeout=60)
        finally:
            close(child)
        assert app.load(Counter, "n4").version == 3
        assert app.load(Counter, "n3").version == 2
        app.execute(Counter, "n9", lambda c: c.increment(), create=True)
        hwm = app.log.offsets(TOPIC, 0).hwm
    assert file_next_offset(data) == hwm
    with make_app(data, partitions=1) as app:
        assert verify_all(app) == []


def test_held_rows_reach_the_file_soon_after_the_appender_goes_quiet(tmp_path: Path) -> None:
    """No append follows, the runtime stays open: the flusher thread writes the held rows
    (FLUSH_AFTER_S after the first), so other processes' loads need not scan the log's tail."""
    data = tmp_path / "data"
    with make_app(data, partitions=1) as app:
        for _ in range(5):
            app.execute(Counter, "c1", lambda c: c.increment(), create=True)
        deadline = time.monotonic() + 30
        while file_next_offset(data) < 5:
            assert time.monotonic() < deadline, "held rows never reached the file"
            time.sleep(0.01)
        assert index_of(app, 0).view(b"c1").offsets == list(range(5))
        app.execute(Counter, "c1", lambda c: c.increment())  # holding goes on afterwards
        assert app.load(Counter, "c1").version == 6
    assert file_next_offset(data) == 6


def test_held_rows_of_a_deleted_topic_are_dropped_quietly(tmp_path: Path) -> None:
    """The topic is deleted while rows are held: neither the flusher thread nor closing
    fails on the partition that is gone (nothing is logged above debug)."""
    data = tmp_path / "data"
    with capture_logs() as logs:
        app = make_app(data, partitions=1)
        for _ in range(3):
            app.execute(Counter, "c1", lambda c: c.increment(), create=True)
        app.log.delete_topic(TOPIC)
        time.sleep(key_index.FLUSH_AFTER_S * 4)  # the flusher's turn comes and goes
        app.close()
    assert [e for e in logs if e["log_level"] not in ("debug", "info")] == []


def test_held_rows_of_a_killed_appender_are_indexed_from_the_log(tmp_path: Path) -> None:
    """kill -9 of an appender holding rows back: the file lacks them; loads overlay the
    log's tail, the next save indexes it, and the index verifies clean."""
    data = tmp_path / "data"
    with make_app(data, partitions=1) as app:
        app.execute(Counter, "c1", lambda c: c.increment(), create=True)
    proc = spawn("hold_then_die", data=str(data), partitions=1, aggregate="c1", count=10)
    try:
        assert read_line(proc) == "H"
        proc.wait(timeout=60)
        assert proc.returncode == -9, stderr_of(proc)
    finally:
        close(proc)
    assert file_next_offset(data) < 11  # the dead process's held rows never reached it
    with make_app(data, partitions=1) as app:
        assert app.load(Counter, "c1").version == 11
        app.execute(Counter, "c1", lambda c: c.increment())
        assert (app.load(Counter, "c1").version, app.load(Counter, "c1").value) == (12, 12)
        assert verify_all(app) == []
