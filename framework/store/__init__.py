"""The event store on the log: per-key index, conditional append, snapshots, repository."""

from framework.store.event_store import DEFAULT_PARTITIONS, EVENT_TOPIC_CONFIG, EventStore
from framework.store.index_check import check_key_indexes
from framework.store.key_index import IndexReport, KeyIndex
from framework.store.repository import Repository, snapshot_topic

__all__ = [
    "DEFAULT_PARTITIONS",
    "EVENT_TOPIC_CONFIG",
    "EventStore",
    "IndexReport",
    "KeyIndex",
    "Repository",
    "check_key_indexes",
    "snapshot_topic",
]
