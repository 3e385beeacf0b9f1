"""Partition assignors: pure functions from a group's members to an assignment.

An assignor gets every member's subscription (the topics it wants) and previous assignment
(what it was given last time), and the partition count of every topic; it returns, for every
member, the partitions it should own. No I/O, no clocks, no randomness: the same input gives
the same output in every process, so any member can compute the plan.

Guarantees of every assignor here:

* every partition of a subscribed topic goes to exactly one member subscribed to that topic;
* members are processed in sorted member-id order, so results are deterministic.

Balance:

* ``range`` (Kafka's ``RangeAssignor``): per topic, consecutive ranges of partitions to the
  members subscribed to it, in member order; balanced within one *per topic* (several topics
  can add up to an imbalance: the first members get the extra partition of every topic).
* ``roundrobin`` (``RoundRobinAssignor``): all partitions, sorted by (topic, partition), dealt
  to members in turn, skipping members not subscribed to the topic; balanced within one when
  all members subscribe to the same topics.
* ``sticky`` (``StickyAssignor``): balanced within one when all members subscribe to the same
  topics, *and* keeps as many of each member's previous partitions as that balance allows
  (members that held more than the average keep the extra partition first). With differing
  subscriptions it keeps previous partitions, gives new ones to the least loaded eligible
  member, then moves partitions from members holding two or more above an eligible member.

Whether a rebalance is *eager* (every member revokes everything, then the new plan is handed
out) or *cooperative* (only partitions that move are revoked, then handed to their new
owner) is the protocol of the assignor name, see :data:`ASSIGNORS`; the functions themselves
only compute the target plan.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from eventlane.errors import ConfigError
from eventlane.log.record import TopicPartition

__all__ = [
    "ASSIGNORS",
    "Assignment",
    "AssignorFn",
    "AssignorSpec",
    "MemberSubscription",
    "range_assign",
    "roundrobin_assign",
    "sticky_assign",
    "get_assignor",
]


class MemberSubscription(NamedTuple):
    """What an assignor knows of one member: its topics and its previous partitions."""

    topics: frozenset[str]
    previous: tuple[TopicPartition, ...] = ()


Assignment = dict[str, list[TopicPartition]]
"""Member id → partitions, each list sorted by (topic, partition)."""

AssignorFn = Callable[[Mapping[str, MemberSubscription], Mapping[str, int]], Assignment]


def _sub(*topics: str, previous: Iterable[tuple[str, int]] = ()) -> MemberSubscription:
    """Doctest shorthand: a subscription to ``topics`` with ``previous`` partitions."""
    return MemberSubscription(frozenset(topics), tuple(TopicPartition(*tp) for tp in previous))


def _show(assignment: Assignment) -> dict[str, list[str]]:
    """Doctest shorthand: ``{"a": ["t-0", "t-1"]}``."""
    return {m: [f"{tp.topic}-{tp.partition}" for tp in tps] for m, tps in assignment.items()}


def _all_partitions(
    members: Mapping[str, MemberSubscription], partitions: Mapping[str, int]
) -> list[TopicPartition]:
    topics = sorted({t for sub in members.values() for t in sub.topics})
    return [TopicPartition(t, p) for t in topics for p in range(max(partitions.get(t, 0), 0))]


def range_assign(
    members: Mapping[str, MemberSubscription], partitions: Mapping[str, int]
) -> Assignment:
    """Kafka's range assignor.

    >>> _show(range_assign({"a": _sub("t"), "b": _sub("t")}, {"t": 5}))
    {'a': ['t-0', 't-1', 't-2'], 'b': ['t-3', 't-4']}
    >>> _show(range_assign({"a": _sub("t", "u"), "b": _sub("t")}, {"t": 2, "u": 2}))
    {'a': ['t-0', 'u-0', 'u-1'], 'b': ['t-1']}
    """
    out: Assignment = {m: [] for m in sorted(members)}
    topics = sorted({t for sub in members.values() for t in sub.topics})
    for topic in topics:
        subscribers = [m for m in sorted(members) if topic in members[m].topics]
        count = max(partitions.get(topic, 0), 0)
        per, extra = divmod(count, len(subscribers))
        start = 0
        for i, member in enumerate(subscribers):
            length = per + (1 if i < extra else 0)
            out[member].extend(TopicPartition(topic, p) for p in range(start, start + length))
            start += length
    return {m: sorted(tps) for m, tps in out.items()}


def roundrobin_assign(
    members: Mapping[str, MemberSubscription], partitions: Mapping[str, int]
) -> Assignment:
    """Kafka's round-robin assignor.

    >>> _show(roundrobin_assign({"a": _sub("t", "u"), "b": _sub("t", "u")}, {"t": 2, "u": 1}))
    {'a': ['t-0', 'u-0'], 'b': ['t-1']}
    >>> _show(roundrobin_assign({"a": _sub("t"), "b": _sub("u")}, {"t": 2, "u": 1}))
    {'a': ['t-0', 't-1'], 'b': ['u-0']}
    """
    order = sorted(members)
    out: Assignment = {m: [] for m in order}
    if not order:
        return out
    turn = 0
    for tp in _all_partitions(members, partitions):
        for step in range(len(order)):
            member = order[(turn + step) % len(order)]
            if tp.topic in members[member].topics:
                out[member].append(tp)
                turn = (turn + step + 1) % len(order)
                break
    return out


def _valid_previous(
    members: Mapping[str, MemberSubscription], partitions: Mapping[str, int]
) -> dict[str, list[TopicPartition]]:
    """Each member's previous partitions that still exist and that it still subscribes to;
    a partition claimed by two members stays with the first in member order."""
    claimed: set[TopicPartition] = set()
    out: dict[str, list[TopicPartition]] = {}
    for m in sorted(members):
        sub = members[m]
        keep = []
        for tp in sorted(set(sub.previous)):
            if (
                tp.topic in sub.topics
                and 0 <= tp.partition < partitions.get(tp.topic, 0)
                and tp not in claimed
            ):
                keep.append(tp)
                claimed.add(tp)
        out[m] = keep
    return out


def sticky_assign(
    members: Mapping[str, MemberSubscription], partitions: Mapping[str, int]
) -> Assignment:
    """Kafka's sticky assignor: balanced, and moving as few partitions as possible.

    A third member joins two that own three partitions each: one partition moves from each.

    >>> before = {"a": _sub("t", previous=[("t", 0), ("t", 1), ("t", 2)]),
    ...           "b": _sub("t", previous=[("t", 3), ("t", 4), ("t", 5)]),
    ...           "c": _sub("t")}
    >>> _show(sticky_assign(before, {"t": 6}))
    {'a': ['t-0', 't-1'], 'b': ['t-3', 't-4'], 'c': ['t-2', 't-5']}

    A member leaves: the survivors keep theirs and share its partitions.

    >>> after = {"a": _sub("t", previous=[("t", 0), ("t", 1)]),
    ...          "c": _sub("t", previous=[("t", 2), ("t", 5)])}
    >>> _show(sticky_assign(after, {"t": 6}))
    {'a': ['t-0', 't-1', 't-3'], 'c': ['t-2', 't-4', 't-5']}
    """
    order = sorted(members)
    if not order:
        return {}
    previous = _valid_previous(members, partitions)
    topic_sets = {members[m].topics for m in order}
    if len(topic_sets) == 1:
        result = _sticky_homogeneous(order, previous, _all_partitions(members, partitions))
    else:
        result = _sticky_general(order, members, previous, _all_partitions(members, partitions))
    return {m: sorted(result[m]) for m in order}


def _sticky_homogeneous(
    order: list[str],
    previous: dict[str, list[TopicPartition]],
    all_partitions: list[TopicPartition],
) -> dict[str, list[TopicPartition]]:
    """Every member subscribes to the same topics: exact quotas, maximal retention.

    Quotas are ``floor(P/N)`` or one more for ``P mod N`` members; those extra slots go first
    to members that previously held more than the floor (so they keep one more), which
    maximises the number of partitions kept.
    """
    n = len(order)
    base, extra = divmod(len(all_partitions), n)
    by_previous = sorted(order, key=lambda m: (-len(previous[m]), m))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(by_previous)}
    result = {m: previous[m][: quota[m]] for m in order}
    taken = {tp for tps in result.values() for tp in tps}
    free = [tp for tp in all_partitions if tp not in taken]
    for tp in free:
        member = min(
            (m for m in order if len(result[m]) < quota[m]), key=lambda m: (len(result[m]), m)
        )
        result[member].append(tp)
    return result


def _sticky_general(
    order: list[str],
    members: Mapping[str, MemberSubscription],
    previous: dict[str, list[TopicPartition]],
    all_partitions: list[TopicPartition],
) -> dict[str, list[TopicPartition]]:
    """Members subscribe to different topics: keep, fill the least loaded, then even out."""
    result = {m: list(previous[m]) for m in order}
    owner = {tp: m for m, tps in result.items() for tp in tps}
    eligible = {tp: [m for m in order if tp.topic in members[m].topics] for tp in all_partitions}
    # Most constrained partitions first, each to its least loaded eligible member.
    for tp in sorted(all_partitions, key=lambda tp: (len(eligible[tp]), tp)):
        if tp in owner:
            continue
        member = min(eligible[tp], key=lambda m: (len(result[m]), m))
        result[member].append(tp)
        owner[tp] = member
    # Even out: move a partition from a member two or more above an eligible member. Each
    # move lowers the sum of squared loads, so this terminates.
    moved = True
    while moved:
        moved = False
        for tp in sorted(owner, key=lambda tp: (-len(result[owner[tp]]), tp)):
            src = owner[tp]
            dst = min(eligible[tp], key=lambda m: (len(result[m]), m))
            if len(result[src]) - len(result[dst]) >= 2:
                result[src].remove(tp)
                result[dst].append(tp)
                owner[tp] = dst
                moved = True
                break
    return result


class AssignorSpec(NamedTuple):
    """An assignor function and its rebalance protocol (``eager`` or ``cooperative``)."""

    name: str
    assign: AssignorFn
    protocol: str


ASSIGNORS: dict[str, AssignorSpec] = {
    "range": AssignorSpec("range", range_assign, "eager"),
    "roundrobin": AssignorSpec("roundrobin", roundrobin_assign, "eager"),
    "sticky": AssignorSpec("sticky", sticky_assign, "eager"),
    "cooperative-sticky": AssignorSpec("cooperative-sticky", sticky_assign, "cooperative"),
}
"""Assignor names (Kafka's ``partition.assignment.strategy`` short names) → spec."""


def get_assignor(name: str) -> AssignorSpec:
    """The assignor called ``name``.

    >>> get_assignor("range").protocol
    'eager'
    >>> get_assignor("cooperative-sticky").protocol
    'cooperative'
    >>> get_assignor("fair")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    eventlane.errors.ConfigError: unknown assignor 'fair'; known: cooperative-sticky, range, ...
    """
    try:
        return ASSIGNORS[name]
    except KeyError:
        raise ConfigError(
            f"unknown assignor {name!r}; known: {', '.join(sorted(ASSIGNORS))}"
        ) from None
