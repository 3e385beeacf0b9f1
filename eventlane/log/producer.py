"""The producer: picks a partition for each record and appends, acknowledging durably.

Partitioning follows Kafka's default partitioner so a topic can move to Kafka keeping its
key → partition placement: an explicit partition wins; a keyed record goes to
``(murmur2(key) & 0x7fffffff) % partitions``; keyless records are spread across partitions.

Two ways to send:

* :meth:`Producer.send_batch` appends many records at once and returns their metadata once
  durable: one write and one fsync per partition touched. This is the throughput API.
* :meth:`Producer.send` returns a :class:`~concurrent.futures.Future`, like Kafka's producer.
  A background sender thread appends whatever has accumulated (waiting up to ``linger_ms``
  for more), so concurrent sends share one fsync: *group commit*. ``send(...).result()`` in
  a loop gives one fsync per record.
"""

from __future__ import annotations

import itertools
import operator
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import overload

from eventlane.errors import ConfigError, InvalidRecordError
from eventlane.log.names import refuse_internal
from eventlane.log.partitioner import KeylessSpreader, partition_for_key, partitions_for_keys
from eventlane.log.port import Log
from eventlane.log.record import Header, ProducerRecord, RecordMetadata
from eventlane.observability import get_logger

log = get_logger("eventlane.producer")


class SentBatch(Sequence[RecordMetadata]):
    """The metadata of one :meth:`Producer.send_batch` call, built on access.

    Item ``i`` is ``RecordMetadata(topic, partition of record i, offset of record i, its
    timestamp)``; it compares equal to the list of those items. Holding only the partition,
    offset and timestamp columns (ints, which Python's cyclic GC never tracks) instead of a
    list of tuples costs O(1) tracked objects per call where a 10k-record batch used to
    allocate 10k tuples that every later collection walked.
    """

    __slots__ = ("_offsets", "_partition", "_partitions", "_timestamps", "_topic")

    def __init__(
        self,
        topic: str,
        partitions: int | Sequence[int],
        offsets: Sequence[int],
        timestamps: Sequence[int],
    ) -> None:
        """``partitions``: one partition for every record, or one per record."""
        if len(offsets) != len(timestamps) or (
            not isinstance(partitions, int) and len(partitions) != len(offsets)
        ):
            raise ValueError("partitions, offsets and timestamps must be as long")
        self._topic = topic
        self._partition = partitions if isinstance(partitions, int) else -1
        self._partitions = () if isinstance(partitions, int) else partitions
        self._offsets = offsets
        self._timestamps = timestamps

    def __len__(self) -> int:
        return len(self._offsets)

    @overload
    def __getitem__(self, index: int) -> RecordMetadata: ...

    @overload
    def __getitem__(self, index: slice) -> list[RecordMetadata]: ...

    def __getitem__(self, index: int | slice) -> RecordMetadata | list[RecordMetadata]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        part = self._partition if self._partition >= 0 else self._partitions[index]
        return RecordMetadata(self._topic, part, self._offsets[index], self._timestamps[index])

    def __iter__(self) -> Iterator[RecordMetadata]:
        parts = (
            itertools.repeat(self._partition, len(self))
            if self._partition >= 0
            else self._partitions
        )
        fields = zip(itertools.repeat(self._topic), parts, self._offsets, self._timestamps)
        return map(RecordMetadata._make, fields)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SentBatch | list | tuple):
            return len(self) == len(other) and all(map(operator.eq, self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SentBatch({list(self)!r})"


class Producer:
    """Sends records to topics of a :class:`~eventlane.log.port.Log`. Thread-safe."""

    def __init__(self, log_: Log, *, linger_ms: float = 0.0) -> None:
        if linger_ms < 0:
            raise ConfigError(f"linger_ms must be >= 0, got {linger_ms}")
        self.log = log_
        self.linger_ms = linger_ms
        self._spreaders: dict[str, KeylessSpreader] = {}
        self._pending: dict[
            tuple[str, int], list[tuple[ProducerRecord, Future[RecordMetadata]]]
        ] = defaultdict(list)
        self._cond = threading.Condition()
        self._sender: threading.Thread | None = None
        self._closed = False
        self._inflight = 0

    # ------------------------------------------------------------------ partitioning
    def partition_for(self, topic: str, key: bytes | None, partition: int | None = None) -> int:
        """The partition a record goes to (explicit, by key, or spread for keyless)."""
        count = self.log.partition_count(topic)
        if partition is not None:
            if not isinstance(partition, int) or not 0 <= partition < count:
                raise InvalidRecordError(
                    f"partition {partition!r} does not exist (topic has {count})", topic=topic
                )
            return partition
        if key is not None:
            return partition_for_key(key, count)
        spreader = self._spreaders.get(topic)
        if spreader is None or spreader.num_partitions != count:
            spreader = self._spreaders[topic] = KeylessSpreader(count)
        return spreader.next_partition()

    # ------------------------------------------------------------------ batch API
    def send_batch(
        self,
        topic: str,
        records: Iterable[ProducerRecord],
        *,
        partition: int | None = None,
    ) -> SentBatch:
        """Append ``records`` and return their metadata, in order, once durable.

        Keyed records go to their key's partition; the keyless records of one call stick to
        one partition (Kafka's sticky partitioning), the next call moves on. Record fields
        are type-checked by the encoder, which names the offending record. The metadata is a
        :class:`SentBatch` (a sequence, built on access).
        """
        refuse_internal(topic, "produce to it")
        items = records if isinstance(records, list) else list(records)
        if not items:
            return SentBatch(topic, 0, (), ())
        count = self.log.partition_count(topic)
        if partition is not None:
            targets = [self.partition_for(topic, None, partition)] * len(items)
        else:
            try:
                keys = [r[0] for r in items]
                if None not in keys:
                    targets = partitions_for_keys(keys, count)  # type: ignore[arg-type]
                else:
                    sticky = self.partition_for(topic, None)
                    targets = [sticky if k is None else partition_for_key(k, count) for k in keys]
            except (TypeError, IndexError) as exc:  # a key that is not bytes, a non-record
                raise InvalidRecordError(f"cannot partition records: {exc}", topic=topic) from None
        first = targets[0]
        if targets.count(first) == len(targets):  # one partition: no regrouping
            result = self.log.append(topic, first, items)
            offsets = range(result.base_offset, result.base_offset + len(items))
            return SentBatch(topic, first, offsets, result.timestamps)
        by_partition: dict[int, list[int]] = defaultdict(list)
        for i, t in enumerate(targets):
            by_partition[t].append(i)
        offsets_at = [0] * len(items)
        stamps_at = [0] * len(items)
        for p, indexes in by_partition.items():
            result = self.log.append(topic, p, [items[i] for i in indexes])
            stamps = result.timestamps
            for n, i in enumerate(indexes):
                offsets_at[i] = result.base_offset + n
                stamps_at[i] = stamps[n]
        return SentBatch(topic, targets, offsets_at, stamps_at)

    # ------------------------------------------------------------------ future API
    def send(
        self,
        topic: str,
        value: bytes | None = None,
        *,
        key: bytes | None = None,
        headers: Sequence[Header] = (),
        partition: int | None = None,
        timestamp: int | None = None,
    ) -> Future[RecordMetadata]:
        """Queue one record; the future resolves to its metadata once it is durable."""
        refuse_internal(topic, "produce to it")
        record = ProducerRecord(key, value, tuple(headers), timestamp)
        _check_record(topic, record)
        target = self.partition_for(topic, key, partition)
        future: Future[RecordMetadata] = Future()
        with self._cond:
            if self._closed:
                raise InvalidRecordError("producer is closed", topic=topic)
            self._pending[(topic, target)].append((record, future))
            if self._sender is None:
                self._sender = threading.Thread(
                    target=self._run, name="eventlane-producer", daemon=True
                )
                self._sender.start()
            self._cond.notify_all()
        return future

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending and self._closed:
                    return
                if self.linger_ms:
                    self._cond.wait(self.linger_ms / 1000)
                batch, self._pending = self._pending, defaultdict(list)
                self._inflight += 1
            try:
                for (topic, p), entries in batch.items():
                    try:
                        result = self.log.append(topic, p, [r for r, _ in entries])
                    except Exception as exc:  # delivered to every waiting future
                        for _, fut in entries:
                            fut.set_exception(exc)
                        continue
                    for n, ((_, fut), ts) in enumerate(
                        zip(entries, result.timestamps, strict=True)
                    ):
                        fut.set_result(RecordMetadata(topic, p, result.base_offset + n, ts))
            finally:
                with self._cond:
                    self._inflight -= 1
                    self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> None:
        """Block until every record sent so far is durable (or ``timeout`` seconds pass)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._pending or self._inflight:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError("flush timed out")
                self._cond.wait(remaining)

    def close(self) -> None:
        """Flush and stop the sender thread."""
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._sender is not None:
            self._sender.join()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_record(topic: str, record: ProducerRecord) -> None:
    key, value, headers, ts = record
    if key is not None and not isinstance(key, bytes):
        raise InvalidRecordError(
            f"key must be bytes or None, not {type(key).__name__}", topic=topic
        )
    if value is not None and not isinstance(value, bytes):
        raise InvalidRecordError(
            f"value must be bytes or None, not {type(value).__name__}", topic=topic
        )
    if ts is not None and (not isinstance(ts, int) or ts < 0):
        raise InvalidRecordError(f"timestamp must be ms >= 0, got {ts!r}", topic=topic)
    for header in headers:
        if (
            not isinstance(header, tuple)
            or len(header) != 2
            or not isinstance(header[0], str)
            or not (header[1] is None or isinstance(header[1], bytes))
        ):
            raise InvalidRecordError(
                f"bad header {header!r}: expected (str, bytes | None)", topic=topic
            )
