"""Property tests of the assignors (pure functions): exactly once, balance, stickiness."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlane.consumer.assignors import (
    ASSIGNORS,
    MemberSubscription,
    get_assignor,
    range_assign,
    roundrobin_assign,
    sticky_assign,
)
from eventlane.errors import ConfigError
from eventlane.log import TopicPartition

TOPICS = ["a", "b", "c"]

member_ids = st.lists(
    st.text("xyzw0123", min_size=1, max_size=4), min_size=1, max_size=9, unique=True
)
partition_counts = st.fixed_dictionaries({t: st.integers(0, 12) for t in TOPICS})


@st.composite
def groups(
    draw: st.DrawFn, homogeneous: bool
) -> tuple[dict[str, MemberSubscription], dict[str, int]]:
    counts = draw(partition_counts)
    ids = draw(member_ids)
    if homogeneous:
        topics = frozenset(draw(st.sets(st.sampled_from(TOPICS), min_size=1)))
        subs = {m: MemberSubscription(topics) for m in ids}
    else:
        subs = {
            m: MemberSubscription(frozenset(draw(st.sets(st.sampled_from(TOPICS), min_size=1))))
            for m in ids
        }
    # Arbitrary (possibly invalid, stale or conflicting) previous assignments.
    universe = [TopicPartition(t, p) for t in TOPICS for p in range(14)]
    subs = {
        m: s._replace(previous=tuple(draw(st.lists(st.sampled_from(universe), max_size=8))))
        for m, s in subs.items()
    }
    return subs, counts


def expected_partitions(
    subs: dict[str, MemberSubscription], counts: dict[str, int]
) -> list[TopicPartition]:
    topics = {t for s in subs.values() for t in s.topics}
    return sorted(TopicPartition(t, p) for t in topics for p in range(counts[t]))


ALL = [range_assign, roundrobin_assign, sticky_assign]


@pytest.mark.parametrize("assign", ALL, ids=lambda f: f.__name__)
@given(group=groups(homogeneous=False))
def test_every_partition_assigned_exactly_once_to_a_subscriber(assign, group) -> None:
    subs, counts = group
    result = assign(subs, counts)
    assert set(result) == set(subs)
    flat = [tp for tps in result.values() for tp in tps]
    assert sorted(flat) == expected_partitions(subs, counts)  # each exactly once
    for m, tps in result.items():
        assert all(tp.topic in subs[m].topics for tp in tps)
        assert tps == sorted(tps)
    assert assign(subs, counts) == result  # deterministic


@pytest.mark.parametrize("assign", [roundrobin_assign, sticky_assign], ids=lambda f: f.__name__)
@given(group=groups(homogeneous=True))
def test_balanced_within_one_with_equal_subscriptions(assign, group) -> None:
    subs, counts = group
    sizes = [len(tps) for tps in assign(subs, counts).values()]
    assert max(sizes) - min(sizes) <= 1


@given(group=groups(homogeneous=True))
def test_range_is_balanced_within_one_per_topic(group) -> None:
    subs, counts = group
    result = range_assign(subs, counts)
    for topic in TOPICS:
        sizes = [sum(tp.topic == topic for tp in tps) for tps in result.values()]
        if any(topic in s.topics for s in subs.values()):
            assert max(sizes) - min(sizes) <= 1


def valid_previous(
    subs: dict[str, MemberSubscription], counts: dict[str, int]
) -> dict[str, set[TopicPartition]]:
    """Previous partitions that still exist; one claimed twice counts for the first member."""
    valid = set(expected_partitions(subs, counts))
    claimed: set[TopicPartition] = set()
    out = {}
    for m in sorted(subs):
        out[m] = {tp for tp in subs[m].previous if tp in valid and tp not in claimed}
        claimed |= out[m]
    return out


def optimal_kept(subs: dict[str, MemberSubscription], counts: dict[str, int]) -> int:
    """The most previous partitions a balanced assignment can leave where they were."""
    prev = {m: len(tps) for m, tps in valid_previous(subs, counts).items()}
    base, extra = divmod(len(expected_partitions(subs, counts)), len(subs))
    above = sum(1 for n in prev.values() if n > base)
    return sum(min(n, base) for n in prev.values()) + min(extra, above)


@given(group=groups(homogeneous=True))
def test_sticky_keeps_as_many_as_balance_allows(group) -> None:
    subs, counts = group
    result = sticky_assign(subs, counts)
    previous = valid_previous(subs, counts)
    kept = sum(len(set(result[m]) & previous[m]) for m in subs)
    assert kept == optimal_kept(subs, counts)


@settings(max_examples=60)
@given(
    ids=member_ids,
    count=st.integers(1, 24),
    changes=st.lists(st.tuples(st.booleans(), st.text("pqrs", min_size=1, max_size=3)), max_size=8),
)
def test_sticky_across_membership_changes(ids, count, changes) -> None:
    """Join/leave sequences: after each change, only the partitions that balance forces to
    move move (a leaver's partitions, and the share a joiner must get)."""
    current = sticky_assign({m: MemberSubscription(frozenset("a")) for m in ids}, {"a": count})
    for join, name in changes:
        members = set(current)
        if join:
            members.add(name)
        elif len(members) > 1:
            members.discard(sorted(members)[len(name) % len(members)])
        subs = {m: MemberSubscription(frozenset("a"), tuple(current.get(m, ()))) for m in members}
        nxt = sticky_assign(subs, {"a": count})
        kept = sum(len(set(nxt[m]) & set(current.get(m, ()))) for m in members)
        assert kept == optimal_kept(subs, {"a": count})
        sizes = [len(v) for v in nxt.values()]
        assert max(sizes) - min(sizes) <= 1
        current = nxt


def test_known_assignor_names_and_protocols() -> None:
    assert {n: s.protocol for n, s in ASSIGNORS.items()} == {
        "range": "eager",
        "roundrobin": "eager",
        "sticky": "eager",
        "cooperative-sticky": "cooperative",
    }
    with pytest.raises(ConfigError, match="unknown assignor"):
        get_assignor("nope")


def test_members_beyond_partition_count_stay_idle() -> None:
    subs = {f"m{i}": MemberSubscription(frozenset("a")) for i in range(7)}
    for assign in ALL:
        sizes = Counter(len(v) for v in assign(subs, {"a": 6}).values())
        assert sizes == {1: 6, 0: 1}
