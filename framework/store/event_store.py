"""The event store: aggregates' event streams on the log, with optimistic concurrency.

An aggregate's events are records keyed by its id, so they all land in one partition of the
aggregate class's topic (Kafka's partitioner), totally ordered. What Kafka cannot do and this
store does: an append is *conditional* on the stream's current version. The check runs under
the partition's append lock, against the per-key index caught up to the log end offset, so
two writers can never fork a history: the loser gets
:class:`~framework.errors.ConcurrencyError` and nothing of its batch is written. A save's
events form one batch (``atomic=True``), so a crash never leaves part of a save visible.

Reading a stream uses the key index (:mod:`framework.store.key_index`) to fetch only the
aggregate's records, never scanning the partition.

The index is derived data, so nothing here trusts it blindly:

* the version check first reads the stream's last record from the log and compares its key
  and ``aggregate_version`` with the index (one point read per save, skipped when the index
  names exactly the head this store last appended or checked); on a difference the index
  is rebuilt before deciding;
* a read checks that every record has the stream's key and the next version; on a
  difference the index is rebuilt once and the read repeated. A difference that survives a
  rebuild is in the log itself: :class:`~framework.errors.SerializationError` naming the
  topic, partition and offset.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import structlog

from framework.codec import Envelope, EventCodec
from framework.errors import (
    ConcurrencyError,
    OffsetOutOfRangeError,
    SerializationError,
)
from framework.log import Log, Record, RecordMetadata
from framework.log.partition import AppendResult, Cursor
from framework.log.partitioner import partition_for_key
from framework.store.key_index import IndexReport, KeyIndex, Mode, index_path

log = structlog.get_logger("eventlane.store")

EVENT_TOPIC_CONFIG: dict[str, object] = {"retention_ms": -1, "cleanup_policy": "delete"}
"""The config of an event topic: unbounded retention, no compaction (a rebuild from the
low-water mark sees the whole history)."""
DEFAULT_PARTITIONS = 6
"""The partition count of an event topic an application creates, unless it says otherwise."""

_READ_BYTES_PER_RECORD = 4 << 10
"""Bytes fetched per wanted record when reading a run of adjacent offsets (capped at 1 MiB):
enough for a store record, so a run is usually one ``pread``, never a MiB for one record."""
_MAX_READ_BYTES = 1 << 20
_CHECKED_HEADS = 1 << 16
"""Stream heads remembered as checked against the log (the cache is cleared when full)."""


class _IndexMismatchError(Exception):
    """Internal: the key index named a record the log does not have at that offset."""

    def __init__(self, offset: int, problem: str) -> None:
        super().__init__(problem)
        self.offset = offset
        self.problem = problem


def stored_version(record: Record) -> int | None:
    """The ``aggregate_version`` in an event record's JSON value (``None`` if absent)."""
    try:
        doc = orjson.loads(record.value) if record.value is not None else None
    except orjson.JSONDecodeError:
        return None
    version = doc.get("aggregate_version") if type(doc) is dict else None
    return version if type(version) is int else None


class EventStore:
    """Appends and reads aggregate event streams on a :class:`~framework.log.Log`.

    Key indexes live under ``index_dir`` (default ``<data>/store``), one per partition,
    opened on first use and kept open until :meth:`close`.
    """

    def __init__(self, log_: Log, codec: EventCodec, *, index_dir: Path | None = None) -> None:
        self.log = log_
        self.codec = codec
        self.index_dir = index_dir if index_dir is not None else log_.path / "store"
        self._indexes: dict[tuple[str, int], KeyIndex] = {}
        self._lock = threading.Lock()
        # (topic, partition, key) → (version, offset) of a stream head this object checked
        # against the log (or appended itself): the version check skips the log read when
        # the index still names exactly that head.
        self._checked_heads: dict[tuple[str, int, bytes], tuple[int, int]] = {}

    # ------------------------------------------------------------------ placement
    def partition_of(self, topic: str, aggregate_id: str) -> int:
        return partition_for_key(aggregate_id.encode(), self.log.partition_count(topic))

    def index(self, topic: str, partition: int, mode: Mode | None = None) -> KeyIndex:
        """The key index of a partition (opened and checked on first use).

        ``mode``: ``stream`` for event topics (what the append and read paths ask for),
        ``latest`` for snapshot topics; ``None`` takes the existing file's mode (maintenance).
        An index found in the other mode is emptied and switched (it is derived data).
        """
        idx = self._indexes.get((topic, partition))
        if idx is None:
            with self._lock:
                idx = self._indexes.get((topic, partition))
                if idx is None:
                    path = index_path(self.index_dir, topic, partition)
                    idx = KeyIndex(self.log, topic, partition, path, mode=mode)
                    self._indexes[(topic, partition)] = idx
        if mode is not None:
            idx.use_mode(mode)
        return idx

    # ------------------------------------------------------------------ writing
    def append(
        self,
        topic: str,
        aggregate_id: str,
        expected_version: int,
        envelopes: Sequence[Envelope[Any]],
    ) -> list[RecordMetadata]:
        """Append ``envelopes`` (versions ``expected_version + 1 …``) iff the stream is at
        ``expected_version``; raise :class:`ConcurrencyError` otherwise (nothing written).

        The envelopes are one batch: all of them are appended, or none.
        """
        if not envelopes:
            return []
        for i, env in enumerate(envelopes, start=expected_version + 1):
            if env.aggregate_id != aggregate_id or env.aggregate_version != i:
                raise SerializationError(
                    f"envelope {env.aggregate_id!r} v{env.aggregate_version} does not continue "
                    f"{aggregate_id!r} at version {i}",
                    topic=topic,
                )
        encoded = [self.codec.encode(env) for env in envelopes]
        records = [(r.key, r.value, tuple(r.headers), None) for r in encoded]
        key = aggregate_id.encode()
        partition = self.partition_of(topic, aggregate_id)
        index = self.index(topic, partition, "stream")

        def check(leo: int) -> None:
            actual = self._verified_head(index, key, leo)
            if actual != expected_version:
                raise ConcurrencyError(
                    f"aggregate {aggregate_id!r} changed concurrently",
                    expected=expected_version,
                    actual=actual,
                    topic=topic,
                    partition=partition,
                )

        def indexed(result: AppendResult) -> None:
            offsets = list(range(result.base_offset, result.last_offset + 1))
            if index.add(key, expected_version + 1, offsets, result.last_offset + 1):
                self._remember_head(
                    topic, partition, key, expected_version + len(offsets), result.last_offset
                )

        result = self.log.append(
            topic, partition, records, precondition=check, on_appended=indexed, atomic=True
        )
        return [
            RecordMetadata(topic, partition, result.base_offset + i, ts)
            for i, ts in enumerate(result.timestamps)
        ]

    def _verified_head(self, index: KeyIndex, key: bytes, leo: int) -> int:
        """The stream's version below ``leo``, from the index checked against the log."""
        where = (index.topic, index.partition, key)
        for attempt in (1, 2):
            entry = index.head_at(key, leo)
            if entry is None:
                return 0
            seq, offset = entry
            if self._checked_heads.get(where) == entry:
                return seq
            record = index.record_at(offset)
            found = None if record is None or record.key != key else stored_version(record)
            if found == seq:
                self._remember_head(*where, seq, offset)
                return seq
            if attempt == 2:
                raise SerializationError(
                    f"stream {key.decode(errors='replace')!r}: its record #{seq} at this offset "
                    f"has aggregate_version {found} (the log itself is inconsistent)",
                    topic=index.topic,
                    partition=index.partition,
                    offset=offset,
                )
            index.reset(
                f"its last entry for {key!r} (#{seq}, offset {offset}) disagrees with the log"
            )
        raise AssertionError("unreachable")  # pragma: no cover

    def _remember_head(
        self, topic: str, partition: int, key: bytes, version: int, offset: int
    ) -> None:
        if len(self._checked_heads) >= _CHECKED_HEADS:
            self._checked_heads.clear()
        self._checked_heads[(topic, partition, key)] = (version, offset)

    # ------------------------------------------------------------------ reading
    def current_version(self, topic: str, aggregate_id: str) -> int:
        """The stream's last version (0 when it has no events)."""
        partition = self.partition_of(topic, aggregate_id)
        view = self.index(topic, partition, "stream").view(aggregate_id.encode(), upto_seq=0)
        return view.head

    def record_offsets(
        self,
        topic: str,
        aggregate_id: str,
        after_version: int = 0,
        upto_version: int | None = None,
    ) -> tuple[int, list[int]]:
        """``(partition, offsets)`` of the stream's records with versions in the range."""
        partition = self.partition_of(topic, aggregate_id)
        index = self.index(topic, partition, "stream")
        view = index.view(aggregate_id.encode(), after_version, upto_version)
        return partition, view.offsets

    def read_records(self, topic: str, partition: int, offsets: Sequence[int]) -> list[Record]:
        """The records at ``offsets`` (ascending); one read per run of adjacent offsets.

        Raises :class:`~framework.errors.SerializationError` when the log has no record at
        one of them.
        """
        try:
            return self._read_records(topic, partition, offsets)
        except _IndexMismatchError as exc:
            raise SerializationError(
                exc.problem, topic=topic, partition=partition, offset=exc.offset
            ) from None

    def _read_records(self, topic: str, partition: int, offsets: Sequence[int]) -> list[Record]:
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
                        topic,
                        partition,
                        position,
                        max_bytes=want,
                        cursor=cursor,
                        upto=end,
                    )
                except OffsetOutOfRangeError:
                    batch = []
                if not batch or batch[0].offset != position:
                    raise _IndexMismatchError(
                        position, "the key index names an offset with no record"
                    )
                for record in batch:
                    if record.offset >= end:  # the rest of the last batch: not asked for
                        break
                    if record.offset != position:
                        raise _IndexMismatchError(
                            position, "the key index names an offset with no record"
                        )
                    out.append(record)
                    position += 1
            i = j + 1
        return out

    def read(
        self,
        topic: str,
        aggregate_id: str,
        after_version: int = 0,
        upto_version: int | None = None,
    ) -> list[Envelope[Any]]:
        """The stream's envelopes with ``after_version < version <= upto_version``, checked
        against the stream's key and version sequence (see the module docstring)."""
        key = aggregate_id.encode()
        partition = self.partition_of(topic, aggregate_id)
        index = self.index(topic, partition, "stream")
        for attempt in (1, 2):
            view = index.view(key, after_version, upto_version)
            try:
                return self._decode_stream(topic, partition, key, after_version, view.offsets)
            except _IndexMismatchError as exc:
                if attempt == 2 or exc.offset < index.trusted_upto:
                    raise SerializationError(
                        f"stream {aggregate_id!r}: {exc.problem}",
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
        raise AssertionError("unreachable")  # pragma: no cover

    def _decode_stream(
        self, topic: str, partition: int, key: bytes, after_version: int, offsets: list[int]
    ) -> list[Envelope[Any]]:
        envelopes = []
        expected = after_version + 1
        decode = self.codec.decode
        for record in self._read_records(topic, partition, offsets):
            if record.key != key:
                raise _IndexMismatchError(
                    record.offset,
                    f"expected the record of version {expected}, found one of {record.key!r}",
                )
            env = decode(
                record.key,
                record.value,
                record.headers,  # type: ignore[arg-type]
                topic=topic,
                partition=partition,
                offset=record.offset,
            )
            if env.aggregate_version != expected:
                raise _IndexMismatchError(
                    record.offset,
                    f"expected version {expected}, found version {env.aggregate_version}",
                )
            envelopes.append(env)
            expected += 1
        return envelopes

    # ------------------------------------------------------------------ maintenance
    def verify_index(self, topic: str, partition: int) -> IndexReport:
        """Compare the partition's key index with a fresh scan of the log."""
        return self.index(topic, partition).verify()

    def rebuild_index(self, topic: str, partition: int) -> int:
        """Rebuild the partition's key index from the log; returns the records indexed."""
        return self.index(topic, partition).rebuild()

    def close(self) -> None:
        with self._lock:
            for index in self._indexes.values():
                index.close()
            self._indexes.clear()
