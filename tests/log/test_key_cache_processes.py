"""Conditional appends from several processes on shared keys, against the log as the model.

An appender's version check (:meth:`~eventlane.log.embedded.key_index.KeyIndex.head_at`)
answers from a per-process cache of key heads when it can; issue 36 item 1 asks to keep that
cache across other processes' writes (today another process's commit empties it). Whatever
keeps it, a head the cache failed to move past another process's record accepts an append
checked against a stale head: a lost update. This test is the guard for any such change:
real OS processes, one partition, fsync on (records in flight between the high-water mark
and the log end while others check), a seeded generator of keys, stale beliefs kept on
purpose, and unconditional appends of other keys between the checks. (A cache that never
counted others' records failed it: ``k3@9 followed 6, expected 2``.)

Oracle (independent of the index): the log itself, read back in full. Every acknowledged
conditional append must directly follow, among its key's records, the record it expected
(none for ``None``); every refusal must name a record of the key; afterwards the index file
verifies clean and lags the log by fewer than ``DEFER_OFFSETS`` offsets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from eventlane.log import LogStore
from eventlane.log.embedded.key_index import DEFER_OFFSETS

STEPS = 120
KEYS = 5

CHILD = r"""
import json, random, sys, time
from pathlib import Path
from typing import Any
from eventlane.errors import ConcurrencyError
from eventlane.log import Expect, LogStore
data, seed, steps, keys = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
belief = {}  # key -> the last offset this process believes it has (stale when others wrote)
with LogStore(Path(data)) as log:
    Path(data, f"ready-{seed}").touch()
    while not Path(data, "go").exists():
        time.sleep(0.002)
    for step in range(steps):
        if rng.random() < 0.25:  # a record of a key nobody checks, between the checks
            log.append("t", 0, [(b"noise-%d" % rng.randrange(50), b"n", (), None)])
            continue
        key = b"k%d" % rng.randrange(keys)
        expected = belief.get(key)
        try:
            r = log.append("t", 0, [(key, b"%d:%d" % (seed, step), (), None)],
                           expect=Expect(key, expected), atomic=True)
        except ConcurrencyError as exc:
            print(json.dumps(["refused", key.decode(), expected, exc.actual]), flush=True)
            belief[key] = exc.actual
            continue
        print(json.dumps(["stored", key.decode(), expected, r.base_offset]), flush=True)
        if rng.random() < 0.8:  # else keep a stale belief on purpose
            belief[key] = r.base_offset
"""


def _topic(tmp_path: Path) -> Path:
    """A data directory with the topic the children append to (fsync on: records in flight)."""
    data = tmp_path / "data"
    with LogStore(data) as log:
        log.create_topic("t", 1, {"flush_policy": "always"})
    return data


def _child(data: Path, seed: int, steps: int, relay: str) -> subprocess.Popen[str]:
    """A writer process running ``CHILD`` (``relay``: ``EVENTLANE_RELAY``)."""
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(data), str(seed), str(steps), str(KEYS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "EVENTLANE_RELAY": relay},
    )


@pytest.mark.parametrize(
    ("processes", "relay", "seed"),
    [(3, "on", 0), (2, "on", 10), (3, "off", 20), (2, "off", 30)],
    ids=["three-through-the-relay", "two", "three-direct", "two-direct"],
)
def test_conditional_appends_from_processes_follow_what_they_expected(
    tmp_path: Path, processes: int, relay: str, seed: int
) -> None:
    """Two processes always append directly (each reads the other's records from the log
    into its cache and its held rows: *Shared tail* in key_index.py); three hand their
    appends to the relay process unless ``EVENTLANE_RELAY=off``."""
    data = _topic(tmp_path)
    seeds = range(seed, seed + processes)
    children = [_child(data, n, STEPS, relay) for n in seeds]
    try:
        ready = [data / f"ready-{n}" for n in seeds]
        for child in children:  # all open before any appends: their caches interleave
            while not all(path.exists() for path in ready) and child.poll() is None:
                time.sleep(0.005)
        (data / "go").touch()
        ended = [child.communicate(timeout=300) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert [child.returncode for child in children] == [0] * processes, ended
    outputs = [out for out, _ in ended]
    for _, err in ended:  # an index found to contradict the log is emptied and rebuilt:
        assert "key index" not in err, err  # never here (rows numbered from what was seen)
    events = [json.loads(line) for out in outputs for line in out.splitlines()]
    _check(data, events)


def _check(data: Path, events: list[Any]) -> None:
    """The oracle of the module docstring: the log read back in full."""
    with LogStore(data) as log:
        hwm = log.offsets("t", 0).hwm
        records = []
        while len(records) < hwm:
            batch, _ = log.read("t", 0, len(records))
            records.extend(batch)
        by_key: dict[bytes, list[int]] = defaultdict(list)
        for record in records:
            assert record.key is not None
            by_key[record.key].append(record.offset)
        stored = refused = 0
        for kind, key, expected, found in events:
            offsets = by_key[key.encode()]
            if kind == "stored":
                stored += 1
                at = offsets.index(found)  # KeyError-free: the record is in the log
                before = offsets[at - 1] if at else None
                assert before == expected, f"{key}@{found} followed {before}, expected {expected}"
            else:
                refused += 1
                assert found != expected
                assert found is None or found in offsets, f"{key}: refused naming {found}"
        assert stored > KEYS and refused > 0  # the generator reached both outcomes
        reports = log.check_keys(["t"])
        assert all(not report.problems for report in reports), reports
        assert hwm - log.keys.index("t", 0).next_offset() < DEFER_OFFSETS


def test_a_writer_killed_while_it_holds_rows_leaves_the_other_correct(tmp_path: Path) -> None:
    """Two processes appending directly hold the rows of the unwritten tail (theirs and the
    other's); one is killed (``kill -9``) in the middle of its appends, holding rows that never
    reach the file. The other goes on over the records the dead one left (acknowledged or
    not) and must still follow the rule; the file verifies after it closes."""
    data = _topic(tmp_path)
    victim, survivor = _child(data, 40, 100_000, "off"), _child(data, 41, 3 * STEPS, "off")
    try:
        while not all((data / f"ready-{n}").exists() for n in (40, 41)):
            assert victim.poll() is None and survivor.poll() is None
            time.sleep(0.005)
        (data / "go").touch()
        assert victim.stdout is not None
        lines = [victim.stdout.readline() for _ in range(STEPS // 2)]
        victim.kill()  # SIGKILL, in the middle of its appends
        victim.wait(timeout=30)
        rest, _ = victim.communicate(timeout=30)
        out, err = survivor.communicate(timeout=300)
    finally:
        for child in (victim, survivor):
            if child.poll() is None:
                child.kill()
                child.wait()
    assert survivor.returncode == 0, err
    assert "key index" not in err, err
    whole = [line for line in [*lines, *rest.splitlines(keepends=True)] if line.endswith("\n")]
    events = [json.loads(line) for line in [*whole, *out.splitlines()]]
    _check(data, events)
