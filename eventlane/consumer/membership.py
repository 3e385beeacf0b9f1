"""A consumer group's membership state and its transitions (pure: no I/O, no clocks).

The state lives in ``<data>/groups/<group>/state.json`` (see :mod:`.coordinator`), which
stores :meth:`GroupState.to_json`::

    {"format": 1, "group": G, "version": V, "generation": N, "rebalance_generation": R,
     "assignor": "cooperative-sticky", "protocol": "cooperative" | "eager",
     "partitions": {topic: count},
     "members": {member_id: {"instance_id", "client_id", "host", "pid", "slot", "token",
                             "session_timeout_ms", "topics": [topic],
                             "joined_generation", "synced_generation",
                             "target": [[topic, partition]],
                             "owned": [[topic, partition, since_generation]]}},
     "updated_ms": ms,
     "clients": null | {"state", "generation", "protocol_type", "protocol", "leader",
                        "published_ms", "lease_ms",
                        "members": {member_id: {"instance_id", "client_id", "host",
                                                "session_timeout_ms",
                                                "assignment": [[topic, partition]]}}}}

``target`` is what the assignor wants a member to own; ``owned`` is what it *may* consume
right now, each partition with the generation since which it has owned it. The protocol:

* **Every membership or metadata change** (join, leave, eviction, static take-over, a topic
  gaining partitions) bumps ``generation`` and recomputes every ``target`` with the
  assignor, feeding it each member's previous target (plus partitions it owns that no target
  claims) so sticky assignors keep what they can.
* **A partition is granted** (added to ``owned``) only while no member owns it. Granting
  bumps ``generation`` (once per state change), so a partition's successive owners hold it
  under strictly increasing generations: the generation is a fencing token.
* **Cooperative** protocol: a member that owns a partition outside its target runs its
  ``on_revoked``, commits, then *releases* it (:func:`release`); only then is it granted to
  its new owner. **Eager** protocol: after a rebalance every member releases everything
  (``synced_generation`` reaches ``rebalance_generation``); grants wait until all have.
* **Removing a member** (graceful leave, eviction) frees its partitions at once.

``clients`` is a group of *Kafka clients* as the Kafka listener's coordinator last published
it (:class:`ClientGroup`): those clients assign partitions among themselves, so nothing here
assigns or fences them; the snapshot only lets ``eventlane groups`` show them. It is a lease:
the listener republishes it while the group has members, and a snapshot older than its
``lease_ms`` (a listener that stopped without saying so) shows no members.

Invariants (checked by :func:`check_invariants`, and by a Hypothesis state-machine test):
the ``owned`` sets are pairwise disjoint; no partition is in two targets; every target
partition exists and is of a topic the member subscribes to; ``since <= generation``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import orjson

from eventlane.consumer.assignors import AssignorSpec, MemberSubscription, get_assignor
from eventlane.errors import CommitFailedError
from eventlane.log.record import TopicPartition

__all__ = [
    "ClientGroup",
    "ClientMember",
    "GroupState",
    "Member",
    "add_member",
    "check_invariants",
    "needs_release",
    "release",
    "remove_members",
    "take_over",
    "to_release",
    "update_partitions",
    "validate_commit",
]

FORMAT = 1


@attrs.define
class Member:
    """One member of a group, as stored in the group state."""

    member_id: str
    instance_id: str | None
    client_id: str
    host: str
    pid: int
    slot: int
    token: int
    session_timeout_ms: int
    topics: tuple[str, ...]
    joined_generation: int = 0
    synced_generation: int = 0
    target: list[TopicPartition] = attrs.field(factory=list)
    owned: dict[TopicPartition, int] = attrs.field(factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "client_id": self.client_id,
            "host": self.host,
            "pid": self.pid,
            "slot": self.slot,
            "token": self.token,
            "session_timeout_ms": self.session_timeout_ms,
            "topics": list(self.topics),
            "joined_generation": self.joined_generation,
            "synced_generation": self.synced_generation,
            "target": [[tp.topic, tp.partition] for tp in sorted(self.target)],
            "owned": [[tp.topic, tp.partition, since] for tp, since in sorted(self.owned.items())],
        }

    @classmethod
    def from_json(cls, member_id: str, body: Mapping[str, Any]) -> Member:
        return cls(
            member_id=member_id,
            instance_id=body.get("instance_id"),
            client_id=str(body.get("client_id", "")),
            host=str(body.get("host", "")),
            pid=int(body.get("pid", 0)),
            slot=int(body["slot"]),
            token=int(body["token"]),
            session_timeout_ms=int(body["session_timeout_ms"]),
            topics=tuple(body.get("topics", ())),
            joined_generation=int(body.get("joined_generation", 0)),
            synced_generation=int(body.get("synced_generation", 0)),
            target=[TopicPartition(t, int(p)) for t, p in body.get("target", ())],
            owned={TopicPartition(t, int(p)): int(s) for t, p, s in body.get("owned", ())},
        )


@attrs.define
class ClientMember:
    """One Kafka client in a :class:`ClientGroup`, with the partitions its group's leader
    assigned it (decoded from the consumer protocol's assignment)."""

    member_id: str
    instance_id: str | None
    client_id: str
    host: str
    session_timeout_ms: int
    assignment: list[TopicPartition] = attrs.field(factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "client_id": self.client_id,
            "host": self.host,
            "session_timeout_ms": self.session_timeout_ms,
            "assignment": [[tp.topic, tp.partition] for tp in sorted(self.assignment)],
        }

    @classmethod
    def from_json(cls, member_id: str, body: Mapping[str, Any]) -> ClientMember:
        return cls(
            member_id=member_id,
            instance_id=body.get("instance_id"),
            client_id=str(body.get("client_id", "")),
            host=str(body.get("host", "")),
            session_timeout_ms=int(body.get("session_timeout_ms", 0)),
            assignment=[TopicPartition(t, int(p)) for t, p in body.get("assignment", ())],
        )


@attrs.define
class ClientGroup:
    """A group of Kafka clients as the Kafka listener last published it (a lease: see the
    module docstring). ``state`` is Kafka's (Empty, PreparingRebalance, CompletingRebalance,
    Stable)."""

    state: str
    generation: int
    protocol_type: str | None
    protocol: str | None
    leader: str | None
    published_ms: int
    lease_ms: int
    members: dict[str, ClientMember] = attrs.field(factory=dict)

    def live(self, now_ms: int) -> bool:
        """Whether the snapshot is current (its publisher renewed it within its lease)."""
        return now_ms - self.published_ms <= self.lease_ms

    def live_members(self, now_ms: int) -> dict[str, ClientMember]:
        return self.members if self.live(now_ms) else {}

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "generation": self.generation,
            "protocol_type": self.protocol_type,
            "protocol": self.protocol,
            "leader": self.leader,
            "published_ms": self.published_ms,
            "lease_ms": self.lease_ms,
            "members": {mid: m.to_json() for mid, m in sorted(self.members.items())},
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> ClientGroup:
        return cls(
            state=str(body["state"]),
            generation=int(body["generation"]),
            protocol_type=body.get("protocol_type"),
            protocol=body.get("protocol"),
            leader=body.get("leader"),
            published_ms=int(body["published_ms"]),
            lease_ms=int(body["lease_ms"]),
            members={
                mid: ClientMember.from_json(mid, m) for mid, m in body.get("members", {}).items()
            },
        )


@attrs.define
class GroupState:
    """The whole shared state of one group (see the module docstring)."""

    group: str
    version: int = 0
    generation: int = 0
    rebalance_generation: int = 0
    assignor: str | None = None
    partitions: dict[str, int] = attrs.field(factory=dict)
    members: dict[str, Member] = attrs.field(factory=dict)
    updated_ms: int = 0
    clients: ClientGroup | None = None

    @property
    def protocol(self) -> str:
        return "eager" if self.assignor is None else get_assignor(self.assignor).protocol

    def owner_of(self, tp: TopicPartition) -> str | None:
        for m in self.members.values():
            if tp in m.owned:
                return m.member_id
        return None

    def member_by_instance(self, instance_id: str) -> Member | None:
        for m in self.members.values():
            if m.instance_id == instance_id:
                return m
        return None

    def barrier_done(self) -> bool:
        """Eager protocol: every member has released what it owned before the rebalance."""
        return all(m.synced_generation >= self.rebalance_generation for m in self.members.values())

    def state_name(self) -> str:
        """Kafka's group state names: ``Empty``, ``Stable``, ``PreparingRebalance``."""
        if not self.members:
            return "Empty"
        for m in self.members.values():
            if needs_release(self, m.member_id) or set(m.owned) != set(m.target):
                return "PreparingRebalance"
        return "Stable"

    def topics(self) -> set[str]:
        return {t for m in self.members.values() for t in m.topics}

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "format": FORMAT,
                "group": self.group,
                "version": self.version,
                "generation": self.generation,
                "rebalance_generation": self.rebalance_generation,
                "assignor": self.assignor,
                "protocol": self.protocol,
                "partitions": dict(sorted(self.partitions.items())),
                "members": {mid: m.to_json() for mid, m in sorted(self.members.items())},
                "updated_ms": self.updated_ms,
                **({} if self.clients is None else {"clients": self.clients.to_json()}),
            },
            option=orjson.OPT_INDENT_2,
        )

    @classmethod
    def from_json(cls, data: bytes) -> GroupState:
        body = orjson.loads(data)
        return cls(
            group=str(body["group"]),
            version=int(body.get("version", 0)),
            generation=int(body.get("generation", 0)),
            rebalance_generation=int(body.get("rebalance_generation", 0)),
            assignor=body.get("assignor"),
            partitions={str(t): int(n) for t, n in body.get("partitions", {}).items()},
            members={mid: Member.from_json(mid, m) for mid, m in body.get("members", {}).items()},
            updated_ms=int(body.get("updated_ms", 0)),
            clients=None if body.get("clients") is None else ClientGroup.from_json(body["clients"]),
        )

    def copy(self) -> GroupState:
        return GroupState.from_json(self.to_json())


# ---------------------------------------------------------------------- transitions
def _rebalance(state: GroupState) -> None:
    """New generation and new targets for every member, then grant what is free."""
    state.generation += 1
    state.rebalance_generation = state.generation
    if not state.members:
        state.assignor = None
        return
    assert state.assignor is not None
    spec: AssignorSpec = get_assignor(state.assignor)
    claimed = {tp for m in state.members.values() for tp in m.target}
    subs = {
        mid: MemberSubscription(
            frozenset(m.topics),
            tuple(sorted(set(m.target) | {tp for tp in m.owned if tp not in claimed})),
        )
        for mid, m in state.members.items()
    }
    counts = {t: n for t, n in state.partitions.items() if t in state.topics()}
    plan = spec.assign(subs, counts)
    for mid, m in state.members.items():
        m.target = list(plan.get(mid, []))
    _grant(state, bumped=True)


def _grant(state: GroupState, *, bumped: bool) -> list[tuple[str, TopicPartition]]:
    """Give every free target partition to its target member (eager: after the barrier)."""
    if state.protocol == "eager" and not state.barrier_done():
        return []
    owned = {tp for m in state.members.values() for tp in m.owned}
    grants = [
        (mid, tp)
        for mid, m in sorted(state.members.items())
        for tp in sorted(m.target)
        if tp not in owned
    ]
    if grants:
        if not bumped:
            state.generation += 1
        for mid, tp in grants:
            state.members[mid].owned[tp] = state.generation
    return grants


def add_member(state: GroupState, member: Member, assignor: str) -> None:
    """A new member joins: it owns nothing yet and has nothing to release."""
    if not state.members:
        state.assignor = assignor
    member.target, member.owned = [], {}
    member.joined_generation = member.synced_generation = state.generation + 1
    state.members[member.member_id] = member
    _rebalance(state)


def remove_members(state: GroupState, member_ids: Iterable[str]) -> list[str]:
    """Members leave or are evicted: their partitions are free at once. Returns who left."""
    gone = [mid for mid in member_ids if state.members.pop(mid, None) is not None]
    if gone:
        _rebalance(state)
    return gone


def take_over(state: GroupState, old_id: str, member: Member) -> None:
    """A static member (same ``instance_id``) replaces ``old_id`` and keeps its partitions.

    The old member id is gone (its commits are rejected from now on). Partitions the old
    member owned and was due to keep are re-granted to the new one under a new generation;
    partitions it owned but was due to give up are freed. Other members are untouched.
    """
    old = state.members.pop(old_id)
    state.generation += 1
    member.joined_generation = state.generation
    member.synced_generation = max(state.generation, state.rebalance_generation)
    member.target = list(old.target)
    member.owned = {tp: state.generation for tp in old.owned if tp in set(old.target)}
    state.members[member.member_id] = member
    _grant(state, bumped=True)


def needs_release(state: GroupState, member_id: str) -> bool:
    """Whether the member must run ``on_revoked`` and :func:`release` now."""
    m = state.members[member_id]
    if state.protocol == "eager" and m.synced_generation < state.rebalance_generation:
        return True
    return any(tp not in set(m.target) for tp in m.owned)


def to_release(state: GroupState, member_id: str) -> set[TopicPartition]:
    """The partitions the member must give up now (eager: everything it owns)."""
    m = state.members[member_id]
    if state.protocol == "eager" and m.synced_generation < state.rebalance_generation:
        return set(m.owned)
    target = set(m.target)
    return {tp for tp in m.owned if tp not in target}


def release(state: GroupState, member_id: str, partitions: Iterable[TopicPartition]) -> None:
    """The member has stopped consuming ``partitions`` (and committed): hand them on."""
    m = state.members[member_id]
    for tp in partitions:
        m.owned.pop(tp, None)
    if state.protocol == "eager" and m.synced_generation < state.rebalance_generation:
        m.owned.clear()
    m.synced_generation = state.generation
    _grant(state, bumped=False)


def update_partitions(state: GroupState, counts: Mapping[str, int]) -> bool:
    """Record new partition counts of subscribed topics; rebalance if any changed."""
    changed = {t: n for t, n in counts.items() if state.partitions.get(t, 0) != n}
    if not changed:
        return False
    state.partitions.update(changed)
    for t in [t for t, n in state.partitions.items() if n == 0]:
        del state.partitions[t]
    if state.members:
        _rebalance(state)
    return True


def check_invariants(state: GroupState) -> None:
    """Raise ``AssertionError`` if the state breaks an invariant of the module docstring."""
    seen: dict[TopicPartition, str] = {}
    for mid, m in state.members.items():
        for tp, since in m.owned.items():
            assert tp not in seen, f"{tp} owned by {seen[tp]} and {mid}"
            seen[tp] = mid
            assert since <= state.generation, f"{tp} owned since {since} > {state.generation}"
        for tp in m.target:
            assert tp.topic in m.topics, f"{mid} targets {tp} outside its subscription"
            assert 0 <= tp.partition < state.partitions.get(tp.topic, 0), f"{tp} does not exist"
    targets = [tp for m in state.members.values() for tp in m.target]
    assert len(targets) == len(set(targets)), "a partition is targeted twice"


def validate_commit(
    state: GroupState,
    member_id: str,
    instance_id: str | None,
    generation: int,
    partitions: Iterable[TopicPartition],
) -> None:
    """Raise :class:`~eventlane.errors.CommitFailedError` unless ``member_id``, acting at
    ``generation``, may commit every one of ``partitions`` in ``state``.

    Accepted iff the member is in the group (not evicted, not left, not replaced by a newer
    instance with its ``instance_id``), owns each partition now, and has owned it without
    interruption since a generation ``<= generation`` (Kafka's ``validateOffsetCommit``,
    with per-partition ownership instead of one group-wide generation, so a cooperative
    member keeps committing the partitions it keeps while others rebalance).
    """
    group = state.group
    me = state.members.get(member_id)
    if me is None:
        other = state.member_by_instance(instance_id) if instance_id is not None else None
        first = next(iter(partitions), None)
        topic = None if first is None else first.topic
        partition = None if first is None else first.partition
        if other is not None:
            raise CommitFailedError(
                f"commit rejected: group {group!r} instance id {instance_id!r} now belongs to"
                f" member {other.member_id} (generation {state.generation}); member"
                f" {member_id} (generation {generation}) is fenced",
                topic=topic,
                partition=partition,
            )
        raise CommitFailedError(
            f"commit rejected: member {member_id} is no longer in group {group!r} (evicted or"
            f" left; its generation {generation}, the group's {state.generation}); rejoin and"
            " resume from the committed offsets",
            topic=topic,
            partition=partition,
        )
    for tp in partitions:
        since = me.owned.get(tp)
        if since is None:
            raise CommitFailedError(
                f"commit rejected: group {group!r} member {member_id} does not own"
                f" {tp.topic}-{tp.partition} at generation {state.generation}",
                topic=tp.topic,
                partition=tp.partition,
            )
        if generation < since:
            raise CommitFailedError(
                f"commit rejected: stale generation {generation} for group {group!r}:"
                f" {tp.topic}-{tp.partition} was (re)assigned to member {member_id} at"
                f" generation {since}",
                topic=tp.topic,
                partition=tp.partition,
            )
        if generation > state.generation:
            raise CommitFailedError(
                f"commit rejected: generation {generation} of group {group!r} is from the"
                f" future (the group is at {state.generation})",
                topic=tp.topic,
                partition=tp.partition,
            )
