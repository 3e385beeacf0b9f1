"""Produce and InitProducerId: client batches in, records appended, idempotent retries.

Invariant (Kafka's ProducerStateManager): per (producer id, partition) the table keeps the
next expected sequence and the last five batches; a retried batch is answered with its first
offset and not appended again, a sequence gap is refused with OUT_OF_ORDER_SEQUENCE_NUMBER,
and appends of the listener to one partition are serialised so that check and append are one
step (a lock per partition, :class:`PartitionLocks`: appends to different partitions, of one
request or of several connections, run side by side).
A partition's records must be exactly one batch (Kafka's rule since Produce v3, which the
listener's oldest version is): none or several are INVALID_RECORD, so a partition's answer
is about one batch, stored whole or not at all.
A batch's records (decompressed) reach an embedded log without a Python object each: they are
checked in C (``_wire.records_scan``) and kept as the request's bytes
(:class:`~eventlane.kafka.records.KafkaRecords`), which ``LogStore.append_framed`` transcodes
into its stored batches in one C pass per batch (``_wire.records_stored``), byte for byte what
appending the parsed tuples writes; anything else (non-ASCII header names, a record the log
refuses, an open key index, another engine) goes through the tuples.
The table is in memory: after a restart a producer's first batch starts its state again.
Transactional producers and batches are refused.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import time
from collections.abc import AsyncIterator
from typing import Any

from kafka.protocol.producer import InitProducerIdResponse, ProduceResponse
from kafka.record.memory_records import MemoryRecords

from eventlane.errors import (
    InvalidTopicError,
)
from eventlane.kafka._base import BrokerState, check_topic_name, refuse_internal
from eventlane.kafka.codes import Errors, errno, error_for
from eventlane.kafka.records import (
    BatchFormatError,
    Charge,
    DecompressedTooLargeError,
    KafkaBatch,
    UnsupportedCompressionError,
    has_compressed,
    parse_batches,
)
from eventlane.observability import get_logger

log = get_logger("eventlane.kafka")


_DEDUPE_WINDOW = 5


TRANSACTIONS_REFUSED = errno(Errors.TransactionalIdAuthorizationFailedError)
"""The answer to every transactional request: a code no client retries (Kafka's clients fail
``init_transactions()`` at once on it), with :data:`TRANSACTIONS_MESSAGE` beside it."""


TRANSACTIONS_MESSAGE = (
    "transactions are not supported by eventlane's Kafka listener (no transaction coordinator)"
)


ONE_BATCH_MESSAGE = (
    "a produce request must hold exactly one record batch per partition (Produce v3 and later)"
)


class _ProducerState:
    """Sequence bookkeeping of one producer on one partition."""

    __slots__ = ("epoch", "next_seq", "recent")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.next_seq = -1  # unknown: accept the first batch's sequence
        self.recent: collections.deque[tuple[int, int, int]] = collections.deque(
            maxlen=_DEDUPE_WINDOW
        )  # (first seq, last seq, base offset)


class ProducerStateTable:
    """Kafka's ProducerStateManager, in memory: per (producer id, topic, partition) the
    producer's epoch, the next expected sequence and its last ``_DEDUPE_WINDOW`` batches
    (first sequence, last sequence, base offset).

    Invariants: a batch is appended only if :meth:`check` said so, and :meth:`appended`
    records it before the next batch of the partition is checked (both under the produce
    append lock, on the listener's event loop: the table has no lock of its own); a new
    epoch starts the producer's state again. Producer ids are unique per process start
    (the clock's milliseconds, shifted)."""

    def __init__(self) -> None:
        self._states: dict[tuple[int, str, int], _ProducerState] = {}
        self._next_pid = (int(time.time() * 1000) & 0xFFFFFFFFFF) << 12

    def new_producer_id(self) -> int:
        self._next_pid += 1
        return self._next_pid

    def check(self, batch: KafkaBatch, topic: str, partition: int) -> tuple[int, str | None]:
        """``(base offset, None)`` for a retry of a batch already stored (answer with its
        offset, append nothing); ``(-1, message)`` for a sequence gap (refuse it:
        OUT_OF_ORDER_SEQUENCE_NUMBER); ``(-1, None)``: append it."""
        if batch.producer_id < 0:
            return -1, None
        key = (batch.producer_id, topic, partition)
        state = self._states.get(key)
        if state is None or state.epoch != batch.producer_epoch:
            state = self._states[key] = _ProducerState(batch.producer_epoch)
        seq, last = batch.base_sequence, batch.base_sequence + batch.record_count - 1
        retried = [off for f, lst, off in state.recent if f == seq and lst == last]
        if retried:
            return retried[0], None
        if state.next_seq >= 0 and seq != state.next_seq:
            return -1, f"expected sequence {state.next_seq}, got {seq}"
        return -1, None

    def appended(self, batch: KafkaBatch, topic: str, partition: int, base_offset: int) -> None:
        """Record that ``batch`` was stored at ``base_offset``."""
        state = self._states.get((batch.producer_id, topic, partition))
        if batch.producer_id < 0 or state is None:
            return
        count = batch.record_count
        state.recent.append((batch.base_sequence, batch.base_sequence + count - 1, base_offset))
        state.next_seq = (batch.base_sequence + count) & 0x7FFFFFFF


class PartitionLocks:
    """One :class:`asyncio.Lock` per ``(topic, partition)`` being produced to.

    Invariants: two holders of one partition's lock never overlap, and waiters get it in
    the order they asked (asyncio's locks are FIFO); an entry lives only while someone holds
    or waits for it, so the table never outgrows the partitions in flight. Event loop only.
    """

    def __init__(self) -> None:
        self._locks: dict[tuple[str, int], tuple[asyncio.Lock, list[int]]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, topic: str, partition: int) -> AsyncIterator[None]:
        key = (topic, partition)
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[key]

    def __len__(self) -> int:
        return len(self._locks)


class _RefusedError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _MemoryBusyError(DecompressedTooLargeError):
    """Decompressed records found no room under the in-flight memory cap in time."""


def _produced_batches(
    raw: bytes, charge: Charge | None = None, *, framed: bool = False
) -> list[KafkaBatch]:
    """A Produce request's batches: plain ones parsed here (fast), compressed ones
    decompressed in charged chunks (gzip, snappy, lz4, zstd) and parsed the same way;
    transactional and control batches refused, and any batch that does not decode whole
    refuses the partition's request: never half-applied. Records that decompress past the
    bound: MESSAGE_TOO_LARGE (Kafka's RecordTooLargeException for a batch over its limit);
    no room under the memory cap in time: REQUEST_TIMED_OUT (retriable, nothing written).
    ``framed``: batches' records kept as bytes (decompressed) where they can be
    (:class:`~eventlane.kafka.records.KafkaRecords`, for ``append_framed``).
    """
    try:
        if charge is None:
            return parse_batches(raw, framed=framed)
        return parse_batches(raw, charge, framed=framed)
    except _MemoryBusyError as exc:
        raise _RefusedError(errno(Errors.RequestTimedOutError), str(exc)) from None
    except DecompressedTooLargeError as exc:
        raise _RefusedError(errno(Errors.MessageSizeTooLargeError), str(exc)) from None
    except UnsupportedCompressionError as exc:
        raise _RefusedError(errno(Errors.UnsupportedCompressionTypeError), str(exc)) from None
    except BatchFormatError as exc:
        if not exc.fallback:
            raise _RefusedError(
                errno(Errors.CorruptRecordError), f"bad record batch: {exc}"
            ) from None
    try:
        return _decoded(raw)
    except _RefusedError:
        raise
    except Errors.UnsupportedCodecError as exc:
        raise _RefusedError(
            errno(Errors.UnsupportedCompressionTypeError), f"unsupported compression: {exc}"
        ) from None
    except Exception as exc:
        raise _RefusedError(
            errno(Errors.CorruptRecordError), f"bad record batch: {type(exc).__name__}: {exc}"
        ) from None


async def _acquire(budget: Any, size: int, wait_s: float) -> None:
    async with asyncio.timeout(wait_s):
        await budget.acquire(size)


def _decoded(raw: bytes) -> list[KafkaBatch]:
    out = []
    records = MemoryRecords(raw)
    while (batch := records.next_batch()) is not None:
        if getattr(batch, "magic", 2) != 2:
            raise _RefusedError(
                errno(Errors.UnsupportedForMessageFormatError),
                f"message format v{batch.magic} (magic {batch.magic}): only record batches v2",
            )
        if batch.is_transactional or batch.is_control_batch:
            raise _RefusedError(TRANSACTIONS_REFUSED, TRANSACTIONS_MESSAGE)
        if batch.compression_type not in _CODECS:
            raise _RefusedError(
                errno(Errors.UnsupportedCompressionTypeError),
                f"compression type {batch.compression_type} is not one of Kafka's",
            )
        if not batch.validate_crc():
            raise _RefusedError(errno(Errors.CorruptRecordError), "record batch CRC mismatch")
        records_ = [
            (
                None if r.key is None else bytes(r.key),
                None if r.value is None else bytes(r.value),
                tuple((k, None if v is None else bytes(v)) for k, v in r.headers),
                r.timestamp if r.timestamp is not None and r.timestamp >= 0 else None,
            )
            for r in batch
        ]
        if len(records_) != batch.records_count:
            raise _RefusedError(
                errno(Errors.CorruptRecordError),
                f"batch says {batch.records_count} records, holds {len(records_)}",
            )
        out.append(
            KafkaBatch(
                batch.producer_id if batch.has_producer_id() else -1,
                batch.producer_epoch,
                batch.base_sequence,
                records_,
            )
        )
    return out


_CODECS = frozenset({0, 1, 2, 3, 4})
"""Kafka's compression types: none, gzip, snappy, lz4, zstd."""


class ProduceApis(BrokerState):
    """Produce and InitProducerId (the module docstring)."""

    producer_states: ProducerStateTable
    append_locks: PartitionLocks
    """Serialises the listener's appends per partition: a batch's sequence check and its
    append are one step (:class:`ProducerStateTable`)."""
    budget: Any
    """The server's in-flight memory budget (set by the server; ``None``: none)."""
    max_decompressed_bytes: int
    memory_wait_s: float

    # -- produce ---------------------------------------------------------------------------
    async def init_producer_id(self, request: Any) -> Any:
        if request.transactional_id is not None:
            log.info("transactional producer refused", transactional_id=request.transactional_id)
            return InitProducerIdResponse(
                throttle_time_ms=0,
                error_code=TRANSACTIONS_REFUSED,
                producer_id=-1,
                producer_epoch=-1,
            )
        return InitProducerIdResponse(
            throttle_time_ms=0,
            error_code=0,
            producer_id=self.producer_states.new_producer_id(),
            producer_epoch=0,
        )

    async def produce(self, request: Any) -> Any:
        Topic = ProduceResponse.TopicProduceResponse
        Part = Topic.PartitionProduceResponse
        # every partition of the request at once (each under its own partition's lock)
        answers = iter(
            await asyncio.gather(
                *(
                    self._produce_partition(
                        topic.name, pdata.index, pdata.records, request.transactional_id
                    )
                    for topic in request.topic_data
                    for pdata in topic.partition_data
                )
            )
        )
        topics = []
        for topic in request.topic_data:
            parts = []
            for pdata in topic.partition_data:
                code, base, append_time, lwm, message = next(answers)
                parts.append(
                    Part(
                        index=pdata.index,
                        error_code=code,
                        base_offset=base,
                        log_append_time_ms=append_time,
                        log_start_offset=lwm,
                        record_errors=[],
                        error_message=message,
                    )
                )
            topics.append(Topic(name=topic.name, partition_responses=parts))
        # acks=0: the server sends nothing (its metrics still count the answer's error)
        return ProduceResponse(responses=topics, throttle_time_ms=0, node_endpoints=[])

    async def _produce_partition(
        self, topic: str, partition: int, raw: bytes | None, transactional_id: str | None
    ) -> tuple[int, int, int, int, str | None]:
        if transactional_id is not None:
            return TRANSACTIONS_REFUSED, -1, -1, -1, TRANSACTIONS_MESSAGE
        charged = [0]  # bytes of decompressed records counted against the in-flight cap
        try:
            return await self._produce_charged(topic, partition, bytes(raw or b""), charged)
        finally:
            if charged[0] and self.budget is not None:
                await self.budget.release(charged[0])

    async def _batches(self, raw: bytes, charged: list[int]) -> list[KafkaBatch]:
        """The request's batches; compressed ones are decompressed in a worker thread, their
        records counted against the in-flight memory cap (``charged``, released by the
        caller once appended) and bounded by ``max_decompressed_bytes`` (the request size
        limit: what an uncompressed request could hold)."""
        budget = self.budget
        # records the engine appends from their bytes (append_framed) stay bytes
        framed = hasattr(self.log, "append_framed")
        if budget is None or not has_compressed(raw):
            return _produced_batches(raw, framed=framed)
        loop = asyncio.get_running_loop()
        limit, wait_s = self.max_decompressed_bytes, self.memory_wait_s

        def charge(size: int) -> None:
            if charged[0] + size > limit:
                raise DecompressedTooLargeError(
                    f"the records decompress to more than {limit} bytes (socket.request.max.bytes)"
                )
            try:
                asyncio.run_coroutine_threadsafe(_acquire(budget, size, wait_s), loop).result()
            except TimeoutError:
                raise _MemoryBusyError(
                    f"no room for {size} decompressed bytes under the in-flight memory cap"
                    f" within {wait_s} s"
                ) from None
            charged[0] += size

        return await asyncio.to_thread(
            functools.partial(_produced_batches, raw, charge, framed=framed)
        )

    async def _produce_charged(
        self, topic: str, partition: int, raw: bytes, charged: list[int]
    ) -> tuple[int, int, int, int, str | None]:
        try:
            refuse_internal(check_topic_name(topic), "produce to")
            batches = await self._batches(raw, charged)
        except InvalidTopicError as exc:
            return errno(Errors.InvalidTopicError), -1, -1, -1, str(exc)
        except _RefusedError as exc:
            return exc.code, -1, -1, -1, str(exc)
        if len(batches) != 1:
            return errno(Errors.InvalidRecordError), -1, -1, -1, ONE_BATCH_MESSAGE
        (batch,) = batches
        first_base = -1
        append_time = -1
        marks: tuple[int, bool] | Exception | None = None
        async with self.append_locks.hold(topic, partition):
            stored, gap = self.producer_states.check(batch, topic, partition)
            if stored >= 0:  # a retry of a batch we have: answer with its offset
                first_base = stored
            elif gap is not None:
                return errno(Errors.OutOfOrderSequenceNumberError), -1, -1, -1, gap
            elif batch.record_count:
                try:
                    result, marks = await asyncio.to_thread(
                        self._append_and_marks, topic, partition, batch
                    )
                except Exception as exc:
                    return error_for(exc), -1, -1, -1, str(exc)
                first_base = result.base_offset
                append_time = result.timestamps[0] if result.timestamps else -1
                self.producer_states.appended(batch, topic, partition, result.base_offset)
        if marks is None:
            marks = await asyncio.to_thread(self._marks, topic, partition)
        if isinstance(marks, Exception):
            # the records are stored (acknowledge them): only the marks could not be read
            return errno(Errors.NoError), first_base, -1, -1, f"stored; {marks}"
        lwm, timestamp_type = marks
        return errno(Errors.NoError), first_base, append_time if timestamp_type else -1, lwm, None

    def _append_and_marks(
        self, topic: str, partition: int, batch: KafkaBatch
    ) -> tuple[Any, tuple[int, bool] | Exception]:
        """The append and what its answer reports, in one worker-thread hop. Records kept
        as bytes (``batch.framed``) are transcoded into the log's batches without a tuple
        each (``append_framed``), unless it hands them back (a record it refuses: the
        tuples' append then raises its error)."""
        result = None
        if batch.framed is not None:
            result = self.log.append_framed(topic, partition, batch.framed)  # type: ignore[attr-defined]
        if result is None:
            result = self.log.append(topic, partition, batch.log_records())
        return result, self._marks(topic, partition)

    def _marks(self, topic: str, partition: int) -> tuple[int, bool] | Exception:
        """``(low-water mark, LogAppendTime topic?)``, or what stopped reading them."""
        try:
            return self.log.offsets(topic, partition).lwm, self._append_time_topic(topic)
        except Exception as exc:
            return exc

    def _append_time_topic(self, topic: str) -> bool:
        return bool(self.log.topic_config(topic).log_append_time)
