"""eventlane: event sourcing and CQRS on a partitioned, compacted, append-only log."""

from framework.observability import configure_default_logging

configure_default_logging()

# The public API is re-exported below the logging set-up on purpose.

from framework.consumer import Consumer  # noqa: E402
from framework.log import (  # noqa: E402
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
