"""Consumers of the log: the free consumer and consumer groups.

* :class:`Consumer` (:mod:`.free`): assigned partitions, explicit positions, no commits.
* :class:`GroupConsumer` (:mod:`.group`): a member of a named group sharing its topics'
  partitions with the other members, in any process on the machine; rebalancing
  (:mod:`.membership`, :mod:`.coordinator`), assignors (:mod:`.assignors`), committed
  offsets in ``__consumer_offsets`` (:mod:`.offsets`), administration (:mod:`.admin`).
"""

from eventlane.consumer.assignors import ASSIGNORS, MemberSubscription
from eventlane.consumer.free import Consumer, OffsetAndTimestamp
from eventlane.consumer.group import GroupConsumer, RebalanceListener
from eventlane.consumer.offsets import OFFSETS_TOPIC, CommittedOffset, OffsetAndMetadata

__all__ = [
    "Consumer",
    "OffsetAndTimestamp",
    "GroupConsumer",
    "RebalanceListener",
    "OffsetAndMetadata",
    "CommittedOffset",
    "OFFSETS_TOPIC",
    "ASSIGNORS",
    "MemberSubscription",
]
