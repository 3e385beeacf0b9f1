"""How eventlane's names, configs and errors map onto Apache Kafka's.

* Topic names: ``<namespace>.<topic>`` on the cluster (the namespace lets several logs share
  one cluster; an empty namespace uses eventlane's names as they are). Kafka refuses two
  topics whose names differ only by ``.`` versus ``_``; that refusal is an
  :class:`~eventlane.errors.InvalidTopicError`.
* Topic configs: every :class:`~eventlane.log.config.TopicConfig` field is one of Kafka's
  topic configs (:data:`CONFIG_KEYS`), set explicitly at creation so that describing the
  topic gives the same config back. Two need a word: ``segment_bytes`` below Kafka 4's
  minimum of 1 MiB goes to Kafka's ``internal.segment.bytes`` (tests use small segments);
  ``flush_policy="always"`` is ``flush.messages=1`` (each append fsynced on every replica
  before it is acknowledged), ``"os"`` is Kafka's default (replication, no fsync).
* Errors: :func:`append_error` turns a delivery report's error into the framework's
  hierarchy; an error after which the record may be stored is
  :class:`~eventlane.errors.OutcomeUnknownError`, never "refused".
"""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import KafkaError

from eventlane.errors import (
    InvalidRecordError,
    InvalidTopicError,
    LogError,
    LogUnavailableError,
    OutcomeUnknownError,
    RecordTooLargeError,
    UnknownPartitionError,
    UnknownTopicError,
)
from eventlane.log.config import TopicConfig

MIN_SEGMENT_BYTES = 1 << 20
"""Kafka 4's least ``segment.bytes``; smaller segments use ``internal.segment.bytes``."""
FLUSH_EVERY = "1"
FLUSH_NEVER = str(2**63 - 1)

CONFIG_KEYS = {
    "cleanup_policy": "cleanup.policy",
    "retention_ms": "retention.ms",
    "retention_bytes": "retention.bytes",
    "segment_ms": "segment.ms",
    "min_compaction_lag_ms": "min.compaction.lag.ms",
    "delete_retention_ms": "delete.retention.ms",
    "max_record_bytes": "max.message.bytes",
    "timestamp_type": "message.timestamp.type",
    "index_interval_bytes": "index.interval.bytes",
}
"""eventlane's config field -> Kafka's topic config, where the value is the same."""


def kafka_configs(cfg: TopicConfig) -> dict[str, str]:
    """The Kafka topic configs that hold ``cfg`` (all of them, explicitly)."""
    out = {kafka: str(getattr(cfg, ours)) for ours, kafka in CONFIG_KEYS.items()}
    if cfg.segment_bytes < MIN_SEGMENT_BYTES:
        out["internal.segment.bytes"] = str(cfg.segment_bytes)
    else:
        out["segment.bytes"] = str(cfg.segment_bytes)
    out["flush.messages"] = FLUSH_EVERY if cfg.flush_policy == "always" else FLUSH_NEVER
    return out


def topic_config(described: Mapping[str, str | None]) -> TopicConfig:
    """The :class:`TopicConfig` a topic's described Kafka configs hold."""
    values: dict[str, object] = {}
    for ours, kafka in CONFIG_KEYS.items():
        raw = described.get(kafka)
        if raw is not None:
            values[ours] = raw if ours in ("cleanup_policy", "timestamp_type") else int(raw)
    internal = described.get("internal.segment.bytes")
    segment = internal if internal is not None else described.get("segment.bytes")
    if segment is not None:
        values["segment_bytes"] = int(segment)
    values["flush_policy"] = "always" if described.get("flush.messages") == FLUSH_EVERY else "os"
    return TopicConfig(**values)  # type: ignore[arg-type]


_NOTHING_WRITTEN = {
    KafkaError._PURGE_QUEUE,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.BROKER_NOT_AVAILABLE,
    KafkaError.KAFKA_STORAGE_ERROR,
    KafkaError._QUEUE_FULL,
}
"""Errors that say the broker did not append (retriable: nothing was written)."""


def append_error(err: KafkaError, topic: str, partition: int) -> LogError:
    """The framework's error for a failed delivery of a record of ``topic[partition]``."""
    code = err.code()
    text = f"append to Kafka failed: {err.str()}"
    where = {"topic": topic, "partition": partition}
    if code in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG_SIZE):
        return RecordTooLargeError(text, **where)  # type: ignore[arg-type]
    if code in (KafkaError.INVALID_RECORD, KafkaError.INVALID_MSG, KafkaError.INVALID_TIMESTAMP):
        return InvalidRecordError(text, **where)  # type: ignore[arg-type]
    if code in (KafkaError._UNKNOWN_TOPIC,):
        return UnknownTopicError(text, topic=topic)
    if code in (KafkaError._UNKNOWN_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART):
        return UnknownPartitionError(text, **where)  # type: ignore[arg-type]
    if code == KafkaError.TOPIC_EXCEPTION:
        return InvalidTopicError(text, topic=topic)
    if code in _NOTHING_WRITTEN:
        return LogUnavailableError(text, **where)  # type: ignore[arg-type]
    return OutcomeUnknownError(text, **where)  # type: ignore[arg-type]
