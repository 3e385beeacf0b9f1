"""What the listener does for each Kafka API, on the log port.

One broker, node id 0, leader of every partition, with itself as the only replica and the
whole in-sync set. Records cross the wire as Kafka record batches (magic 2); the log stores
them in its own batch format, so a produce decodes the client's batches into records and a
fetch encodes the log's records into batches (offsets, timestamps, keys, values and headers
kept; compaction gaps kept as gaps between record offsets).

Idempotent producers (the default of kafka-python 3 and of Java clients since Kafka 3.0):
``InitProducerId`` hands out producer ids, and per (producer id, partition) the broker keeps
the next expected sequence and the last five batches, so a retried batch is answered with
its first offset instead of being appended twice, and a gap is refused with
OUT_OF_ORDER_SEQUENCE_NUMBER. This state is in memory: after a restart a producer's first
batch starts its state again (Kafka rebuilds it from the log). Transactions are refused:
the transaction APIs are not advertised, and a transactional ``InitProducerId`` or a
transactional batch gets an error, so clients fail fast instead of half-working.
"""

from __future__ import annotations

import asyncio
import collections
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from kafka.protocol.admin import (
    CreateTopicsResponse,
    DeleteGroupsResponse,
    DeleteRecordsResponse,
    DeleteTopicsResponse,
    DescribeConfigsResponse,
    DescribeGroupsResponse,
    ListGroupsResponse,
)
from kafka.protocol.consumer import (
    FetchResponse,
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    ListOffsetsResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
    SyncGroupResponse,
)
from kafka.protocol.metadata import ApiVersionsResponse, FindCoordinatorResponse, MetadataResponse
from kafka.protocol.producer import InitProducerIdResponse, ProduceResponse
from kafka.record.memory_records import MemoryRecords

from framework.consumer.admin import live_worker_members
from framework.consumer.coordination import coordination_for
from framework.consumer.coordinator import validate_group_id
from framework.consumer.membership import ClientGroup, GroupState
from framework.consumer.offsets import OffsetAndMetadata, OffsetStore
from framework.errors import (
    ConfigError,
    FrameworkError,
    InvalidTopicError,
    OffsetOutOfRangeError,
    TopicExistsError,
)
from framework.kafka.codes import Errors, errno, error_for, group_error_for
from framework.kafka.groups import GroupCoordinator
from framework.kafka.protocol import SUPPORTED
from framework.kafka.records import (
    BatchFormatError,
    Charge,
    DecompressedTooLargeError,
    KafkaBatch,
    UnsupportedCompressionError,
    encode_batch,
    has_compressed,
    parse_batches,
)
from framework.log import Log, TopicConfig, TopicPartition
from framework.log.names import INTERNAL_TOPICS, validate_topic_name
from framework.observability import get_logger

log = get_logger("eventlane.kafka")

NODE_ID = 0
CLUSTER_ID = "eventlane"
_TOPIC_NS = uuid.UUID("6f1c7c56-3c1a-4e8e-9a53-3b1f0d6a6b21")
_DEDUPE_WINDOW = 5
_MAX_PLACEHOLDERS = 100_000
"""Negative commits held in memory (see ``offset_commit``): a bound, oldest dropped first."""
TRANSACTIONS_REFUSED = errno(Errors.TransactionalIdAuthorizationFailedError)
"""The answer to every transactional request: a code no client retries (Kafka's clients fail
``init_transactions()`` at once on it), with :data:`TRANSACTIONS_MESSAGE` beside it."""
TRANSACTIONS_MESSAGE = (
    "transactions are not supported by eventlane's Kafka listener (no transaction coordinator)"
)
KAFKA_INTERNAL_TOPICS = frozenset(
    {"__transaction_state", "__share_group_state", "__cluster_metadata"}
)
"""Kafka's own internal topics: refused like eventlane's (a client may think it writes them)."""
_LEGAL = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
_MAX_TOPIC_NAME = 249


def is_internal(name: str) -> bool:
    """Whether ``name`` is an internal topic: written by eventlane (or, for Kafka's, by
    nobody), never by a client."""
    return name in INTERNAL_TOPICS or name in KAFKA_INTERNAL_TOPICS


def check_topic_name(name: object) -> str:
    """``name`` if Kafka and eventlane both accept it as a topic name, else
    :class:`InvalidTopicError` (Kafka's rule: 1-249 characters of ``[a-zA-Z0-9._-]``, not
    ``.`` or ``..``; eventlane's: no leading ``.``)."""
    if not isinstance(name, str) or not name or len(name) > _MAX_TOPIC_NAME:
        raise InvalidTopicError(f"illegal topic name {name!r}", topic=str(name)[:300])
    if not set(name) <= _LEGAL or name in (".", ".."):
        raise InvalidTopicError(f"illegal topic name {name!r}", topic=name)
    validate_topic_name(name)
    return name


def refuse_internal(name: str, action: str) -> None:
    """:class:`InvalidTopicError` when a client asks to ``action`` an internal topic."""
    if is_internal(name):
        raise InvalidTopicError(
            f"{name} is an internal topic: clients cannot {action} it", topic=name
        )


def topic_id(name: str | None) -> uuid.UUID:
    """A stable topic id (Kafka's are random; eventlane's topics are named, so derived)."""
    return uuid.uuid5(_TOPIC_NS, name or "")


class _ProducerState:
    """Sequence bookkeeping of one producer on one partition."""

    __slots__ = ("epoch", "next_seq", "recent")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.next_seq = -1  # unknown: accept the first batch's sequence
        self.recent: collections.deque[tuple[int, int, int]] = collections.deque(
            maxlen=_DEDUPE_WINDOW
        )  # (first seq, last seq, base offset)


class Broker:
    """The API handlers (async; log calls run in threads)."""

    def __init__(
        self, log_: Log, *, auto_create_topics: bool = True, default_partitions: int = 1
    ) -> None:
        self.log = log_
        self.auto_create_topics = auto_create_topics
        self.default_partitions = default_partitions
        self.host = "127.0.0.1"
        self.port = 9092
        self._producers: dict[tuple[int, str, int], _ProducerState] = {}
        self._next_pid = (int(time.time() * 1000) & 0xFFFFFFFFFF) << 12
        self._append_lock = asyncio.Lock()
        self.limits: dict[str, str] = {}
        # (group, partition) -> a negative committed offset (-1 latest, -2 earliest: a
        # client's "no position, apply the reset policy"), answered by OffsetFetch until the
        # group commits a real offset there; the store keeps its last real commit
        self._placeholders: dict[tuple[str, TopicPartition], int] = {}
        self.offsets = OffsetStore(log_)
        self.budget: Any = None  # the server's in-flight memory budget (set by the server)
        self.max_decompressed_bytes = 100 << 20
        self.memory_wait_s = 30.0
        self.groups = GroupCoordinator(
            self.offsets, eventlane_live=self._eventlane_live, publish=self._publish_group
        )

    def _eventlane_live(self, group: str) -> bool:
        """Whether eventlane workers (its own coordinator) hold live members of ``group``."""
        try:
            return bool(live_worker_members(self.log, group))
        except FrameworkError:
            return False

    def _publish_group(self, group: str, snapshot: ClientGroup) -> None:
        """Write a group's membership into its group state, where ``eventlane groups``
        reads it (blocking)."""

        def change(state: GroupState) -> None:
            state.clients = snapshot

        coord = coordination_for(self.log).coordinator(group)
        try:
            coord.mutate(change)
        finally:
            coord.close()

    def advertise(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    def handlers(self) -> dict[int, Callable[[Any], Awaitable[Any]]]:
        return {
            0: self.produce,
            1: self.fetch,
            2: self.list_offsets,
            3: self.metadata,
            10: self.find_coordinator,
            18: self.api_versions,
            19: self.create_topics,
            20: self.delete_topics,
            21: self.delete_records,
            22: self.init_producer_id,
            32: self.describe_configs,
            8: self.offset_commit,
            9: self.offset_fetch,
            11: self.join_group,
            12: self.heartbeat,
            13: self.leave_group,
            14: self.sync_group,
            15: self.describe_groups,
            16: self.list_groups,
            42: self.delete_groups,
        }

    # -- ApiVersions ---------------------------------------------------------------------
    def _versions(self) -> list[Any]:
        return [
            ApiVersionsResponse.ApiVersion(api_key=key, min_version=lo, max_version=hi)
            for key, (lo, hi) in sorted(SUPPORTED.items())
        ]

    async def api_versions(self, request: Any) -> Any:
        return ApiVersionsResponse(
            error_code=0,
            api_keys=self._versions(),
            throttle_time_ms=0,
            supported_features=[],
            finalized_features_epoch=-1,
            finalized_features=[],
            zk_migration_ready=False,
        )

    def api_versions_error(self, correlation_id: int) -> bytes:
        response = ApiVersionsResponse(
            error_code=errno(Errors.UnsupportedVersionError), api_keys=self._versions()
        )
        response.API_VERSION = 0
        response.with_header(correlation_id=correlation_id)
        return bytes(response.encode(header=True, framed=True))

    # -- Metadata ------------------------------------------------------------------------
    def _topic_metadata(self, name: str) -> Any:
        Topic = MetadataResponse.MetadataResponseTopic
        Partition = Topic.MetadataResponsePartition
        try:
            count = self.log.partition_count(check_topic_name(name))
        except Exception as exc:
            return Topic(
                error_code=error_for(exc),
                name=name,
                topic_id=uuid.UUID(int=0),
                is_internal=False,
                partitions=[],
            )
        return Topic(
            error_code=0,
            name=name,
            topic_id=topic_id(name),
            is_internal=is_internal(name),
            partitions=[
                Partition(
                    error_code=0,
                    partition_index=p,
                    leader_id=NODE_ID,
                    leader_epoch=0,
                    replica_nodes=[NODE_ID],
                    isr_nodes=[NODE_ID],
                    offline_replicas=[],
                )
                for p in range(count)
            ],
        )

    async def metadata(self, request: Any) -> Any:
        if request.topics is None:
            names = await asyncio.to_thread(self.log.list_topics)
        else:
            names = [t.name for t in request.topics]
            if self.auto_create_topics and getattr(request, "allow_auto_topic_creation", True):
                for name in names:
                    await asyncio.to_thread(self._auto_create, name)
        topics = [await asyncio.to_thread(self._topic_metadata, n) for n in names]
        return MetadataResponse(
            throttle_time_ms=0,
            brokers=[
                MetadataResponse.MetadataResponseBroker(
                    node_id=NODE_ID, host=self.host, port=self.port, rack=None
                )
            ],
            cluster_id=CLUSTER_ID,
            controller_id=NODE_ID,
            topics=topics,
            error_code=0,
        )

    def _auto_create(self, name: str) -> None:
        try:
            if name.startswith("__") or self.log.topic_exists(check_topic_name(name)):
                return
            self.log.create_topic(name, self.default_partitions, exist_ok=True)
            log.info("topic auto-created", topic=name, partitions=self.default_partitions)
        except Exception as exc:
            log.warning("topic not auto-created", topic=name, error=str(exc))

    # -- topics ----------------------------------------------------------------------------
    async def create_topics(self, request: Any) -> Any:
        Result = CreateTopicsResponse.CreatableTopicResult
        results = []
        for topic in request.topics:
            code, message = errno(Errors.NoError), None
            configs: list[Any] = []
            partitions = topic.num_partitions if topic.num_partitions > 0 else 1
            if is_internal(topic.name):
                code = errno(Errors.InvalidTopicError)
                message = f"{topic.name} is an internal topic: clients cannot create it"
            elif topic.replication_factor not in (-1, 1):
                code = errno(Errors.InvalidReplicationFactorError)
                message = "eventlane is one broker: replication factor must be 1"
            elif topic.assignments:
                code = errno(Errors.InvalidRequestError)
                message = "manual replica assignment is not supported"
            else:
                try:
                    check_topic_name(topic.name)
                    config = eventlane_config({c.name: c.value for c in topic.configs})
                    if getattr(request, "validate_only", False):
                        if self.log.topic_exists(topic.name):
                            raise TopicExistsError(f"topic {topic.name!r} exists", topic=topic.name)
                    else:
                        await asyncio.to_thread(
                            self.log.create_topic, topic.name, partitions, config
                        )
                        created = await asyncio.to_thread(self.log.topic_config, topic.name)
                        configs = [
                            Result.CreatableTopicConfigs(
                                name=name,
                                value=value,
                                read_only=True,
                                config_source=5 if is_default else 1,
                                is_sensitive=False,
                            )
                            for name, (value, is_default) in sorted(
                                _with_defaults(kafka_config(created), _TOPIC_DEFAULTS).items()
                            )
                        ]
                except Exception as exc:
                    code, message = error_for(exc), str(exc)
            results.append(
                Result(
                    name=topic.name,
                    topic_id=topic_id(topic.name),
                    error_code=code,
                    error_message=message,
                    topic_config_error_code=0,
                    num_partitions=partitions if code == 0 else -1,
                    replication_factor=1 if code == 0 else -1,
                    configs=configs,
                )
            )
        return CreateTopicsResponse(throttle_time_ms=0, topics=results)

    async def delete_topics(self, request: Any) -> Any:
        names = (
            [t.name for t in request.topics]
            if getattr(request, "topics", None)
            else list(request.topic_names or [])
        )
        results = []
        for name in names:
            code, message = errno(Errors.NoError), None
            try:
                refuse_internal(check_topic_name(name), "delete")
                await asyncio.to_thread(self.log.delete_topic, name)
            except Exception as exc:
                code, message = error_for(exc), str(exc)
            results.append(
                DeleteTopicsResponse.DeletableTopicResult(
                    name=name, topic_id=topic_id(name), error_code=code, error_message=message
                )
            )
        return DeleteTopicsResponse(throttle_time_ms=0, responses=results)

    async def describe_configs(self, request: Any) -> Any:
        """Topic configs (Kafka's names) and the broker's; each entry says whether it is the
        default (source DEFAULT_CONFIG, 5) or set (TOPIC_CONFIG 1 / STATIC_BROKER_CONFIG 4).
        Everything is read-only: AlterConfigs is not implemented."""
        Result = DescribeConfigsResponse.DescribeConfigsResult
        Entry = Result.DescribeConfigsResourceResult
        results = []
        for resource in request.resources:
            entries: list[Any] = []
            code, message = errno(Errors.NoError), None
            values: dict[str, tuple[str, bool]] = {}
            set_source = 1
            try:
                if resource.resource_type == 2:  # TOPIC
                    name = check_topic_name(resource.resource_name)
                    config = await asyncio.to_thread(self.log.topic_config, name)
                    values = _with_defaults(kafka_config(config), _TOPIC_DEFAULTS)
                elif resource.resource_type == 4:  # BROKER
                    if resource.resource_name not in ("", str(NODE_ID)):
                        raise ConfigError(f"unknown broker {resource.resource_name!r}")
                    values = _with_defaults(self.broker_configs, _BROKER_DEFAULTS)
                    set_source = 4
                else:
                    code = errno(Errors.InvalidRequestError)
                    message = f"resource type {resource.resource_type} is not supported"
            except Exception as exc:
                code, message, values = error_for(exc), str(exc), {}
                if resource.resource_type == 4:
                    code = errno(Errors.InvalidRequestError)
            wanted = resource.configuration_keys
            for name, (value, is_default) in sorted(values.items()):
                if wanted is None or name in wanted:
                    entries.append(
                        Entry(
                            name=name,
                            value=value,
                            read_only=True,
                            config_source=5 if is_default else set_source,
                            is_default=is_default,
                            is_sensitive=False,
                            synonyms=[],
                            config_type=0,
                            documentation=None,
                        )
                    )
            results.append(
                Result(
                    error_code=code,
                    error_message=message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    configs=entries,
                )
            )
        return DescribeConfigsResponse(throttle_time_ms=0, results=results)

    @property
    def broker_configs(self) -> dict[str, str]:
        """The broker's configuration under Kafka's names."""
        return {
            "broker.id": str(NODE_ID),
            "node.id": str(NODE_ID),
            "auto.create.topics.enable": str(self.auto_create_topics).lower(),
            "num.partitions": str(self.default_partitions),
            "default.replication.factor": "1",
            "offsets.topic.replication.factor": "1",
            **self.limits,
        }

    # -- produce ---------------------------------------------------------------------------
    async def init_producer_id(self, request: Any) -> Any:
        if request.transactional_id is not None:
            log.info("transactional producer refused", transactional_id=request.transactional_id)
            return InitProducerIdResponse(
                throttle_time_ms=0,
                error_code=TRANSACTIONS_REFUSED,
                producer_id=-1,
                producer_epoch=-1,
            )
        self._next_pid += 1
        return InitProducerIdResponse(
            throttle_time_ms=0, error_code=0, producer_id=self._next_pid, producer_epoch=0
        )

    async def produce(self, request: Any) -> Any:
        Topic = ProduceResponse.TopicProduceResponse
        Part = Topic.PartitionProduceResponse
        topics = []
        for topic in request.topic_data:
            parts = []
            for pdata in topic.partition_data:
                code, base, append_time, lwm, message = await self._produce_partition(
                    topic.name, pdata.index, pdata.records, request.transactional_id
                )
                parts.append(
                    Part(
                        index=pdata.index,
                        error_code=code,
                        base_offset=base,
                        log_append_time_ms=append_time,
                        log_start_offset=lwm,
                        record_errors=[],
                        error_message=message,
                    )
                )
            topics.append(Topic(name=topic.name, partition_responses=parts))
        if request.acks == 0:
            return None
        return ProduceResponse(responses=topics, throttle_time_ms=0, node_endpoints=[])

    async def _produce_partition(
        self, topic: str, partition: int, raw: bytes | None, transactional_id: str | None
    ) -> tuple[int, int, int, int, str | None]:
        if transactional_id is not None:
            return TRANSACTIONS_REFUSED, -1, -1, -1, TRANSACTIONS_MESSAGE
        charged = [0]  # bytes of decompressed records counted against the in-flight cap
        try:
            return await self._produce_charged(topic, partition, bytes(raw or b""), charged)
        finally:
            if charged[0] and self.budget is not None:
                await self.budget.release(charged[0])

    async def _batches(self, raw: bytes, charged: list[int]) -> list[KafkaBatch]:
        """The request's batches; compressed ones are decompressed in a worker thread, their
        records counted against the in-flight memory cap (``charged``, released by the
        caller once appended) and bounded by ``max_decompressed_bytes`` (the request size
        limit: what an uncompressed request could hold)."""
        budget = self.budget
        if budget is None or not has_compressed(raw):
            return _produced_batches(raw)
        loop = asyncio.get_running_loop()
        limit, wait_s = self.max_decompressed_bytes, self.memory_wait_s

        def charge(size: int) -> None:
            if charged[0] + size > limit:
                raise DecompressedTooLargeError(
                    f"the records decompress to more than {limit} bytes (socket.request.max.bytes)"
                )
            acquire = asyncio.wait_for(budget.acquire(size), wait_s)
            try:
                asyncio.run_coroutine_threadsafe(acquire, loop).result()
            except TimeoutError:
                raise _MemoryBusyError(
                    f"no room for {size} decompressed bytes under the in-flight memory cap"
                    f" within {wait_s} s"
                ) from None
            charged[0] += size

        return await asyncio.to_thread(_produced_batches, raw, charge)

    async def _produce_charged(
        self, topic: str, partition: int, raw: bytes, charged: list[int]
    ) -> tuple[int, int, int, int, str | None]:
        try:
            refuse_internal(check_topic_name(topic), "produce to")
            batches = await self._batches(raw, charged)
        except InvalidTopicError as exc:
            return errno(Errors.InvalidTopicError), -1, -1, -1, str(exc)
        except _RefusedError as exc:
            return exc.code, -1, -1, -1, str(exc)
        first_base = -1
        append_time = -1
        async with self._append_lock:
            for batch in batches:
                tuples = batch.records
                state = None
                if batch.producer_id >= 0:
                    key = (batch.producer_id, topic, partition)
                    state = self._producers.get(key)
                    if state is None or state.epoch != batch.producer_epoch:
                        state = self._producers[key] = _ProducerState(batch.producer_epoch)
                    seq, last = batch.base_sequence, batch.base_sequence + len(tuples) - 1
                    retried = [off for f, lst, off in state.recent if f == seq and lst == last]
                    if retried:  # a retry of a batch we have: answer with its offset
                        first_base = retried[0] if first_base < 0 else first_base
                        continue
                    if state.next_seq >= 0 and seq != state.next_seq:
                        return (
                            errno(Errors.OutOfOrderSequenceNumberError),
                            -1,
                            -1,
                            -1,
                            f"expected sequence {state.next_seq}, got {seq}",
                        )
                if not tuples:
                    continue
                try:
                    result = await asyncio.to_thread(self.log.append, topic, partition, tuples)
                except Exception as exc:
                    return error_for(exc), -1, -1, -1, str(exc)
                if first_base < 0:
                    first_base = result.base_offset
                append_time = result.timestamps[0] if result.timestamps else -1
                if state is not None:
                    state.recent.append(
                        (
                            batch.base_sequence,
                            batch.base_sequence + len(tuples) - 1,
                            result.base_offset,
                        )
                    )
                    state.next_seq = (batch.base_sequence + len(tuples)) & 0x7FFFFFFF
        try:
            lwm = (await asyncio.to_thread(self.log.offsets, topic, partition)).lwm
            timestamp_type = await asyncio.to_thread(self._append_time_topic, topic)
        except Exception as exc:
            # the records are stored (acknowledge them): only the marks could not be read
            return errno(Errors.NoError), first_base, -1, -1, f"stored; {exc}"
        return errno(Errors.NoError), first_base, append_time if timestamp_type else -1, lwm, None

    def _append_time_topic(self, topic: str) -> bool:
        return bool(self.log.topic_config(topic).log_append_time)

    # -- fetch -----------------------------------------------------------------------------
    async def fetch(self, request: Any) -> Any:
        deadline = time.monotonic() + max(request.max_wait_ms, 0) / 1000.0
        while True:
            seen = self.log.wait_seq()
            response, size = await asyncio.to_thread(self._fetch_once, request)
            remaining = deadline - time.monotonic()
            if size >= max(request.min_bytes, 1) or remaining <= 0:
                return response
            await asyncio.to_thread(self.log.wait, seen, min(remaining, 0.5))

    def _fetch_once(self, request: Any) -> tuple[Any, int]:
        TopicR = FetchResponse.FetchableTopicResponse
        PartR = TopicR.PartitionData
        budget = request.max_bytes if request.max_bytes > 0 else 0x7FFFFFFF
        total = 0
        topics = []
        for topic in request.topics:
            parts = []
            for p in topic.partitions:
                code, hwm, lwm, blob = errno(Errors.NoError), -1, -1, b""
                try:
                    marks = self.log.offsets(check_topic_name(topic.topic), p.partition)
                    hwm, lwm = marks.hwm, marks.lwm
                    if p.fetch_offset < lwm or p.fetch_offset > hwm:
                        raise OffsetOutOfRangeError(
                            f"offset {p.fetch_offset} outside [{lwm}, {hwm}]",
                            topic=topic.topic,
                            partition=p.partition,
                            offset=p.fetch_offset,
                            lwm=lwm,
                            leo=marks.leo,
                        )
                    limit = min(p.partition_max_bytes, max(budget - total, 0))
                    if limit > 0 and p.fetch_offset < hwm:
                        blob = self._read_batches(
                            topic.topic, p.partition, p.fetch_offset, hwm, limit, total == 0
                        )
                        total += len(blob)
                except Exception as exc:
                    code = error_for(exc)
                parts.append(
                    PartR(
                        partition_index=p.partition,
                        error_code=code,
                        high_watermark=hwm,
                        last_stable_offset=hwm,
                        log_start_offset=lwm,
                        aborted_transactions=None,
                        preferred_read_replica=-1,
                        records=blob,
                    )
                )
            topics.append(TopicR(topic=topic.topic, partitions=parts))
        return (
            FetchResponse(
                throttle_time_ms=0,
                error_code=0,
                session_id=0,
                responses=topics,
                node_endpoints=[],
            ),
            total,
        )

    def _read_batches(
        self, topic: str, partition: int, offset: int, hwm: int, limit: int, first: bool
    ) -> bytes:
        """Kafka record batches for the log's records from ``offset`` (at most ``limit``
        bytes, but at least one batch when ``first``, as Kafka returns an oversized first
        batch rather than nothing)."""
        records, _ = self.log.read(topic, partition, offset, max_bytes=max(limit, 1), upto=hwm)
        if not records:
            return b""
        # Kafka's framing is smaller than the log's (varints against fixed-width fields), so
        # what the log read within ``limit`` bytes stays within it once re-framed.
        return encode_batch(records)

    # -- offsets ---------------------------------------------------------------------------
    async def list_offsets(self, request: Any) -> Any:
        TopicR = ListOffsetsResponse.ListOffsetsTopicResponse
        PartR = TopicR.ListOffsetsPartitionResponse
        topics = []
        for topic in request.topics:
            parts = []
            for p in topic.partitions:
                code, offset, ts = errno(Errors.NoError), -1, -1
                try:
                    offset, ts = await asyncio.to_thread(
                        self._offset_for,
                        check_topic_name(topic.name),
                        p.partition_index,
                        p.timestamp,
                    )
                except Exception as exc:
                    code = error_for(exc)
                parts.append(
                    PartR(
                        partition_index=p.partition_index,
                        error_code=code,
                        old_style_offsets=[offset] if offset >= 0 else [],
                        timestamp=ts,
                        offset=offset,
                        leader_epoch=0,
                    )
                )
            topics.append(TopicR(name=topic.name, partitions=parts))
        return ListOffsetsResponse(throttle_time_ms=0, topics=topics)

    def _offset_for(self, topic: str, partition: int, timestamp: int) -> tuple[int, int]:
        marks = self.log.offsets(topic, partition)
        if timestamp == -2:
            return marks.lwm, -1
        if timestamp in (-1, -3):  # latest (-3: max timestamp, answered as latest)
            return marks.hwm, -1
        found = self.log.offset_for_time(topic, partition, timestamp)
        if found is None:
            return -1, -1
        records, _ = self.log.read(topic, partition, found, max_bytes=1, upto=marks.hwm)
        return found, (records[0].timestamp if records else -1)

    async def delete_records(self, request: Any) -> Any:
        TopicR = DeleteRecordsResponse.DeleteRecordsTopicResult
        PartR = TopicR.DeleteRecordsPartitionResult
        topics = []
        for topic in request.topics:
            parts = []
            for p in topic.partitions:
                code, lwm = errno(Errors.NoError), -1
                try:
                    refuse_internal(check_topic_name(topic.name), "delete records of")
                    offset = p.offset
                    if offset == -1:
                        offset = (
                            await asyncio.to_thread(self.log.offsets, topic.name, p.partition_index)
                        ).hwm
                    lwm = await asyncio.to_thread(
                        self.log.delete_records, topic.name, p.partition_index, offset
                    )
                except Exception as exc:
                    code = error_for(exc)
                parts.append(
                    PartR(partition_index=p.partition_index, low_watermark=lwm, error_code=code)
                )
            topics.append(TopicR(name=topic.name, partitions=parts))
        return DeleteRecordsResponse(throttle_time_ms=0, topics=topics)

    # -- groups ----------------------------------------------------------------------------
    async def join_group(self, request: Any) -> Any:
        client_id = request.header.client_id or ""
        result = await self.groups.join(request, client_id)
        Member = JoinGroupResponse.JoinGroupResponseMember
        return JoinGroupResponse(
            throttle_time_ms=0,
            error_code=result["error_code"],
            generation_id=result["generation_id"],
            protocol_type=result["protocol_type"],
            protocol_name=result["protocol_name"],
            leader=result["leader"],
            skip_assignment=False,
            member_id=result["member_id"],
            members=[
                Member(
                    member_id=m["member_id"],
                    group_instance_id=m["group_instance_id"],
                    metadata=m["metadata"],
                )
                for m in result["members"]
            ],
        )

    async def sync_group(self, request: Any) -> Any:
        code, assignment = await self.groups.sync(request)
        group = self.groups.describe(request.group_id)
        return SyncGroupResponse(
            throttle_time_ms=0,
            error_code=code,
            protocol_type=None if group is None else group.protocol_type,
            protocol_name=None if group is None else group.protocol,
            assignment=assignment,
        )

    async def heartbeat(self, request: Any) -> Any:
        return HeartbeatResponse(throttle_time_ms=0, error_code=self.groups.heartbeat(request))

    async def leave_group(self, request: Any) -> Any:
        members = getattr(request, "members", None)
        if members:
            wanted = [(m.member_id, m.group_instance_id) for m in members]
        else:
            wanted = [(request.member_id, None)]
        results = self.groups.leave(request.group_id, wanted)
        code = results[0][2] if results and not members else errno(Errors.NoError)
        return LeaveGroupResponse(
            throttle_time_ms=0,
            error_code=code,
            members=[
                LeaveGroupResponse.MemberResponse(member_id=m, group_instance_id=i, error_code=c)
                for m, i, c in results
            ],
        )

    async def offset_commit(self, request: Any) -> Any:
        """Kafka stores any committed offset; so does the listener. A negative one (-1, -2:
        a client's placeholder for "latest"/"earliest" after OFFSET_OUT_OF_RANGE) is held as
        a placeholder that OffsetFetch answers, so the client applies its reset policy; one
        below the low-water mark is stored, and the next fetch from it gets
        OFFSET_OUT_OF_RANGE, so the client resets as its policy says (Kafka's behaviour)."""
        TopicR = OffsetCommitResponse.OffsetCommitResponseTopic
        PartR = TopicR.OffsetCommitResponsePartition
        generation = request.generation_id_or_member_epoch
        group = request.group_id
        try:
            validate_group_id(group)
            code = self.groups.check_commit(group, generation, request.member_id or "")
        except ConfigError:
            code = errno(Errors.InvalidGroupIdError)
        wanted: dict[TopicPartition, OffsetAndMetadata] = {}
        placeholders: dict[TopicPartition, int] = {}
        errors: dict[TopicPartition, int] = {}
        for topic in request.topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.name, p.partition_index)
                if code:
                    errors[tp] = code
                    continue
                try:
                    exists = self.log.topic_exists(check_topic_name(topic.name))
                    if not exists or p.partition_index >= self.log.partition_count(topic.name):
                        errors[tp] = errno(Errors.UnknownTopicOrPartitionError)
                    elif p.committed_offset < 0:
                        placeholders[tp] = p.committed_offset
                    else:
                        meta = p.committed_metadata or ""
                        wanted[tp] = OffsetAndMetadata(p.committed_offset, meta)
                except Exception as exc:
                    errors[tp] = error_for(exc)
        if wanted:
            try:
                await asyncio.to_thread(
                    self.offsets.commit,
                    group,
                    wanted,
                    generation=generation,
                    member_id=request.member_id or "kafka-simple",
                )
            except Exception as exc:
                for tp in wanted:
                    errors[tp] = group_error_for(exc)
        for tp in wanted:
            if tp not in errors:
                self._placeholders.pop((group, tp), None)
        for tp, offset in placeholders.items():
            self._placeholders.pop((group, tp), None)
            self._placeholders[(group, tp)] = offset
        while len(self._placeholders) > _MAX_PLACEHOLDERS:  # the oldest go first
            del self._placeholders[next(iter(self._placeholders))]
        topics = []
        for topic in request.topics:
            parts = [
                PartR(
                    partition_index=p.partition_index,
                    error_code=errors.get(TopicPartition(topic.name, p.partition_index), 0),
                )
                for p in topic.partitions
            ]
            topics.append(TopicR(name=topic.name, partitions=parts))
        return OffsetCommitResponse(throttle_time_ms=0, topics=topics)

    async def offset_fetch(self, request: Any) -> Any:
        groups = getattr(request, "groups", None)
        if groups:
            Group = OffsetFetchResponse.OffsetFetchResponseGroup
            Topics = Group.OffsetFetchResponseTopics
            Parts = Topics.OffsetFetchResponsePartitions
            out = []
            for g in groups:
                code, found = await self._fetch_committed(g.group_id, g.topics)
                out.append(
                    Group(
                        group_id=g.group_id,
                        error_code=code,
                        topics=[
                            Topics(
                                name=name,
                                partitions=[
                                    Parts(
                                        partition_index=p,
                                        committed_offset=o,
                                        committed_leader_epoch=-1,
                                        metadata=m,
                                        error_code=code,
                                    )
                                    for p, o, m in parts
                                ],
                            )
                            for name, parts in found
                        ],
                    )
                )
            return OffsetFetchResponse(throttle_time_ms=0, groups=out)
        Topic = OffsetFetchResponse.OffsetFetchResponseTopic
        Part = Topic.OffsetFetchResponsePartition
        code, found = await self._fetch_committed(request.group_id, request.topics)
        return OffsetFetchResponse(
            throttle_time_ms=0,
            error_code=code,
            topics=[
                Topic(
                    name=name,
                    partitions=[
                        Part(
                            partition_index=p,
                            committed_offset=o,
                            committed_leader_epoch=-1,
                            metadata=m,
                            error_code=code,
                        )
                        for p, o, m in parts
                    ],
                )
                for name, parts in found
            ],
        )

    async def _fetch_committed(
        self, group: Any, topics: Any
    ) -> tuple[int, list[tuple[str, list[tuple[int, int, str]]]]]:
        """(error code, committed offsets by topic) of ``group``; on an error every asked
        partition is listed with offset -1."""
        try:
            validate_group_id(group)
            return 0, await asyncio.to_thread(self._committed, group, topics)
        except ConfigError:
            code = errno(Errors.InvalidGroupIdError)
        except Exception as exc:
            code = group_error_for(exc)
        asked = [(t.name, [(p, -1, "") for p in t.partition_indexes]) for t in topics or []]
        return code, asked

    def _committed(self, group: str, topics: Any) -> list[tuple[str, list[tuple[int, int, str]]]]:
        if not self.offsets.exists():
            committed: dict[TopicPartition, tuple[int, str]] = {}
        else:
            committed = {
                tp: (c.offset, c.metadata or "")
                for tp, c in self.offsets.group_offsets(group).items()
            }
        for (g, tp), offset in list(self._placeholders.items()):
            if g == group:
                committed[tp] = (offset, "")
        if topics is None:
            by_topic: dict[str, list[tuple[int, int, str]]] = {}
            for tp, (offset, meta) in sorted(committed.items()):
                by_topic.setdefault(tp.topic, []).append((tp.partition, offset, meta))
            return sorted(by_topic.items())
        out = []
        for t in topics:
            parts = []
            for p in t.partition_indexes:
                offset, meta = committed.get(TopicPartition(t.name, p), (-1, ""))
                parts.append((p, offset, meta))
            out.append((t.name, parts))
        return out

    async def list_groups(self, request: Any) -> Any:
        names = set(self.groups.groups)
        if self.offsets.exists():
            names |= await asyncio.to_thread(self.offsets.groups)
        listed = []
        for name in sorted(names):
            group = self.groups.describe(name)
            state = "Empty" if group is None else group.state
            if getattr(request, "states_filter", None) and state not in request.states_filter:
                continue
            listed.append(
                ListGroupsResponse.ListedGroup(
                    group_id=name, protocol_type="consumer", group_state=state, group_type="classic"
                )
            )
        return ListGroupsResponse(throttle_time_ms=0, error_code=0, groups=listed)

    async def describe_groups(self, request: Any) -> Any:
        Described = DescribeGroupsResponse.DescribedGroup
        Member = Described.DescribedGroupMember
        out = []
        for name in request.groups:
            group = self.groups.describe(name)
            members = [] if group is None else list(group.members.values())
            out.append(
                Described(
                    error_code=0,
                    error_message=None,
                    group_id=name,
                    group_state="Dead" if group is None else group.state,
                    protocol_type="" if group is None else (group.protocol_type or ""),
                    protocol_data="" if group is None else (group.protocol or ""),
                    members=[
                        Member(
                            member_id=m.member_id,
                            group_instance_id=m.instance_id,
                            client_id=m.client_id,
                            client_host=m.client_host,
                            member_metadata=dict(m.protocols).get(group.protocol or "", b"")
                            if group
                            else b"",
                            member_assignment=m.assignment,
                        )
                        for m in members
                    ],
                )
            )
        return DescribeGroupsResponse(throttle_time_ms=0, groups=out)

    async def delete_groups(self, request: Any) -> Any:
        results = []
        for name in request.groups_names:
            group = self.groups.describe(name)
            code = errno(Errors.NoError)
            if group is not None and group.members:
                code = errno(Errors.NonEmptyGroupError)
            else:
                try:
                    await asyncio.to_thread(self.offsets.delete_group, name)
                    self.groups.groups.pop(name, None)
                    for key in [k for k in self._placeholders if k[0] == name]:
                        del self._placeholders[key]
                except Exception as exc:
                    code = group_error_for(exc)
            results.append(
                DeleteGroupsResponse.DeletableGroupResult(group_id=name, error_code=code)
            )
        return DeleteGroupsResponse(throttle_time_ms=0, results=results)

    async def find_coordinator(self, request: Any) -> Any:
        keys = list(getattr(request, "coordinator_keys", None) or [request.key])
        if request.key_type != 0:  # 1: a transaction coordinator, 2: a share group's
            code, message = TRANSACTIONS_REFUSED, TRANSACTIONS_MESSAGE
        else:
            code, message = errno(Errors.NoError), None
        return FindCoordinatorResponse(
            throttle_time_ms=0,
            error_code=code,
            error_message=message,
            node_id=NODE_ID if code == 0 else -1,
            host=self.host if code == 0 else "",
            port=self.port if code == 0 else -1,
            coordinators=[
                FindCoordinatorResponse.Coordinator(
                    key=k,
                    node_id=NODE_ID if code == 0 else -1,
                    host=self.host if code == 0 else "",
                    port=self.port if code == 0 else -1,
                    error_code=code,
                    error_message=message,
                )
                for k in keys
            ],
        )


_KAFKA_NAMES = {"max_record_bytes": "max.message.bytes", "timestamp_type": "message.timestamp.type"}
_FROM_KAFKA = {kafka: ours for ours, kafka in _KAFKA_NAMES.items()}
IGNORED_CONFIGS = frozenset(
    {
        "min.insync.replicas",
        "unclean.leader.election.enable",
        "compression.type",
        "message.downconversion.enable",
        "preallocate",
        "follower.replication.throttled.replicas",
        "leader.replication.throttled.replicas",
    }
)
"""Kafka topic configs that mean nothing on one node: accepted and ignored (logged)."""


def eventlane_config(values: dict[str, str | None]) -> dict[str, str]:
    """A CreateTopics config under eventlane's names (Kafka's names accepted)."""
    out: dict[str, str] = {}
    for name, value in values.items():
        if value is None:
            continue
        if name in IGNORED_CONFIGS:
            log.info("topic config ignored on one node", config=name, value=value)
            continue
        out[_FROM_KAFKA.get(name, name)] = value
    return out


def _with_defaults(values: dict[str, str], defaults: dict[str, str]) -> dict[str, tuple[str, bool]]:
    return {name: (value, defaults.get(name) == value) for name, value in values.items()}


_BROKER_DEFAULTS = {
    "auto.create.topics.enable": "true",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "socket.request.max.bytes": str(100 << 20),
    "connections.max.idle.ms": "600000",
    "max.connections": str(0x7FFFFFFF),
    "queued.max.request.bytes": "-1",
}
"""Kafka's defaults of the broker configs the listener reports."""


def kafka_config(config: Any) -> dict[str, str]:
    """A topic's configuration under Kafka's names (what DescribeConfigs returns)."""
    out: dict[str, str] = {}
    for name, value in config.to_dict().items():
        kafka = _KAFKA_NAMES.get(name, name.replace("_", "."))
        out[kafka] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


_TOPIC_DEFAULTS = kafka_config(TopicConfig())
"""A topic's configs when nothing was set (eventlane's defaults, which are Kafka's)."""


class _RefusedError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _MemoryBusyError(DecompressedTooLargeError):
    """Decompressed records found no room under the in-flight memory cap in time."""


def _produced_batches(raw: bytes, charge: Charge | None = None) -> list[KafkaBatch]:
    """A Produce request's batches: plain ones parsed here (fast), compressed ones
    decompressed in charged chunks (gzip, snappy, lz4, zstd) and parsed the same way;
    transactional and control batches refused, and any batch that does not decode whole
    refuses the partition's request: never half-applied. Records that decompress past the
    bound: MESSAGE_TOO_LARGE (Kafka's RecordTooLargeException for a batch over its limit);
    no room under the memory cap in time: REQUEST_TIMED_OUT (retriable, nothing written).
    """
    try:
        return parse_batches(raw) if charge is None else parse_batches(raw, charge)
    except _MemoryBusyError as exc:
        raise _RefusedError(errno(Errors.RequestTimedOutError), str(exc)) from None
    except DecompressedTooLargeError as exc:
        raise _RefusedError(errno(Errors.MessageSizeTooLargeError), str(exc)) from None
    except UnsupportedCompressionError as exc:
        raise _RefusedError(errno(Errors.UnsupportedCompressionTypeError), str(exc)) from None
    except BatchFormatError as exc:
        if not exc.fallback:
            raise _RefusedError(
                errno(Errors.CorruptRecordError), f"bad record batch: {exc}"
            ) from None
    try:
        return _decoded(raw)
    except _RefusedError:
        raise
    except Errors.UnsupportedCodecError as exc:
        raise _RefusedError(
            errno(Errors.UnsupportedCompressionTypeError), f"unsupported compression: {exc}"
        ) from None
    except Exception as exc:
        raise _RefusedError(
            errno(Errors.CorruptRecordError), f"bad record batch: {type(exc).__name__}: {exc}"
        ) from None


def _decoded(raw: bytes) -> list[KafkaBatch]:
    out = []
    records = MemoryRecords(raw)
    while (batch := records.next_batch()) is not None:
        if getattr(batch, "magic", 2) != 2:
            raise _RefusedError(
                errno(Errors.UnsupportedForMessageFormatError),
                f"message format v{batch.magic} (magic {batch.magic}): only record batches v2",
            )
        if batch.is_transactional or batch.is_control_batch:
            raise _RefusedError(TRANSACTIONS_REFUSED, TRANSACTIONS_MESSAGE)
        if batch.compression_type not in _CODECS:
            raise _RefusedError(
                errno(Errors.UnsupportedCompressionTypeError),
                f"compression type {batch.compression_type} is not one of Kafka's",
            )
        if not batch.validate_crc():
            raise _RefusedError(errno(Errors.CorruptRecordError), "record batch CRC mismatch")
        records_ = [
            (
                None if r.key is None else bytes(r.key),
                None if r.value is None else bytes(r.value),
                tuple((k, None if v is None else bytes(v)) for k, v in r.headers),
                r.timestamp if r.timestamp is not None and r.timestamp >= 0 else None,
            )
            for r in batch
        ]
        if len(records_) != batch.records_count:
            raise _RefusedError(
                errno(Errors.CorruptRecordError),
                f"batch says {batch.records_count} records, holds {len(records_)}",
            )
        out.append(
            KafkaBatch(
                batch.producer_id if batch.has_producer_id() else -1,
                batch.producer_epoch,
                batch.base_sequence,
                records_,
            )
        )
    return out


_CODECS = frozenset({0, 1, 2, 3, 4})
"""Kafka's compression types: none, gzip, snappy, lz4, zstd."""
