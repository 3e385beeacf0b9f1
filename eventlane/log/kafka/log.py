"""The log port on Apache Kafka, through confluent-kafka (librdkafka): :class:`KafkaLog`.

``KafkaLog.from_url("kafka://h1:9092,h2:9092?namespace=ns")``, or ``--log kafka://...``,
``EVENTLANE_LOG`` and ``App.open(url)`` through the ``eventlane.engines`` entry point.

One concept at ~850 lines: the log port's methods over three librdkafka clients (an admin,
a lingering idempotent producer, a hand-assigned reader) that share the topic metadata
cache, the locks and the wake-up sequence. The per-record work of appends and reads (batch
sizes, conversions) is :mod:`.records`; topic configs and error codes :mod:`.mapping`; the
local cluster :mod:`.cluster`; migration :mod:`.migrate`. Part 2's per-key state and
conditional appends (KeyedLog) belong in modules of their own beside it.

Invariants and how they hold:

* **An append returns only once acknowledged** by ``acks=all`` (every in-sync replica; the
  cluster keeps ``min.insync.replicas=2``) from an idempotent producer, so a retried
  request is never stored twice. A delivery error or a timeout after which the records may
  be stored raises :class:`~eventlane.errors.OutcomeUnknownError`; a refusal (too large, a
  keyless record on a compacted topic, no leader before sending) raises the matching
  permanent or retriable error and nothing was written.
* **An append's records form one Kafka record batch** (``atomic=True``, and every append
  that fits the topic's ``max.message.bytes``): the producers linger "forever" and an
  append enqueues its records and flushes on a producer it holds alone
  (:mod:`.producers`: appends of concurrent callers are in flight together, each on its
  own producer), so librdkafka sends exactly them in one batch, which the leader appends,
  replicates and exposes (the high-water mark moves by whole batches) at once. Their
  offsets are therefore contiguous. An append larger than one batch (not atomic) is sent
  as several batches, one after the other.
* **Reads** go through a consumer assigned by hand (no group), from any offset: below the
  low-water mark or above the high-water mark is
  :class:`~eventlane.errors.OffsetOutOfRangeError`; nothing at or above the high-water mark
  is returned (the consumer reads committed data only). Kafka exposes no log end offset to
  clients: ``leo`` is reported as the high-water mark.
* **Placement** is Kafka's: the same murmur2 partitioner (:mod:`eventlane.log.partitioner`)
  picks partitions for keys (eventlane's producer names the partition of every append).
* **Waiting**: an append through this log wakes its waiters at once; other processes'
  appends (and :meth:`KafkaLog.wake`, a record on the namespace's wake topic) are seen by a
  consumer following the end of every partition of the namespace, started by the first
  :meth:`KafkaLog.wait`.
* **Roles**: the core :class:`~eventlane.log.port.Log` and
  :class:`~eventlane.log.port.KeyedLog`: per-key reads and conditional appends, which
  Kafka lacks, are eventlane's (:mod:`.keyed`), validated by log order (:mod:`.order`): a
  conditional append that loses a race is written but rejected by every reader, so
  :meth:`KafkaLog.read` and :meth:`KafkaLog.visible` skip the records the rule rejects.
  Not :class:`~eventlane.log.port.MaintainedLog` (Kafka's log cleaner and retention
  threads run on their own schedule, per the topic's configs; ``request_compaction`` is a
  no-op hint), not :class:`~eventlane.log.port.FencedLog`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
)
from confluent_kafka import TopicPartition as Kp
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.cimpl import NewPartitions, NewTopic

from eventlane.errors import (
    ConfigError,
    InvalidRecordError,
    InvalidTopicError,
    LogError,
    LogUnavailableError,
    OffsetOutOfRangeError,
    OutcomeUnknownError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from eventlane.log.config import (
    TopicConfig,
    altered_partitions,
    new_topic_config,
    warn_partitions_increased,
)
from eventlane.log.kafka import order
from eventlane.log.kafka.keyed import KeyIndex
from eventlane.log.kafka.mapping import append_error, kafka_configs, topic_config
from eventlane.log.kafka.producers import ProducerPool
from eventlane.log.kafka.records import batches, take_messages
from eventlane.log.local import LocalDir, default_data_dir
from eventlane.log.record import Record
from eventlane.log.remote import WakeSequence, parse_log_url
from eventlane.log.types import (
    AppendResult,
    Clock,
    Cursor,
    Expect,
    PartitionDescription,
    PartitionOffsets,
    RecordTuple,
    TopicDescription,
    wall_clock_ms,
)
from eventlane.metrics import M, appended
from eventlane.observability import get_logger

log = get_logger("eventlane.log")

DEFAULT_READ_BYTES = 1 << 20
WAKE_TOPIC = "__eventlane_wake"
"""The namespace's topic that :meth:`KafkaLog.wake` writes to (not listed as a topic)."""
_OUT_OF_RANGE = (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET)
"""A fetch from outside the marks (librdkafka's name for it with auto.offset.reset=error)."""
_NOT_LEADERS = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE)
_NO_LEADER_YET = {
    *_NOT_LEADERS,
    KafkaError._NOENT,  # librdkafka's admin: "Failed to query partition leaders"
    KafkaError._TRANSPORT,
    KafkaError._TIMED_OUT,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.BROKER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
}


def _leaderless(err: KafkaError) -> bool:
    """Whether an admin call failed because no leader answered yet (asking again may help)."""
    return bool(err.retriable()) or err.code() in _NO_LEADER_YET


ADMIN_TRY_S = 5.0
"""How long one try of an admin call that is asked again (DeleteRecords) may wait."""
META_REFRESH_S = 5.0
"""Age after which a topic's cached partition count and config are read again (in the
background: :meth:`KafkaLog._topic_meta`)."""


AGREED = 3
"""Metadata answers come from any broker, and each broker learns a new topic, config or
deletion from the metadata log a little after the controller accepted it: a change is seen
once this many answers in a row show it."""


class _Reader:
    """A consumer assigned by hand to one partition at a time, and where its last read
    stopped: a read that continues there keeps what the consumer fetched ahead."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.lock = threading.Lock()
        self.reading: tuple[str, int, int] | None = None  # (topic, partition, next offset)
        self.ahead: list[Message] = []  # fetched past where the last read stopped


class _Readers:
    """Up to ``size`` readers made by ``make`` when first needed, lent one read at a time:
    the key index's catch-up reads of different partitions run at once. A read is lent,
    first choice, the reader whose last read stopped where it starts (it keeps its place
    and what it fetched ahead), else one that last read that partition, else any."""

    def __init__(self, make: Callable[[], Consumer], size: int) -> None:
        self._make = make
        self._size = size
        self._cond = threading.Condition(threading.Lock())
        self._free: list[_Reader] = []
        self.all: list[_Reader] = []

    def acquire(self, topic: str, partition: int, offset: int) -> _Reader:
        with self._cond:
            while True:
                if self._free:
                    best = max(
                        self._free,
                        key=lambda rd: (
                            rd.reading == (topic, partition, offset),
                            rd.reading is not None and rd.reading[:2] == (topic, partition),
                        ),
                    )
                    self._free.remove(best)
                    return best
                if len(self.all) < self._size:
                    made = _Reader(self._make())
                    self.all.append(made)
                    return made
                self._cond.wait()

    def release(self, rd: _Reader) -> None:
        with self._cond:
            self._free.append(rd)
            self._cond.notify()


class _Meta(NamedTuple):
    partitions: int
    config: TopicConfig
    checked: float


def open_url(url: str, local: LocalDir) -> KafkaLog:
    """The engine opener for ``kafka://`` URLs (entry point ``eventlane.engines: kafka``)."""
    return KafkaLog.from_url(url, local=local)


def parse_url(url: str) -> dict[str, Any]:
    """``kafka://h1:p1,h2:p2?namespace=ns`` -> keyword arguments of the log.

    >>> parse_url("kafka://127.0.0.1:9092,127.0.0.1:9093?namespace=shop")
    {'bootstrap': '127.0.0.1:9092,127.0.0.1:9093', 'namespace': 'shop'}
    """
    hosts, options = parse_log_url(url, "kafka", {"namespace": str})
    return {"bootstrap": ",".join(hosts), **options}


def namespace_for(directory: str | Path) -> str:
    """A namespace private to a directory (tests: one log per temporary directory)."""
    return "t" + hashlib.sha1(str(Path(directory).resolve()).encode()).hexdigest()[:12]


class KafkaLog:
    """The log port on an Apache Kafka cluster. See the module docstring."""

    def __init__(
        self,
        bootstrap: str,
        *,
        namespace: str = "",
        clock: Clock = wall_clock_ms,
        timeout: float = 30.0,
        local: LocalDir | None = None,
        appends_in_flight: int = 8,
    ) -> None:
        """``appends_in_flight``: how many appends of concurrent callers may be in flight at
        once, each on a producer of its own (:mod:`.producers`; 1: one after another), and
        how many key-index reads may run at once, each on a consumer of its own."""
        if appends_in_flight < 1:
            raise ConfigError(f"appends_in_flight must be at least 1, got {appends_in_flight}")
        if namespace and not namespace.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"namespace {namespace!r} must be letters, digits, - or _")
        self.local = local if local is not None else LocalDir(default_data_dir())
        self.bootstrap = bootstrap
        self.namespace = namespace
        self._prefix = f"{namespace}." if namespace else ""
        self.url = f"kafka://{bootstrap}" + (f"?namespace={namespace}" if namespace else "")
        """What :func:`eventlane.engine.open_log` opens this log by in another process."""
        self.clock = clock
        self.timeout = timeout
        base: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "logger": _LIBRDKAFKA,
            "log_level": 0,  # errors reach callers as exceptions
        }
        self._admin = AdminClient({**base, "client.id": "eventlane-admin"})
        self._producer_config = {
            **base,
            "client.id": "eventlane-producer",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": int(timeout * 1000) - 1,  # nothing leaves until an append flushes
            "batch.num.messages": 1_000_000,
            "batch.size": 2**31 - 1,
            "message.max.bytes": 1_000_000_000,
            "message.timeout.ms": int(timeout * 1000),
            "request.timeout.ms": int(min(timeout, 10.0) * 1000),
            "compression.type": "none",
        }
        self._producers = ProducerPool(self._producer_config, appends_in_flight)
        self._consumer_config = {
            **base,
            "client.id": "eventlane-reader",
            "group.id": "eventlane-unused",  # never joined nor committed: assign() only
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "isolation.level": "read_committed",
            "check.crcs": True,
            "fetch.wait.max.ms": 100,
            # a dead leader's partitions are looked up again within seconds (librdkafka's
            # default, 5 min, stalled the key index's reads that long after a kill -9)
            "topic.metadata.refresh.interval.ms": 3000,
        }
        self._main = _Reader(Consumer({**self._consumer_config, "enable.partition.eof": True}))
        self._marks = Consumer({**self._consumer_config, "client.id": "eventlane-marks"})
        scan_config = {
            **self._consumer_config,
            "client.id": "eventlane-keys",
            "enable.partition.eof": True,
        }
        self._scans = _Readers(lambda: Consumer(scan_config), appends_in_flight)
        self._keys = KeyIndex(self._scan_read, self._watermarks, self._append_atomic, self.timeout)
        self._meta: dict[str, _Meta] = {}
        self._meta_lock = threading.Lock()
        self._refreshing: set[str] = set()  # topics whose metadata a thread is reading
        self._wake = WakeSequence()
        self._tail_lock = threading.Lock()  # starts the tailing thread once
        self._tailer: threading.Thread | None = None
        self._waker = Producer({**base, "client.id": "eventlane-waker", "linger.ms": 0})
        self._has_wake_topic = False
        self._closed = False

    @classmethod
    def from_url(
        cls, url: str, *, clock: Clock = wall_clock_ms, local: LocalDir | None = None
    ) -> KafkaLog:
        return cls(**parse_url(url), clock=clock, local=local)

    # ------------------------------------------------------------------ names
    def _kname(self, topic: str) -> str:
        return self._prefix + topic

    def _ours(self, kname: str) -> str | None:
        if kname.startswith("__") or not kname.startswith(self._prefix):
            return None
        name = kname[len(self._prefix) :]
        return None if name == WAKE_TOPIC else name

    # ------------------------------------------------------------------ topics
    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        config: TopicConfig | Mapping[str, object] | None = None,
        *,
        exist_ok: bool = False,
    ) -> TopicDescription:
        cfg = new_topic_config(name, partitions, config)
        new = NewTopic(self._kname(name), partitions, config=kafka_configs(cfg))
        try:
            self._admin.create_topics([new], request_timeout=self.timeout)[new.topic].result()
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                if exist_ok:
                    return self._describe_when_visible(name)
                raise TopicExistsError(f"topic {name!r} already exists", topic=name) from None
            if err.code() in (KafkaError.INVALID_CONFIG, KafkaError.INVALID_PARTITIONS):
                raise ConfigError(f"Kafka refused topic {name!r}: {err.str()}") from None
            if err.code() == KafkaError.TOPIC_EXCEPTION:
                raise InvalidTopicError(f"Kafka refused topic {name!r}: {err.str()}") from None
            raise self._unavailable(err, name) from None
        self._wait_leaders(name, partitions)
        self._described_config(name, cfg)
        self._cache_meta(name, _Meta(partitions, cfg, time.monotonic()))
        return self._describe(name, partitions, cfg)

    def _describe_when_visible(self, name: str) -> TopicDescription:
        """Describe a topic the controller says exists: another client may have just created
        it, and the broker answering metadata may not know it yet (a new topic reaches each
        broker's metadata cache a moment after the controller accepts it)."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return self.describe_topic(name)
            except UnknownTopicError:
                if time.monotonic() >= deadline:
                    raise LogUnavailableError(
                        f"Kafka says topic {name!r} exists, but its metadata did not show it"
                        f" within {self.timeout:g} s",
                        topic=name,
                    ) from None
                time.sleep(0.05)

    def _wait_leaders(self, name: str, partitions: int) -> None:
        """Wait until metadata shows a leader for each partition of a new topic."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            meta = self._admin.list_topics(self._kname(name), timeout=self.timeout)
            found = meta.topics.get(self._kname(name))
            if (
                found is not None
                and found.error is None
                and len(found.partitions) == partitions
                and all(p.leader >= 0 for p in found.partitions.values())
            ):
                return
            time.sleep(0.05)

    def list_topics(self) -> list[str]:
        meta = self._cluster_metadata()
        return sorted(t for k in meta.topics if (t := self._ours(k)) is not None)

    def topic_exists(self, name: str) -> bool:
        try:
            self._topic_meta(name, fresh=True)
        except UnknownTopicError:
            return False
        return True

    def describe_topic(self, name: str) -> TopicDescription:
        meta = self._topic_meta(name, fresh=True)
        return self._describe(name, meta.partitions, meta.config)

    def _describe(self, name: str, partitions: int, cfg: TopicConfig) -> TopicDescription:
        details = []
        for p in range(partitions):
            lwm, hwm, leo = self.offsets(name, p)
            details.append(PartitionDescription(p, lwm, hwm, leo, 0, 0, leo))
        return TopicDescription(name, partitions, cfg, tuple(details))

    def alter_topic(
        self,
        name: str,
        *,
        partitions: int | None = None,
        config: Mapping[str, object] | None = None,
    ) -> TopicDescription:
        """Change config values or add partitions (never remove them)."""
        meta = self._topic_meta(name, fresh=True)
        cfg = TopicConfig.from_mapping(config or {}, base=meta.config)
        count = meta.partitions
        if partitions is not None:
            altered_partitions(name, meta.partitions, partitions)
            if partitions > meta.partitions:
                warn_partitions_increased(name, meta.partitions, partitions)
                new = NewPartitions(self._kname(name), partitions)
                self._admin_call(name, self._admin.create_partitions([new]))
                self._wait_leaders(name, partitions)
                count = partitions
        if cfg != meta.config:
            self._set_configs(name, meta.config, cfg)
            self._described_config(name, cfg)
        self._cache_meta(name, _Meta(count, cfg, time.monotonic()))
        return self._describe(name, count, cfg)

    def _set_configs(self, name: str, old: TopicConfig, new: TopicConfig) -> None:
        before, after = kafka_configs(old), kafka_configs(new)
        entries = [
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in after.items()
            if before.get(k) != v
        ]
        entries += [
            ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE)
            for k in before
            if k not in after
        ]
        resource = ConfigResource("topic", self._kname(name), incremental_configs=entries)
        self._admin_call(name, self._admin.incremental_alter_configs([resource]))

    def delete_topic(self, name: str) -> None:
        self._topic_meta(name, fresh=True)
        self._admin_call(name, self._admin.delete_topics([self._kname(name)]))
        self._cache_meta(name, None)
        self._keys.forget(name)
        # gone: AGREED answers in a row say so (one said so while the next still listed it:
        # the contract kit saw that under load)
        deadline, gone = time.monotonic() + self.timeout, 0
        while gone < AGREED and time.monotonic() < deadline:
            gone = gone + 1 if name not in self.list_topics() else 0
            time.sleep(0.05)

    def partition_count(self, name: str) -> int:
        return self._topic_meta(name).partitions

    def topic_config(self, name: str) -> TopicConfig:
        return self._topic_meta(name, fresh=True).config

    def _cluster_metadata(self, topic: str | None = None) -> Any:
        try:
            if topic is None:
                return self._admin.list_topics(timeout=self.timeout)
            return self._admin.list_topics(topic, timeout=self.timeout)
        except KafkaException as exc:
            raise self._unavailable(exc.args[0], topic) from None

    def _topic_meta(self, name: str, *, fresh: bool = False) -> _Meta:
        """Partition count and config of ``name``: read from the cluster when ``fresh`` or
        not cached; else the cached ones, refreshed in the background once older than
        :data:`META_REFRESH_S` (the data path never waits for the admin's round trips: a
        change made by another client is seen within about that long)."""
        cached = self._meta.get(name)
        if cached is None or fresh:
            return self._fetch_meta(name)
        if time.monotonic() - cached.checked >= META_REFRESH_S:
            self._refresh_meta(name)
        return cached

    def _cache_meta(self, name: str, meta: _Meta | None, *, unless: _Meta | None = None) -> None:
        """Cache (``None``: forget) ``name``'s metadata; with ``unless``, only while the
        cached entry is still ``unless`` (a background refresh never overwrites what a
        create, alter or delete of this log stored meanwhile)."""
        with self._meta_lock:
            if unless is not None and self._meta.get(name) is not unless:
                return
            if meta is None:
                self._meta.pop(name, None)
            else:
                self._meta[name] = meta

    def _refresh_meta(self, name: str) -> None:
        """Read ``name``'s metadata again in a thread (one at a time per topic)."""
        with self._meta_lock:
            cached = self._meta.get(name)
            if cached is None or name in self._refreshing or self._closed:
                return
            self._refreshing.add(name)

        def refresh() -> None:
            try:
                self._cache_meta(name, self._read_meta(name), unless=cached)
            except UnknownTopicError:  # gone: the next call reads (and raises) itself
                self._cache_meta(name, None, unless=cached)
            except (LogError, KafkaException):
                pass  # no answer now: the cached metadata stays, read again later
            finally:
                with self._meta_lock:
                    self._refreshing.discard(name)

        threading.Thread(target=refresh, name="eventlane-kafka-meta", daemon=True).start()

    def _fetch_meta(self, name: str) -> _Meta:
        """Partition count and config of ``name`` from the cluster, cached."""
        try:
            meta = self._read_meta(name)
        except UnknownTopicError:
            self._cache_meta(name, None)
            raise
        self._cache_meta(name, meta)
        return meta

    def _read_meta(self, name: str) -> _Meta:
        kname = self._kname(name)
        meta = self._admin.list_topics(timeout=self.timeout)  # all: never auto-creates
        found = meta.topics.get(kname)
        gone = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)
        if found is None or (found.error is not None and found.error.code() in gone):
            raise UnknownTopicError(f"unknown topic {name!r}", topic=name)
        return _Meta(len(found.partitions), self._described_config(name), time.monotonic())

    def _described_config(self, name: str, want: TopicConfig | None = None) -> TopicConfig:
        """The topic's config as a broker describes it; with ``want``, asked again until
        three answers in a row are that (each broker learns a new topic or config from the
        metadata log a little after the controller accepts it)."""
        resource = ConfigResource("topic", self._kname(name))
        deadline = time.monotonic() + self.timeout
        agreed = 0  # brokers answer in turn: AGREED answers in a row must agree
        while True:
            try:
                described = self._admin.describe_configs([resource])[resource].result()
            except KafkaException as exc:
                if time.monotonic() > deadline:
                    if exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        raise UnknownTopicError(f"unknown topic {name!r}", topic=name) from None
                    raise self._unavailable(exc.args[0], name) from None
            else:
                cfg = topic_config({k: e.value for k, e in described.items()})
                agreed = agreed + 1 if cfg == want else 0
                if want is None or agreed == AGREED or time.monotonic() > deadline:
                    return cfg
            time.sleep(0.05)

    def _check_partition(self, topic: str, partition: int) -> _Meta:
        meta = self._topic_meta(topic)
        if not 0 <= partition < meta.partitions:
            meta = self._topic_meta(topic, fresh=True)
            if not 0 <= partition < meta.partitions:
                raise UnknownPartitionError(
                    f"topic {topic!r} has {meta.partitions} partitions",
                    topic=topic,
                    partition=partition,
                )
        return meta

    def _admin_call(self, name: str, futures: Mapping[Any, Any]) -> None:
        for future in futures.values():
            try:
                future.result()
            except KafkaException as exc:
                err = exc.args[0]
                if err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise UnknownTopicError(f"unknown topic {name!r}", topic=name) from None
                if err.code() in (KafkaError.INVALID_CONFIG, KafkaError.INVALID_PARTITIONS):
                    raise ConfigError(f"Kafka refused: {err.str()}", topic=name) from None
                raise self._unavailable(err, name) from None

    @staticmethod
    def _unavailable(err: KafkaError, topic: str | None) -> LogError:
        return LogUnavailableError(f"Kafka did not answer: {err.str()}", topic=topic)

    # ------------------------------------------------------------------ appends
    def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[RecordTuple],
        *,
        expect: Expect | None = None,
        atomic: bool = False,
    ) -> AppendResult:
        """Append ``records`` to ``topic[partition]``; returns once acknowledged (acks=all).

        With ``expect``: a conditional append, validated by log order (:mod:`.order`,
        :mod:`.keyed`): always one batch; :class:`~eventlane.errors.ConcurrencyError` when
        the key's last record is not at ``expect.last_offset``, whether this process saw
        it before writing (nothing written) or the rule rejected the written records
        (never visible to any eventlane reader)."""
        if expect is not None:
            if not records:
                raise InvalidRecordError("an append needs at least one record", topic=topic)
            self._check_partition(topic, partition)
            return self._keys.append(topic, partition, records, expect)
        return self._append(topic, partition, records, atomic=atomic)

    def _append_atomic(
        self, topic: str, partition: int, records: Sequence[RecordTuple]
    ) -> AppendResult:
        return self._append(topic, partition, records, atomic=True)

    def _append(
        self, topic: str, partition: int, records: Sequence[RecordTuple], *, atomic: bool
    ) -> AppendResult:
        begun = time.perf_counter() if M.on else 0.0
        meta = self._check_partition(topic, partition)
        if not records:
            raise InvalidRecordError("an append needs at least one record", topic=topic)
        cfg = meta.config
        if cfg.compact and any(r[0] is None for r in records):
            raise InvalidRecordError(
                "a compacted topic refuses records without a key", topic=topic, partition=partition
            )
        limit = min(cfg.max_record_bytes, cfg.segment_bytes)  # Kafka refuses larger batches
        chunks, nbytes = batches(records, limit, atomic, topic, partition)
        first = last = -1
        stamps: list[int] = []
        producer = self._producers.acquire()  # this append's alone until it returns
        try:
            for chunk in chunks:
                base, last, chunk_stamps = self._send(
                    producer, topic, partition, chunk, cfg.log_append_time
                )
                first = base if first < 0 else first
                stamps += chunk_stamps
        finally:
            self._producers.release(producer)
        self._bump()
        if M.on:
            appended(topic, len(records), nbytes, time.perf_counter() - begun)
        return AppendResult(first, last, stamps)

    def _send(
        self,
        producer: Producer,
        topic: str,
        partition: int,
        records: Sequence[RecordTuple],
        append_time: bool,
    ) -> tuple[int, int, list[int]]:
        """Produce ``records`` as one batch on ``producer`` (held by this append alone:
        :mod:`.producers`) and flush it; the first and last offsets, and the timestamp of
        each."""
        if self._closed:  # its producer is released: nothing is sent
            raise LogError("append to a closed KafkaLog", topic=topic, partition=partition)
        delivered: list[Message] = []  # one partition: reports come in produce order
        errors: list[KafkaError] = []

        def done(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append(err)
            delivered.append(msg)

        kname = self._kname(topic)
        now = 0 if append_time else self.clock()
        produce = producer.produce
        for attempt in (1, 2):
            try:
                for key, value, headers, ts in records:
                    if headers:
                        produce(
                            kname,
                            value,
                            key,
                            partition=partition,
                            on_delivery=done,
                            timestamp=now if ts is None or append_time else ts,
                            headers=list(headers),
                        )
                    else:  # no headers argument at all: -0.3 us a record (bench_kafka_engine)
                        produce(
                            kname,
                            value,
                            key,
                            partition=partition,
                            on_delivery=done,
                            timestamp=now if ts is None or append_time else ts,
                        )
                break
            except (BufferError, KafkaException) as exc:
                # nothing has left: the batch waits for the flush below
                producer.purge(in_queue=True, in_flight=False)
                producer.poll(0)
                errors.clear()
                delivered.clear()
                code = exc.args[0].code() if isinstance(exc, KafkaException) else None
                if code == KafkaError._UNKNOWN_PARTITION and attempt == 1:
                    # a partition added since the producer last read the topic's metadata
                    producer.list_topics(kname, timeout=self.timeout)
                    continue
                if code is not None:
                    raise append_error(exc.args[0], topic, partition) from None
                raise LogUnavailableError(
                    f"the producer's queue is full: {exc}", topic=topic, partition=partition
                ) from None
        left = producer.flush(self.timeout + 5.0)
        if left:
            producer.purge(in_queue=True, in_flight=True)
            producer.flush(5.0)
        if errors or len(delivered) != len(records):
            if any(e.fatal() for e in errors):  # its idempotence state is gone: not lent again
                self._producers.broke(producer)
            if not errors:
                raise OutcomeUnknownError(
                    "no acknowledgement from Kafka in time", topic=topic, partition=partition
                )
            worst = next((e for e in errors if e.code() == KafkaError._PURGE_INFLIGHT), errors[0])
            if len({e.code() for e in errors}) > 1 and worst.code() == KafkaError._PURGE_QUEUE:
                worst = next(e for e in errors if e.code() != KafkaError._PURGE_QUEUE)
            raise append_error(worst, topic, partition)
        if append_time:  # the broker's clock
            stamps = [m.timestamp()[1] for m in delivered]
        else:  # the broker keeps a create time as sent
            stamps = [now if ts is None else ts for _, _, _, ts in records]  # no list per *_
        return delivered[0].offset() or 0, delivered[-1].offset() or 0, stamps

    # ------------------------------------------------------------------ reads
    def offsets(self, topic: str, partition: int) -> PartitionOffsets:
        self._check_partition(topic, partition)
        lwm, hwm = self._watermarks(topic, partition)
        return PartitionOffsets(lwm, hwm, hwm)

    def _watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                low, high = self._marks.get_watermark_offsets(
                    Kp(self._kname(topic), partition), timeout=self.timeout, cached=False
                )
                return int(low), int(high)
            except KafkaException as exc:
                err = exc.args[0]
                if err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION):
                    self._topic_meta(topic, fresh=True)  # UnknownTopicError if gone
                    self._marks.list_topics(self._kname(topic), timeout=self.timeout)
                if time.monotonic() > deadline:
                    raise LogUnavailableError(
                        f"no low/high-water marks from Kafka: {err.str()}",
                        topic=topic,
                        partition=partition,
                    ) from None
                time.sleep(0.1)

    def _out_of_range(self, topic: str, partition: int, offset: int) -> OffsetOutOfRangeError:
        lwm, hwm = self._watermarks(topic, partition)
        return OffsetOutOfRangeError(
            f"offset {offset} is outside [{lwm}, {hwm}]",
            topic=topic,
            partition=partition,
            offset=offset,
            lwm=lwm,
            leo=hwm,
        )

    def _known_end(self, rd: _Reader, topic: str, partition: int, offset: int) -> int | None:
        """The high-water mark a read from ``offset`` may rely on without asking anyone.

        A read that continues where the last one stopped uses the mark the reader's last
        fetch response carried when it shows records there (it can only be older, so lower:
        never one that exposes unreplicated records). A read from elsewhere asks nobody
        (``None``): the fetch itself meets the end (Kafka's partition-EOF event) or a
        wrong offset (Kafka's out-of-range error). Otherwise (a reader at the end, waiting
        for more) the leader is asked for the marks."""
        if rd.reading != (topic, partition, offset):
            return None
        if rd.ahead:
            return None
        try:
            low, high = rd.consumer.get_watermark_offsets(
                Kp(self._kname(topic), partition), cached=True
            )
        except KafkaException:
            low = high = -1
        if 0 <= low <= offset < high:
            return int(high)
        lwm, hwm = self._watermarks(topic, partition)
        if not lwm <= offset <= hwm:
            raise self._out_of_range(topic, partition, offset)
        return hwm

    def _fetched_end(
        self, rd: _Reader, kname: str, partition: int, nxt: int, upto: int | None
    ) -> int | None:
        """The high-water mark the reader's fetch responses carried, if above ``nxt``."""
        try:
            _, high = rd.consumer.get_watermark_offsets(Kp(kname, partition), cached=True)
        except KafkaException:
            return None
        if high <= nxt:
            return None
        return int(high) if upto is None else min(int(high), upto)

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = DEFAULT_READ_BYTES,
        cursor: Cursor | None = None,
        upto: int | None = None,
    ) -> tuple[list[Record], Cursor | None]:
        """Records from ``offset`` below the high-water mark (and ``upto``), at least one
        if any, about ``max_bytes`` at most, as the log-order rule lets eventlane see them
        (:mod:`.order`: a conditional append the rule rejects is skipped, like a
        compaction gap)."""
        while True:
            records, cursor = self._read_raw(
                self._main, topic, partition, offset, max_bytes=max_bytes, cursor=cursor, upto=upto
            )
            if not order.any_conditional(records):
                return records, cursor
            visible = self._keys.visible(topic, partition, records)
            if visible:
                return visible, cursor
            offset = records[-1].offset + 1  # only rejected records: read on

    def read_key(
        self, topic: str, partition: int, key: bytes, *, after: int | None = None
    ) -> list[Record]:
        """``key``'s visible records above ``after``, ascending (the key index says
        where; the records are read by offset range)."""
        self._check_partition(topic, partition)
        wanted = self._keys.key_offsets(topic, partition, key, after)
        recent = self._keys.recent(topic, partition, wanted)
        if recent is not None:
            return recent
        out: list[Record] = []
        i = 0
        while i < len(wanted):
            records, _ = self._read_raw(
                self._main, topic, partition, wanted[i], upto=wanted[-1] + 1
            )
            if not records:
                break
            for r in records:
                while i < len(wanted) and wanted[i] < r.offset:
                    i += 1  # compacted away since it was indexed
                if i < len(wanted) and wanted[i] == r.offset:
                    out.append(r)
                    i += 1
            if records[-1].offset >= wanted[-1]:
                break
        return out

    def key_head(self, topic: str, partition: int, key: bytes) -> int | None:
        """The offset of ``key``'s last visible record in ``[lwm, hwm)`` (the key index)."""
        self._check_partition(topic, partition)
        return self._keys.key_head(topic, partition, key)

    def _scan_read(self, topic: str, partition: int, offset: int, upto: int) -> list[Record]:
        """The key index's read: consumers of its own, so loads and reads keep their
        place; concurrent callers' reads on different consumers (:class:`_Readers`, as
        many as appends may be in flight)."""
        rd = self._scans.acquire(topic, partition, offset)
        try:
            return self._read_raw(rd, topic, partition, offset, upto=upto)[0]
        finally:
            self._scans.release(rd)

    def visible(self, records: list[Record]) -> list[Record]:
        """``records`` (of any partitions, each partition's in offset order) without those
        the log-order rule rejects: what a reader outside :meth:`read` (the group consumer)
        applies to what it fetched."""
        if not order.any_conditional(records):
            return records
        rejected: set[tuple[str, int, int]] = set()
        by_partition: dict[tuple[str, int], list[Record]] = {}
        for r in records:
            by_partition.setdefault((r.topic, r.partition), []).append(r)
        for (topic, partition), group in by_partition.items():
            kept = {r.offset for r in self._keys.visible(topic, partition, group)}
            rejected.update((topic, partition, r.offset) for r in group if r.offset not in kept)
        return [r for r in records if (r.topic, r.partition, r.offset) not in rejected]

    def _read_raw(
        self,
        rd: _Reader,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = DEFAULT_READ_BYTES,
        cursor: Cursor | None = None,
        upto: int | None = None,
    ) -> tuple[list[Record], Cursor | None]:
        """Every record from ``offset`` below the high-water mark (and ``upto``), at least
        one if any, about ``max_bytes`` at most, through reader ``rd`` (rejected ones too).

        One consumer reads every partition in turn, assigned by hand; a read that continues
        where the last one stopped keeps its position and what it fetched ahead (a seek
        would drop the prefetched data). The end of the partition is Kafka's partition-EOF
        event (the fetch reached the high-water mark); only a read that would return
        nothing asks the leader for the marks, to tell "nothing yet" from a wrong offset."""
        self._check_partition(topic, partition)
        if upto is not None and offset >= upto:
            lwm, hwm = self._watermarks(topic, partition)
            if not lwm <= offset <= hwm:
                raise self._out_of_range(topic, partition, offset)
            return [], cursor
        kname = self._kname(topic)
        out: list[Record] = []
        size = 0
        with rd.lock:
            end = self._known_end(rd, topic, partition, offset)
            if end is not None and offset >= end:
                return [], cursor
            stop = end if upto is None else upto if end is None else min(end, upto)
            ahead, rd.ahead = rd.ahead, []
            if rd.reading != (topic, partition, offset):
                rd.consumer.assign([Kp(kname, partition, offset)])
                ahead = []
            rd.reading = None
            deadline = time.monotonic() + self.timeout
            nxt = offset
            eof_at = -1  # where Kafka's end event said the partition ended
            while stop is None or nxt < stop:
                # ask for no more than the known end holds: consume() waits for as many
                want = 500 if stop is None else max(1, min(500, stop - nxt))
                if not ahead and rd.ahead:  # what came after an end event, in this read
                    ahead, rd.ahead = rd.ahead, []
                msgs = ahead or rd.consumer.consume(num_messages=want, timeout=0.2)
                ahead = []
                at_end = not msgs
                # the read's hot path: one pass over the batch, in C (records.take_messages)
                i, size, nxt = take_messages(
                    msgs, topic, partition, nxt, -1 if stop is None else stop, size, max_bytes, out
                )
                if i < len(msgs):
                    m = msgs[i]
                    err = m.error()
                    if err is None:
                        # fetched ahead of what this call returns (past ``stop`` or
                        # max_bytes): the next read from ``nxt`` starts with them
                        rd.ahead = msgs[i:]
                        rd.reading = (topic, partition, nxt)
                        return out, _cursor(nxt)
                    code = err.code()
                    if code == KafkaError._PARTITION_EOF:
                        if m.partition() == partition and m.topic() == kname:
                            rd.ahead = msgs[i + 1 :]
                            at_end, eof_at = True, m.offset() or 0
                        else:  # another partition's end, from an earlier assignment
                            ahead = msgs[i + 1 :]
                    elif code in _OUT_OF_RANGE:
                        rd.reading = None  # the consumer stopped: assign again
                        raise self._out_of_range(topic, partition, nxt)
                    else:
                        raise LogUnavailableError(
                            f"read from Kafka failed: {err.str()}", topic=topic, partition=partition
                        )
                if not at_end:
                    if stop is None:  # the end the fetch responses carry, once known
                        stop = self._fetched_end(rd, kname, partition, nxt, upto)
                    continue
                if out:
                    break
                # nothing yet: the end, a wrong offset, records the fetch has not seen, or
                # an end event from before the latest appends (it may lie in the queue)
                lwm, hwm = self._watermarks(topic, partition)
                if not lwm <= nxt <= hwm:
                    raise self._out_of_range(topic, partition, nxt)
                if nxt >= (hwm if upto is None else min(hwm, upto)) or time.monotonic() > deadline:
                    break
                if eof_at >= hwm:
                    break  # the fetch reached today's end: what lay between was compacted away
            rd.reading = (topic, partition, nxt)  # every message taken was used
        return out, _cursor(nxt)

    def offset_for_time(self, topic: str, partition: int, timestamp: int) -> int | None:
        """The first offset whose timestamp is >= ``timestamp`` (Kafka's time index)."""
        if not isinstance(timestamp, int) or isinstance(timestamp, bool):
            raise ConfigError(f"timestamp must be an integer (ms), got {timestamp!r}", topic=topic)
        self._check_partition(topic, partition)
        try:
            (found,) = self._marks.offsets_for_times(
                [Kp(self._kname(topic), partition, timestamp)], timeout=self.timeout
            )
        except KafkaException as exc:
            raise self._unavailable(exc.args[0], topic) from None
        if found.error is not None:
            raise self._unavailable(found.error, topic)
        return None if found.offset < 0 else int(found.offset)

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        """Kafka's DeleteRecords: the low-water mark moves to ``before_offset`` (never back)."""
        self._check_partition(topic, partition)
        lwm, hwm = self._watermarks(topic, partition)
        if before_offset > hwm:
            raise OffsetOutOfRangeError(
                f"cannot delete records below {before_offset}: the high-water mark is {hwm}",
                topic=topic,
                partition=partition,
                offset=before_offset,
                lwm=lwm,
                leo=hwm,
            )
        if before_offset <= lwm:
            return lwm
        tp = Kp(self._kname(topic), partition, before_offset)
        deadline = time.monotonic() + self.timeout
        while True:  # the mark only moves forward: asking again is safe
            try:
                # short tries: a request sent to a dead leader waits out its whole timeout
                wait = max(0.5, min(ADMIN_TRY_S, deadline - time.monotonic()))
                future = self._admin.delete_records([tp], request_timeout=wait)[tp]
                return int(future.result().low_watermark)
            except KafkaException as exc:
                err = exc.args[0]
                # a leader the admin client cannot find yet (a broker that has not learned a
                # new topic's leaders, an election after a broker died) is asked for again;
                # CI saw "Failed to query partition leaders: No leaders found" right after
                # a migration's first appends
                if not _leaderless(err) or time.monotonic() > deadline:
                    timed_out = err.code() in (KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT)
                    kind = OutcomeUnknownError if timed_out else LogUnavailableError
                    raise kind(
                        f"Kafka did not confirm deleting records below {before_offset}"
                        f" ({err.str()}){'; read the low-water mark' if timed_out else ''}",
                        topic=topic,
                        partition=partition,
                        offset=before_offset,
                    ) from None
                with contextlib.suppress(KafkaException):  # a refresh; the next try decides
                    self._admin.list_topics(self._kname(topic), timeout=ADMIN_TRY_S)
                time.sleep(0.1)

    # ------------------------------------------------------------------ waiting
    def _bump(self) -> None:
        self._wake.bump()

    def wait_seq(self) -> int:
        return self._wake.current()

    def wait(self, seen: int, timeout: float) -> None:
        """Sleep until an append (by any process) or a :meth:`wake` after ``seen``, or
        ``timeout`` seconds. Appends through this log wake at once; other processes'
        appends and wakes are seen by a tailing consumer (started by the first wait)."""
        self._tail()
        self._wake.wait(seen, timeout)

    def wake(self) -> None:
        """Wake every waiter: this process's at once, other processes' through a record on
        the namespace's wake topic (which their tailing consumers see)."""
        self._bump()
        if self._closed:
            return
        kname = self._kname(WAKE_TOPIC)
        if not self._has_wake_topic:
            try:
                new = NewTopic(kname, 1, config={"retention.ms": "60000"})
                self._admin.create_topics([new])[kname].result()
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    return  # best effort: waiters time out instead
            self._has_wake_topic = True
        self._waker.produce(kname, b"")
        self._waker.poll(0)

    def _tail(self) -> None:
        """Start the tailing consumer's thread (once)."""
        with self._tail_lock:
            if self._tailer is not None or self._closed:
                return
            self._tailer = threading.Thread(target=self._follow, name="kafka-log-tail", daemon=True)
            self._tailer.start()

    def _follow(self) -> None:
        """Follow the end of every partition of the namespace's topics (and the wake topic);
        any record bumps the wait sequence. Topics and partitions that appear later (found
        every 2 s) are followed from their beginning: all their records are new."""
        consumer = Consumer({**self._consumer_config, "client.id": "eventlane-tail"})
        assigned: set[tuple[str, int]] = set()
        refreshed = 0.0
        start = OFFSET_END  # what exists when following starts: only what comes next
        try:
            while not self._closed:
                if time.monotonic() - refreshed > 2.0:
                    refreshed = time.monotonic()
                    try:
                        meta = consumer.list_topics(timeout=self.timeout)
                    except KafkaException:
                        continue
                    new = [
                        Kp(k, p, start)
                        for k, t in meta.topics.items()
                        if self._ours(k) is not None or k == self._kname(WAKE_TOPIC)
                        for p in t.partitions
                        if (k, p) not in assigned
                    ]
                    if new:
                        consumer.incremental_assign(new)
                        assigned.update((tp.topic, tp.partition) for tp in new)
                    start = OFFSET_BEGINNING
                got = consumer.consume(num_messages=1000, timeout=0.2)
                if any(m.error() is None for m in got):
                    self._bump()
        finally:
            consumer.close()

    # ------------------------------------------------------------------ maintenance
    def request_compaction(self, topic: str, partition: int) -> None:
        """Kafka's log cleaner compacts on its own schedule: a no-op."""
        self._check_partition(topic, partition)

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._tailer is not None:
            self._tailer.join(5.0)
        # A closed producer stops reconnecting to the cluster (one left to the garbage
        # collector keeps trying, and logging, as long as anything holds this log). One
        # with records still undelivered after the flush is left as it is: close() would
        # wait for them without a bound.
        self._producers.close()
        if self._waker.flush(2.0) == 0:
            self._waker.close()
        self._main.consumer.close()
        for rd in self._scans.all:
            rd.consumer.close()
        self._marks.close()

    def __enter__(self) -> KafkaLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cursor(offset: int) -> Cursor:
    """The next offset to read (the reader continues without a seek when it is asked for)."""
    return Cursor(offset)


_LIBRDKAFKA = logging.getLogger("eventlane.log.librdkafka")
"""librdkafka's own log lines (its errors also reach callers as exceptions)."""
