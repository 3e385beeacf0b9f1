"""Group administration: list, describe (with lag), reset offsets, delete.

What the ``eventlane groups`` commands run. Every function takes the :class:`Log` of the data
directory and reads the same files the members use; nothing here talks to members, so the
commands work whether members are running or not.

* **describe** reports the members (as of the shared state, after evicting members whose
  session expired, exactly as a member would), the partitions each owns now, and per
  partition the committed offset, the high-water mark and the lag ``hwm - committed``.
  A group of Kafka clients (the Kafka listener's, published into the group state as a
  lease: :class:`~eventlane.consumer.membership.ClientGroup`) shows its members, their
  client ids, hosts and assigned partitions while the lease is current; once it lapses (the
  listener stopped) the group shows its committed offsets and no members.
* **reset_offsets** and **delete_group** are refused while the group has live members (as
  Kafka refuses them for a group that is not empty): they run under the group's lock, so
  no member can join while they work.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from eventlane.consumer.coordination import (
    Coordinator,
    GroupCoordination,
    OffsetStorage,
    coordination_for,
)
from eventlane.consumer.coordinator import validate_group_id
from eventlane.consumer.membership import ClientMember, GroupState, Member
from eventlane.consumer.offsets import ADMIN_MEMBER, OffsetAndMetadata
from eventlane.errors import ConfigError, ConsumerError, UnknownTopicError
from eventlane.log.port import Log
from eventlane.log.record import TopicPartition
from eventlane.observability import get_logger

__all__ = [
    "RESET_MODES",
    "delete_group",
    "describe_group",
    "partition_lag",
    "group_exists",
    "list_groups",
    "live_worker_members",
    "parse_datetime_ms",
    "reset_offsets",
]

log = get_logger("eventlane.consumer.admin")

RESET_MODES = ("to-earliest", "to-latest", "to-offset", "to-datetime", "shift-by")


def _coordination(log_: Log, coordination: GroupCoordination | None) -> GroupCoordination:
    return coordination if coordination is not None else coordination_for(log_)


def group_exists(log_: Log, group: str, coordination: GroupCoordination | None = None) -> bool:
    validate_group_id(group)
    groups = _coordination(log_, coordination)
    return groups.has_state(group) or group in groups.offsets.groups()


def _require(log_: Log, group: str, groups: GroupCoordination) -> None:
    if not group_exists(log_, group, groups):
        raise ConsumerError(f"consumer group {group!r} does not exist")


@contextmanager
def _coordinator(groups: GroupCoordination, group: str) -> Iterator[Coordinator]:
    coord = groups.coordinator(group)
    try:
        yield coord
    finally:
        coord.close()


def list_groups(log_: Log, coordination: GroupCoordination | None = None) -> list[dict[str, Any]]:
    """Every group with membership state or committed offsets:
    ``[{"group", "state", "generation", "members"}]`` sorted by name."""
    groups = _coordination(log_, coordination)
    names = set(groups.offsets.groups())
    with_state = groups.group_names()
    names.update(with_state)
    out = []
    for name in sorted(names):
        try:
            validate_group_id(name)
        except ConfigError:
            continue
        state = _live_state(groups, name) if name in with_state else GroupState(name)
        view = _View(state)
        out.append(
            {
                "group": name,
                "state": view.state,
                "generation": view.generation,
                "members": len(view.members),
            }
        )
    return out


def _live_state(groups: GroupCoordination, group: str) -> GroupState:
    with _coordinator(groups, group) as coord:
        coord.evict_expired()
        return coord.current().copy()


def live_worker_members(
    log_: Log, group: str, coordination: GroupCoordination | None = None
) -> list[str]:
    """The live eventlane workers of ``group`` (Kafka clients excluded): what the Kafka
    listener asks before it lets Kafka clients form a group of that name."""
    groups = _coordination(log_, coordination)
    if not groups.has_state(group):
        return []
    with _coordinator(groups, group) as coord:
        return coord.alive(coord.current())


class _View:
    """What ``groups list/describe`` show of a group state: its eventlane workers, or the
    Kafka clients of the listener's current snapshot (the two kinds never share a group)."""

    def __init__(self, state: GroupState, now_ms: int | None = None) -> None:
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        clients = state.clients
        live = {} if clients is None else clients.live_members(now)
        self.members: list[Member | ClientMember]
        if live or (not state.members and clients is not None):
            assert clients is not None
            self.state = clients.state if clients.live(now) else "Empty"
            self.generation = clients.generation
            self.members = list(live.values())
        else:
            self.state = state.state_name()
            self.generation = state.generation
            self.members = list(state.members.values())
        self.members.sort(key=lambda m: m.member_id)

    def topics(self) -> set[str]:
        return {tp.topic for m in self.members for tp in _partitions(m)}


def _partitions(member: Member | ClientMember) -> list[TopicPartition]:
    return sorted(member.owned if isinstance(member, Member) else member.assignment)


def partition_lag(hwm: int, lwm: int, position: int | None) -> int:
    """The lag of one partition: ``hwm - position``, the records a consumer at
    ``position`` (the next offset it reads: a group's committed offset, a projector's
    stored position) has still to read; ``None`` (nothing committed or applied yet) counts
    from the low-water mark. Never negative. ``groups describe`` and ``project status``
    both use this one definition.

    >>> partition_lag(120, 0, 100), partition_lag(120, 20, None), partition_lag(5, 0, 9)
    (20, 100, 0)
    """
    return max(hwm - (lwm if position is None else position), 0)


def describe_group(
    log_: Log, group: str, coordination: GroupCoordination | None = None
) -> dict[str, Any]:
    """The ``groups describe --json`` document::

        {"group", "state", "generation",
         "members": [{"member_id", "instance_id", "client_id", "host",
                      "assignment": [{"topic", "partition"}]}],
         "offsets": [{"topic", "partition", "committed", "hwm", "lag"}]}

    ``committed`` and ``lag`` are ``null`` for a partition the group never committed.
    """
    groups = _coordination(log_, coordination)
    offsets = groups.offsets
    _require(log_, group, groups)
    state = _live_state(groups, group) if groups.has_state(group) else GroupState(group)
    view = _View(state)
    committed = offsets.group_offsets(group)
    topics = state.topics() | view.topics() | {tp.topic for tp in committed}
    rows = []
    for topic in sorted(topics):
        try:
            count = log_.partition_count(topic)
        except UnknownTopicError:
            count = 0
        partitions = {TopicPartition(topic, p) for p in range(count)}
        partitions |= {tp for tp in committed if tp.topic == topic}
        for tp in sorted(partitions):
            entry = committed.get(tp)
            marks = log_.offsets(topic, tp.partition) if tp.partition < count else None
            hwm = None if marks is None else marks.hwm
            value = None if entry is None else entry.offset
            lag = (
                None
                if value is None or marks is None
                else partition_lag(marks.hwm, marks.lwm, value)
            )
            rows.append(
                {
                    "topic": tp.topic,
                    "partition": tp.partition,
                    "committed": value,
                    "hwm": hwm,
                    "lag": lag,
                }
            )
    members = [
        {
            "member_id": m.member_id,
            "instance_id": m.instance_id,
            "client_id": m.client_id,
            "host": m.host,
            "assignment": [{"topic": tp.topic, "partition": tp.partition} for tp in _partitions(m)],
        }
        for m in view.members
    ]
    return {
        "group": group,
        "state": view.state,
        "generation": view.generation,
        "members": members,
        "offsets": rows,
    }


def parse_datetime_ms(text: str) -> int:
    """An ISO-8601 date-time as milliseconds since the epoch (naive means UTC).

    >>> parse_datetime_ms("2024-01-01T00:00:00Z")
    1704067200000
    >>> parse_datetime_ms("2024-01-01T01:00:00+01:00")
    1704067200000
    """
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"not an ISO-8601 date-time: {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _plan(
    log_: Log, group: str, topic: str, mode: str, value: int | str | None, offsets: OffsetStorage
) -> list[dict[str, Any]]:
    if mode not in RESET_MODES:
        raise ConfigError(f"reset mode must be one of {', '.join(RESET_MODES)}, got {mode!r}")
    if mode in ("to-offset", "shift-by", "to-datetime") and value is None:
        raise ConfigError(f"--{mode} needs a value")
    amount = int(value) if mode in ("to-offset", "shift-by") and value is not None else 0
    count = log_.partition_count(topic)
    current = offsets.group_offsets(group)
    when = parse_datetime_ms(str(value)) if mode == "to-datetime" else None
    rows = []
    for p in range(count):
        tp = TopicPartition(topic, p)
        marks = log_.offsets(topic, p)
        entry = current.get(tp)
        if mode == "to-earliest":
            new = marks.lwm
        elif mode == "to-latest":
            new = marks.hwm
        elif mode == "to-offset":
            new = amount
        elif mode == "shift-by":
            new = (marks.lwm if entry is None else entry.offset) + amount
        else:
            assert when is not None
            found = log_.offset_for_time(topic, p, when)
            new = marks.hwm if found is None else found
        row: dict[str, Any] = {
            "topic": topic,
            "partition": p,
            "current": None if entry is None else entry.offset,
            "new": min(max(new, marks.lwm), marks.hwm),
        }
        if row["new"] != new:  # outside [lwm, hwm]: said, as Kafka's tool says it
            row["requested"] = new
        rows.append(row)
    return rows


def _refuse_if_live(coord: Coordinator, state: GroupState, action: str) -> None:
    expired = set(coord.expired(state))
    live = sorted(mid for mid in state.members if mid not in expired)
    if state.clients is not None:
        live += sorted(state.clients.live_members(time.time_ns() // 1_000_000))
    if live:
        raise ConsumerError(
            f"cannot {action} consumer group {coord.group!r}: it has {len(live)} live"
            f" member(s) ({', '.join(live)}); stop them first"
        )


def reset_offsets(
    log_: Log,
    group: str,
    topic: str,
    mode: str,
    value: int | str | None = None,
    *,
    execute: bool = False,
    coordination: GroupCoordination | None = None,
) -> list[dict[str, Any]]:
    """Plan (and with ``execute``, commit) new offsets of ``group`` for every partition of
    ``topic``: ``[{"topic", "partition", "current", "new"}]``.

    Modes: ``to-earliest`` (the low-water mark), ``to-latest`` (the high-water mark),
    ``to-offset N``, ``to-datetime ISO`` (the first offset with a timestamp at or after it,
    else the high-water mark), ``shift-by N`` (from the committed offset, or the low-water
    mark where none). Every result is clamped to ``[lwm, hwm]``; a row whose offset was
    clamped also has ``"requested"``, the offset asked for. Refused (even the dry run) while
    the group has live members.
    """
    validate_group_id(group)
    groups = _coordination(log_, coordination)
    offsets = groups.offsets
    with _coordinator(groups, group) as coord, coord.locked() as state:
        _refuse_if_live(coord, state, "reset offsets of")
        rows = _plan(log_, group, topic, mode, value, offsets)
        if execute:
            # Members join only under the lock we hold (file coordination), or the commit is
            # fenced by the state it checked (KV coordination): none can appear meanwhile.
            offsets.commit(
                group,
                {
                    TopicPartition(r["topic"], r["partition"]): OffsetAndMetadata(r["new"])
                    for r in rows
                },
                generation=-1,
                member_id=ADMIN_MEMBER,
                precondition=lambda: _refuse_if_live(coord, coord.current(), "reset offsets of"),
            )
            log.info("offsets reset", group=group, topic=topic, mode=mode, partitions=len(rows))
        return rows


def delete_group(log_: Log, group: str, coordination: GroupCoordination | None = None) -> int:
    """Delete ``group``: tombstone its committed offsets and remove its state directory.
    Refused while it has live members. Returns how many offsets were deleted."""
    groups = _coordination(log_, coordination)
    offsets = groups.offsets
    _require(log_, group, groups)
    with _coordinator(groups, group) as coord, coord.locked() as state:
        _refuse_if_live(coord, state, "delete")
        deleted = offsets.delete_group(
            group, precondition=lambda: _refuse_if_live(coord, coord.current(), "delete")
        )
        groups.delete_state(group)
    log.info("group deleted", group=group, offsets=deleted)
    return deleted
