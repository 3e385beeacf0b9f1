"""The per-key state eventlane keeps for a Kafka log: :class:`KeyIndex`.

Kafka has neither per-key reads nor conditional appends; a :class:`KeyIndex` gives the
:class:`~eventlane.log.kafka.log.KafkaLog` both, per process, in memory:

* for each partition it has read, the rule's verdict on every record (:mod:`.order`),
  each key's visible offsets (``read_key``) and last visible offset (``key_head``);
* it is built by reading the partition from its low-water mark the first time a partition
  is asked about, and caught up to the high-water mark before every answer, so it answers
  as of a moment inside the call: every record anyone appended before the call is counted;
* a conditional append (:meth:`KeyIndex.append`) checks the expectation against the caught
  up index (refused at once, nothing written, when it does not hold), appends with the
  rule's headers, then catches up to its own records and reports the rule's verdict: a
  conditional append that lost a race to another writer's is written but rejected, by
  every reader alike (:class:`~eventlane.errors.ConcurrencyError`).

Costs (docs/scale-out.md): a first read of a partition's keys reads the whole partition
(every process, after every start); the index holds every visible offset of every key it
has seen in memory. Thread-safe: one lock per partition's index (its catch-up reads and
verdicts) and one per key being written (conditional appends touching different keys
run at once), so callers on different partitions catch up at once (each read on a scan
reader of its own: :meth:`~eventlane.log.kafka.log.KafkaLog._scan_read`); the map of
partitions has a lock of its own, held for no read.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from eventlane.errors import ConcurrencyError, LogUnavailableError
from eventlane.log.kafka import order
from eventlane.log.record import Record
from eventlane.log.types import AppendResult, Expect, RecordTuple

__all__ = ["KeyIndex"]

ReadRaw = Callable[[str, int, int, int], list[Record]]
"""``(topic, partition, offset, upto)`` -> every record from ``offset`` below ``upto``
(at least one if any), rejected ones included."""
Marks = Callable[[str, int], tuple[int, int]]
"""``(topic, partition)`` -> (low-water mark, high-water mark)."""
Append = Callable[[str, int, Sequence[RecordTuple]], AppendResult]
"""A plain atomic append of records to ``(topic, partition)``."""


RECENT = 4096
"""Records each partition's index keeps after reading them: a load that follows another
process's append (the usual case under contention) finds them here instead of reading."""


class _Partition:
    """One partition's index. Invariant: every record in ``[verdicts.start, next)`` was
    judged once, in order; ``rejected`` and ``offsets`` hold the verdicts."""

    def __init__(self, start: int) -> None:
        self.lock = threading.Lock()  # held while this partition is caught up or judged
        self.verdicts = order.Verdicts(start)
        self.next = start
        self.offsets: dict[bytes, list[int]] = {}
        self.rejected: set[int] = set()
        self.recent: dict[int, Record] = {}  # the last RECENT records read, by offset

    def take(self, records: list[Record]) -> None:
        for r in records:
            if r.offset >= self.next:
                self.recent[r.offset] = r
            self.judge(r.offset, r.key, r.headers)
        while len(self.recent) > RECENT:
            del self.recent[next(iter(self.recent))]

    def judge(
        self, offset: int, key: bytes | None, headers: Sequence[tuple[str, bytes | None]]
    ) -> None:
        if offset < self.next:
            return
        if self.verdicts.judge(offset, key, headers):
            if key is not None:
                self.offsets.setdefault(key, []).append(offset)
        else:
            self.rejected.add(offset)
        self.next = offset + 1


class KeyIndex:
    """Per-key state of the partitions a :class:`~eventlane.log.kafka.log.KafkaLog` has
    been asked about (module docstring)."""

    def __init__(self, read_raw: ReadRaw, marks: Marks, append: Append, timeout: float) -> None:
        self.timeout = timeout
        self._read_raw = read_raw
        self._marks = marks
        self._append = append
        self._lock = threading.Lock()  # the maps below only: never held while reading
        self._parts: dict[tuple[str, int], _Partition] = {}
        # this process's conditional appends touching a key, one at a time: [lock, users]
        self._writing: dict[tuple[str, int, bytes], list[Any]] = {}

    @contextlib.contextmanager
    def _writing_keys(self, topic: str, partition: int, keys: list[bytes]) -> Iterator[None]:
        """Hold the locks of this process's conditional appends to ``keys`` (sorted: taken
        in one order by every caller), each dropped when no caller uses it (a lock per key
        being written, not one for every key ever written).

        Appends that touch different keys of a partition run at once: each is judged by
        the rule in log order, whichever caller's catch-up reads it (:meth:`append`); those
        touching a key (its expectation's or a record's) are checked one after another, so
        no caller of this process writes a record the rule must reject because of another
        caller of this process."""
        names = [(topic, partition, key) for key in keys]
        with self._lock:
            entries = [self._writing.setdefault(name, [threading.Lock(), 0]) for name in names]
            for entry in entries:
                entry[1] += 1
        try:
            with contextlib.ExitStack() as held:
                for entry in entries:
                    held.enter_context(entry[0])
                yield
        finally:
            with self._lock:
                for name, entry in zip(names, entries, strict=True):
                    entry[1] -= 1
                    if not entry[1]:
                        del self._writing[name]

    def forget(self, topic: str) -> None:
        """Drop the index of a deleted topic."""
        with self._lock:
            for tp in [tp for tp in self._parts if tp[0] == topic]:
                del self._parts[tp]

    def _caught_up(
        self, topic: str, partition: int, upto: int | None = None
    ) -> tuple[_Partition, int]:
        """The partition's index with every record below ``upto`` (default: the high-water
        mark, asked now) judged; and the low-water mark."""
        lwm, hwm = self._marks(topic, partition)
        end = hwm if upto is None else upto
        with self._lock:
            part = self._parts.get((topic, partition))
            if part is None:
                part = self._parts[(topic, partition)] = _Partition(lwm)
        with part.lock:
            part.next = max(part.next, lwm)  # records deleted below what was read: skipped
            deadline = time.monotonic() + self.timeout
            while part.next < end:
                records = self._read_raw(topic, partition, part.next, end)
                if records:
                    part.take(records)
                    continue
                lwm, hwm = self._marks(topic, partition)
                part.next = max(part.next, lwm)
                if part.next >= min(end, hwm) and end <= hwm:
                    break  # the rest of the range is gone (compacted, or aborted)
                if time.monotonic() > deadline:
                    raise LogUnavailableError(
                        f"the key index could not read up to offset {end}",
                        topic=topic,
                        partition=partition,
                    )
                time.sleep(0.01)
            return part, lwm

    def key_head(self, topic: str, partition: int, key: bytes) -> int | None:
        part, lwm = self._caught_up(topic, partition)
        head = part.verdicts.heads.get(key)
        return head if head is not None and head >= lwm else None

    def key_offsets(self, topic: str, partition: int, key: bytes, after: int | None) -> list[int]:
        """The offsets of ``key``'s visible records above ``after`` (and the low-water
        mark), ascending, below the high-water mark."""
        part, lwm = self._caught_up(topic, partition)
        offsets = part.offsets.get(key, [])
        low = lwm if after is None else max(lwm, after + 1)
        return offsets[bisect.bisect_left(offsets, low) :]

    def recent(self, topic: str, partition: int, offsets: list[int]) -> list[Record] | None:
        """The records at ``offsets`` if the index read them lately (else ``None``)."""
        with self._lock:
            part = self._parts.get((topic, partition))
        if part is None or not offsets:
            return None
        with part.lock:
            found = [part.recent.get(o) for o in offsets]
        return None if None in found else found  # type: ignore[return-value]

    def visible(self, topic: str, partition: int, records: list[Record]) -> list[Record]:
        """``records`` (of this partition, ascending) without those the rule rejects."""
        if not records:
            return records
        part, _ = self._caught_up(topic, partition, records[-1].offset + 1)
        if not part.rejected:
            return records
        return [r for r in records if r.offset not in part.rejected]

    def append(
        self, topic: str, partition: int, records: Sequence[RecordTuple], expect: Expect
    ) -> AppendResult:
        """A conditional append (module docstring): checked here against the caught-up
        index, written with the rule's headers, then judged by the rule."""
        keys = {expect.key, *(r[0] for r in records if r[0] is not None)}
        with self._writing_keys(topic, partition, sorted(keys)):
            part, lwm = self._caught_up(topic, partition)
            head = part.verdicts.heads.get(expect.key)
            if head is not None and head < lwm:
                head = None
            if head != expect.last_offset:
                raise _conflict(expect, head, topic, partition)
            stamped = order.stamp(records, expect, lwm)
            result = self._append(topic, partition, stamped)
            # what others appended before ours is read; ours is judged from what was sent
            # (the same bytes the partition holds at the offsets the broker acknowledged)
            part, _ = self._caught_up(topic, partition, result.base_offset)
            with part.lock:
                if part.next == result.base_offset:
                    for i, (key, _value, headers, _ts) in enumerate(stamped):
                        part.judge(result.base_offset + i, key, headers)
            part, _ = self._caught_up(topic, partition, result.last_offset + 1)
            if result.base_offset in part.rejected:
                # another writer's conditional append came first: ours is in the log, but
                # no reader will ever see it
                raise _conflict(expect, part.verdicts.heads.get(expect.key), topic, partition)
            return result


def _conflict(expect: Expect, head: int | None, topic: str, partition: int) -> ConcurrencyError:
    return ConcurrencyError(
        f"key {expect.key.decode(errors='replace')!r} changed concurrently",
        expected=expect.last_offset,
        actual=head,
        unit="last offset",
        topic=topic,
        partition=partition,
    )
