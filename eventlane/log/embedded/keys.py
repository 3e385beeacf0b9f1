"""The embedded engine's per-key state: the port's ``read_key``, ``key_head`` and
``append(expect=...)`` on top of one :class:`~.key_index.KeyIndex` per partition.

Index files live under ``LocalDir.key_indexes()`` (``<data>/store``). A topic whose cleanup
policy includes ``compact`` gets a ``latest``-mode index (one row per key: compaction keeps
only the last record anyway), every other topic a ``stream``-mode index.

Nothing here trusts an index blindly (it is derived data):

* an ``expect`` check reads the key's last record from the log and checks its key (skipped
  when the index names exactly the head this object appended or checked); on a difference
  the index is emptied and caught up again before deciding;
* ``read_key`` checks that every record it returns has the key; on a difference the index is
  rebuilt once and the read repeated. Rows of records below the low-water mark (removed by
  retention, in any process) are skipped, not a difference. A difference that survives a
  rebuild is in the log itself: :class:`~eventlane.errors.SerializationError` naming
  topic, partition and offset.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections import OrderedDict
from collections.abc import Collection, Sequence
from pathlib import Path

from eventlane.errors import ConcurrencyError, OffsetOutOfRangeError, SerializationError
from eventlane.log.embedded.key_check import check_key_indexes
from eventlane.log.embedded.key_index import KeyIndex, Mode, index_path
from eventlane.log.port import Log
from eventlane.log.record import Record
from eventlane.log.types import (
    AppendHook,
    AppendResult,
    Cursor,
    Expect,
    KeyIndexReport,
    Precondition,
    RecordTuple,
)
from eventlane.observability import get_logger

log = get_logger("eventlane.log")

_READ_BYTES_PER_RECORD = 4 << 10
"""Bytes fetched per wanted record when reading a run of adjacent offsets (capped at 1 MiB):
enough for an event record, so a run is usually one ``pread``, never a MiB for one record."""
_MAX_READ_BYTES = 1 << 20
CHECKED_HEADS = 1 << 13
"""Key heads an object remembers as checked against the log (~250 bytes each), the least
recently used forgotten first: bounded, however many keys the process ever writes."""
_LAST_ROW_ONLY = 1 << 62
"""``after_seq`` for a view that fetches only a key's last row (its head)."""


_NO_RECORD = "the key index names an offset with no record"


class _Indexed:
    """The append hook that indexes an append's keyed records (and, for a conditional
    append, remembers its key's new head as checked). The appends one group commit writes
    are indexed together: one key-index transaction for the group (:meth:`together`; the
    partition calls it when every hook of the group has the same :attr:`group`)."""

    __slots__ = ("group", "key", "keys", "records")

    def __init__(
        self,
        keys: KeyIndexes,
        index: KeyIndex,
        records: Sequence[RecordTuple],
        key: bytes | None = None,
    ) -> None:
        self.keys = keys
        self.group = index
        self.records = records
        self.key = key

    def __call__(self, result: AppendResult) -> None:
        self.together([(self, result)])

    def _pairs(self, base: int) -> list[tuple[bytes, int]]:
        return [(r[0], base + i) for i, r in enumerate(self.records) if r[0] is not None]

    def together(self, appended: Sequence[tuple[_Indexed, AppendResult]]) -> None:
        """Index the appends ``appended`` (hooks of this index, their offsets contiguous and
        ascending) in one transaction; non-contiguous ones one by one."""
        for (_, a), (_, b) in itertools.pairwise(appended):
            if b.base_offset != a.last_offset + 1:
                for hook, result in appended:
                    hook.together([(hook, result)])
                return
        each = [(hook, hook._pairs(result.base_offset)) for hook, result in appended]
        pairs = [p for _, hook_pairs in each for p in hook_pairs]
        first, end = appended[0][1].base_offset, appended[-1][1].last_offset + 1
        if not self.group.add_appended(pairs, first, end):
            return
        index = self.group
        for hook, hook_pairs in each:
            if hook.key is not None:
                mine = [o for k, o in hook_pairs if k == hook.key]
                if mine:
                    hook.keys._remember((index.topic, index.partition, hook.key), mine[-1])


class _MismatchError(Exception):
    def __init__(self, offset: int, problem: str) -> None:
        super().__init__(problem)
        self.offset = offset
        self.problem = problem


class KeyIndexes:
    """The key indexes of one embedded log (``log_``), opened on first use."""

    def __init__(self, log_: Log, root: Path) -> None:
        self.log = log_
        self.root = root
        self._indexes: dict[tuple[str, int], KeyIndex] = {}
        self._lock = threading.Lock()
        # (topic, partition, key) -> offset of a head this object checked or appended,
        # least recently used first (at most CHECKED_HEADS: _remember)
        self._checked: OrderedDict[tuple[str, int, bytes], int] = OrderedDict()
        self.shared = False
        """This process relays other processes' appends (set by the relay before it opens
        an index): its indexes write every row at once, never holding any back."""

    def mode_of(self, topic: str) -> Mode:
        return "latest" if self.log.topic_config(topic).compact else "stream"

    def index(self, topic: str, partition: int) -> KeyIndex:
        """The key index of a partition (opened and checked on first use)."""
        idx = self._indexes.get((topic, partition))
        if idx is None:
            mode = self.mode_of(topic)
            with self._lock:
                idx = self._indexes.get((topic, partition))
                if idx is None:
                    path = index_path(self.root, topic, partition)
                    idx = KeyIndex(self.log, topic, partition, path, mode=mode)
                    idx.shared = self.shared
                    self._indexes[(topic, partition)] = idx
        return idx

    def open_index(self, topic: str, partition: int) -> KeyIndex | None:
        return self._indexes.get((topic, partition))

    # ------------------------------------------------------------------ appends
    def indexing_hook(
        self, topic: str, partition: int, records: Sequence[RecordTuple]
    ) -> AppendHook | None:
        """A hook keeping an already open index current with a plain append (else the
        index lags and catches up on use)."""
        index = self._indexes.get((topic, partition))
        if index is None:
            return None
        return _Indexed(self, index, records)

    def conditional(
        self, topic: str, partition: int, expect: Expect, records: Sequence[RecordTuple]
    ) -> tuple[Precondition, AppendHook]:
        """The precondition checking ``expect`` under the append lock, and the hook that
        indexes the appended records."""
        index = self.index(topic, partition)
        key = expect.key

        def check(leo: int) -> None:
            found = self._verified_head(index, key, leo)
            if found != expect.last_offset:
                raise ConcurrencyError(
                    f"key {key.decode(errors='replace')!r} changed concurrently",
                    expected=expect.last_offset,
                    actual=found,
                    unit="last offset",
                    topic=topic,
                    partition=partition,
                )

        return check, _Indexed(self, index, records, key)

    def _verified_head(self, index: KeyIndex, key: bytes, leo: int) -> int | None:
        where = (index.topic, index.partition, key)
        for attempt in (1, 2):
            entry = index.head_at(key, leo)
            if entry is None:
                return None
            offset = entry[1]
            if offset < self.log.offsets(index.topic, index.partition).lwm:
                return None  # removed by DeleteRecords or retention: as head() answers
            if self._checked.get(where) == offset:
                with contextlib.suppress(KeyError):  # forgotten by another thread meanwhile
                    self._checked.move_to_end(where)
                return offset
            record = index.record_at(offset)
            if record is not None and record.key == key:
                self._remember(where, offset)
                return offset
            if attempt == 2:
                raise SerializationError(
                    f"key {key.decode(errors='replace')!r}: the log has no record of it at the"
                    " offset its freshly rebuilt index names",
                    topic=index.topic,
                    partition=index.partition,
                    offset=offset,
                )
            index.reset(f"its last entry for {key!r} (offset {offset}) disagrees with the log")
        raise AssertionError("unreachable")  # pragma: no cover

    def _remember(self, where: tuple[str, int, bytes], offset: int) -> None:
        # no lock: each step is one call on the OrderedDict (threads of other partitions
        # may remember or forget between them)
        checked = self._checked
        checked.pop(where, None)
        checked[where] = offset  # the most recently used
        if len(checked) > CHECKED_HEADS:
            with contextlib.suppress(KeyError):
                checked.popitem(last=False)

    # ------------------------------------------------------------------ reads
    def head(self, topic: str, partition: int, key: bytes) -> int | None:
        """The offset of ``key``'s last record in ``[lwm, hwm)``, or ``None``: a key whose
        records are all below the low-water mark, or whose last record compaction removed,
        has none (as ``read_key`` and the ``expect`` check answer)."""
        index = self.index(topic, partition)
        last = index.view(key, after_seq=_LAST_ROW_ONLY).last  # one query, usually enough
        if last == -1:
            indexed = index.head(key)
            step = 1
            while True:  # the last indexed rows may be in flight (not readable yet): look back
                after = max(0, indexed - step)
                offsets = index.view(key, after_seq=after).offsets
                if offsets or after == 0:
                    last = offsets[-1] if offsets else None
                    break
                step *= 4
        if last is not None and last < self.log.offsets(topic, partition).lwm:
            return None
        if last is not None and index.mode == "latest":
            # compaction may have removed it (a tombstone past delete.retention.ms) while the
            # index still names it: answer what read_key (and the expect check) finds
            record = index.record_at(last)
            if record is None or record.key != key:
                records = self.read_key(topic, partition, key)
                return records[-1].offset if records else None
        return last

    def read_key(
        self, topic: str, partition: int, key: bytes, after: int | None = None
    ) -> list[Record]:
        """``key``'s records with offsets above ``after``, ascending, each checked."""
        index = self.index(topic, partition)
        attempt = retention_races = 0
        while True:
            attempt += 1
            offsets = index.view(key).offsets
            if index.mode == "latest":  # the tail overlay may hold older records of the key
                offsets = offsets[-1:]
            # rows of records that retention removed (the index keeps them until rebuilt)
            lwm = self.log.offsets(topic, partition).lwm
            floor = lwm - 1 if after is None else max(after, lwm - 1)
            if offsets and offsets[0] <= floor:
                offsets = [o for o in offsets if o > floor]
            try:
                records = self._read(topic, partition, offsets)
                for record in records:
                    if record.key != key:
                        raise _MismatchError(
                            record.offset, f"the key index names a record of {record.key!r}"
                        )
                return records
            except _MismatchError as exc:
                if retention_races < 10 and exc.offset < self.log.offsets(topic, partition).lwm:
                    retention_races += 1  # retention moved the low-water mark meanwhile
                    attempt -= 1
                    continue
                if attempt == 2 or exc.offset < index.trusted_upto:
                    raise SerializationError(
                        f"key {key.decode(errors='replace')!r}: {exc.problem}",
                        topic=topic,
                        partition=partition,
                        offset=exc.offset,
                    ) from None
                log.warning(
                    "key index disagrees with the log; rebuilding it",
                    topic=topic,
                    partition=partition,
                    offset=exc.offset,
                    problem=exc.problem,
                )
                index.rebuild()

    def _read(self, topic: str, partition: int, offsets: Sequence[int]) -> list[Record]:
        """The records at ``offsets`` (ascending); one read per run of adjacent offsets."""
        out: list[Record] = []
        i, n = 0, len(offsets)
        while i < n:
            j = i
            while j + 1 < n and offsets[j + 1] == offsets[j] + 1:
                j += 1
            start, end = offsets[i], offsets[j] + 1
            position = start
            cursor: Cursor | None = None
            while position < end:
                want = min((end - position) * _READ_BYTES_PER_RECORD, _MAX_READ_BYTES)
                try:
                    batch, cursor = self.log.read(
                        topic, partition, position, max_bytes=want, cursor=cursor, upto=end
                    )
                except OffsetOutOfRangeError:
                    batch = []
                if not batch or batch[0].offset != position:
                    raise _MismatchError(position, _NO_RECORD)
                for record in batch:
                    if record.offset >= end:  # the rest of the last batch: not asked for
                        break
                    if record.offset != position:
                        raise _MismatchError(
                            position, "the key index names an offset with no record"
                        )
                    out.append(record)
                    position += 1
            i = j + 1
        return out

    # ------------------------------------------------------------------ maintenance
    def rebuild(self, topic: str, partition: int) -> int:
        """Rebuild a partition's index from the log (skipped, returning 0, when this object
        rebuilt it and nothing was appended since); returns the records indexed."""
        index = self.index(topic, partition)
        if index.trusted_upto >= self.log.offsets(topic, partition).hwm:
            return 0
        with self._lock:
            self._checked = OrderedDict(
                (k, v) for k, v in self._checked.items() if k[:2] != (topic, partition)
            )
        return index.rebuild()

    def check(
        self, topics: Collection[str] | None = None, *, repair: bool = False
    ) -> list[KeyIndexReport]:
        """Verify every index file as it is on disk (see :mod:`.key_check`)."""
        if repair:  # open indexes are rebuilt behind this object's back: forget them
            self.close()
        return check_key_indexes(self.log, self.root, topics=topics, repair=repair)

    def close(self) -> None:
        with self._lock:
            for index in self._indexes.values():
                index.close()
            self._indexes.clear()
            self._checked.clear()
