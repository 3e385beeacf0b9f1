"""What the listener does for each Kafka API, on the log port.

One broker, node id 0, leader of every partition, with itself as the only replica and the
whole in-sync set. Records cross the wire as Kafka record batches (magic 2); the log stores
them in its own batch format, so a produce decodes the client's batches into records and a
fetch transcodes the stored batches into Kafka's (offsets, timestamps, keys, values and
headers kept; compaction gaps kept as gaps between record offsets).

Idempotent producers (the default of kafka-python 3 and of Java clients since Kafka 3.0):
``InitProducerId`` hands out producer ids, and per (producer id, partition) the broker keeps
the next expected sequence and the last five batches, so a retried batch is answered with
its first offset instead of being appended twice, and a gap is refused with
OUT_OF_ORDER_SEQUENCE_NUMBER. This state is in memory: after a restart a producer's first
batch starts its state again (Kafka rebuilds it from the log). Transactions are refused:
the transaction APIs are not advertised, and a transactional ``InitProducerId`` or a
transactional batch gets an error, so clients fail fast instead of half-working.

:class:`Broker` composes one mixin per concept, each module with its invariants on top:
:mod:`._produce` (Produce, InitProducerId and the producer-state table), :mod:`._fetch`
(Fetch, ListOffsets), :mod:`._admin` (ApiVersions, Metadata, topics, configs,
DeleteRecords) and :mod:`._group_apis` (the group APIs); :mod:`._base` holds what they share.
:class:`Broker` sets the state they use, once, and maps API keys to their handlers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from eventlane.consumer.offsets import OffsetStore
from eventlane.kafka._admin import AdminApis
from eventlane.kafka._fetch import FetchApis
from eventlane.kafka._group_apis import GroupApis
from eventlane.kafka._produce import PartitionLocks, ProduceApis, ProducerStateTable
from eventlane.kafka.groups import GroupCoordinator
from eventlane.log import Log, TopicPartition
from eventlane.observability import get_logger

log = get_logger("eventlane.kafka")


class Broker(ProduceApis, FetchApis, AdminApis, GroupApis):
    """The API handlers (async; log calls run in threads), one mixin per concept."""

    def __init__(
        self, log_: Log, *, auto_create_topics: bool = True, default_partitions: int = 1
    ) -> None:
        self.log = log_
        self.auto_create_topics = auto_create_topics
        self.default_partitions = default_partitions
        self.host = "127.0.0.1"
        self.port = 9092
        self.producer_states = ProducerStateTable()
        self.append_locks = PartitionLocks()
        self.limits: dict[str, str] = {}
        # (group, partition) -> a negative committed offset (-1 latest, -2 earliest: a
        # client's "no position, apply the reset policy"), answered by OffsetFetch until the
        # group commits a real offset there; the store keeps its last real commit
        self._placeholders: dict[tuple[str, TopicPartition], int] = {}
        self.offsets = OffsetStore(log_)
        self.budget: Any = None  # the server's in-flight memory budget (set by the server)
        self.max_decompressed_bytes = 100 << 20
        self.memory_wait_s = 30.0
        self.max_fetch_wait_s = 30.0
        self.groups = GroupCoordinator(
            self.offsets, eventlane_live=self._eventlane_live, publish=self._publish_group
        )

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
