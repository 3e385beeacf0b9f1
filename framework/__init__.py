"""eventlane: event sourcing and CQRS on a partitioned, compacted, append-only log."""

from framework.consumer import Consumer
from framework.log import (
    Log,
    LogStore,
    Producer,
    ProducerRecord,
    Record,
    RecordMetadata,
    TopicConfig,
    TopicPartition,
)

__all__ = [
    "Consumer",
    "Log",
    "LogStore",
    "Producer",
    "ProducerRecord",
    "Record",
    "RecordMetadata",
    "TopicConfig",
    "TopicPartition",
]
