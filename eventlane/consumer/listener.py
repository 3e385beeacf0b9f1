"""Rebalance listeners: what a group member is told when its partitions change.

All callbacks run inside ``GroupConsumer.poll()`` (or ``close()``), in the application's
thread, so they never race the application's processing of records.
"""

from __future__ import annotations

from collections.abc import Callable

from eventlane.log.record import TopicPartition

__all__ = ["CallbackListener", "Partitions", "RebalanceListener"]

Partitions = list[TopicPartition]
"""Partitions passed to a callback, sorted by (topic, partition)."""


class RebalanceListener:
    """Callbacks around rebalances (Kafka's ``ConsumerRebalanceListener``). Subclass it.

    ``on_partitions_revoked`` runs before partitions are handed to another member: commit
    (or store) progress there. ``on_partitions_assigned`` runs once partitions are this
    member's: seek there to positions stored elsewhere. ``on_partitions_lost`` runs when the
    member was evicted (session timeout, ``max_poll_interval_ms``) and its partitions may
    already be owned by another member: committing is pointless (it would be rejected); by
    default it calls ``on_partitions_revoked``, as Kafka does.
    """

    def on_partitions_revoked(self, revoked: Partitions) -> None:
        """Partitions about to be given up (this member still owns them)."""

    def on_partitions_assigned(self, assigned: Partitions) -> None:
        """Partitions newly owned by this member."""

    def on_partitions_lost(self, lost: Partitions) -> None:
        """Partitions taken away without a chance to commit."""
        self.on_partitions_revoked(lost)


class CallbackListener(RebalanceListener):
    def __init__(
        self,
        on_assigned: Callable[[Partitions], None] | None,
        on_revoked: Callable[[Partitions], None] | None,
        on_lost: Callable[[Partitions], None] | None,
    ) -> None:
        self._assigned, self._revoked, self._lost = on_assigned, on_revoked, on_lost

    def on_partitions_revoked(self, revoked: Partitions) -> None:
        if self._revoked is not None:
            self._revoked(revoked)

    def on_partitions_assigned(self, assigned: Partitions) -> None:
        if self._assigned is not None:
            self._assigned(assigned)

    def on_partitions_lost(self, lost: Partitions) -> None:
        if self._lost is not None:
            self._lost(lost)
        else:
            self.on_partitions_revoked(lost)
