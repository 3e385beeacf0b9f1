"""No deadlock across processes: every lock-taking path of the embedded engine, in several OS
processes at once, with random pauses inside the critical sections.

A descheduled process is what turns a lock-order inversion into a hang (issue 26: a writer
stopped inside the state's seqlock while a key-index catch-up read the state, two processes
hung forever). ``EVENTLANE_PAUSES`` (:mod:`eventlane._pauses`) makes each child sleep at
random after taking and before releasing every file lock, inside the seqlock write, with a
segment layout odd, between an append's write and its publication, before the key index's
hooks, catch-up and flusher. The children (``tests/log/lock_paths.py``) run appends,
conditional appends (group commit), key reads and heads, key-index rebuilds, rolls,
compaction, retention and consumer-group commits. The test fails on any stall: a thread
that makes no progress for :data:`STALL_S` seconds; the stuck processes' stacks are dumped
(``faulthandler``) into the failure message. Each acknowledged record of ``t`` is then
read back where it was acknowledged (those retention removed aside).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eventlane.consumer.offsets import OffsetStore
from eventlane.errors import OffsetOutOfRangeError, UnknownTopicError
from eventlane.log import LogStore

CHILD = Path(__file__).with_name("lock_paths.py")
STALL_S = 10.0
"""A thread of a child that makes no progress for this long is stuck (issue 26's figure)."""
SEGMENT = {"segment_bytes": 4096}


def _make_topics(data: Path) -> None:
    with LogStore(data) as log:
        log.create_topic("t", 2, SEGMENT)
        log.create_topic("c", 1, {**SEGMENT, "cleanup_policy": "compact"})
        OffsetStore(log).ensure_topic()


class _Child:
    def __init__(self, data: Path, tag: str, seed: int, ops: int, threads: int, pauses: str):
        self.tag = tag
        self.threads = threads
        self.progress = {n: time.monotonic() for n in range(threads)}
        self.done: set[int] = set()
        self.errors: list[str] = []
        self.acked: list[tuple[int, int, str]] = []
        self.stderr = data.parent / f"{data.name}-{tag}.stderr"
        env = {**os.environ, "EVENTLANE_PAUSES": pauses}
        args = {"data": str(data), "tag": tag, "seed": seed, "ops": ops, "threads": threads}
        with self.stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(CHILD), json.dumps(args)],
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                text=True,
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            kind, _, rest = line.rstrip("\n").partition(" ")
            if kind == "P":
                self.progress[int(rest.split()[0])] = time.monotonic()
            elif kind == "A":
                p, offset, rid = rest.split()
                self.acked.append((int(p), int(offset), rid))
            elif kind == "D":
                self.done.add(int(rest))
            elif kind == "E":
                self.errors.append(rest)

    def stalled(self, now: float) -> list[int]:
        return [
            n
            for n, seen in self.progress.items()
            if n not in self.done and now - seen > STALL_S and self.proc.poll() is None
        ]

    def finished(self) -> bool:
        return self.proc.poll() is not None

    def dump(self) -> str:
        """Every thread's stack (SIGUSR1: faulthandler), then the end of stderr."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGUSR1)
            time.sleep(1.0)
        text = self.stderr.read_text(errors="replace")
        return f"--- {self.tag} (pid {self.proc.pid}) ---\n{text[-6000:]}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._reader.join(10)


def run_with_pauses(
    data: Path,
    *,
    seed: int,
    processes: int,
    threads: int,
    ops: int,
    pauses: str,
    limit_s: float,
) -> dict[str, int]:
    """Run the children; fail on a stall, an unexpected error or a lost record. Returns
    figures (operations, acknowledged records, seconds)."""
    _make_topics(data)
    started = time.monotonic()
    children = [
        _Child(data, f"p{i}", seed, ops, threads, pauses.format(seed=seed + i))
        for i in range(processes)
    ]
    try:
        while not all(c.finished() for c in children):
            time.sleep(0.2)
            now = time.monotonic()
            failed = [(c.tag, c.errors) for c in children if c.errors]
            if failed:
                dumps = "\n".join(c.dump() for c in children)
                pytest.fail(f"errors in the children: {failed} (seed {seed})\n{dumps}")
            stuck = {c.tag: c.stalled(now) for c in children}
            if any(stuck.values()):
                dumps = "\n".join(c.dump() for c in children)
                pytest.fail(
                    f"stall: no progress for {STALL_S:.0f} s in {stuck} (seed {seed}, "
                    f"pauses {pauses!r})\n{dumps}"
                )
            if now - started > limit_s:
                dumps = "\n".join(c.dump() for c in children)
                pytest.fail(f"not done in {limit_s:.0f} s (seed {seed})\n{dumps}")
    finally:
        for c in children:
            c.stop()
    seconds = time.monotonic() - started
    for c in children:
        assert not c.errors, f"{c.tag}: {c.errors}\n{c.dump()}"
        assert c.proc.returncode == 0, c.dump()
        assert c.done == set(range(threads)), c.dump()
    acked = [a for c in children for a in c.acked]
    with LogStore(data) as log:
        for p in (0, 1):
            mine = sorted((o, rid) for q, o, rid in acked if q == p)
            lwm = log.offsets("t", p).lwm
            for offset, rid in mine:
                if offset < lwm:
                    continue
                try:
                    records, _ = log.read("t", p, offset, max_bytes=1, upto=offset + 1)
                except OffsetOutOfRangeError:
                    continue
                assert records and records[0].offset == offset, (p, offset, rid)
                assert records[0].value == rid.encode(), (p, offset, rid, records[0].value)
        problems = [(r.partition, r.problems) for r in log.check_keys(["t"]) if r.problems]
        assert not problems, problems
    return {"ops": processes * threads * ops, "acked": len(acked), "seconds": int(seconds)}


def test_lock_paths_across_processes_with_random_pauses_never_stall(tmp_path: Path) -> None:
    figures = run_with_pauses(
        tmp_path / "data",
        seed=26,
        processes=3,
        threads=2,
        ops=150,
        pauses="{seed},0.2,40",
        limit_s=120,
    )
    print(figures, file=sys.stderr)


@pytest.mark.soak
@pytest.mark.parametrize("seed", range(100, 110))
def test_soak_lock_paths_with_random_pauses(tmp_path: Path, seed: int) -> None:
    figures = run_with_pauses(
        tmp_path / "data",
        seed=seed,
        processes=4,
        threads=2,
        ops=400,
        pauses="{seed},0.15,40",
        limit_s=900,
    )
    print(f"seed {seed}: {figures}", file=sys.stderr)


def test_the_key_index_asks_for_the_epoch_without_opening_the_partition(tmp_path: Path) -> None:
    """Lock order: the key index asks for its partition's epoch under its own lock, which
    comes after the append lock that opening a partition may take (recovery). A partition
    this process does not have open (its topic deleted since, and re-created by another
    process) is reported gone, never opened there."""
    with LogStore(tmp_path / "data") as log:
        log.create_topic("t", 1)
        log.append("t", 0, [(b"k", b"v", (), None)])
        assert log.epoch("t", 0) == 0
    with LogStore(tmp_path / "data") as log:
        with pytest.raises(UnknownTopicError):
            log.epoch("t", 0)
        assert ("t", 0) not in log._partitions  # not opened
        assert log.key_head("t", 0, b"k") == 0  # the index opens it first, then asks
        assert log.epoch("t", 0) == 0
