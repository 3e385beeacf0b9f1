"""The event store on the log: per-key index, conditional append, snapshots, repository."""

from framework.store.application import Application
from framework.store.event_store import EventStore
from framework.store.key_index import KeyIndex
from framework.store.repository import Repository, snapshot_topic

__all__ = ["Application", "EventStore", "KeyIndex", "Repository", "snapshot_topic"]
