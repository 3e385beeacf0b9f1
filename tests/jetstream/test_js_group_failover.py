"""The leader of the groups KV bucket SIGKILLed during a rebalance (issue 13), on a 3-node
cluster of its own (it kills a node): the group converges, no two members ever own a
partition at once, no commit is lost and committed offsets never go backwards.

A member's heartbeats stall with the KV while a new leader is elected; the members do not
evict each other for that stall (see ``KvCoordinator.beat``), so nobody is marked lost."""

from __future__ import annotations

import signal
import sys
import time
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


def _kv_leader(js: JetStreamLog, coordination: JetStreamCoordination) -> str:
    stream = coordination.kv.stream
    info = js.run(js.retry(lambda: js.js.stream_info(stream), what="kv leader"))
    assert info.cluster is not None and info.cluster.leader
    return str(info.cluster.leader)


@pytest.mark.parametrize(
    "round_", [0, *(pytest.param(i, marks=pytest.mark.soak) for i in range(1, 6))]
)
def test_kv_leader_sigkill_during_a_rebalance(
    own_cluster: LocalCluster, namespace: str, members: list[Member], tmp_path: Path, round_: int
) -> None:
    """(Rounds 1-5 repeat it under the soak marker: fresh clusters, other leaders.)"""
    with JetStreamLog.from_url(own_cluster.url, namespace=namespace) as js:
        js.create_topic(TOPIC, 6)
        produce(js, 600, 6)  # type: ignore[arg-type]
        common = {
            "log_url": own_cluster.url,
            "namespace": namespace,
            "group": GROUP,
            "topic": TOPIC,
            "session_timeout_ms": 3000,
            "heartbeat_interval_ms": 300,
            "delay": 0.05,
            "max_records": 10,
            "commit": "after",
        }
        with OffsetWatch(js, GROUP) as watch:
            members.extend(start_member(f"m{i}", tmp_path, **common) for i in range(3))
            wait_for(lambda: counts(members) == [2, 2, 2], START_S, "2/2/2", members)
            leader = _kv_leader(js, watch.coordination)
            produce(js, 300, 6, start=10_000)  # type: ignore[arg-type]
            revoked = sum(len(m.of("revoked")) for m in members)
            members.append(start_member("m3", tmp_path, **common))
            wait_for(
                lambda: sum(len(m.of("revoked")) for m in members) > revoked,
                START_S,
                "the rebalance under way (a partition revoked)",
                members,
            )
            own_cluster.kill(leader, signal.SIGKILL)
            killed_at = time.monotonic()
            wait_for(
                lambda: counts(members) == [1, 1, 2, 2] and union(members) == set(range(6)),
                60,
                "4 members at 2/2/1/1 after the KV leader died",
                members,
            )
            converged_at = time.monotonic()
            assert _kv_leader(js, watch.coordination) != leader
            offsets = watch.coordination.offsets

            def all_committed() -> bool:
                for p in range(6):
                    entry = offsets.committed(GROUP, TopicPartition(TOPIC, p))
                    if entry is None or entry.offset != js.offsets(TOPIC, p).hwm:
                        return False
                return True

            wait_for(all_committed, 60, "everything committed", members)
            for m in members:
                m.stop()
        print(f"\ngroup converged {converged_at - killed_at:.2f}s after SIGKILL of KV leader")
        intervals = ownership_intervals(members, time.monotonic())
        assert overlaps(intervals) == [], "\n".join(
            f"--- {m.name}:\n{m.stderr_path.read_text()[-1500:]}" for m in members
        )
        assert watch.samples > 10 and watch.backwards == []
        done = set(processed(members))
        marks = {p: js.offsets(TOPIC, p).hwm for p in range(6)}
        assert [(p, o) for p in range(6) for o in range(marks[p]) if (p, o) not in done] == []
        # every commit a member saw acknowledged is covered by the final committed offsets
        for m in members:
            for ev in m.of("commit"):
                if ev["ok"]:
                    for p, o in ev["offsets"].items():
                        assert marks[int(p)] >= o
        own_cluster.start_node(leader)
