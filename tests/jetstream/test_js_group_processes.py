"""Consumer groups across OS processes with their coordination on the cluster (issue 13).

The consumer-group acceptance of the embedded backend (tests/consumer/test_group_processes.py)
re-run against the JetStream coordinator: the member processes of
tests/consumer/group_members.py, each with its own connection to the shared 3-node cluster
and no shared file, split the partitions, rebalance cooperatively without two members ever
owning a partition at once, survive kill -9 and fence a SIGSTOPped zombie. Timing
assertions leave generous slack for a noisy 2-core machine.
"""

from __future__ import annotations

import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlane.consumer.jetstream import JetStreamCoordination
from eventlane.log import TopicPartition
from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import JetStreamLog

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "consumer"))
from group_members import (
    GROUP,
    TOPIC,
    Feeder,
    Member,
    overlaps,
    ownership_intervals,
    processed,
    produce,
    start_member,
    wait_for,
)
from js_group_kit import (
    START_S,
    OffsetWatch,
    counts,
    members_fixture,  # noqa: F401 (the `members` fixture)
    union,
)


@pytest.fixture
def js(cluster: LocalCluster, namespace: str) -> Iterator[JetStreamLog]:
    with JetStreamLog.from_url(cluster.url, namespace=namespace) as log:
        log.create_topic(TOPIC, 6)
        yield log


def _hwms(js: JetStreamLog) -> dict[int, int]:
    return {p: js.offsets(TOPIC, p).hwm for p in range(6)}


def _all_committed(js: JetStreamLog, coordination: JetStreamCoordination) -> bool:
    marks = _hwms(js)
    for p in range(6):
        entry = coordination.offsets.committed(GROUP, TopicPartition(TOPIC, p))
        if entry is None or entry.offset != marks[p]:
            return False
    return True


def _common(cluster: LocalCluster, namespace: str, **extra: object) -> dict[str, object]:
    return {
        "log_url": cluster.url,
        "namespace": namespace,
        "group": GROUP,
        "topic": TOPIC,
        **extra,
    }


def test_join_rebalance_never_owns_a_partition_twice(
    js: JetStreamLog, cluster: LocalCluster, namespace: str, members: list[Member], tmp_path: Path
) -> None:
    """3 members settle at 2/2/2; a 4th joins while records flow: no partition is owned by
    two members at any instant and all 6 stay owned; with 7 members exactly one is idle."""
    common = _common(
        cluster, namespace, session_timeout_ms=10_000, heartbeat_interval_ms=500, delay=0.01
    )
    with Feeder(js, 6):  # type: ignore[arg-type]
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
    intervals = ownership_intervals(members, time.monotonic())
    assert overlaps(intervals) == []
    assert sorted(intervals) == list(range(6))
    assert [m.name for m in members if m.of("lost")] == []  # no member was ever evicted
    # Cooperative: the 4th member's arrival moved partitions by revocation, not by loss.
    assert sum(len(ev["tps"]) for m in members[:3] for ev in m.of("revoked")) >= 1


def test_kill9_partitions_reassigned_and_nothing_lost(
    js: JetStreamLog, cluster: LocalCluster, namespace: str, members: list[Member], tmp_path: Path
) -> None:
    """kill -9 of a member: survivors own its partitions within session timeout + 2.5 s;
    committing after processing, every record is processed at least once."""
    session_ms = 2000
    produce(js, 600, 6)  # type: ignore[arg-type]
    common = _common(
        cluster,
        namespace,
        session_timeout_ms=session_ms,
        heartbeat_interval_ms=200,
        delay=0.05,
        max_records=20,
        commit="after",
    )
    # The victim sleeps 1 s between processing a batch and committing it (the others
    # 50 ms), so the kill below lands in that window even when the test polls its events
    # late on a loaded machine: its batch is uncommitted and must be processed again.
    members.append(start_member("m0", tmp_path, **{**common, "delay": 1.0}))
    members.extend(start_member(f"m{i}", tmp_path, **common) for i in range(1, 3))
    wait_for(lambda: counts(members) == [2, 2, 2], START_S, "2/2/2", members)
    victim, survivors = members[0], members[1:]
    seen = len(victim.of("processing"))
    produce(js, 120, 6, start=10_000)  # type: ignore[arg-type]
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
    for m in survivors:  # when the survivors actually got the partitions
        for ev in m.of("assigned"):
            if set(ev["tps"]) & lost_partitions:
                assert ev["t"] - killed_at < session_ms / 1000 + 2.5
    produce(js, 300, 6, start=3000)  # type: ignore[arg-type]
    coordination = JetStreamCoordination(js)
    wait_for(lambda: _all_committed(js, coordination), 60, "everything committed", survivors)
    for m in survivors:
        m.stop()
    # No overlap: the victim's ownership ended when it was killed.
    intervals = ownership_intervals([victim], killed_at)
    for p, spans in ownership_intervals(survivors, time.monotonic()).items():
        intervals.setdefault(p, []).extend(spans)
    assert overlaps(intervals) == []
    done = Counter(processed(members))
    marks = _hwms(js)
    assert [(p, o) for p in range(6) for o in range(marks[p]) if (p, o) not in done] == []
    # The victim processed a batch it never committed: its new owner processed it again.
    assert any(n > 1 for n in done.values())


def test_sigstop_zombie_is_fenced(
    js: JetStreamLog, cluster: LocalCluster, namespace: str, members: list[Member], tmp_path: Path
) -> None:
    """SIGSTOP a member past its session timeout: its partitions move; after SIGCONT every
    commit it attempts as its old membership is rejected; committed offsets never go back."""
    session_ms = 1500
    produce(js, 600, 6)  # type: ignore[arg-type]
    common = _common(
        cluster,
        namespace,
        session_timeout_ms=session_ms,
        heartbeat_interval_ms=300,
        delay=0.4,
        max_records=60,
        commit="after",
    )
    with OffsetWatch(js, GROUP) as watch:
        members.extend(start_member(f"m{i}", tmp_path, **common) for i in range(2))
        wait_for(lambda: counts(members) == [3, 3], START_S, "3/3", members)
        zombie, other = members
        seen = len(zombie.of("processing"))
        produce(js, 120, 6, start=10_000)  # type: ignore[arg-type]
        wait_for(lambda: len(zombie.of("processing")) > seen, 30, "zombie processing", members)
        zombie.signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        old_member = zombie.of("records")[-1]["member"]
        reassigned_at = wait_for(
            lambda: other.owned() == set(range(6)), 30, "other owns all", [other]
        )
        assert reassigned_at - stopped_at < session_ms / 1000 + 2.5
        time.sleep(max(0.0, stopped_at + 3.5 - time.monotonic()))
        produce(js, 120, 6, start=600)  # type: ignore[arg-type]
        zombie.signal(signal.SIGCONT)
        resumed_at = time.monotonic()
        wait_for(
            lambda: any(ev["t0"] > resumed_at for ev in zombie.of("commit")),
            30,
            "the zombie tries to commit",
            members,
        )
        wait_for(
            lambda: _all_committed(js, watch.coordination), 60, "everything committed", members
        )
        for m in members:
            m.stop()
    late = [
        ev for ev in zombie.of("commit") if ev["t0"] > stopped_at and ev["member"] == old_member
    ]
    assert late, "the zombie never attempted a commit after it was resumed"
    assert all(not ev["ok"] for ev in late), late
    assert all(GROUP in ev["error"] and "commit rejected" in ev["error"] for ev in late)
    assert zombie.of("lost"), "the zombie should learn it lost its partitions"
    assert watch.samples > 10 and watch.backwards == []
    done = set(processed(members))
    marks = _hwms(js)
    assert [(p, o) for p in range(6) for o in range(marks[p]) if (p, o) not in done] == []


@pytest.mark.soak
def test_soak_churn_joins_leaves_and_kills(
    js: JetStreamLog, cluster: LocalCluster, namespace: str, members: list[Member], tmp_path: Path
) -> None:
    """12 rounds (bounded: at most a minute each) of a member joining, then one leaving
    gracefully or being killed -9, while records flow: every round converges with all six
    partitions owned, no two members ever own one at once, nothing is left unprocessed."""
    common = _common(
        cluster,
        namespace,
        session_timeout_ms=2000,
        heartbeat_interval_ms=200,
        delay=0.01,
        max_records=20,
        commit="after",
    )
    killed: dict[str, float] = {}
    with Feeder(js, 6):  # type: ignore[arg-type]
        members.extend(start_member(f"m{i}", tmp_path, **common) for i in range(3))
        for round_ in range(12):
            live = [m for m in members if m.proc.poll() is None]
            wait_for(lambda live=live: union(live) == set(range(6)), 60, "all owned", live)
            members.append(start_member(f"n{round_}", tmp_path, **common))
            live = [m for m in members if m.proc.poll() is None]
            wait_for(
                lambda live=live: union(live) == set(range(6)) and min(counts(live)) >= 1,
                60,
                f"round {round_}: the newcomer has a partition",
                live,
            )
            victim = live[round_ % len(live)]
            if round_ % 2:
                victim.proc.kill()
                killed[victim.name] = time.monotonic()
                victim.proc.wait()
            else:
                victim.stop()
    live = [m for m in members if m.proc.poll() is None]
    coordination = JetStreamCoordination(js)
    wait_for(lambda: _all_committed(js, coordination), 120, "everything committed", live)
    for m in live:
        m.stop()
    intervals: dict[int, list[tuple[float, float, str]]] = {}
    for m in members:
        end = killed.get(m.name, time.monotonic())
        for p, spans in ownership_intervals([m], end).items():
            intervals.setdefault(p, []).extend(spans)
    assert overlaps(intervals) == []
    done = set(processed(members))
    marks = _hwms(js)
    assert [(p, o) for p in range(6) for o in range(marks[p]) if (p, o) not in done] == []
