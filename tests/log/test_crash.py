"""Real ``kill -9`` of processes using the log, and recovery (issue 2, crash line).

Every test runs real OS processes (``tests/log/procs.py``) on real files and kills them with
SIGKILL: after a random delay, or at the n-th storage call they make (SQLite's crash-at-N
technique, which also lands kills *inside* the shared-state seqlock). After each kill the
log is reopened (plainly, or after a simulated reboot that drops the shared state so the
full recovery scan runs) and checked against what the processes acknowledged:

* producers killed mid-append (one or two at once, mid-write, mid-fsync, mid-roll): 0
  acknowledged records lost, 0 reordered, 0 duplicated, every one at its acknowledged
  offset, ``verify`` clean, and appends go on; a reader tailing the topic meanwhile never
  saw a record that later disappeared or moved;
* a process killed in the middle of compaction (at random, at each early step of its
  journal and swap, and at chosen steps of two compactions in a row): the log stays
  readable, ``verify`` clean, equal to a compacted-or-uncompacted view of what was written;
* a process killed in the middle of retention: readable, ``verify`` clean, the LWM between
  the old and the new one, nothing above it lost.

The harnesses count anomalies rather than assert, so ``benchmarks/soak_crash.py`` can run
the same loops for 1000 cycles and print the figures; the ``soak`` tests here do the same
under pytest (``pytest -m soak``).
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "eventlane_log_procs", Path(__file__).with_name("procs.py")
)
assert _spec is not None and _spec.loader is not None
procs = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = procs
_spec.loader.exec_module(procs)

SEED = int(os.environ.get("EVENTLANE_CRASH_SEED") or random.randrange(1 << 30))
"""Random per run (kill timing is random anyway); set ``EVENTLANE_CRASH_SEED`` to replay."""


def _assert_clean(figures: procs.CrashFigures) -> None:
    print(f"\nseed={SEED}\n{figures.summary()}")
    assert figures.clean(), f"seed={SEED}\n{figures.summary()}"


@pytest.mark.timeout(400)
def test_kill_producers_mid_append(tmp_path: Path) -> None:
    """25 cycles of SIGKILL to producer processes while a reader process tails the topic."""
    loop = procs.ProducerCrashLoop(tmp_path, seed=SEED, topic_cycles=25, full_check_every=5)
    figures = loop.run(25)
    _assert_clean(figures)
    assert figures.kills >= 25 and figures.crash_at_kills >= 10
    assert figures.double_kills >= 4, "two producers killed at once"
    assert figures.reboots >= 5, "the full recovery scan ran"
    assert figures.acked > 1000, "kills came too early to prove anything"
    assert figures.reader_seen > 0, "the tailing reader read while producers died"
    assert figures.records_in_log >= figures.acked


@pytest.mark.timeout(300)
def test_kill_at_every_storage_call_of_append_and_roll(tmp_path: Path) -> None:
    """A scripted producer killed at its 1st, 2nd, ... 24th storage call, a fresh topic
    each time: the calls span two appends, a segment roll and the append after it."""
    loop = procs.ProducerCrashLoop(
        tmp_path, seed=SEED, partitions=1, segment_bytes=12 * 1024, with_reader=False
    )
    figures = loop.sweep(range(1, 25), plan=[40] * 6)
    _assert_clean(figures)
    assert figures.kills == 24


@pytest.mark.timeout(400)
def test_kill_during_compaction(tmp_path: Path) -> None:
    """Kill a process compacting a topic of many segments: at each early step of the journal
    and the swap in turn, at random storage calls, and after random delays."""
    loop = procs.CompactionCrashLoop(tmp_path, seed=SEED)
    figures = loop.run(8)
    _assert_clean(figures)
    assert figures.kills >= 4
    assert figures.phases.get("mid-swap (layout odd)", 0) >= 1, figures.phases
    assert figures.phases.get("inside a state write (seqlock left odd)", 0) >= 1, figures.phases
    assert figures.reboots >= 2
    assert loop.completed >= 2, "uninterrupted compactions completed between the kills"


@pytest.mark.timeout(300)
def test_compactions_killed_back_to_back(tmp_path: Path) -> None:
    """Kills at chosen steps of consecutive compactions: after a swap but before its journal
    is removed, then mid-clean of the next one, then a reboot; and mid-swap while another
    process that already had the partition open waits to compact it next."""
    loop = procs.CompactionCrashLoop(tmp_path / "back-to-back", seed=SEED, partitions=1)
    figures = loop.run_sequence(loop.BACK_TO_BACK)
    _assert_clean(figures)
    assert figures.kills == 2 and figures.reboots == 1
    loop = procs.CompactionCrashLoop(tmp_path / "dead-swap", seed=SEED, partitions=1)
    figures = loop.run_dead_swap_then_clean()
    _assert_clean(figures)
    assert figures.phases == {"mid-swap (layout odd)": 1}


@pytest.mark.timeout(400)
def test_kill_during_retention(tmp_path: Path) -> None:
    """Kill a process applying size retention to a topic of many small segments."""
    loop = procs.RetentionCrashLoop(tmp_path, seed=SEED, partitions=1)
    figures = loop.run(8)
    _assert_clean(figures)
    assert figures.kills >= 4
    assert figures.phases.get("LWM published, segments being unlinked", 0) >= 1, figures.phases
    assert figures.reboots >= 2


@pytest.mark.soak
@pytest.mark.timeout(7200)
def test_soak_kill_producers_1000_cycles(tmp_path: Path) -> None:
    loop = procs.ProducerCrashLoop(tmp_path, seed=SEED, topic_cycles=50, keep_files=False)
    figures = loop.run(1000)
    _assert_clean(figures)
    assert figures.kills >= 1000


@pytest.mark.soak
@pytest.mark.timeout(7200)
def test_soak_kill_maintenance(tmp_path: Path) -> None:
    compaction = procs.CompactionCrashLoop(tmp_path / "compact", seed=SEED).run(200)
    _assert_clean(compaction)
    retention = procs.RetentionCrashLoop(tmp_path / "retain", seed=SEED).run(200)
    _assert_clean(retention)
