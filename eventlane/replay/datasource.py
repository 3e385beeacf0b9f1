"""The ``eventlane`` PySpark data source: a log's partitions as a DataFrame.

    spark.read.format("eventlane").option("path", DATA).option("topic", "orders").load()
    spark.read.format("eventlane").option("log", "nats://h1:4222,h2:4222").option("topic", ...)

Schema (Kafka's Spark source, minus what one node does not have)::

    topic string, partition int, offset bigint, key binary, value binary,
    headers array<struct<key: string, value: binary>>, timestamp timestamp

Options:

``log``
    the log, as :func:`eventlane.engine.open_log` takes it: an embedded log's data directory
    (on every executor: shared storage on a cluster) or another engine's URL
    (``nats://host:port[,host:port]?namespace=NS``: every executor reads from the cluster
    itself, so no log files are needed on the executors' machines). ``path`` is the same
    option under its older name (a data directory). One of the two is required.
``topic``
    one topic, or several separated by commas. Required.
``startingOffsets``
    ``earliest`` (default: each partition's low-water mark) or JSON, per partition of the
    topic (``{"0": 120, "3": 0}``) or per topic (``{"orders": {"0": 120}}``); partitions not
    named start at their low-water mark.
``endingOffsets``
    ``latest`` (default: each partition's high-water mark, pinned when the read is planned,
    so the DataFrame is a fixed slice however long producers keep appending) or JSON as
    above (exclusive ends).
``maxOffsetsPerPartition``
    input partitions cover at most this many offsets; a larger log partition is read by
    several tasks, by offset range (default 1,000,000).

Planning (on the driver) reads only the partitions' marks. Each input partition is one
offset range; its task opens the log itself (:func:`~eventlane.replay.ranges.open_store`:
the segment files of an embedded log through its read path, CRC checked; a JetStream
partition's sequence range from the cluster) and yields Arrow record batches: records flow
from the log to the executor's JVM without passing through the driver. Compaction gaps and
a low-water mark above 0 need nothing special: the log's reader skips removed offsets.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson
import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from eventlane.engine import log_locator
from eventlane.errors import ConfigError
from eventlane.log import Record, TopicPartition
from eventlane.replay.ranges import (
    OffsetRange,
    open_store,
    plan_ranges,
    read_range,
    split_range,
)

__all__ = [
    "ARROW_SCHEMA",
    "SCHEMA_DDL",
    "EventlaneDataSource",
    "records_to_arrow",
]

SCHEMA_DDL = (
    "topic string, partition int, offset bigint, key binary, value binary,"
    " headers array<struct<key: string, value: binary>>, timestamp timestamp"
)
HEADER_TYPE = pa.struct([("key", pa.string()), ("value", pa.binary())])
ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(HEADER_TYPE)),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)
DEFAULT_MAX_OFFSETS = 1_000_000


def records_to_arrow(records: list[Record]) -> pa.RecordBatch:
    """One Arrow record batch (schema :data:`ARROW_SCHEMA`) of ``records``."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array([r.topic for r in records], pa.string()),
            pa.array([r.partition for r in records], pa.int32()),
            pa.array([r.offset for r in records], pa.int64()),
            pa.array([r.key for r in records], pa.binary()),
            pa.array([r.value for r in records], pa.binary()),
            pa.array(
                [[{"key": k, "value": v} for k, v in r.headers] for r in records],
                pa.list_(HEADER_TYPE),
            ),
            pa.array([r.timestamp * 1000 for r in records], pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
        ],
        schema=ARROW_SCHEMA,
    )


def parse_offsets(text: str | None, topics: list[str], what: str) -> dict[TopicPartition, int]:
    """Offsets from an option (see the module docstring); ``{}`` for the default.

    >>> parse_offsets('{"0": 5}', ["orders"], "startingOffsets")
    {TopicPartition(topic='orders', partition=0): 5}
    >>> parse_offsets('{"a": {"1": 7}}', ["a", "b"], "endingOffsets")
    {TopicPartition(topic='a', partition=1): 7}
    """
    if text is None or text.strip() in ("", "earliest", "latest"):
        return {}
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{what} must be JSON or earliest/latest: {exc}") from None
    if not isinstance(body, dict):
        raise ConfigError(f"{what} must be a JSON object")
    nested = body and all(isinstance(v, dict) for v in body.values())
    per_topic: Mapping[str, Any] = body if nested else dict.fromkeys(topics, body)
    if not nested and len(topics) != 1:
        raise ConfigError(f"{what}: name the topic of each partition when reading several")
    out: dict[TopicPartition, int] = {}
    for topic, parts in per_topic.items():
        for p, off in parts.items():
            if not str(p).isdigit() or not isinstance(off, int):
                raise ConfigError(f"{what}: bad entry {p!r}: {off!r}", topic=topic)
            out[TopicPartition(topic, int(p))] = off
    return out


class RangePartition(InputPartition):
    """One input partition: an offset range of one log partition."""

    def __init__(self, rng: OffsetRange) -> None:
        super().__init__(tuple(rng))
        self.rng = rng


class EventlaneReader(DataSourceReader):
    """Plans the offset ranges once, when created on the driver; reads them on executors."""

    def __init__(self, options: Mapping[str, str]) -> None:
        target = options.get("log") or options.get("path")
        topic = options.get("topic")
        if not target or not topic:
            raise ConfigError("the eventlane data source needs options log (or path) and topic")
        self.path = log_locator(target)
        topics = [t.strip() for t in topic.split(",") if t.strip()]
        max_offsets = int(options.get("maxOffsetsPerPartition", DEFAULT_MAX_OFFSETS))
        store = open_store(self.path)
        start = parse_offsets(options.get("startingOffsets"), topics, "startingOffsets")
        end = parse_offsets(options.get("endingOffsets"), topics, "endingOffsets")
        for t in topics:
            store.partition_count(t)  # UnknownTopicError names a missing topic
        ranges = plan_ranges(store, topics, start=start, end=end or None)
        self.ranges = [r for rng in ranges for r in split_range(rng, max_offsets) if r.size > 0]

    def partitions(self) -> list[InputPartition]:
        if not self.ranges:  # nothing to read: one task that yields nothing
            return [InputPartition(None)]
        return [RangePartition(r) for r in self.ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            return
        store = open_store(self.path)
        for records in read_range(store, partition.rng, max_bytes=1 << 20):
            yield records_to_arrow(records)


class EventlaneDataSource(DataSource):
    """``spark.read.format("eventlane")``: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return "eventlane"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> EventlaneReader:
        return EventlaneReader(self.options)
