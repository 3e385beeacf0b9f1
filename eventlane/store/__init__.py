"""The event store on the log: conditional append, snapshots, repository."""

from eventlane.store.event_store import DEFAULT_PARTITIONS, EVENT_TOPIC_CONFIG, EventStore
from eventlane.store.repository import Repository
from eventlane.store.stream import snapshot_topic

__all__ = [
    "DEFAULT_PARTITIONS",
    "EVENT_TOPIC_CONFIG",
    "EventStore",
    "Repository",
    "snapshot_topic",
]
