"""The event store: aggregates' event streams on the log, with optimistic concurrency.

An aggregate's events are records keyed by its id, so they all land in one partition of the
aggregate class's topic (Kafka's partitioner), totally ordered. What Kafka cannot do and this
store does: an append is *conditional* on the stream's current version. The check runs under
the partition's append lock, against the per-key index caught up to the log end offset, so
two writers can never fork a history: the loser gets
:class:`~framework.errors.ConcurrencyError` and nothing of its batch is written. A save's
events form one batch, so a crash never leaves part of a save visible.

Reading a stream uses the key index (:mod:`framework.store.key_index`) to fetch only the
aggregate's records, never scanning the partition.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from framework.codec import Envelope, EventCodec
from framework.errors import ConcurrencyError, SerializationError
from framework.log import Log, Record, RecordMetadata
from framework.log.partition import AppendResult
from framework.log.partitioner import partition_for_key
from framework.store.key_index import KeyIndex

log = structlog.get_logger("eventlane.store")

_POINT_READ_BYTES = 16 << 10


class EventStore:
    """Appends and reads aggregate event streams on a :class:`~framework.log.Log`."""

    def __init__(self, log_: Log, codec: EventCodec, *, index_dir: Path | None = None) -> None:
        self.log = log_
        self.codec = codec
        self.index_dir = index_dir if index_dir is not None else log_.path / "store"
        self._indexes: dict[tuple[str, int], KeyIndex] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ placement
    def partition_of(self, topic: str, aggregate_id: str) -> int:
        return partition_for_key(aggregate_id.encode(), self.log.partition_count(topic))

    def index(self, topic: str, partition: int) -> KeyIndex:
        """The key index of a partition (opened, and repaired if unreadable, on first use)."""
        idx = self._indexes.get((topic, partition))
        if idx is None:
            with self._lock:
                idx = self._indexes.get((topic, partition))
                if idx is None:
                    path = self.index_dir / topic / f"{partition}.keyindex.sqlite"
                    idx = KeyIndex(self.log, topic, partition, path)
                    self._indexes[(topic, partition)] = idx
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
        ``expected_version``; raise :class:`ConcurrencyError` otherwise."""
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
        index = self.index(topic, partition)

        def check(leo: int) -> None:
            index.catch_up(leo)
            actual = index.head(key)
            if actual != expected_version:
                raise ConcurrencyError(
                    f"aggregate {aggregate_id!r} changed concurrently",
                    expected=expected_version,
                    actual=actual,
                    topic=topic,
                    partition=partition,
                )

        def indexed(result: AppendResult) -> None:
            index.add(
                key,
                expected_version + 1,
                list(range(result.base_offset, result.last_offset + 1)),
                result.last_offset + 1,
            )

        result = self.log.append(
            topic, partition, records, precondition=check, on_appended=indexed, atomic=True
        )
        return [
            RecordMetadata(topic, partition, result.base_offset + i, ts)
            for i, ts in enumerate(result.timestamps)
        ]

    # ------------------------------------------------------------------ reading
    def current_version(self, topic: str, aggregate_id: str) -> int:
        """The stream's last version (0 when it has no events)."""
        key = aggregate_id.encode()
        partition = self.partition_of(topic, aggregate_id)
        index = self.index(topic, partition)
        hwm = self.log.offsets(topic, partition).hwm
        return index.head(key) + len(index.scan_tail(hwm, key))

    def record_offsets(
        self, topic: str, aggregate_id: str, after_version: int = 0, upto_version: int | None = None
    ) -> tuple[int, list[int]]:
        """``(partition, offsets)`` of the stream's records with versions in the range."""
        key = aggregate_id.encode()
        partition = self.partition_of(topic, aggregate_id)
        index = self.index(topic, partition)
        hwm = self.log.offsets(topic, partition).hwm
        if index.next_offset() >= hwm:
            return partition, index.offsets(key, after_version, upto_version)
        # Unindexed tail (a writer died between its append and its index update): overlay it.
        every = index.offsets(key) + [off for _, off in index.scan_tail(hwm, key)]
        return partition, every[after_version:upto_version]

    def read_records(self, topic: str, partition: int, offsets: Sequence[int]) -> list[Record]:
        """The records at ``offsets`` (ascending), fetching each batch once."""
        out: list[Record] = []
        fetched: dict[int, Record] = {}
        cursor = None
        for offset in offsets:
            record = fetched.get(offset)
            if record is None:
                fetched.clear()
                batch, cursor = self.log.read(
                    topic, partition, offset, max_bytes=_POINT_READ_BYTES, cursor=cursor
                )
                fetched = {r.offset: r for r in batch}
                record = fetched.get(offset)
                if record is None:
                    raise SerializationError(
                        "the key index names an offset with no record (index out of date?)",
                        topic=topic,
                        partition=partition,
                        offset=offset,
                    )
            out.append(record)
        return out

    def read(
        self, topic: str, aggregate_id: str, after_version: int = 0, upto_version: int | None = None
    ) -> list[Envelope[Any]]:
        """The stream's envelopes with ``after_version < version <= upto_version``."""
        partition, offsets = self.record_offsets(topic, aggregate_id, after_version, upto_version)
        envelopes = []
        expected = after_version + 1
        key = aggregate_id.encode()
        for record in self.read_records(topic, partition, offsets):
            env = self.codec.decode(
                record.key,
                record.value,
                record.headers,  # type: ignore[arg-type]
                topic=topic,
                partition=partition,
                offset=record.offset,
            )
            if record.key != key or env.aggregate_version != expected:
                raise SerializationError(
                    f"stream {aggregate_id!r}: expected version {expected}, found "
                    f"{env.aggregate_id!r} v{env.aggregate_version} (key index out of date; "
                    "run `eventlane verify` to rebuild it)",
                    topic=topic,
                    partition=partition,
                    offset=record.offset,
                )
            envelopes.append(env)
            expected += 1
        return envelopes

    def verify_index(self, topic: str, partition: int) -> list[str]:
        """Compare the partition's key index with a fresh scan of the log; list differences."""
        index = self.index(topic, partition)
        hwm = self.log.offsets(topic, partition).hwm
        truth: dict[bytes, list[int]] = {}
        for key, offset in _scan_all(self.log, topic, partition, hwm):
            truth.setdefault(key, []).append(offset)
        problems = []
        for key, offsets in truth.items():
            indexed = index.offsets(key)
            if indexed != offsets[: len(indexed)]:
                problems.append(
                    f"key {key!r}: index has offsets {indexed[:5]}…, log has {offsets[:5]}…"
                )
        return problems

    def close(self) -> None:
        for index in self._indexes.values():
            index.close()
        self._indexes.clear()


def _scan_all(log_: Log, topic: str, partition: int, upto: int) -> list[tuple[bytes, int]]:
    out: list[tuple[bytes, int]] = []
    offset = log_.offsets(topic, partition).lwm
    cursor = None
    while offset < upto:
        records, cursor = log_.read(
            topic, partition, offset, max_bytes=4 << 20, cursor=cursor, upto=upto
        )
        if not records:
            break
        out.extend((r.key, r.offset) for r in records if r.key is not None)
        offset = records[-1].offset + 1
    return out
