"""The fencing token of a read model's partitions: claiming a partition and advancing its
position inside a batch's transaction, one piece of code for both engines.

``_eventlane_positions(topic, partition, next_offset, generation)`` holds, per partition,
the next offset to apply and the group generation under which its current owner claimed
it. Invariants (kept by :func:`claim` and :func:`check_and_advance`, each run inside the
read model's write transaction, so they see and change the row atomically):

* a position never moves backwards;
* a writer whose generation is older than the stored one is refused
  (:class:`~eventlane.errors.FencedError`): a partition's successive owners hold it under
  strictly increasing generations, so an older one is a former owner (a zombie);
* the one exception: a claimant that still owns the partition in its group right now
  (``still_owned()``, asked under the lock) while the stored generation is higher: the
  group's state was lost or deleted (generations restarted), and the claim takes over.

The connection is the framework's (:class:`Connection`: SQLite's dialect, ``?``
placeholders; on PostgreSQL :class:`~eventlane.projection.postgres.FrameworkConnection`
rewrites it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from eventlane.errors import FencedError
from eventlane.log import TopicPartition
from eventlane.observability import get_logger

log = get_logger("eventlane.projection")

__all__ = ["Connection", "check_and_advance", "claim"]

_SELECT = "SELECT next_offset, generation FROM _eventlane_positions WHERE topic=? AND partition=?"
_INSERT = "INSERT INTO _eventlane_positions VALUES (?, ?, ?, ?)"
_UPDATE = (
    "UPDATE _eventlane_positions SET next_offset=?, generation=? WHERE topic=? AND partition=?"
)


class Connection(Protocol):
    """What fencing needs of a connection: ``execute`` returning a cursor."""

    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Any: ...


def claim(
    conn: Connection,
    tp: TopicPartition,
    generation: int,
    start: int,
    still_owned: Callable[[], bool] | None = None,
    floor: int | None = None,
) -> int:
    """Inside a transaction: record that a worker of ``generation`` owns ``tp``; return its
    position (``start``, raised to ``floor``, when the partition was never applied). See
    :meth:`ReadModel.claim <eventlane.projection.readmodel.ReadModel.claim>`."""
    row = conn.execute(_SELECT, (tp.topic, tp.partition)).fetchone()
    if row is None:
        start = max(start, floor or 0)
        conn.execute(_INSERT, (tp.topic, tp.partition, start, generation))
        return start
    stored, owner = int(row[0]), int(row[1])
    if owner > generation:
        if still_owned is None or not still_owned():
            raise FencedError(
                f"generation {generation} cannot claim a partition owned at generation {owner}",
                topic=tp.topic,
                partition=tp.partition,
                offset=stored,
            )
        log.warning(
            "stored generation is newer than the group's: the group state was reset;"
            " taking the partition over",
            topic=tp.topic,
            partition=tp.partition,
            offset=stored,
            stored_generation=owner,
            generation=generation,
        )
    stored = max(stored, floor or 0)
    conn.execute(_UPDATE, (stored, generation, tp.topic, tp.partition))
    return stored


def check_and_advance(
    conn: Connection, tp: TopicPartition, generation: int, first: int, next_offset: int
) -> int:
    """Inside a transaction: the offset from which a batch of ``tp`` (``first`` up to
    ``next_offset``) still needs applying, after the fencing check; stores ``next_offset``.
    See :meth:`ReadModel.check_and_advance
    <eventlane.projection.readmodel.ReadModel.check_and_advance>`."""
    row = conn.execute(_SELECT, (tp.topic, tp.partition)).fetchone()
    if row is None:
        conn.execute(_INSERT, (tp.topic, tp.partition, next_offset, generation))
        return first
    stored, owner = int(row[0]), int(row[1])
    if owner > generation:
        raise FencedError(
            f"generation {generation} lost this partition to generation {owner}",
            topic=tp.topic,
            partition=tp.partition,
            offset=first,
        )
    if next_offset > stored:
        conn.execute(_UPDATE, (next_offset, generation, tp.topic, tp.partition))
    return max(stored, first)
