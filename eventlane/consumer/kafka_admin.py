"""The group coordination of a Kafka log: what ``groups list/describe/reset-offsets/delete``,
``project status``, the console and the runner see of groups on Kafka's coordinator.

Members join and rebalance on the broker (:mod:`.kafka`); this module only *reads* the
groups and administers their offsets, through librdkafka's AdminClient:

* **members** come from ``DescribeGroups`` (member id, client id, host, instance id,
  assignment), the **generation** from the coordinator's own GroupMetadata record
  (:mod:`.kafka_generation`: the description has none): :class:`KafkaGroupView`, with the
  interface of eventlane's coordinator handle; the one change made from outside is removing
  a member (``LeaveGroup`` with its identity: the supervisor's hand-over of a worker it saw
  die); everything else is Kafka's coordinator's;
* **committed offsets** are Kafka's own, in ``__consumer_offsets``
  (``ListConsumerGroupOffsets``), so ``kafka-consumer-groups.sh`` and eventlane agree;
  ``reset`` is ``AlterConsumerGroupOffsets`` and ``delete`` is ``DeleteGroups``, both of
  which the coordinator itself refuses while the group has members (the precondition is
  checked here first, for a clear message);
* **a group's home** (where a projection's read model file lives,
  :meth:`KafkaCoordination.claim_home`) is a claim record in the namespace's
  ``__eventlane_group_homes`` topic (one partition, never compacted): the first claim in log
  order since the group's last release wins, so two hosts claiming at once agree without a
  conditional write.

Group ids are namespaced as topics are (:func:`~.kafka.kafka_group_id`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import orjson
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException
from confluent_kafka import TopicPartition as Kp
from confluent_kafka.admin import AdminClient

from eventlane.consumer.coordinator import validate_group_id
from eventlane.consumer.kafka import ASSIGNORS, kafka_group_id
from eventlane.consumer.kafka_generation import group_generation
from eventlane.consumer.membership import GroupState, Member
from eventlane.consumer.offsets import CommittedOffset, OffsetAndMetadata
from eventlane.errors import ConfigError, ConsumerError, FrameworkError, LogUnavailableError
from eventlane.log.kafka.log import KafkaLog
from eventlane.log.record import TopicPartition
from eventlane.observability import get_logger

__all__ = ["HOMES_TOPIC", "KafkaCoordination", "KafkaGroupView", "KafkaOffsets"]

log = get_logger("eventlane.consumer.group")
T = TypeVar("T")

HOMES_TOPIC = "__eventlane_group_homes"
_LIBRDKAFKA = logging.getLogger("eventlane.consumer.librdkafka")


def _unavailable(group: str, exc: KafkaException) -> LogUnavailableError:
    return LogUnavailableError(f"group {group!r}: Kafka did not answer: {exc.args[0].str()}")


class KafkaOffsets:
    """Committed offsets of the namespace's groups on the cluster (``__consumer_offsets``)."""

    def __init__(self, log_: KafkaLog) -> None:
        self.log = log_
        config: dict[str, Any] = {
            "bootstrap.servers": log_.bootstrap,
            "client.id": "eventlane-groups",
            "logger": _LIBRDKAFKA,
            "log_level": 0,  # errors reach callers as exceptions
        }
        self.config = config
        """The admin's librdkafka settings (bootstrap, logging), for other clients."""
        self.admin = AdminClient(config)
        self._prefix = f"{log_.namespace}." if log_.namespace else ""

    def exists(self) -> bool:
        return True

    def _gid(self, group: str) -> str:
        return kafka_group_id(self.log, group)

    def committed(self, group: str, tp: TopicPartition) -> CommittedOffset | None:
        return self.group_offsets(group, [tp]).get(tp)

    def group_offsets(
        self, group: str, partitions: list[TopicPartition] | None = None
    ) -> dict[TopicPartition, CommittedOffset]:
        gid = self._gid(group)
        kps = None if partitions is None else [Kp(self._prefix + t, p) for t, p in partitions]
        request = ConsumerGroupTopicPartitions(gid, kps)
        try:
            found = self.admin.list_consumer_group_offsets([request])[gid].result()
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND:
                return {}
            raise _unavailable(group, exc) from None
        out = {}
        for kp in found.topic_partitions or []:
            if kp.offset < 0 or not kp.topic.startswith(self._prefix) or kp.error is not None:
                continue
            tp = TopicPartition(kp.topic[len(self._prefix) :], kp.partition)
            out[tp] = CommittedOffset(int(kp.offset), kp.metadata or "", -1, "", 0, -1)
        return out

    def groups(self) -> set[str]:
        """The namespace's groups the coordinator knows (with members or offsets)."""
        try:
            listed = self.admin.list_consumer_groups(request_timeout=self.log.timeout).result()
        except KafkaException as exc:
            raise _unavailable("*", exc) from None
        out = set()
        for g in listed.valid:
            if self._prefix and not g.group_id.startswith(self._prefix):
                continue
            name = g.group_id[len(self._prefix) :]
            with contextlib.suppress(ConfigError):
                out.add(validate_group_id(name))
        return out

    def history(self, group: str) -> Iterator[tuple[int, TopicPartition, int | None]]:
        """Kafka compacts and does not expose commit history: the latest commits."""
        for tp, c in sorted(self.group_offsets(group).items()):
            yield c.log_offset, tp, c.offset

    def commit(
        self,
        group: str,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        *,
        generation: int,
        member_id: str,
        precondition: Callable[[], None] | None = None,
        now_ms: Callable[[], int] | None = None,
    ) -> int:
        """An administrative commit (``groups reset-offsets``): AdminClient's
        ``alter_consumer_group_offsets``, which the coordinator refuses while the group has
        members. Members commit through their own consumer (:mod:`.kafka`)."""
        if precondition is not None:
            precondition()
        if not offsets:
            return -1
        gid = self._gid(group)
        kps = []
        for tp, om in sorted(offsets.items()):
            kp = Kp(self._prefix + tp.topic, tp.partition, om.offset)
            if om.metadata:
                kp.metadata = om.metadata
            kps.append(kp)
        try:
            self.admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(gid, kps)])[
                gid
            ].result()
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() in (KafkaError.UNKNOWN_MEMBER_ID, KafkaError.REBALANCE_IN_PROGRESS):
                raise ConsumerError(
                    f"Kafka refused to set offsets of consumer group {group!r}: it has live"
                    f" members ({err.str()}); stop them first"
                ) from None
            raise _unavailable(group, exc) from None
        return -1

    def delete_group(self, group: str, *, precondition: Callable[[], None] | None = None) -> int:
        """Delete the group on the coordinator (its offsets with it); how many offsets it had."""
        if precondition is not None:
            precondition()
        count = len(self.group_offsets(group))
        gid = self._gid(group)
        try:
            self.admin.delete_consumer_groups([gid], request_timeout=self.log.timeout)[gid].result()
        except KafkaException as exc:
            code = exc.args[0].code()
            if code == KafkaError.GROUP_ID_NOT_FOUND:
                return 0
            if code == KafkaError.NON_EMPTY_GROUP:
                raise ConsumerError(
                    f"cannot delete consumer group {group!r}: Kafka says it has members"
                ) from None
            raise _unavailable(group, exc) from None
        return count

    def barrier(self, group: str) -> None:
        """The coordinator answers a commit once it is stored: nothing is in flight."""


class KafkaGroupView:
    """A read-only handle on one group of Kafka's coordinator, with the interface of
    eventlane's coordinator handle (:class:`~eventlane.consumer.coordination.Coordinator`):
    :meth:`current` is the coordinator's description, with the generation the coordinator
    last stored (:mod:`.kafka_generation`); every membership change is refused."""

    def __init__(self, coordination: KafkaCoordination, group: str) -> None:
        self.coordination = coordination
        self.group = validate_group_id(group)

    def current(self) -> GroupState:
        return self.coordination.describe(self.group)

    def version(self) -> int:
        return 0

    @contextlib.contextmanager
    def locked(self) -> Iterator[GroupState]:
        yield self.current()

    def _refuse(self, what: str) -> ConsumerError:
        return ConsumerError(
            f"group {self.group!r} runs on Kafka's coordinator: eventlane cannot {what} it"
            " from outside (a member joins, leaves or is evicted by its session timeout)"
        )

    def mutate(self, change: Callable[[GroupState], T]) -> T:
        raise self._refuse("change")

    def try_mutate(self, change: Callable[[GroupState], T]) -> tuple[bool, T | None]:
        raise self._refuse("change")

    def expired(self, state: GroupState, now_ns: int | None = None) -> list[str]:
        return []  # the coordinator evicts: what it describes is alive

    def alive(self, state: GroupState) -> list[str]:
        return sorted(state.members)

    def evict_expired(self, *, blocking: bool = True) -> list[str]:
        return []

    def beat(self, member: Member) -> bool:
        raise self._refuse("beat for")

    def polled(self, member: Member) -> None:
        raise self._refuse("poll for")

    def join(self, **kwargs: Any) -> Member:
        raise self._refuse("join")

    def leave(
        self,
        member_id: str,
        reason: str = "close",
        *,
        blocking: bool = True,
        joined_generation: int | None = None,
    ) -> bool:
        """Remove ``member_id`` from the group on the coordinator at once (``LeaveGroup``
        with the member's identity, KIP-345's batch form: what the Java admin's
        ``removeMembersFromConsumerGroup`` sends; librdkafka's AdminClient lacks it, so
        kafka-python's sends it). The coordinator rebalances without it: its partitions move
        now and anything it still sends is refused (a new generation). True if it was a
        member. A member id is unique to one join on Kafka, so ``joined_generation`` has
        nothing to guard."""
        return self.coordination.remove_member(self.group, member_id, reason)

    def release(self, member_id: str, partitions: set[TopicPartition]) -> bool:
        raise self._refuse("release partitions of")

    def refresh_partitions(self, *, blocking: bool = True) -> bool:
        return False

    def close(self) -> None:
        """Nothing is held."""


class KafkaCoordination:
    """The :class:`~eventlane.consumer.coordination.GroupCoordination` of a Kafka log."""

    spans_hosts = True

    def __init__(self, log_: KafkaLog) -> None:
        self.log = log_
        self._offsets = KafkaOffsets(log_)
        self._prefix = f"{log_.namespace}." if log_.namespace else ""
        self._lock = threading.Lock()
        self._remover: Any = None  # kafka-python's admin client, made on first use

    @property
    def offsets(self) -> KafkaOffsets:
        return self._offsets

    def coordinator(self, group: str, *, wake: Callable[[], None] | None = None) -> KafkaGroupView:
        return KafkaGroupView(self, group)

    def describe(self, group: str) -> GroupState:
        """The group as the coordinator describes it now (members and assignments)."""
        gid = kafka_group_id(self.log, group)
        try:
            desc = self._offsets.admin.describe_consumer_groups(
                [gid], request_timeout=self.log.timeout
            )[gid].result()
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND:
                return GroupState(group, generation=-1)
            raise _unavailable(group, exc) from None
        members = {}
        for m in desc.members or []:
            owned = [
                TopicPartition(kp.topic[len(self._prefix) :], kp.partition)
                for kp in (m.assignment.topic_partitions if m.assignment else [])
                if kp.topic.startswith(self._prefix)
            ]
            members[m.member_id] = Member(
                member_id=m.member_id,
                instance_id=m.group_instance_id,
                client_id=m.client_id,
                host=m.host.lstrip("/"),
                pid=0,
                slot=0,
                token=0,
                session_timeout_ms=0,
                topics=tuple(sorted({tp.topic for tp in owned})),
                joined_generation=-1,
                synced_generation=-1,
                target=list(owned),
                owned=dict.fromkeys(owned, -1),
            )
        assignor = desc.partition_assignor if desc.partition_assignor in ASSIGNORS else None
        generation = group_generation(self._offsets.config, gid, self.log.timeout)
        return GroupState(group, generation=generation, assignor=assignor, members=members)

    def group_names(self) -> set[str]:
        return self._offsets.groups()

    def has_state(self, group: str) -> bool:
        return group in self.group_names()

    def remove_member(self, group: str, member_id: str, reason: str) -> bool:
        """See :meth:`KafkaGroupView.leave`."""
        try:
            from kafka.admin import KafkaAdminClient, MemberToRemove  # noqa: PLC0415
            from kafka.errors import KafkaError as PyKafkaError  # noqa: PLC0415
            from kafka.errors import NoError, UnknownMemberIdError  # noqa: PLC0415
        except ImportError:
            raise ConsumerError(
                f"group {group!r}: removing a member from outside needs kafka-python (the"
                " kafka-engine extra); its partitions move when its session times out"
            ) from None
        with self._lock:
            if self._remover is None:
                self._remover = KafkaAdminClient(
                    bootstrap_servers=self.log.bootstrap.split(","),
                    client_id="eventlane-groups",
                    request_timeout_ms=int(self.log.timeout * 1000),
                )
            remover = self._remover
        gid = kafka_group_id(self.log, group)
        try:
            answer = remover.remove_group_members(
                gid, [MemberToRemove(member_id=member_id, reason=reason)]
            )
        except PyKafkaError as exc:
            raise LogUnavailableError(
                f"group {group!r}: Kafka did not remove member {member_id}: {exc}"
            ) from None
        (error,) = answer.values()
        if error is NoError:
            log.info("member removed from the group", group=group, member_id=member_id)
            return True
        if error is UnknownMemberIdError:
            return False  # already gone (it left, or its session expired)
        raise ConsumerError(f"group {group!r}: Kafka refused to remove {member_id}: {error}")

    def close(self) -> None:
        with self._lock:
            remover, self._remover = self._remover, None
        if remover is not None:
            remover.close()

    def delete_state(self, group: str) -> None:
        """The coordinator forgot the group with its offsets: release its home."""
        self._homes_append(group, None)

    # ------------------------------------------------------------------ homes
    def _homes(self) -> None:
        if not self.log.topic_exists(HOMES_TOPIC):
            self.log.create_topic(
                HOMES_TOPIC, 1, {"cleanup_policy": "delete", "retention_ms": -1}, exist_ok=True
            )

    def _homes_append(self, group: str, home: str | None) -> None:
        self._homes()
        body = orjson.dumps({"group": group, "home": home, "ms": time.time_ns() // 1_000_000})
        self.log.append(HOMES_TOPIC, 0, [(group.encode(), body, (), None)])

    def _home_of(self, group: str) -> str | None:
        """The first claim of ``group`` after its last release, in log order."""
        home: str | None = None
        offset = self.log.offsets(HOMES_TOPIC, 0).lwm
        while True:
            records, _ = self.log.read(HOMES_TOPIC, 0, offset)
            if not records:
                return home
            for r in records:
                body = orjson.loads(r.value or b"{}")
                if body.get("group") != group:
                    continue
                if body.get("home") is None:
                    home = None
                elif home is None:
                    home = str(body["home"])
            offset = records[-1].offset + 1

    def claim_home(self, group: str, home: str) -> None:
        """Pin ``group`` to ``home``: append a claim, then the first claim in log order
        since the last release wins (every host reads the same order)."""
        try:
            self._homes()
            if self._home_of(group) is None:
                self._homes_append(group, home)
            winner = self._home_of(group)
        except FrameworkError:
            raise
        if winner != home:
            raise ConfigError(
                f"group {group!r} keeps its read model at {winner}; this worker would build a"
                f" second, partial one at {home}. A projection whose read model is a SQLite"
                " file runs its workers on the host that holds the file (policies and plain"
                f" consumers may run anywhere); to move it, stop its workers and run"
                f" `eventlane groups delete {group}` first"
            )
