"""What every part of the listener shares: the broker's identity and topic-name rules.

Invariant: the listener is one broker (node id ``NODE_ID``), leader of every partition; a
client never creates, deletes or writes an internal topic (``refuse_internal``).
"""

from __future__ import annotations

import uuid

from eventlane.consumer.offsets import OffsetStore
from eventlane.errors import (
    InvalidTopicError,
)
from eventlane.kafka.groups import GroupCoordinator
from eventlane.log import Log
from eventlane.log.names import INTERNAL_TOPICS, validate_topic_name

NODE_ID = 0


CLUSTER_ID = "eventlane"


_TOPIC_NS = uuid.UUID("6f1c7c56-3c1a-4e8e-9a53-3b1f0d6a6b21")


KAFKA_INTERNAL_TOPICS = frozenset(
    {"__transaction_state", "__share_group_state", "__cluster_metadata"}
)
"""Kafka's own internal topics: refused like eventlane's (a client may think it writes them)."""


_LEGAL = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


_MAX_TOPIC_NAME = 249


def is_internal(name: str) -> bool:
    """Whether ``name`` is an internal topic: written by eventlane (or, for Kafka's, by
    nobody), never by a client."""
    return name in INTERNAL_TOPICS or name in KAFKA_INTERNAL_TOPICS


def check_topic_name(name: object) -> str:
    """``name`` if Kafka and eventlane both accept it as a topic name, else
    :class:`InvalidTopicError` (Kafka's rule: 1-249 characters of ``[a-zA-Z0-9._-]``, not
    ``.`` or ``..``; eventlane's: no leading ``.``)."""
    if not isinstance(name, str) or not name or len(name) > _MAX_TOPIC_NAME:
        raise InvalidTopicError(f"illegal topic name {name!r}", topic=str(name)[:300])
    if not set(name) <= _LEGAL or name in (".", ".."):
        raise InvalidTopicError(f"illegal topic name {name!r}", topic=name)
    validate_topic_name(name)
    return name


def refuse_internal(name: str, action: str) -> None:
    """:class:`InvalidTopicError` when a client asks to ``action`` an internal topic."""
    if is_internal(name):
        raise InvalidTopicError(
            f"{name} is an internal topic: clients cannot {action} it", topic=name
        )


def topic_id(name: str | None) -> uuid.UUID:
    """A stable topic id (Kafka's are random; eventlane's topics are named, so derived)."""
    return uuid.uuid5(_TOPIC_NS, name or "")


class BrokerState:
    """The state the API mixins share, set once by :class:`~eventlane.kafka.handlers.Broker`
    (its ``__init__``, and ``advertise`` before serving); each mixin declares the state only
    it uses. All of it is used from the listener's one event loop thread; log calls run in
    worker threads and touch none of it."""

    log: Log
    auto_create_topics: bool
    default_partitions: int
    host: str
    port: int
    limits: dict[str, str]
    offsets: OffsetStore
    groups: GroupCoordinator
