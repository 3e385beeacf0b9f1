"""Consumer groups on Apache Kafka's own group coordinator (issue 33, item 3).

One concept at ~820 lines: one group member over librdkafka, overriding every public method
of :class:`~eventlane.consumer.group.GroupConsumer` (a test checks it), whose rebalance
callbacks, fencing and commits depend on each other; the administration of Kafka groups
(describe, reset, delete) is :mod:`.kafka_admin`.

A :class:`~eventlane.consumer.group.GroupConsumer` opened on a
:class:`~eventlane.log.kafka.log.KafkaLog` is a :class:`KafkaGroupConsumer`: a librdkafka
consumer (confluent-kafka) that joins the group on the broker's coordinator with the
**classic** group protocol and the ``cooperative-sticky`` assignor. Why classic and not
KIP-848's consumer protocol, although Kafka 4 and librdkafka 2.16 both speak it:

* the session timeout and heartbeat interval are the member's own (``session_timeout_ms``,
  as in every eventlane engine); under KIP-848 they are the broker's or the group's
  configuration (``group.consumer.session.timeout.ms``, at least 45 s by default), which a
  worker cannot choose;
* the fencing token is the group's **generation id**, which librdkafka exposes (its
  serialised group metadata, :func:`generation_of`) and which grows with every rebalance;
  KIP-848's member epoch would do as well, but the rest of the protocol gains us nothing
  here: cooperative (incremental) rebalancing is what ``cooperative-sticky`` already gives
  the classic protocol;
* static membership (``group.instance.id``) and ``max.poll.interval.ms`` behave as in
  eventlane's own coordinator.

Invariants:

* **Group ids and topics are namespaced** as the log's topics are (``<ns>.<name>``), so two
  logs with different namespaces on one cluster never share a group.
* **Ownership** is what the coordinator assigned, as librdkafka's rebalance callbacks report
  it; they run inside :meth:`KafkaGroupConsumer.poll` (and ``close``), in the caller's
  thread, so ``on_revoked`` / ``on_assigned`` / ``on_lost`` never race the application. A
  ``seek`` from ``on_assigned`` becomes the partition's starting offset when it is
  assigned, else the group's committed offset, else ``auto_offset_reset``.
* **Fencing**: :attr:`KafkaGroupConsumer.generation` is librdkafka's generation id, read
  after every rebalance callback and every poll. A partition's next owner holds it under a
  strictly greater generation than its previous owner (cooperative: a partition moves only
  in the rebalance after the one in which it was revoked; eviction: a new generation without
  the evicted member), so the read model's generation check refuses a zombie's batch. A
  commit goes to the coordinator with the member id and generation librdkafka holds; the
  coordinator refuses a stale generation (``ILLEGAL_GENERATION``) or an evicted member
  (``UNKNOWN_MEMBER_ID``), raised as :class:`~eventlane.errors.CommitFailedError`. A commit
  for a partition this member does not own, or before it joined, is refused here first.
* **What it delivers** is what every eventlane reader of a Kafka log sees: records the
  log-order rule (:mod:`eventlane.log.kafka.order`) rejects are skipped
  (:meth:`~eventlane.log.kafka.log.KafkaLog.visible`), their offsets committed past.
* **Committed offsets** are Kafka's, in ``__consumer_offsets``, read and administered
  through the AdminClient (:mod:`.kafka_admin`), so Kafka's own tools see the same group.

Not thread-safe (one consumer per thread), except :meth:`KafkaGroupConsumer.owns` and the
``generation`` / ``member_id`` properties.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_STORED,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
)
from confluent_kafka import TopicPartition as Kp

from eventlane.consumer.coordinator import validate_group_id
from eventlane.consumer.free import OFFSET_RESETS
from eventlane.consumer.group import CommitCallback, GroupConsumer
from eventlane.consumer.listener import CallbackListener, Partitions, RebalanceListener
from eventlane.consumer.offsets import CommittedOffset, OffsetAndMetadata
from eventlane.errors import (
    CommitFailedError,
    ConfigError,
    ConsumerError,
    LogUnavailableError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    OutcomeUnknownError,
)
from eventlane.log.kafka.log import KafkaLog
from eventlane.log.kafka.records import take_messages
from eventlane.log.record import Record, TopicPartition
from eventlane.observability import get_logger

__all__ = ["KafkaGroupConsumer", "generation_of", "kafka_group_id"]

log = get_logger("eventlane.consumer.group")
_LIBRDKAFKA = logging.getLogger("eventlane.consumer.librdkafka")

ASSIGNORS = {
    "range": "range",
    "roundrobin": "roundrobin",
    "cooperative-sticky": "cooperative-sticky",
}
"""eventlane's assignor names -> librdkafka's (librdkafka has no eager ``sticky``)."""

_FENCED = {
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.FENCED_INSTANCE_ID,
    KafkaError._ASSIGNMENT_LOST,
    KafkaError._STATE,
}
_UNKNOWN = {KafkaError._TIMED_OUT, KafkaError._MSG_TIMED_OUT, KafkaError.REQUEST_TIMED_OUT}
_CGMD_MAGIC = b"CGMDv2:"


def generation_of(metadata: bytes) -> int:
    """The generation id in librdkafka's serialised consumer group metadata
    (``rd_kafka_consumer_group_metadata_write``: ``"CGMDv2:"``, the generation as a native
    int32, then the ids), -1 when not a member.

    >>> generation_of(b"CGMDv2:" + struct.pack("=i", 7) + b"g\\x00m\\x00\\x01")
    7
    """
    if not metadata.startswith(_CGMD_MAGIC) or len(metadata) < len(_CGMD_MAGIC) + 4:
        raise ConsumerError(f"unexpected librdkafka group metadata {metadata[:16]!r}")
    (generation,) = struct.unpack_from("=i", metadata, len(_CGMD_MAGIC))
    return int(generation)


def kafka_group_id(log_: KafkaLog, group: str) -> str:
    """The group's id on the cluster: namespaced as the log's topics are.

    >>> kafka_group_id(type("L", (), {"namespace": "shop"})(), "billing")
    'shop.billing'
    """
    return f"{log_.namespace}.{group}" if log_.namespace else group


def _positive_ms(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer (milliseconds), got {value!r}")
    return value


def member_records(
    messages: list[Message],
    prefix: str,
    owned: set[TopicPartition],
    paused: set[TopicPartition],
    positions: dict[TopicPartition, int],
    on_event: Callable[[Message, KafkaError], None],
) -> list[Record]:
    """The records a member's poll returns from ``messages`` (what ``consume`` handed back),
    advancing ``positions``: a message of a partition not owned or paused (fetched before a
    revoke or pause) or below the partition's position (fetched before a seek backwards) is
    dropped; an event (a message with an error) goes to ``on_event`` (which may raise), in
    its place among the records.

    ``consume`` hands back runs of one partition's messages; each run is taken in one
    :func:`~eventlane.log.kafka.records.take_messages` pass (in C when the extension is built),
    so the only Python step per message is finding where its run ends."""
    out: list[Record] = []
    i, n = 0, len(messages)
    while i < n:
        m = messages[i]
        err = m.error()
        if err is not None:
            on_event(m, err)
            i += 1
            continue
        ktopic, partition = m.topic(), m.partition()
        j = i + 1
        while j < n:
            x = messages[j]
            if x.partition() != partition or x.topic() != ktopic:
                break
            j += 1
        tp = TopicPartition((ktopic or "")[len(prefix) :], partition or 0)
        if tp not in owned or tp in paused:
            # fetched before a revoke or pause: read again from the position; its events
            # are still reported
            for x in messages[i:j]:
                if (e := x.error()) is not None:
                    on_event(x, e)
            i = j
            continue
        run = messages[i:j] if i or j < n else messages
        before = positions.get(tp, -1)
        used, _, nxt = take_messages(run, tp.topic, tp.partition, before, -1, 0, _NO_BOUND, out)
        if nxt != before:
            positions[tp] = nxt
        i += used  # an event inside the run: handled at the top of the loop
    return out


_NO_BOUND = 1 << 62
"""``max_bytes`` for :func:`take_messages` that a poll never reaches (a poll is bounded by
``max_poll_records``, which ``consume`` already applied)."""


class KafkaGroupConsumer(GroupConsumer):
    """A member of consumer group ``group_id`` on the Kafka cluster of ``log_``; the same
    interface and contract as :class:`~eventlane.consumer.group.GroupConsumer` (which
    returns one of these for a Kafka log). See the module docstring."""

    def __init__(
        self,
        log_: KafkaLog,
        *,
        group_id: str,
        topics: Iterable[str] = (),
        group_instance_id: str | None = None,
        client_id: str = "eventlane",
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 3_000,
        max_poll_interval_ms: int = 300_000,
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5_000,
        auto_offset_reset: str = "latest",
        assignor: str = "cooperative-sticky",
        listener: RebalanceListener | None = None,
        on_assigned: Callable[[Partitions], None] | None = None,
        on_revoked: Callable[[Partitions], None] | None = None,
        on_lost: Callable[[Partitions], None] | None = None,
        max_poll_records: int = 500,
        fetch_max_bytes: int = 1 << 20,
        offset_store: object = None,
        coordination: object = None,
    ) -> None:
        self.group_id = validate_group_id(group_id)
        if group_instance_id is not None:
            validate_group_id(group_instance_id, "group instance id")
        self.session_timeout_ms = _positive_ms("session_timeout_ms", session_timeout_ms)
        self.heartbeat_interval_ms = _positive_ms("heartbeat_interval_ms", heartbeat_interval_ms)
        self.max_poll_interval_ms = _positive_ms("max_poll_interval_ms", max_poll_interval_ms)
        self.auto_commit_interval_ms = _positive_ms(
            "auto_commit_interval_ms", auto_commit_interval_ms
        )
        if heartbeat_interval_ms >= session_timeout_ms:
            raise ConfigError(
                f"heartbeat_interval_ms ({heartbeat_interval_ms}) must be lower than"
                f" session_timeout_ms ({session_timeout_ms})"
            )
        if max_poll_interval_ms < session_timeout_ms:
            raise ConfigError(
                f"max_poll_interval_ms ({max_poll_interval_ms}) must be at least"
                f" session_timeout_ms ({session_timeout_ms}) on Kafka (librdkafka's rule)"
            )
        if auto_offset_reset not in OFFSET_RESETS:
            raise ConfigError(
                f"auto_offset_reset must be one of {', '.join(OFFSET_RESETS)},"
                f" got {auto_offset_reset!r}"
            )
        if assignor not in ASSIGNORS:
            raise ConfigError(
                f"assignor {assignor!r} is not offered on Kafka (librdkafka): use one of"
                f" {', '.join(ASSIGNORS)}"
            )
        if listener is not None and (on_assigned or on_revoked or on_lost):
            raise ConfigError("pass either listener= or on_assigned/on_revoked/on_lost, not both")
        if offset_store is not None:
            raise ConfigError("offset_store= is the embedded engine's; Kafka keeps the offsets")
        self.log = log_
        self._kafka = log_
        self.group_instance_id = group_instance_id
        self.client_id = client_id
        self.enable_auto_commit = enable_auto_commit
        self.auto_offset_reset = auto_offset_reset
        self.assignor = assignor
        self._eager = assignor != "cooperative-sticky"  # librdkafka: assign(), not incremental
        self.max_poll_records = max_poll_records
        self._listener = listener or CallbackListener(on_assigned, on_revoked, on_lost)
        self._topics: tuple[str, ...] = tuple(sorted(set(topics)))
        self._prefix = f"{log_.namespace}." if log_.namespace else ""
        config: dict[str, Any] = {
            "bootstrap.servers": log_.bootstrap,
            "group.id": kafka_group_id(log_, self.group_id),
            "client.id": client_id,
            "session.timeout.ms": session_timeout_ms,
            "heartbeat.interval.ms": heartbeat_interval_ms,
            "max.poll.interval.ms": max_poll_interval_ms,
            "partition.assignment.strategy": ASSIGNORS[assignor],
            "enable.auto.commit": False,  # commits go through commit() (see _maybe_auto_commit)
            "enable.auto.offset.store": False,
            "auto.offset.reset": auto_offset_reset,
            "isolation.level": "read_committed",
            "check.crcs": True,
            "fetch.max.bytes": max(fetch_max_bytes, 1 << 20),  # librdkafka's least
            "fetch.wait.max.ms": 100,
            # notice a topic gaining partitions within seconds (the default is 5 minutes)
            "topic.metadata.refresh.interval.ms": 3000,
            "logger": _LIBRDKAFKA,
            "log_level": 0,
            "error_cb": self._on_error,
        }
        if group_instance_id is not None:
            config["group.instance.id"] = group_instance_id
        self._consumer = Consumer(config)
        self._state_lock = threading.Lock()  # owned / generation / member, read by owns()
        self._owned: set[TopicPartition] = set()
        self._paused: set[TopicPartition] = set()
        self._positions: dict[TopicPartition, int] = {}
        self._pending_seeks: dict[TopicPartition, int] = {}
        self._generation = -1
        self._member_name: str | None = None
        self._subscribed = False
        self._closed = False
        self._errors: list[Exception] = []
        self._fenced: str | None = None  # a static member replaced by a newer instance
        self._last_committed: dict[TopicPartition, int] = {}
        self._next_auto_commit = time.monotonic() + auto_commit_interval_ms / 1000
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []
        self._log = log.bind(group=self.group_id)

    # ------------------------------------------------------------------ names
    def _k(self, topic: str) -> str:
        return self._prefix + topic

    def _tp(self, kp: Kp) -> TopicPartition:
        return TopicPartition(kp.topic[len(self._prefix) :], kp.partition)

    def _kp(self, tp: TopicPartition, offset: int | None = None) -> Kp:
        if offset is None:
            return Kp(self._k(tp.topic), tp.partition)
        return Kp(self._k(tp.topic), tp.partition, offset)

    # ------------------------------------------------------------------ properties
    @property
    def member_id(self) -> str | None:
        """This member's id on the coordinator (``None`` before joining)."""
        return self._member_name

    @property
    def generation(self) -> int:
        """The group generation librdkafka last synchronised with (-1: not a member)."""
        return self._generation

    def _refresh(self) -> None:
        """Read the generation and member id librdkafka holds now."""
        if self._closed:
            return
        generation = generation_of(self._consumer.consumer_group_metadata())
        member = self._consumer.memberid() or None
        with self._state_lock:
            self._generation = generation
            self._member_name = member if generation >= 0 else None
        if member is not None:
            self._log = log.bind(group=self.group_id, member_id=member)

    def subscription(self) -> set[str]:
        return set(self._topics)

    def assignment(self) -> set[TopicPartition]:
        return set(self._owned)

    def owns(self, tp: TopicPartition | tuple[str, int]) -> bool:
        """Whether this member holds ``tp`` in a generation librdkafka still believes in (a
        local answer: the coordinator has the last word on commits). Safe from any thread."""
        tp = TopicPartition(*tp)
        with self._state_lock:
            return tp in self._owned and self._generation >= 0

    # ------------------------------------------------------------------ subscription
    def subscribe(self, topics: Iterable[str], listener: RebalanceListener | None = None) -> None:
        self._check_open()
        wanted = tuple(sorted(set(topics)))
        if listener is not None:
            self._listener = listener
        if wanted != self._topics and self._subscribed:
            self._leave_group()
        self._topics = wanted

    def unsubscribe(self) -> None:
        self._check_open()
        if self._subscribed:
            self._leave_group()
        self._topics = ()

    def _leave_group(self) -> None:
        self._revoke_all()
        self._consumer.unsubscribe()
        self._subscribed = False
        self._refresh()

    def _join(self) -> None:
        self._consumer.subscribe(
            [self._k(t) for t in self._topics],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        self._subscribed = True

    def _on_error(self, err: KafkaError) -> None:
        """librdkafka's error callback (served inside poll): a fatal error ends the member;
        a static member fenced by a newer instance with its id is told so."""
        if err.fatal() and self._fenced is None:
            self._fenced = f"group {self.group_id!r}: the member is fenced: {err.str()}"
            if "fenced" not in err.str().lower():
                self._fenced = f"group {self.group_id!r}: fatal consumer error: {err.str()}"

    # ------------------------------------------------------------------ rebalance callbacks
    def _call(self, callback: Callable[[Partitions], None], partitions: Partitions) -> None:
        try:
            callback(partitions)
        except Exception as exc:
            self._log.exception("rebalance listener failed", callback=callback.__name__)
            self._errors.append(exc)

    def _on_assign(self, consumer: Consumer, partitions: list[Kp]) -> None:
        try:
            self._refresh()
            new = sorted(self._tp(kp) for kp in partitions)
            with self._state_lock:
                self._owned |= set(new)
            if new:
                self._log.info(
                    "partitions assigned",
                    generation=self._generation,
                    partitions=[f"{tp.topic}-{tp.partition}" for tp in new],
                )
                self._call(self._listener.on_partitions_assigned, new)
            starts = [
                self._kp(tp, self._pending_seeks.pop(tp, OFFSET_STORED))
                for tp in new
                if tp in self._owned
            ]
            if self._eager:  # the whole assignment, every time
                consumer.assign(starts)
            else:
                consumer.incremental_assign(starts)
        except Exception as exc:  # never let an error escape into librdkafka's callback
            self._errors.append(exc)

    def _give_up(self, partitions: list[TopicPartition]) -> None:
        with self._state_lock:
            self._owned -= set(partitions)
        for tp in partitions:
            self._paused.discard(tp)
            self._positions.pop(tp, None)
            self._pending_seeks.pop(tp, None)

    def _on_revoke(self, consumer: Consumer, partitions: list[Kp]) -> None:
        try:
            mine = sorted(tp for kp in partitions if (tp := self._tp(kp)) in self._owned)
            if mine:
                if self.enable_auto_commit:
                    self._auto_commit(mine)
                self._drain_async()
                self._call(self._listener.on_partitions_revoked, mine)
                self._log.info(
                    "partitions revoked",
                    generation=self._generation,
                    partitions=[f"{tp.topic}-{tp.partition}" for tp in mine],
                )
            self._give_up(mine)
            if self._eager:
                consumer.unassign()
            else:
                consumer.incremental_unassign(partitions)
            self._refresh()
        except Exception as exc:
            self._errors.append(exc)

    def _on_lost(self, consumer: Consumer, partitions: list[Kp]) -> None:
        try:
            lost = sorted(tp for kp in partitions if (tp := self._tp(kp)) in self._owned)
            self._give_up(lost)
            self._drain_async(quiet=True)
            if lost:
                self._log.warning(
                    "partitions lost", partitions=[f"{tp.topic}-{tp.partition}" for tp in lost]
                )
                self._call(self._listener.on_partitions_lost, lost)
            if self._eager:
                consumer.unassign()
            else:
                consumer.incremental_unassign(partitions)
            self._refresh()
        except Exception as exc:
            self._errors.append(exc)

    def _raise_errors(self) -> None:
        if self._errors:
            first, self._errors = self._errors[0], []
            raise first

    # ------------------------------------------------------------------ polling
    def poll(self, timeout: float = 0.0, max_records: int | None = None) -> list[Record]:
        """Records of owned partitions, waiting up to ``timeout`` seconds for some; joins
        on first use and runs the rebalance listener (inside librdkafka's poll)."""
        self._check_open()
        if not self._topics:
            raise ConfigError("poll() before subscribe(): no topics to consume")
        if self._fenced is not None:
            raise ConsumerError(self._fenced)
        if not self._subscribed:
            self._join()
        self._maybe_auto_commit()
        deadline = time.monotonic() + timeout
        wanted = max_records or self.max_poll_records
        while True:
            messages = self._consumer.consume(
                num_messages=wanted, timeout=max(0.0, min(deadline - time.monotonic(), 1.0))
            )
            self._refresh()
            self._raise_errors()
            if self._fenced is not None:
                raise ConsumerError(self._fenced)
            records = self._records(messages)
            if records or time.monotonic() >= deadline:
                return records

    def _records(self, messages: list[Message]) -> list[Record]:
        out = member_records(
            messages, self._prefix, self._owned, self._paused, self._positions, self._message_error
        )
        # conditional appends the log-order rule rejects are never delivered (the
        # positions still move past them)
        return self._kafka.visible(out)

    def _message_error(self, m: Message, err: KafkaError) -> None:
        code = err.code()
        topic = (m.topic() or "")[len(self._prefix) :] or None
        if code == KafkaError._PARTITION_EOF:
            return
        if code == KafkaError._AUTO_OFFSET_RESET and "no previously committed" in err.str():
            raise NoOffsetForPartitionError(
                f"group {self.group_id!r} has no committed offset and auto_offset_reset is"
                f" 'error': {err.str()}",
                topic=topic or "",
                partition=m.partition() or 0,
            )
        if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            partition = m.partition() or 0
            lwm, hwm = self._kafka.offsets(topic or "", partition)[:2]
            raise OffsetOutOfRangeError(
                f"group {self.group_id!r}: {err.str()}",
                topic=topic or "",
                partition=partition,
                offset=m.offset() or 0,
                lwm=lwm,
                leo=hwm,
            )
        if code == KafkaError.INCONSISTENT_GROUP_PROTOCOL:
            raise ConfigError(
                f"group {self.group_id!r}: Kafka refused the join: assignor {self.assignor!r}"
                " is not the one the group's members use"
            )
        if code == KafkaError.INVALID_SESSION_TIMEOUT:
            raise ConfigError(
                f"group {self.group_id!r}: Kafka refused session_timeout_ms="
                f"{self.session_timeout_ms}: it must lie within the brokers'"
                " group.min.session.timeout.ms and group.max.session.timeout.ms"
                " (6 s and 30 min by default)"
            )
        if err.fatal():
            self._on_error(err)
            assert self._fenced is not None
            raise ConsumerError(self._fenced)
        # transient (a broker down, a topic not there yet): librdkafka retries by itself
        self._log.warning("consumer error (retried by librdkafka)", error=err.str(), topic=topic)

    # ------------------------------------------------------------------ positions
    def _assigned_now(self) -> set[TopicPartition]:
        return {self._tp(kp) for kp in self._consumer.assignment()}

    def seek(self, tp: TopicPartition | tuple[str, int], offset: int) -> None:
        """Read ``tp`` from ``offset`` next (from ``on_assigned``: where it starts)."""
        tp = self._check_owned(tp)
        self._positions[tp] = offset
        if tp not in self._assigned_now():
            self._pending_seeks[tp] = offset
            return
        self._seek(tp, offset)

    def _seek(self, tp: TopicPartition, offset: int) -> None:
        deadline = time.monotonic() + 10.0
        while True:
            try:
                self._consumer.seek(self._kp(tp, offset))
                return
            except KafkaException as exc:
                # a partition whose fetcher is still starting: librdkafka says _STATE
                if exc.args[0].code() != KafkaError._STATE or time.monotonic() > deadline:
                    raise ConsumerError(
                        f"seek failed: {exc.args[0].str()}",
                        topic=tp.topic,
                        partition=tp.partition,
                        offset=offset,
                    ) from None
                self._consumer.consume(num_messages=0, timeout=0.01)  # let it start
                self._raise_errors()

    def pause(self, *partitions: TopicPartition) -> None:
        for given in partitions:
            tp = self._check_owned(given)
            self._paused.add(tp)
            if tp in self._assigned_now():
                self._consumer.pause([self._kp(tp)])

    def resume(self, *partitions: TopicPartition) -> None:
        for given in partitions:
            tp = TopicPartition(*given)
            if tp in self._paused:
                self._paused.discard(tp)
                if tp in self._assigned_now():
                    self._consumer.resume([self._kp(tp)])
                    # records fetched while paused were dropped: read on from the position
                    if tp in self._positions:
                        self._seek(tp, self._positions[tp])

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def _seek_to(self, special: int, partitions: tuple[TopicPartition, ...]) -> None:
        for given in partitions or tuple(sorted(self._owned)):
            tp = self._check_owned(given)
            lwm, hwm = self._kafka.offsets(tp.topic, tp.partition)[:2]
            self.seek(tp, lwm if special == OFFSET_BEGINNING else hwm)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._seek_to(OFFSET_BEGINNING, partitions)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._seek_to(OFFSET_END, partitions)

    def position(self, tp: TopicPartition | tuple[str, int]) -> int:
        """The offset of the next record ``poll`` returns for owned partition ``tp``."""
        tp = self._check_owned(tp)
        if tp in self._positions:
            return self._positions[tp]
        committed = self.committed(tp)
        if committed is not None:
            return committed
        lwm, hwm = self._kafka.offsets(tp.topic, tp.partition)[:2]
        if self.auto_offset_reset == "error":
            raise OffsetOutOfRangeError(
                f"group {self.group_id!r} has no position for the partition (auto_offset_reset"
                " is 'error')",
                topic=tp.topic,
                partition=tp.partition,
                offset=-1,
                lwm=lwm,
                leo=hwm,
            )
        return hwm if self.auto_offset_reset == "latest" else lwm

    def committed(self, tp: TopicPartition | tuple[str, int]) -> int | None:
        entry = self.committed_entry(tp)
        return None if entry is None else entry.offset

    def committed_entry(self, tp: TopicPartition | tuple[str, int]) -> CommittedOffset | None:
        """The group's committed offset of ``tp`` on the coordinator (Kafka keeps no
        generation or member with it: those read -1 and "")."""
        tp = TopicPartition(*tp)
        try:
            (found,) = self._consumer.committed([self._kp(tp)], timeout=self._kafka.timeout)
        except KafkaException as exc:
            raise LogUnavailableError(
                f"group {self.group_id!r}: no committed offsets from Kafka: {exc.args[0].str()}",
                topic=tp.topic,
                partition=tp.partition,
            ) from None
        if found.offset < 0:
            return None
        return CommittedOffset(int(found.offset), found.metadata or "", -1, "", 0, -1)

    # ------------------------------------------------------------------ commits
    def _current_positions(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        chosen = self._owned if partitions is None else partitions
        return {
            tp: OffsetAndMetadata(self._positions[tp])
            for tp in sorted(chosen)
            if tp in self._owned and tp in self._positions
        }

    def _commit_checked(
        self,
        offsets: dict[TopicPartition, OffsetAndMetadata],
        member: str | None,
        owned: set[TopicPartition],
    ) -> None:
        if not offsets:
            return
        first = min(offsets)
        if member is None:
            raise CommitFailedError(
                f"commit rejected: not a member of group {self.group_id!r} (not joined yet,"
                " evicted, or closed)",
                topic=first.topic,
                partition=first.partition,
            )
        foreign = sorted(set(offsets) - owned)
        if foreign:
            raise CommitFailedError(
                f"commit rejected: group {self.group_id!r} member {member} (generation"
                f" {self._generation}) does not own {foreign[0].topic}-{foreign[0].partition}",
                topic=foreign[0].topic,
                partition=foreign[0].partition,
            )
        kps = [self._kp(tp, om.offset) for tp, om in sorted(offsets.items())]
        for kp, (_, om) in zip(kps, sorted(offsets.items()), strict=True):
            if om.metadata:
                kp.metadata = om.metadata
        try:
            answered = self._consumer.commit(offsets=kps, asynchronous=False)
        except KafkaException as exc:
            err = exc.args[0]
            code = err.code()
            if code == KafkaError.FENCED_INSTANCE_ID:
                self._fenced = (
                    f"group {self.group_id!r} instance id {self.group_instance_id!r} was taken"
                    f" over by a newer member; member {member} is fenced and cannot rejoin"
                )
            if code in _FENCED:
                raise CommitFailedError(
                    f"commit rejected: group {self.group_id!r} member {member}: {err.str()}",
                    topic=first.topic,
                    partition=first.partition,
                ) from None
            if code in _UNKNOWN:
                raise OutcomeUnknownError(
                    f"group {self.group_id!r}: commit not answered: {err.str()}",
                    topic=first.topic,
                    partition=first.partition,
                ) from None
            raise LogUnavailableError(
                f"group {self.group_id!r}: commit failed: {err.str()}",
                topic=first.topic,
                partition=first.partition,
            ) from None
        for kp in answered or []:
            if kp.error is not None:
                raise CommitFailedError(
                    f"commit rejected: group {self.group_id!r} member {member}: {kp.error.str()}",
                    topic=first.topic,
                    partition=kp.partition,
                )
        for tp, om in offsets.items():
            self._last_committed[tp] = om.offset

    def commit(
        self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None
    ) -> None:
        """Commit ``offsets`` (default: the positions of all owned partitions) on the
        coordinator; see the module docstring for what is refused."""
        self._check_open()
        self._commit_checked(self._normalize(offsets), self._member_name, set(self._owned))

    def commit_async(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None,
        callback: CommitCallback | None = None,
    ) -> Future[None]:
        self._check_open()
        normalized = self._normalize(offsets)
        member, owned = self._member_name, set(self._owned)

        def run() -> None:
            error: Exception | None = None
            try:
                self._commit_checked(normalized, member, owned)
            except Exception as exc:
                error = exc
            if callback is not None:
                try:
                    callback(normalized, error)
                except Exception:
                    self._log.exception("commit callback failed")
            if error is not None:
                raise error

        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="eventlane-commit")
        future = self._executor.submit(run)
        self._pending = [f for f in self._pending if not f.done()] + [future]
        return future

    def _auto_commit(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        changed = {
            tp: om
            for tp, om in self._current_positions(partitions).items()
            if self._last_committed.get(tp) != om.offset
        }
        try:
            self._commit_checked(changed, self._member_name, set(self._owned))
        except CommitFailedError as exc:
            self._log.warning("auto-commit rejected", error=str(exc))

    def _maybe_auto_commit(self) -> None:
        if not self.enable_auto_commit or self._member_name is None:
            return
        now = time.monotonic()
        if now >= self._next_auto_commit:
            self._next_auto_commit = now + self.auto_commit_interval_ms / 1000
            self._auto_commit()

    # ------------------------------------------------------------------ leaving
    def _revoke_all(self) -> None:
        """What a leave does before librdkafka's: commit (auto-commit) and ``on_revoked``."""
        owned = sorted(self._owned)
        if not owned:
            return
        if self._member_name is not None:
            if self.enable_auto_commit:
                self._auto_commit(owned)
            self._drain_async()
            self._call(self._listener.on_partitions_revoked, owned)
        else:
            self._drain_async(quiet=True)
            self._call(self._listener.on_partitions_lost, owned)
        self._give_up(owned)

    def close(self, autocommit: bool = True) -> None:
        """Leave the group (a static member's partitions wait for it for its session, as in
        Kafka): commit if auto-commit is on and ``autocommit``, run ``on_revoked``."""
        if self._closed:
            return
        try:
            if not autocommit:
                self.enable_auto_commit = False
            if self._subscribed:
                self._revoke_all()
            error = self._errors[0] if self._errors else None
            if error is not None:
                self._log.warning("rebalance listener failed while leaving", error=str(error))
        finally:
            self._closed = True
            if self._executor is not None:
                self._executor.shutdown(wait=True)
            self._consumer.close()
            with self._state_lock:
                self._generation, self._member_name = -1, None

    def __enter__(self) -> KafkaGroupConsumer:
        return self
