"""Consumer groups on Kafka's own coordinator, as real processes (issue 33, item 3).

The consumer-group acceptance of the embedded and JetStream engines
(tests/consumer/test_group_processes.py, tests/jetstream/test_js_group_processes.py) run
against the 3-broker cluster with the same member processes (tests/consumer/group_members.py):
each member is a ``GroupConsumer`` on a ``kafka://`` log, so a librdkafka member of the
group on the brokers' coordinator (classic protocol, cooperative-sticky). 3 members settle at
2/2/2 with no partition owned twice; kill -9 of one moves its partitions within the session
timeout plus slack; a SIGSTOPped zombie's commits are refused by the coordinator after its
partitions moved, and the group's committed offsets (sampled in ``__consumer_offsets``
through the AdminClient) never go backwards. Kafka's smallest session timeout is the
brokers' ``group.min.session.timeout.ms`` (6 s by default, kept), so the sessions here are 6 s.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from eventlane.cli import main
from eventlane.console.data import ConsoleData
from eventlane.consumer.group import GroupConsumer
from eventlane.consumer.kafka_admin import KafkaCoordination
from eventlane.errors import ConfigError
from eventlane.log import TopicPartition
from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "consumer"))
import group_members
from group_members import (
    GROUP,
    START_S,
    TOPIC,
    Member,
    OffsetWatch,
    counts,
    overlaps,
    ownership_intervals,
    processed,
    produce,
    start_member,
    union,
    wait_for,
)

members = pytest.fixture(name="members")(group_members.members_fixture)
SESSION_MS = 6000
SLACK_S = 6.0  # the rebalance after the eviction, on a loaded 2-core machine


@pytest.fixture
def kafka(kafka_cluster: LocalKafkaCluster, namespace: str) -> Iterator[KafkaLog]:
    with KafkaLog.from_url(f"{kafka_cluster.url}?namespace={namespace}") as log:
        log.create_topic(TOPIC, 6)
        yield log


def _hwms(log: KafkaLog) -> dict[int, int]:
    return {p: log.offsets(TOPIC, p).hwm for p in range(6)}


def _all_committed(log: KafkaLog) -> bool:
    marks = _hwms(log)
    found = KafkaCoordination(log).offsets.group_offsets(GROUP)
    return all(
        (e := found.get(TopicPartition(TOPIC, p))) is not None and e.offset == marks[p]
        for p in range(6)
    )


def _common(cluster: LocalKafkaCluster, namespace: str, **extra: object) -> dict[str, object]:
    return {
        "log_url": cluster.url,
        "namespace": namespace,
        "group": GROUP,
        "topic": TOPIC,
        "session_timeout_ms": SESSION_MS,
        "heartbeat_interval_ms": 500,
        **extra,
    }


def test_three_members_two_each_then_kill9_reassigned(
    kafka: KafkaLog,
    kafka_cluster: LocalKafkaCluster,
    namespace: str,
    members: list[Member],
    tmp_path: Path,
) -> None:
    """3 members settle at 2/2/2 with every partition owned once; kill -9 of one (with a
    batch processed but not committed): the survivors own its partitions within the session
    timeout + slack, no partition is ever owned twice, every record is processed (the
    victim's uncommitted batch again), and ``groups describe`` shows the survivors."""
    produce(kafka, 600, 6)  # type: ignore[arg-type]
    common = _common(kafka_cluster, namespace, delay=0.05, max_records=20, commit="after")
    members.append(start_member("m0", tmp_path, **{**common, "delay": 1.5}))
    members.extend(start_member(f"m{i}", tmp_path, **common) for i in range(1, 3))
    wait_for(
        lambda: counts(members) == [2, 2, 2] and union(members) == set(range(6)),
        START_S,
        "3 members at 2/2/2",
        members,
    )
    victim, survivors = members[0], members[1:]
    seen = len(victim.of("processing"))
    produce(kafka, 120, 6, start=10_000)  # type: ignore[arg-type]
    wait_for(lambda: len(victim.of("processing")) > seen, 30, "victim processing", members)
    victim.proc.kill()
    killed_at = time.monotonic()
    victim.proc.wait()
    lost_partitions = victim.owned()
    reassigned_at = wait_for(
        lambda: union(survivors) == set(range(6)),
        SESSION_MS / 1000 + 60,
        "survivors own every partition",
        survivors,
    )
    took = reassigned_at - killed_at
    sys.stderr.write(f"\nkill -9: partitions reassigned after {took:.2f}s\n")
    assert took < SESSION_MS / 1000 + SLACK_S
    for m in survivors:
        for ev in m.of("assigned"):
            if set(ev["tps"]) & lost_partitions:
                assert ev["t"] - killed_at < SESSION_MS / 1000 + SLACK_S
    produce(kafka, 300, 6, start=3000)  # type: ignore[arg-type]
    wait_for(lambda: _all_committed(kafka), 60, "everything committed", survivors)
    described = KafkaCoordination(kafka).describe(GROUP)
    assert len(described.members) == 2
    assert {tp.partition for m in described.members.values() for tp in m.owned} == set(range(6))
    for m in survivors:
        m.stop()
    intervals = ownership_intervals([victim], killed_at)
    for p, spans in ownership_intervals(survivors, time.monotonic()).items():
        intervals.setdefault(p, []).extend(spans)
    assert overlaps(intervals) == []
    assert sorted(intervals) == list(range(6))
    done = Counter(processed(members))
    marks = _hwms(kafka)
    assert [(p, o) for p in range(6) for o in range(marks[p]) if (p, o) not in done] == []
    # the victim's last batch, if the kill landed before its commit, was processed again
    events = victim.read()
    last = max(i for i, ev in enumerate(events) if ev["ev"] == "records")
    if not any(ev["ev"] == "commit" for ev in events[last:]):
        assert all(done[(p, o)] > 1 for p, o in events[last]["recs"])
    # generations only grow, member by member
    for m in members:
        gens = [ev["gen"] for ev in m.of("assigned")]
        assert gens == sorted(gens) and all(g >= 1 for g in gens)


def test_sigstop_zombie_is_fenced_and_offsets_never_go_backwards(
    kafka: KafkaLog,
    kafka_cluster: LocalKafkaCluster,
    namespace: str,
    members: list[Member],
    tmp_path: Path,
) -> None:
    """SIGSTOP a member past its session timeout: its partitions move to the other member;
    after SIGCONT every commit it attempts as its old membership is refused by Kafka's
    coordinator (stale generation or unknown member); its batches applied to a read model
    with positions in the same transaction apply nothing twice; the committed offsets in
    ``__consumer_offsets`` never go backwards and every record is processed."""
    produce(kafka, 600, 6)  # type: ignore[arg-type]
    readmodel = str(tmp_path / "readmodel.sqlite")
    common = _common(
        kafka_cluster,
        namespace,
        delay=0.4,
        max_records=60,
        commit="after",
        projector=readmodel,
        catch_up=True,
    )
    offsets = KafkaCoordination(kafka).offsets
    with OffsetWatch(lambda: offsets.group_offsets(GROUP)) as watch:
        # the zombie holds each batch for 2 s, so the SIGSTOP below lands while it has one
        members.append(start_member("m0", tmp_path, **{**common, "delay": 2.0}))
        members.append(start_member("m1", tmp_path, **common))
        wait_for(lambda: counts(members) == [3, 3], START_S, "3/3", members)
        zombie, other = members
        seen = len(zombie.of("processing"))
        produce(kafka, 120, 6, start=10_000)  # type: ignore[arg-type]
        wait_for(lambda: len(zombie.of("processing")) > seen, 30, "zombie processing", members)
        zombie.signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        old_member = zombie.of("records")[-1]["member"]
        old_gen = zombie.of("records")[-1]["gen"]
        reassigned_at = wait_for(
            lambda: other.owned() == set(range(6)),
            SESSION_MS / 1000 + 60,
            "other owns all",
            [other],
        )
        took = reassigned_at - stopped_at
        sys.stderr.write(f"\nSIGSTOP: partitions reassigned after {took:.2f}s\n")
        assert took < SESSION_MS / 1000 + SLACK_S
        produce(kafka, 120, 6, start=600)  # type: ignore[arg-type]
        wait_for(lambda: _all_committed(kafka), 60, "the other member committed all", [other])
        resumed_at = time.monotonic()  # before: the zombie may run (and commit) at once
        zombie.signal(signal.SIGCONT)
        wait_for(
            lambda: any(ev["t0"] > resumed_at for ev in zombie.of("commit")),
            30,
            "the zombie tries to commit",
            members,
        )
        produce(kafka, 60, 6, start=20_000)  # type: ignore[arg-type]
        wait_for(lambda: _all_committed(kafka), 60, "everything committed", members)
        for m in members:
            m.stop()
    late = [
        ev for ev in zombie.of("commit") if ev["t0"] > stopped_at and ev["member"] == old_member
    ]
    assert late, "the zombie never attempted a commit after it was resumed"
    assert all(not ev["ok"] for ev in late), late
    assert all(GROUP in ev["error"] and "commit rejected" in ev["error"] for ev in late)
    assert zombie.of("lost"), "the zombie should learn it lost its partitions"
    assert other.of("assigned")[-1]["gen"] > old_gen  # the new owner's generation is newer
    assert watch.samples > 10 and watch.backwards == []
    done = set(processed(members))
    marks = _hwms(kafka)
    assert [(p, o) for p in range(6) for o in range(marks[p]) if (p, o) not in done] == []
    # the read model: every record applied exactly once (its primary key forbids twice)
    applied = [tuple(rec) for m in members for ev in m.of("applied") for rec in ev["recs"]]
    assert len(applied) == len(set(applied))
    assert set(applied) == {(p, o) for p in range(6) for o in range(marks[p])}


def test_the_kafka_member_overrides_every_public_method_of_group_consumer() -> None:
    """``GroupConsumer(kafka_log)`` is a KafkaGroupConsumer: none of the embedded member's
    code (its coordinator, its fetcher) may run on a Kafka log through a method it forgot."""
    from eventlane.consumer.kafka import KafkaGroupConsumer  # noqa: PLC0415

    public = {n for n in vars(GroupConsumer) if not n.startswith("_") or n == "__enter__"}
    missing = sorted(n for n in public if n not in vars(KafkaGroupConsumer) and n != "__exit__")
    assert missing == []


def _eventlane(*args: str) -> Any:
    """The CLI in this process (a child's start costs seconds on a loaded machine)."""
    return CliRunner().invoke(main, list(args))


def test_consume_group_and_groups_commands_against_the_cluster(
    kafka: KafkaLog, tmp_path: Path
) -> None:
    """``eventlane consume --group`` is a member of a group on Kafka's coordinator and
    commits there; ``groups list/describe`` and the console's groups pages read the
    committed offsets back from ``__consumer_offsets``; ``groups reset-offsets`` is refused while the group has a live
    member (here one in this process) and moves the offsets once it has none."""
    produce(kafka, 60, 6)  # type: ignore[arg-type]
    base = ["--data", str(tmp_path / "data"), "--log", kafka.url]
    out = _eventlane(*base, "consume", TOPIC, "--group", GROUP, "--timeout", "3")
    assert out.exit_code == 0, out.stderr[-2000:]
    assert len(out.stdout.splitlines()) == 60  # stdout: the records only
    listed = json.loads(_eventlane(*base, "groups", "list", "--json").stdout)
    assert [g["group"] for g in listed] == [GROUP]
    described = json.loads(_eventlane(*base, "groups", "describe", GROUP, "--json").stdout)
    assert described["members"] == []
    assert {
        r["partition"]: (r["committed"], r["lag"]) for r in described["offsets"]
    } == dict.fromkeys(range(6), (10, 0))
    console = ConsoleData(KafkaLog.from_url(kafka.url))  # the console's groups pages
    try:
        assert [(g["group"], g["lag"]) for g in console.groups()] == [(GROUP, 0)]
        assert {r["partition"]: r["committed"] for r in console.group(GROUP)["offsets"]} == (
            dict.fromkeys(range(6), 10)
        )
    finally:
        console.close()
    member = GroupConsumer(kafka, group_id=GROUP, topics=[TOPIC], session_timeout_ms=SESSION_MS)
    try:
        deadline = time.monotonic() + START_S
        while len(member.assignment()) < 6:
            member.poll(0.2)
            assert time.monotonic() < deadline
        live = json.loads(_eventlane(*base, "groups", "describe", GROUP, "--json").stdout)
        assert [m["member_id"] for m in live["members"]] == [member.member_id]
        assert len(live["members"][0]["assignment"]) == 6
        refused = _eventlane(
            *base, "groups", "reset-offsets", GROUP, "--topic", TOPIC, "--to-earliest", "--execute"
        )
        assert refused.exit_code != 0 and "live member" in refused.stderr
    finally:
        member.close(autocommit=False)
    reset = _eventlane(
        *base, "groups", "reset-offsets", GROUP, "--topic", TOPIC, "--to-offset", "4", "--execute"
    )
    assert reset.exit_code == 0, reset.stderr[-2000:]
    committed = KafkaCoordination(kafka).offsets.group_offsets(GROUP)
    assert {tp.partition: c.offset for tp, c in committed.items()} == dict.fromkeys(range(6), 4)


def test_a_session_timeout_kafka_refuses_is_a_config_error(kafka: KafkaLog) -> None:
    """Below the brokers' group.min.session.timeout.ms (1 s on the development cluster,
    6 s by Kafka's default) Kafka refuses the join: the member says so instead of retrying
    forever."""
    member = GroupConsumer(
        kafka, group_id="short", topics=[TOPIC], session_timeout_ms=500, heartbeat_interval_ms=100
    )
    try:
        with pytest.raises(ConfigError, match=r"session_timeout_ms=500"):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                member.poll(0.5)
    finally:
        member.close()


def test_a_dead_members_partitions_move_at_once_when_the_supervisor_removes_it(
    kafka: KafkaLog,
    kafka_cluster: LocalKafkaCluster,
    namespace: str,
    members: list[Member],
    tmp_path: Path,
) -> None:
    """The supervisor's hand-over on a known death, on Kafka: find the dead process's
    member by its client id in the coordinator's description and remove it (``LeaveGroup``
    with its identity); the survivor owns every partition long before the dead member's
    30 s session would have expired."""
    common = _common(
        kafka_cluster, namespace, session_timeout_ms=30_000, heartbeat_interval_ms=1000
    )
    members.extend(
        start_member(f"m{i}", tmp_path, **common, client_id=f"worker-{i}") for i in range(2)
    )
    wait_for(lambda: counts(members) == [3, 3], START_S, "3/3", members)
    dead, survivor = members
    dead.proc.kill()
    dead.proc.wait()
    killed_at = time.monotonic()
    coordinator = KafkaCoordination(kafka).coordinator(GROUP)
    with coordinator.locked() as state:
        found = [m.member_id for m in state.members.values() if m.client_id == "worker-0"]
    assert len(found) == 1
    assert coordinator.leave(found[0], reason="worker exited") is True
    assert coordinator.leave(found[0], reason="worker exited") is False  # gone already
    moved_at = wait_for(lambda: survivor.owned() == set(range(6)), 60, "hand-over", [survivor])
    took = moved_at - killed_at
    sys.stderr.write(f"\nhand-over: partitions moved {took:.2f}s after the kill\n")
    assert took < 15.0  # the session (30 s) played no part


def test_groups_describe_shows_the_coordinators_generation(kafka: KafkaLog, tmp_path: Path) -> None:
    """``groups describe`` (and ``groups list``) on Kafka show the group's generation as the
    coordinator holds it: the one its members synchronised with (librdkafka's generation
    id), growing with each rebalance; a group with no member keeps its last one."""
    base = ["--data", str(tmp_path / "data"), "--log", kafka.url]

    def described() -> int:
        out = _eventlane(*base, "groups", "describe", GROUP, "--json")
        assert out.exit_code == 0, out.stderr[-2000:]
        return int(json.loads(out.stdout)["generation"])

    def stable(members: list[GroupConsumer], partitions: int) -> None:
        deadline = time.monotonic() + START_S
        while (
            sum(len(m.assignment()) for m in members) < partitions
            or len({m.generation for m in members}) > 1
        ):
            for m in members:
                m.poll(0.1)
            assert time.monotonic() < deadline, "the group did not settle"

    first = GroupConsumer(kafka, group_id=GROUP, topics=[TOPIC], session_timeout_ms=SESSION_MS)
    second: GroupConsumer | None = None
    try:
        stable([first], 6)
        assert first.generation >= 1
        assert described() == first.generation
        second = GroupConsumer(kafka, group_id=GROUP, topics=[TOPIC], session_timeout_ms=SESSION_MS)
        deadline = time.monotonic() + START_S
        while not second.assignment() or len(first.assignment()) != 3:
            first.poll(0.1), second.poll(0.1)
            assert time.monotonic() < deadline, "the second member got nothing"
        stable([first, second], 6)
        assert second.generation > 1 and described() == second.generation
        listed = json.loads(_eventlane(*base, "groups", "list", "--json").stdout)
        assert [g["generation"] for g in listed if g["group"] == GROUP] == [second.generation]
    finally:
        first.close(autocommit=False)
        if second is not None:
            second.close(autocommit=False)
