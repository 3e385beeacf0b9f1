"""Consumer groups across real OS processes: rebalancing, death, zombies, delivery semantics.

Each member is a separate Python process (``tests/consumer/group_members.py``) logging its
ownership changes and processed records with CLOCK_MONOTONIC timestamps; the test process
produces records, kills / stops / resumes members, and checks the logs. Timing assertions
leave generous slack for a noisy 2-core machine.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from group_members import (
    GROUP,
    TOPIC,
    Feeder,
    Member,
    all_committed,
    hwms,
    overlaps,
    ownership_intervals,
    processed,
    produce,
    start_member,
    wait_for,
)

from eventlane.consumer.offsets import OffsetStore
from eventlane.log import LogStore, TopicPartition

START_S = 60.0  # a member process may take long to start on a loaded machine


@pytest.fixture
def data(tmp_path: Path) -> Iterator[tuple[Path, LogStore]]:
    path = tmp_path / "data"
    store = LogStore(path)
    yield path, store
    store.close()


def counts(group: list[Member]) -> list[int]:
    return sorted(len(m.owned()) for m in group)


def union(group: list[Member]) -> set[int]:
    return set().union(*(m.owned() for m in group))


def test_join_rebalance_never_owns_a_partition_twice(data, members, tmp_path) -> None:
    """3 members settle at 2/2/2; a 4th joins while records flow: no partition is owned by
    two members at any instant and all 6 stay owned; with 7 members exactly one is idle."""
    path, store = data
    store.create_topic(TOPIC, 6)
    common = {
        "data": str(path),
        "group": GROUP,
        "topic": TOPIC,
        "session_timeout_ms": 10_000,
        "heartbeat_interval_ms": 500,
        "delay": 0.01,
    }
    with Feeder(store, 6):
        members.extend(start_member(f"m{i}", tmp_path, **common) for i in range(3))
        wait_for(
            lambda: counts(members) == [2, 2, 2] and union(members) == set(range(6)),
            START_S,
            "3 members at 2/2/2",
            members,
        )

        members.append(start_member("m3", tmp_path, **common))
        wait_for(
            lambda: counts(members) == [1, 1, 2, 2] and union(members) == set(range(6)),
            START_S,
            "4 members at 2/2/1/1",
            members,
        )
        assert overlaps(ownership_intervals(members, time.monotonic())) == []

        members.extend(start_member(f"m{i}", tmp_path, **common) for i in range(4, 7))
        wait_for(
            lambda: counts(members) == [0, 1, 1, 1, 1, 1, 1] and union(members) == set(range(6)),
            START_S,
            "7 members, one idle",
            members,
        )
    end = time.monotonic()
    intervals = ownership_intervals(members, end)
    assert overlaps(intervals) == []
    assert sorted(intervals) == list(range(6))
    assert [m.name for m in members if m.of("lost")] == []  # no member was ever evicted
    # Cooperative: the 4th member's arrival moved exactly one partition.
    assert sum(len(ev["tps"]) for m in members[:3] for ev in m.of("revoked")) >= 1


def test_kill9_partitions_reassigned_and_nothing_lost(data, members, tmp_path) -> None:
    """kill -9 of a member: survivors own its partitions within session timeout + slack;
    committing after processing, every record is processed at least once."""
    path, store = data
    session_ms = 2000
    store.create_topic(TOPIC, 6)
    produce(store, 3000, 6)
    common = {
        "data": str(path),
        "group": GROUP,
        "topic": TOPIC,
        "session_timeout_ms": session_ms,
        "heartbeat_interval_ms": 200,
        "delay": 0.05,
        "max_records": 20,
        "commit": "after",
    }
    # The victim sleeps 1 s between processing a batch and committing it (the others
    # 50 ms), so the kill below lands in that window even when the test polls its events
    # late on a loaded machine: its batch is uncommitted and must be processed again.
    members.append(start_member("m0", tmp_path, **{**common, "delay": 1.0}))
    members.extend(start_member(f"m{i}", tmp_path, **common) for i in range(1, 3))
    wait_for(lambda: counts(members) == [2, 2, 2], START_S, "2/2/2", members)
    victim, survivors = members[0], members[1:]
    # Kill it while it sleeps between processing a batch and committing it.
    seen = len(victim.of("processing"))
    produce(store, 120, 6, start=10_000)  # fresh work, whatever the members did meanwhile
    wait_for(lambda: len(victim.of("processing")) > seen, 30, "victim processing", members)
    victim.proc.kill()
    killed_at = time.monotonic()
    victim.proc.wait()
    lost_partitions = victim.owned()
    reassigned_at = wait_for(
        lambda: union(survivors) == set(range(6)),
        session_ms / 1000 + 30,
        "survivors own every partition",
        survivors,
    )
    assert reassigned_at - killed_at < session_ms / 1000 + 2.5
    for m in survivors:  # the survivors record when they actually got the partitions
        for ev in m.of("assigned"):
            if set(ev["tps"]) & lost_partitions:
                assert ev["t"] - killed_at < session_ms / 1000 + 2.5
    produce(store, 600, 6, start=3000)
    wait_for(lambda: all_committed(store, 6), 60, "everything committed", survivors)
    for m in survivors:
        m.stop()
    done = Counter(processed(members))
    marks = hwms(store, 6)
    missing = [(p, o) for p in range(6) for o in range(marks[p]) if (p, o) not in done]
    assert missing == []
    # The victim processed a batch it never committed: its new owner processed it again.
    assert any(n > 1 for n in done.values())


def test_sigstop_zombie_is_fenced(data, members, tmp_path) -> None:
    """SIGSTOP a member past its session timeout: its partitions move; after SIGCONT every
    commit it attempts as its old membership is rejected; committed offsets never go back."""
    path, store = data
    session_ms = 1500
    store.create_topic(TOPIC, 6)
    produce(store, 600, 6)
    common = {
        "data": str(path),
        "group": GROUP,
        "topic": TOPIC,
        "session_timeout_ms": session_ms,
        "heartbeat_interval_ms": 300,
        "delay": 0.4,
        "max_records": 60,
        "commit": "after",
    }
    members.extend(start_member(f"m{i}", tmp_path, **common) for i in range(2))
    wait_for(lambda: counts(members) == [3, 3], START_S, "3/3", members)
    zombie, other = members
    seen = len(zombie.of("processing"))
    produce(store, 120, 6, start=10_000)  # fresh work, whatever the members did meanwhile
    wait_for(lambda: len(zombie.of("processing")) > seen, 30, "zombie processing", members)
    zombie.signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    old_member = zombie.of("records")[-1]["member"]
    reassigned_at = wait_for(lambda: other.owned() == set(range(6)), 30, "other owns all", [other])
    assert reassigned_at - stopped_at < session_ms / 1000 + 2.0
    time.sleep(max(0.0, stopped_at + 3.5 - time.monotonic()))
    produce(store, 120, 6, start=600)
    zombie.signal(signal.SIGCONT)
    resumed_at = time.monotonic()
    wait_for(
        lambda: any(ev["t0"] > resumed_at for ev in zombie.of("commit")),
        30,
        "the zombie tries to commit",
        members,
    )
    wait_for(lambda: all_committed(store, 6), 60, "everything committed", members)
    for m in members:
        m.stop()
    late = [
        ev for ev in zombie.of("commit") if ev["t0"] > stopped_at and ev["member"] == old_member
    ]
    assert late, "the zombie never attempted a commit after it was resumed"
    assert all(not ev["ok"] for ev in late), late
    assert all(GROUP in ev["error"] and "commit rejected" in ev["error"] for ev in late)
    assert zombie.of("lost"), "the zombie should learn it lost its partitions"
    # Offsets never move backwards in the log of commits.
    last: dict[TopicPartition, int] = {}
    for _, tp, offset in OffsetStore(store).history(GROUP):
        assert offset is not None and offset >= last.get(tp, 0), (tp, offset, last.get(tp))
        last[tp] = offset
    done = set(processed(members))
    marks = hwms(store, 6)
    assert [(p, o) for p in range(6) for o in range(marks[p]) if (p, o) not in done] == []


def test_at_most_once_skips_but_never_repeats(data, members, tmp_path) -> None:
    """Committing before processing: a crash between commit and processing skips that batch,
    and no record is ever processed twice."""
    path, store = data
    store.create_topic(TOPIC, 4)
    produce(store, 2000, 4)
    common = {
        "data": str(path),
        "group": GROUP,
        "topic": TOPIC,
        "session_timeout_ms": 2000,
        "heartbeat_interval_ms": 200,
        "delay": 0.05,
        "max_records": 20,
        "commit": "before",
    }
    members.extend(start_member(f"m{i}", tmp_path, **common) for i in range(2))
    wait_for(lambda: counts(members) == [2, 2], START_S, "2/2", members)
    victim, survivor = members
    seen = len(victim.of("processing"))
    produce(store, 80, 4, start=10_000)  # fresh work, whatever the members did meanwhile
    wait_for(lambda: len(victim.of("processing")) > seen, 30, "victim processing", members)
    victim.proc.kill()  # committed, not yet processed
    victim.proc.wait()
    wait_for(lambda: all_committed(store, 4), 60, "everything committed", [survivor])
    survivor.stop()
    done = Counter(processed(members))
    assert [rec for rec, n in done.items() if n > 1] == []
    marks = hwms(store, 4)
    skipped = [(p, o) for p in range(4) for o in range(marks[p]) if (p, o) not in done]
    assert skipped, "the crash after commit should have skipped the batch in flight"


def test_graceful_leave_rebalances_immediately(data, members, tmp_path) -> None:
    """close() hands the partitions over at once, far below the session timeout."""
    path, store = data
    session_ms = 30_000
    store.create_topic(TOPIC, 6)
    common = {
        "data": str(path),
        "group": GROUP,
        "topic": TOPIC,
        "session_timeout_ms": session_ms,
        "heartbeat_interval_ms": 1000,
    }
    members.extend(start_member(f"m{i}", tmp_path, **common) for i in range(2))
    wait_for(lambda: counts(members) == [3, 3], START_S, "3/3", members)
    leaver, stayer = members
    leaver.signal(signal.SIGTERM)
    asked_at = time.monotonic()
    took_over = wait_for(lambda: stayer.owned() == set(range(6)), 20, "stayer owns all", members)
    leaver.proc.wait(20)
    assert took_over - asked_at < 3.0  # vs a 30 s session timeout
    revoked = leaver.of("revoked")[-1]
    assigned = [ev for ev in stayer.of("assigned") if set(ev["tps"]) & set(revoked["tps"])][-1]
    assert revoked["t"] <= assigned["t"]
    assert assigned["t"] - revoked["t"] < 1.0
