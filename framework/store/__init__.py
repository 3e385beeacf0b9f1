"""The event store on the log: conditional append, snapshots, repository."""

from framework.store.application import Application
from framework.store.event_store import EventStore
from framework.store.repository import Repository, snapshot_topic

__all__ = [
    "Application",
    "EventStore",
    "Repository",
    "snapshot_topic",
]
