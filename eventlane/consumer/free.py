"""The free consumer: assigned partitions, explicit positions, no group and no commits.

Used for browsing, tailing (``tail -f``) and request/reply. Its position in a partition is the
offset of the next record it will return. ``poll`` returns records below the high-water mark
only, and when every assigned partition is caught up it sleeps until another process appends
(no busy-spinning) or the timeout passes.

``auto_offset_reset`` decides what happens where there is no valid position: before the first
poll of a partition with no ``seek``, or when the position fell below the low-water mark
(retention deleted it): ``earliest`` → the low-water mark, ``latest`` → the high-water mark,
``error`` → :class:`~eventlane.errors.NoOffsetForPartitionError` /
:class:`~eventlane.errors.OffsetOutOfRangeError`, never a silent skip.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from eventlane.errors import ConfigError, NoOffsetForPartitionError, OffsetOutOfRangeError
from eventlane.log.port import Log
from eventlane.log.record import Record, TopicPartition
from eventlane.log.types import SEQUENTIAL, Cursor
from eventlane.observability import get_logger

log = get_logger("eventlane.consumer")

OFFSET_RESETS = ("earliest", "latest", "error")


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int


class Consumer:
    """A consumer of explicitly assigned partitions. Not thread-safe (one per thread)."""

    def __init__(
        self,
        log_: Log,
        *,
        auto_offset_reset: str = "latest",
        max_poll_records: int = 500,
        fetch_max_bytes: int = 1 << 20,
    ) -> None:
        if auto_offset_reset not in OFFSET_RESETS:
            raise ConfigError(
                f"auto_offset_reset must be one of {', '.join(OFFSET_RESETS)}, got"
                f" {auto_offset_reset!r}"
            )
        if max_poll_records < 1:
            raise ConfigError(f"max_poll_records must be >= 1, got {max_poll_records}")
        self.log = log_
        self.auto_offset_reset = auto_offset_reset
        self.max_poll_records = max_poll_records
        self.fetch_max_bytes = fetch_max_bytes
        self._positions: dict[TopicPartition, int | None] = {}
        self._cursors: dict[TopicPartition, Cursor | None] = {}
        self._buffers: dict[TopicPartition, list[Record]] = {}
        self._paused: set[TopicPartition] = set()
        self._next = 0

    # ------------------------------------------------------------------ assignment
    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Replace the assignment. Positions of partitions kept in it are kept."""
        wanted = [TopicPartition(*tp) for tp in partitions]
        for tp in wanted:
            count = self.log.partition_count(tp.topic)
            if not 0 <= tp.partition < count:
                # The count may be cached from before another process added partitions.
                count = self.log.describe_topic(tp.topic).partitions
            if not 0 <= tp.partition < count:
                raise ConfigError(
                    f"partition {tp.partition} does not exist (topic has {count})",
                    topic=tp.topic,
                    partition=tp.partition,
                )
        self._positions = {tp: self._positions.get(tp) for tp in wanted}
        self._cursors = {tp: self._cursors.get(tp) for tp in wanted}
        self._buffers = {tp: self._buffers.get(tp, []) for tp in wanted}
        self._paused &= set(wanted)

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop returning records of ``partitions`` (assigned ones) until :meth:`resume`;
        their positions stay. A partition leaving the assignment is no longer paused."""
        for tp in partitions:
            self._paused.add(self._check(tp))

    def resume(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self._paused.discard(TopicPartition(*tp))

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def assignment(self) -> list[TopicPartition]:
        return list(self._positions)

    def _check(self, tp: TopicPartition | tuple[str, int]) -> TopicPartition:
        tp = TopicPartition(*tp)
        if tp not in self._positions:
            raise ConfigError(
                "partition is not assigned to this consumer", topic=tp.topic, partition=tp.partition
            )
        return tp

    # ------------------------------------------------------------------ positions
    def seek(self, tp: TopicPartition | tuple[str, int], offset: int) -> None:
        """Set the next offset to read. Validated at the next poll against the LWM/LEO."""
        tp = self._check(tp)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ConfigError(
                f"offset must be an integer >= 0, got {offset!r}",
                topic=tp.topic,
                partition=tp.partition,
            )
        self._positions[tp] = offset
        self._cursors[tp] = None
        self._buffers[tp] = []

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        for tp in partitions or tuple(self._positions):
            self.seek(tp, self.log.offsets(tp.topic, tp.partition).lwm)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        for tp in partitions or tuple(self._positions):
            self.seek(tp, self.log.offsets(tp.topic, tp.partition).hwm)

    def position(self, tp: TopicPartition | tuple[str, int]) -> int:
        """The offset of the next record ``poll`` will return for ``tp``."""
        tp = self._check(tp)
        pos = self._positions[tp]
        if pos is None:
            pos = self._reset(tp, None)
        buffered = self._buffers[tp]
        return buffered[0].offset if buffered else pos

    def _reset(self, tp: TopicPartition, error: OffsetOutOfRangeError | None) -> int:
        marks = self.log.offsets(tp.topic, tp.partition)
        if self.auto_offset_reset == "earliest":
            pos = marks.lwm
        elif self.auto_offset_reset == "latest":
            pos = marks.hwm
        elif error is not None:
            raise error
        else:
            raise NoOffsetForPartitionError(
                "no position and auto_offset_reset='error'", topic=tp.topic, partition=tp.partition
            )
        if error is not None:
            log.warning(
                "offset out of range; reset",
                topic=tp.topic,
                partition=tp.partition,
                offset=error.offset,
                reset_to=pos,
                policy=self.auto_offset_reset,
            )
        self._positions[tp] = pos
        self._cursors[tp] = None
        return pos

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """For each partition, the earliest offset whose timestamp is >= the given one."""
        out: dict[TopicPartition, OffsetAndTimestamp | None] = {}
        for given, ts in timestamps.items():
            tp = TopicPartition(*given)
            offset = self.log.offset_for_time(tp.topic, tp.partition, ts)
            if offset is None:
                out[tp] = None
            else:
                records, _ = self.log.read(tp.topic, tp.partition, offset, max_bytes=1)
                out[tp] = OffsetAndTimestamp(offset, records[0].timestamp if records else ts)
        return out

    # ------------------------------------------------------------------ polling
    def _fetch(self, tp: TopicPartition) -> list[Record]:
        buffered = self._buffers[tp]
        if buffered:
            return buffered
        pos = self._positions[tp]
        if pos is None:
            pos = self._reset(tp, None)
        try:
            records, cursor = self.log.read(
                tp.topic,
                tp.partition,
                pos,
                max_bytes=self.fetch_max_bytes,
                cursor=SEQUENTIAL if self._cursors[tp] is None else self._cursors[tp],
            )
        except OffsetOutOfRangeError as err:
            pos = self._reset(tp, err)
            records, cursor = self.log.read(
                tp.topic, tp.partition, pos, max_bytes=self.fetch_max_bytes, cursor=SEQUENTIAL
            )
        self._cursors[tp] = cursor
        if records:
            self._positions[tp] = records[-1].offset + 1
        self._buffers[tp] = records
        return records

    def poll(self, timeout: float = 0.0, max_records: int | None = None) -> list[Record]:
        """Up to ``max_records`` records from the assigned partitions, waiting up to
        ``timeout`` seconds for some to arrive. Partitions are served round-robin."""
        limit = max_records or self.max_poll_records
        deadline = time.monotonic() + timeout
        partitions = [tp for tp in self._positions if tp not in self._paused]
        if not partitions:
            if timeout > 0:
                time.sleep(timeout)
            return []
        while True:
            seen = self.log.wait_seq()
            out: list[Record] = []
            n = len(partitions)
            for i in range(n):
                tp = partitions[(self._next + i) % n]
                records = self._fetch(tp)
                if not records:
                    continue
                take = records[: limit - len(out)]
                out.extend(take)
                self._buffers[tp] = records[len(take) :]
                if len(out) >= limit:
                    self._next = (self._next + i + 1) % n
                    break
            else:
                self._next = (self._next + 1) % n
            if out:
                return out
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return out
            self.log.wait(seen, remaining)

    def close(self) -> None:
        self._positions.clear()
        self._buffers.clear()
        self._cursors.clear()
