"""``kill -9`` during multi-event saves: a save is stored whole or not at all.

A child process (``store_procs.py atomic``) saves batches of 5-50 ``Tick`` events on a few
aggregates in a loop, each event naming its save number and its place in the save; it is
stopped inside a save (mid-append, mid-state-update, before its index update: a seam of
:mod:`eventlane._pauses`, at a hit drawn from the seed) and killed there with SIGKILL. After
every kill the partition's raw records are read without the store and must be whole saves
with contiguous versions; every save the child saw acknowledged must be there; the store
must load every aggregate, and the next child continues saving on top.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from store_domain import Batcher, make_app, raw_streams
from store_helpers import close, read_line, spawn, stderr_of

from eventlane.testing.logs import capture_logs

AGGREGATES = 4


def check_whole_saves(stream: list[dict[str, Any]]) -> int:
    """Assert ``stream`` (one aggregate's raw values) is whole saves 1, 2, 3… with
    contiguous versions; return the number of saves."""
    versions = [doc["aggregate_version"] for doc in stream]
    assert versions == list(range(1, len(stream) + 1))
    save, i = 0, 0
    while i < len(stream):
        first = stream[i]["data"]
        save += 1
        assert first["save"] == save and first["index"] == 0, (save, first)
        size = first["size"]
        part = [doc["data"] for doc in stream[i : i + size]]
        assert part == [{"save": save, "index": k, "size": size} for k in range(size)], (
            f"save {save} is not whole: {len(part)} of {size} events stored"
        )
        i += size
    return save


SEAMS = [
    # (the point a child stops at: see eventlane._pauses, which hits of it to stop at)
    ("partition.append.written", (2, 6)),  # a save's batch written, the state not updated
    ("state.write", (6, 15)),  # inside the seqlock write of an append or of its HWM
    ("partition.append.hooks", (2, 6)),  # a save published, its key index not updated
]
"""Where the kills land: each cycle stops its child at one of these, then kills it."""


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (``T`` in /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def kill_cycles(data: Path, cycles: int, seed: int) -> tuple[dict[str, int], int]:
    """Run ``cycles`` kill cycles; return the last acknowledged version per aggregate and
    how many unacknowledged tails (appends cut short by the kill) recovery truncated.

    Each child stops itself (``SIGSTOP``, ``EVENTLANE_PAUSES=stop:POINT#N``) inside a save,
    at the ``N``-th hit of a point of the append path (:data:`SEAMS`, in turn, ``N`` drawn
    from the seed), and is killed there with ``SIGKILL``: every kill lands mid-save, however
    loaded the host is."""
    rng = random.Random(seed)
    acked: dict[str, int] = {}  # aggregate → last acknowledged version
    kills_mid_run = 0
    truncated = 0
    for cycle in range(cycles):
        point, (low, high) = SEAMS[cycle % len(SEAMS)]
        seam = f"{point}#{rng.randint(low, high)}"
        proc = spawn(
            "atomic",
            env={"EVENTLANE_PAUSES": f"stop:{seam}"},
            data=str(data),
            seed=seed * 1000 + cycle,
            aggregates=AGGREGATES,
            min_size=5,
            max_size=50,
        )
        try:
            assert read_line(proc) == "R"
            deadline = time.monotonic() + 60
            while not _stopped(proc.pid):
                assert proc.poll() is None, stderr_of(proc)
                assert time.monotonic() < deadline, f"the child never reached {seam}"
                time.sleep(0.005)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            assert proc.stdout is not None
            lines = proc.stdout.read().splitlines()
            assert proc.returncode == -signal.SIGKILL, stderr_of(proc)
        finally:
            close(proc)
        kills_mid_run += bool(lines)
        for line in lines:
            _, aggregate_id, _, _, version = line.split()
            acked[aggregate_id] = max(acked.get(aggregate_id, 0), int(version))

        with capture_logs() as logs, make_app(data) as app:
            streams = raw_streams(app.log, Batcher.topic)
            tails = sum("truncating" in entry["event"] for entry in logs)
            if point == "partition.append.written":  # the batch written past the state
                assert tails >= 1, f"cycle {cycle} ({seam}): no unacknowledged tail truncated"
            truncated += tails
            for aggregate_id, version in acked.items():
                stream = streams[aggregate_id]
                assert len(stream) >= version, f"acknowledged save of {aggregate_id} lost"
                saves = check_whole_saves(stream)
                batcher = app.load(Batcher, aggregate_id)
                assert (batcher.version, batcher.saves) == (len(stream), saves)
    assert kills_mid_run == cycles, "every child acknowledged saves before its kill"
    return acked, truncated


def finish_and_verify(data: Path, acked: dict[str, int]) -> None:
    with make_app(data) as app:
        for aggregate_id in acked:  # new saves continue on top of what the crashes left
            batcher = app.load(Batcher, aggregate_id)
            batcher.record_save(batcher.saves + 1, 7)
            app.save(batcher)
        streams = raw_streams(app.log, Batcher.topic)
        for aggregate_id in acked:
            check_whole_saves(streams[aggregate_id])
        for partition in range(app.log.partition_count(Batcher.topic)):
            report = app.store.verify_index(Batcher.topic, partition)
            assert report.ok, report.problems


def test_kill_9_during_saves_never_leaves_a_partial_batch(tmp_path: Path) -> None:
    data = tmp_path / "data"
    acked, truncated = kill_cycles(data, cycles=12, seed=1)
    print(f"unacknowledged tails truncated: {truncated} in 12 cycles")
    assert len(acked) == AGGREGATES
    finish_and_verify(data, acked)


@pytest.mark.soak
def test_kill_9_during_saves_soak(tmp_path: Path) -> None:
    data = tmp_path / "data"
    acked, truncated = kill_cycles(data, cycles=300, seed=2)
    print(f"unacknowledged tails truncated: {truncated} in 300 cycles")
    assert truncated > 0, "no kill ever landed inside an append"
    finish_and_verify(data, acked)
