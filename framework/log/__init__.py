"""The partitioned, append-only log (bytes only; knows nothing of events).

Public surface: :class:`Log` (the port), :class:`LogStore` (the embedded implementation),
:class:`Producer`, records and topic configuration.
"""

from framework.log.config import TopicConfig
from framework.log.port import Log
from framework.log.producer import Producer
from framework.log.record import (
    Header,
    ProducerRecord,
    Record,
    RecordMetadata,
    TimestampType,
    TopicPartition,
)
from framework.log.store import LogStore
from framework.log.types import PartitionOffsets, TopicDescription

__all__ = [
    "Log",
    "LogStore",
    "Producer",
    "TopicConfig",
    "Header",
    "ProducerRecord",
    "Record",
    "RecordMetadata",
    "TimestampType",
    "TopicPartition",
    "PartitionOffsets",
    "TopicDescription",
]
