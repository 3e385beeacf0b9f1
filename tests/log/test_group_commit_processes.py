"""Group commit across processes: records in flight between their write and their fsync.

An appender writes its batch under the partition's append lock and lets go of it; the fsync
happens under ``sync.lock``, where one fsync covers every batch written so far (see
eventlane/log/embedded/partition.py). These tests hold ``sync.lock`` from the test process (a real
``flock``) to freeze appenders in other processes between their write and their fsync, and
check what the contract says about that moment, then let a crowd of processes append and
count their fsyncs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlane.log import LogStore
from eventlane.log.types import Expect

TOPIC = "gc"
ROOT = Path(__file__).resolve().parents[2]

_CHILD = textwrap.dedent(
    """
    import errno, json, os, sys
    from eventlane.errors import ConcurrencyError, PartitionReadOnlyError
    from eventlane.log import LogStore
    from eventlane.log.types import Expect
    from eventlane.observability import configure_logging

    configure_logging("warning")  # logs on stderr; stdout carries only the protocol
    data, key, count, expect_none = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    syncs = 0
    real = os.fdatasync

    def counted(fd):
        global syncs
        syncs += 1
        if os.environ.get("FAIL_SYNC"):
            raise OSError(errno.EIO, "Input/output error (injected)")
        real(fd)

    os.fdatasync = counted
    with LogStore(data) as log:
        log.offsets("gc", 0)  # opened now (an opener finishes others' in-flight fsyncs)
        print("ready", flush=True)
        sys.stdin.readline()
        offsets = []
        last = None
        try:
            for i in range(count):
                expect = Expect(key.encode(), None if expect_none == "1" else last)
                result = log.append("gc", 0, [(key.encode(), b"%d" % i, (), None)], expect=expect)
                last = result.last_offset
                offsets.append(last)
            print(json.dumps({"offsets": offsets, "syncs": syncs}), flush=True)
        except ConcurrencyError as exc:
            print(json.dumps({"conflict": exc.actual}), flush=True)
        except PartitionReadOnlyError:
            print(json.dumps({"refused": offsets, "syncs": syncs}), flush=True)
    """
)


def _child(
    data: Path, key: str, count: int, *, expect_none: bool = False, fail_sync: bool = False
) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if fail_sync:
        env["FAIL_SYNC"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(data), key, str(count), "1" if expect_none else "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _go(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.flush()


def _result(proc: subprocess.Popen[str], timeout: float = 60.0) -> dict[str, object]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    proc.wait(timeout=timeout)
    result: dict[str, object] = json.loads(line)
    return result


def _stop(*procs: subprocess.Popen[str]) -> None:
    """Kill what is still running (a failed test), stopped children included."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()


def _wait_for(predicate: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def _topic(tmp_path: Path) -> Path:
    """A data directory holding the tests' topic (one partition)."""
    data = tmp_path / "data"
    with LogStore(data) as log:
        log.create_topic(TOPIC, 1)
    return data


def _contend(data: Path) -> None:
    """Leave the hint an appender leaves when it finds the append lock taken: the next
    appender writes, lets go of the lock and then fsyncs (under sync.lock), as it does while
    appenders queue, instead of fsyncing while it holds the lock (state byte 112, ms of
    CLOCK_MONOTONIC, which every process shares). Dated a minute ahead, so that a child slow
    to start its append under load still finds it fresh (the window is 200 ms)."""
    with open(data / "topics" / TOPIC / "0" / "state", "r+b") as f:
        f.seek(112)
        f.write(struct.pack("<Q", time.monotonic_ns() // 1_000_000 + 60_000))


def _append_lock_free(data: Path) -> bool:
    fd = os.open(data / "topics" / TOPIC / "0" / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing drops the flock
    return True


def _in_flight(log: LogStore, data: Path, proc: subprocess.Popen[str], leo: int, who: str) -> None:
    """Let ``proc`` append as a queued appender does (:func:`_contend`) and wait until its
    record is written (the LEO is ``leo``) but, ``sync.lock`` being held, not durable."""
    _contend(data)
    _go(proc)
    _wait_for(lambda: log.offsets(TOPIC, 0).leo == leo, f"{who} record is in flight")


@contextlib.contextmanager
def _append_lock_held(data: Path) -> Iterator[None]:
    """The partition's append lock, flock()ed by this process, as an appender holds it."""
    fd = os.open(data / "topics" / TOPIC / "0" / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the flock


class _SyncLockHeld:
    """The partition's ``sync.lock``, flock()ed by this process: no appender can fsync."""

    def __init__(self, data: Path) -> None:
        self.fd = os.open(data / "topics" / TOPIC / "0" / "sync.lock", os.O_RDWR | os.O_CREAT)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def release(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def test_in_flight_records_are_unread_counted_by_conditional_appends_then_durable(
    tmp_path: Path,
) -> None:
    data = _topic(tmp_path)
    with LogStore(data) as log:
        log.append(TOPIC, 0, [(b"other", b"x", (), None)])
    held = _SyncLockHeld(data)
    writer = _child(data, "k", 1, expect_none=True)
    rival = _child(data, "k", 1, expect_none=True)
    try:
        with LogStore(data) as log:
            _in_flight(log, data, writer, 2, "the writer's")  # offset 1, waits for sync.lock
            marks = log.offsets(TOPIC, 0)
            assert (marks.hwm, marks.leo) == (1, 2)
            records, _ = log.read(TOPIC, 0, 0)
            assert [r.offset for r in records] == [0]  # readers never see it
            assert log.key_head(TOPIC, 0, b"k") is None
            _go(rival)  # expects no record of k yet: must lose to the in-flight one
            time.sleep(0.5)
            assert writer.poll() is None and rival.poll() is None  # neither acknowledged
            assert log.offsets(TOPIC, 0).leo == 2  # the rival wrote nothing
            held.release()
            assert _result(writer) == {"offsets": [1], "syncs": 1}
            assert _result(rival) == {"conflict": 1}  # it saw offset 1, durable by then
            records, _ = log.read(TOPIC, 0, 0)
            assert [(r.offset, r.key) for r in records] == [(0, b"other"), (1, b"k")]
            assert log.key_head(TOPIC, 0, b"k") == 1
    finally:
        _stop(writer, rival)


def test_a_writer_killed_before_its_fsync_leaves_records_the_next_opener_makes_durable(
    tmp_path: Path,
) -> None:
    data = _topic(tmp_path)
    held = _SyncLockHeld(data)
    writer = _child(data, "k", 1, expect_none=True)
    try:
        with LogStore(data) as log:
            _in_flight(log, data, writer, 1, "the writer's")
            os.kill(writer.pid, signal.SIGKILL)  # never acknowledged
            writer.wait(timeout=30)
            assert log.offsets(TOPIC, 0).hwm == 0
        held.release()
        with LogStore(data) as log:  # a new process-level opener: fsyncs and publishes it
            marks = log.offsets(TOPIC, 0)
            assert (marks.hwm, marks.leo) == (1, 1)
            records, _ = log.read(TOPIC, 0, 0)
            assert [(r.offset, r.key, r.value) for r in records] == [(0, b"k", b"0")]
            # and the next conditional append counts it
            log.append(TOPIC, 0, [(b"k", b"1", (), None)], expect=Expect(b"k", 0))
            assert log.key_head(TOPIC, 0, b"k") == 1
    finally:
        _stop(writer)


def test_a_failed_fsync_in_one_process_acknowledges_no_in_flight_record_of_another(
    tmp_path: Path,
) -> None:
    """A's record is in flight (A is stopped while it waits for sync.lock); B writes after it
    and B's fsync fails (EIO injected): B throws every in-flight record away, and A, let go,
    gets an error instead of an acknowledgement. Nothing of either is ever read."""
    data = _topic(tmp_path)
    held = _SyncLockHeld(data)
    a = _child(data, "a", 1, expect_none=True)
    b = _child(data, "b", 1, expect_none=True, fail_sync=True)
    try:
        with LogStore(data) as log:
            _in_flight(log, data, a, 1, "A's")
            _wait_for(lambda: _append_lock_free(data), "A let go of the append lock")
            os.kill(a.pid, signal.SIGSTOP)  # it cannot take sync.lock when we let go
            _in_flight(log, data, b, 2, "B's")
            held.release()
            assert _result(b) == {"refused": [], "syncs": 1}
            os.kill(a.pid, signal.SIGCONT)
            assert _result(a) == {"refused": [], "syncs": 0}  # epoch moved: never acked
        with LogStore(data) as log:  # recovered from the files: the tail was cut
            marks = log.offsets(TOPIC, 0)
            assert (marks.hwm, marks.leo) == (0, 0)
            result = log.append(TOPIC, 0, [(b"c", b"x", (), None)], expect=Expect(b"c", None))
            assert result.base_offset == 0
            records, _ = log.read(TOPIC, 0, 0)
            assert [(r.offset, r.key) for r in records] == [(0, b"c")]
            assert log.key_head(TOPIC, 0, b"a") is None and log.key_head(TOPIC, 0, b"b") is None
    finally:
        _stop(a, b)


def test_processes_share_fsyncs_and_every_acknowledged_record_is_where_it_was_told(
    tmp_path: Path,
) -> None:
    data = _topic(tmp_path)
    writers = {f"w{i}": _child(data, f"w{i}", 150) for i in range(6)}
    for proc in writers.values():
        _go(proc)
    results = {key: _result(proc, timeout=300) for key, proc in writers.items()}
    appended = sum(len(r["offsets"]) for r in results.values())  # type: ignore[arg-type]
    syncs = sum(int(r["syncs"]) for r in results.values())  # type: ignore[call-overload]
    assert appended == 900
    # one fsync per append would be 900; every process waits for the others' fsyncs while
    # they write, so groups form (generous slack: a fast disk and a slow CPU make them small)
    assert syncs < 0.9 * appended, (syncs, appended)
    with LogStore(data) as log:
        marks = log.offsets(TOPIC, 0)
        assert (marks.hwm, marks.leo) == (900, 900)
        records, _ = log.read(TOPIC, 0, 0, max_bytes=1 << 24)
        assert len(records) == 900
        where = {r.offset: (r.key, r.value) for r in records}
        for key, result in results.items():
            for i, offset in enumerate(result["offsets"]):  # type: ignore[arg-type]
                assert where[offset] == (key.encode(), b"%d" % i)


def test_a_version_check_never_counts_in_flight_records_a_failed_fsync_threw_away(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """This process's key index reads A's in-flight record into its cache (a version check
    made while it is in flight: *Shared tail* in key_index.py); A's fsync fails, throwing
    it away, and D appends another record at its offset. The log then ends where this
    process's view of it ends, so only the partition's epoch says the view is stale: the
    next version check here must not answer from it (it would name D's record as A's key's;
    the check of the record found there would catch that, and empty the index: not here)."""
    data = tmp_path / "data"
    with LogStore(data, clock=lambda: 1_700_000_000_000) as log:  # no relay: all direct
        log.create_topic(TOPIC, 1)
        log.append(TOPIC, 0, [(b"k", b"0", (), None)], expect=Expect(b"k", None))
        held = _SyncLockHeld(data)
        a = _child(data, "a", 1, expect_none=True, fail_sync=True)
        d = None
        try:
            _in_flight(log, data, a, 2, "A's")
            _wait_for(lambda: _append_lock_free(data), "A let go of the append lock")
            with _append_lock_held(data):  # a version check here, as an appender makes it
                assert log.keys.index(TOPIC, 0).head_at(b"a", 2) == (1, 1)  # A's, in flight
            held.release()
            assert _result(a) == {"refused": [], "syncs": 1}  # thrown away
            d = _child(data, "d", 1, expect_none=True)
            _go(d)
            assert _result(d) == {"offsets": [1], "syncs": 1}  # D's record at A's offset
            assert log.offsets(TOPIC, 0).leo == 2
            with caplog.at_level(logging.WARNING):
                result = log.append(TOPIC, 0, [(b"a", b"1", (), None)], expect=Expect(b"a", None))
            assert result.base_offset == 2
            assert not [r for r in caplog.records if "key index" in r.getMessage()]
            assert log.key_head(TOPIC, 0, b"a") == 2 and log.key_head(TOPIC, 0, b"d") == 1
        finally:
            _stop(a, *([d] if d else []))


def _flocks(pid: int) -> dict[int, str]:
    """The ``flock`` locks of process ``pid`` by inode: ``held`` or ``waiting`` (/proc/locks)."""
    found = {}
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        waiting = fields[1] == "->"
        if waiting:
            del fields[1]
        if fields[1] == "FLOCK" and int(fields[4]) == pid:
            found[int(fields[5].rsplit(":", 1)[1])] = "waiting" if waiting else "held"
    return found


def test_a_synced_appender_waiting_to_publish_lets_go_of_sync_lock(tmp_path: Path) -> None:
    """A's fsync is done but the append lock, which publishing the HWM takes, is held (by
    this test, as by another appender writing): A waits for it without ``sync.lock``, so the
    next appender's fsync need not wait for A's publication too (two writer processes took
    turns at ``sync.lock``, each holding it through the other's write). A's record is not
    readable until A publishes it, and A is acknowledged once it has."""
    data = _topic(tmp_path)
    held = _SyncLockHeld(data)
    a = _child(data, "a", 1, expect_none=True)
    try:
        with LogStore(data) as log:
            _in_flight(log, data, a, 1, "A's")
            _wait_for(lambda: _append_lock_free(data), "A let go of the append lock")
            folder = data / "topics" / TOPIC / "0"
            with _append_lock_held(data):  # as an appender writing holds it
                held.release()  # A syncs now, then waits to publish
                # A blocks on one lock only, the append lock (its one blocking wait here)
                _wait_for(lambda: "waiting" in _flocks(a.pid).values(), "A waits to publish")
                assert os.stat(folder / "sync.lock").st_ino not in _flocks(a.pid)
                assert log.offsets(TOPIC, 0).hwm == 0  # durable, not yet published
            assert _result(a) == {"offsets": [0], "syncs": 1}
            assert log.offsets(TOPIC, 0).hwm == 1
    finally:
        _stop(a)
