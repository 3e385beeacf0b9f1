"""Group coordination on JetStream KV (issue 13): membership by compare-and-set, eviction,
and commits fenced by the group state's revision, on the real 3-node cluster."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from eventlane.consumer.jetstream import JetStreamCoordination
from eventlane.consumer.membership import (
    GroupState,
    needs_release,
    to_release,
    validate_commit,
)
from eventlane.consumer.offsets import OffsetAndMetadata
from eventlane.errors import CommitFailedError, ConcurrencyError
from eventlane.log import TopicPartition
from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import JetStreamLog


@pytest.fixture
def js(cluster: LocalCluster, namespace: str) -> Iterator[JetStreamLog]:
    with JetStreamLog.from_url(cluster.url, namespace=namespace) as log:
        log.create_topic("t", 6)
        yield log


def _settle(coords: list, members: list, timeout: float = 20.0) -> GroupState:  # type: ignore[type-arg]
    """Let each member release what it must and take what it is given (as consumers do),
    until every connection sees the same settled state (each learns of the others' changes
    through its change feed, so a view may lag a moment)."""
    deadline = time.monotonic() + timeout
    while True:
        for coord, m in zip(coords, members, strict=True):
            state = coord.current()
            if m.member_id in state.members and needs_release(state, m.member_id):
                coord.release(m.member_id, to_release(state, m.member_id))
        views = [coord.current() for coord in coords]
        settled = all(set(m.owned) == set(m.target) for m in views[0].members.values())
        if settled and len({v.generation for v in views}) == 1:
            return views[0]
        assert time.monotonic() < deadline, "the connections never agreed on a settled state"
        time.sleep(0.05)


def test_three_members_split_six_partitions_and_agree_across_connections(
    js: JetStreamLog, cluster: LocalCluster, namespace: str
) -> None:
    others = [JetStreamLog.from_url(cluster.url, namespace=namespace) for _ in range(2)]
    try:
        coords = [JetStreamCoordination(log).coordinator("g") for log in (js, *others)]
        members = [
            c.join(topics=("t",), assignor="range", session_timeout_ms=10_000) for c in coords
        ]
        state = _settle(coords, members)
        assert sorted(len(m.target) for m in state.members.values()) == [2, 2, 2]
        deadline = time.monotonic() + 5
        while any(c.current().generation != state.generation for c in coords):
            assert time.monotonic() < deadline, "a connection never saw the new state"
            time.sleep(0.05)
        assert coords[1].leave(members[1].member_id)
        state = _settle(coords, members)
        assert sorted(len(m.target) for m in state.members.values()) == [3, 3]
    finally:
        for log in others:
            log.close()


def test_a_silent_member_is_evicted_and_its_beat_fails(js: JetStreamLog) -> None:
    coordination = JetStreamCoordination(js)
    alive, silent = coordination.coordinator("g"), coordination.coordinator("g")
    a = alive.join(topics=("t",), assignor="range", session_timeout_ms=10_000)
    s = silent.join(topics=("t",), assignor="range", session_timeout_ms=300)
    time.sleep(0.5)
    assert alive.beat(a)
    assert alive.evict_expired() == [s.member_id]
    assert not silent.beat(s)  # fenced: its heartbeat key is gone
    assert set(alive.current().members) == {a.member_id}


def test_commits_are_fenced_by_the_state_revision(js: JetStreamLog) -> None:
    coordination = JetStreamCoordination(js)
    coord = coordination.coordinator("g")
    m = coord.join(topics=("t",), assignor="range", session_timeout_ms=10_000)
    tp = TopicPartition("t", 0)
    generation = coord.current().generation

    def owned() -> None:
        validate_commit(coord.current(), m.member_id, None, generation, [tp])

    offsets = coordination.offsets
    offsets.commit(
        "g",
        {tp: OffsetAndMetadata(5)},
        generation=generation,
        member_id=m.member_id,
        precondition=owned,
    )
    assert offsets.committed("g", tp).offset == 5  # type: ignore[union-attr]
    _, rev = coordination.kv.get("g.state")
    other = coordination.coordinator("g")
    other.join(topics=("t",), assignor="range", session_timeout_ms=10_000)  # state moves on
    with pytest.raises(ConcurrencyError):  # a commit checked against the old state: refused
        coordination.kv.put_many({"g.off.t.0": b"{}"}, fence=("g.state", rev))
    coord.leave(m.member_id)
    with pytest.raises(CommitFailedError):  # the evicted/left member is a zombie now
        offsets.commit(
            "g",
            {tp: OffsetAndMetadata(9)},
            generation=generation,
            member_id=m.member_id,
            precondition=owned,
        )
    assert offsets.committed("g", tp).offset == 5  # type: ignore[union-attr]
    assert offsets.groups() == {"g"} and coordination.group_names() == {"g"}


def test_a_state_change_wakes_waiters_of_other_processes(
    js: JetStreamLog, cluster: LocalCluster, namespace: str
) -> None:
    with JetStreamLog.from_url(cluster.url, namespace=namespace) as other:
        watcher = JetStreamCoordination(other).coordinator("g", wake=other.wake)
        assert watcher.current().members == {}
        seen = js.wait_seq()
        JetStreamCoordination(js).coordinator("g").join(
            topics=("t",), assignor="range", session_timeout_ms=10_000
        )
        js.wait(seen, 10.0)  # the watcher's wake() (on its loop thread) reached us
        assert js.wait_seq() != seen
        assert len(watcher.current().members) == 1
