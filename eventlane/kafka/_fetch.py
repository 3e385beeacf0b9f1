"""Fetch and ListOffsets: the log's records out as Kafka record batches.

Invariant: a fetch never returns records at or above the high-water mark; a fetch below the
low-water mark or above the high-water mark is OFFSET_OUT_OF_RANGE; at least one batch is
returned when any is there (as Kafka returns an oversized first batch).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kafka.protocol.consumer import (
    FetchResponse,
    ListOffsetsResponse,
)

from eventlane.errors import (
    CorruptRecordError,
    OffsetOutOfRangeError,
)
from eventlane.kafka._base import BrokerState, check_topic_name
from eventlane.kafka.codes import Errors, errno, error_for
from eventlane.kafka.protocol import connection_open
from eventlane.kafka.records import (
    FROM_STORED,
    encode_batch,
    encode_stored,
)


class FetchApis(BrokerState):
    """Fetch and ListOffsets (the module docstring)."""

    # -- fetch -----------------------------------------------------------------------------
    max_fetch_wait_s: float

    async def fetch(self, request: Any) -> Any:
        """Kafka's long poll: answers once ``min_bytes`` are there or ``max_wait_ms`` has
        passed, waiting at most ``max_fetch_wait_s`` (a client that asks for days gets an
        empty answer then, and asks again) and no longer than its connection stays open (a
        wait for a client that is gone would hold a worker thread and re-read on every
        append until its deadline)."""
        wait_s = min(max(request.max_wait_ms, 0) / 1000.0, self.max_fetch_wait_s)
        deadline = time.monotonic() + wait_s
        still_open = connection_open.get()
        while True:
            seen = self.log.wait_seq()
            response, size = await asyncio.to_thread(self._fetch_once, request)
            remaining = deadline - time.monotonic()
            if size >= max(request.min_bytes, 1) or remaining <= 0 or not still_open():
                return response
            await asyncio.to_thread(self.log.wait, seen, min(remaining, 0.5))

    def _fetch_once(self, request: Any) -> tuple[Any, int]:
        TopicR = FetchResponse.FetchableTopicResponse
        PartR = TopicR.PartitionData
        budget = request.max_bytes if request.max_bytes > 0 else 0x7FFFFFFF
        total = 0
        topics = []
        for topic in request.topics:
            parts = []
            for p in topic.partitions:
                code, hwm, lwm = errno(Errors.NoError), -1, -1
                blob: bytes | bytearray = b""
                try:
                    marks = self.log.offsets(check_topic_name(topic.topic), p.partition)
                    hwm, lwm = marks.hwm, marks.lwm
                    if p.fetch_offset < lwm or p.fetch_offset > hwm:
                        raise OffsetOutOfRangeError(
                            f"offset {p.fetch_offset} outside [{lwm}, {hwm}]",
                            topic=topic.topic,
                            partition=p.partition,
                            offset=p.fetch_offset,
                            lwm=lwm,
                            leo=marks.leo,
                        )
                    limit = min(p.partition_max_bytes, max(budget - total, 0))
                    if limit > 0 and p.fetch_offset < hwm:
                        blob = self._read_batches(
                            topic.topic, p.partition, p.fetch_offset, hwm, limit, total == 0
                        )
                        total += len(blob)
                except Exception as exc:
                    code = error_for(exc)
                parts.append(
                    PartR(
                        partition_index=p.partition,
                        error_code=code,
                        high_watermark=hwm,
                        last_stable_offset=hwm,
                        log_start_offset=lwm,
                        aborted_transactions=None,
                        preferred_read_replica=-1,
                        records=blob,
                    )
                )
            topics.append(TopicR(topic=topic.topic, partitions=parts))
        return (
            FetchResponse(
                throttle_time_ms=0,
                error_code=0,
                session_id=0,
                responses=topics,
                node_endpoints=[],
            ),
            total,
        )

    def _read_batches(
        self, topic: str, partition: int, offset: int, hwm: int, limit: int, first: bool
    ) -> bytes | bytearray:
        """Kafka record batches for the log's records from ``offset`` (at most ``limit``
        bytes, but at least one batch when ``first``, as Kafka returns an oversized first
        batch rather than nothing)."""
        # Kafka's framing is smaller than the log's (varints against fixed-width fields), so
        # what the log read within ``limit`` bytes stays within it once re-framed.
        read_batches = getattr(self.log, "read_batches", None) if FROM_STORED else None
        if read_batches is None:  # another engine, or no C extension: through records
            records, _ = self.log.read(topic, partition, offset, max_bytes=max(limit, 1), upto=hwm)
            return encode_batch(records) if records else b""
        batches = read_batches(topic, partition, offset, max_bytes=max(limit, 1), upto=hwm)
        if not batches:
            return b""
        try:
            blob, _ = encode_stored(batches, offset, hwm)
        except ValueError as exc:  # CRC-checked, yet malformed: written so, never read so
            raise CorruptRecordError(
                str(exc), topic=topic, partition=partition, offset=offset
            ) from None
        return blob

    # -- offsets ---------------------------------------------------------------------------
    async def list_offsets(self, request: Any) -> Any:
        TopicR = ListOffsetsResponse.ListOffsetsTopicResponse
        PartR = TopicR.ListOffsetsPartitionResponse
        topics = []
        for topic in request.topics:
            parts = []
            for p in topic.partitions:
                code, offset, ts = errno(Errors.NoError), -1, -1
                try:
                    offset, ts = await asyncio.to_thread(
                        self._offset_for,
                        check_topic_name(topic.name),
                        p.partition_index,
                        p.timestamp,
                    )
                except Exception as exc:
                    code = error_for(exc)
                parts.append(
                    PartR(
                        partition_index=p.partition_index,
                        error_code=code,
                        old_style_offsets=[offset] if offset >= 0 else [],
                        timestamp=ts,
                        offset=offset,
                        leader_epoch=0,
                    )
                )
            topics.append(TopicR(name=topic.name, partitions=parts))
        return ListOffsetsResponse(throttle_time_ms=0, topics=topics)

    def _offset_for(self, topic: str, partition: int, timestamp: int) -> tuple[int, int]:
        marks = self.log.offsets(topic, partition)
        if timestamp == -2:
            return marks.lwm, -1
        if timestamp in (-1, -3):  # latest (-3: max timestamp, answered as latest)
            return marks.hwm, -1
        found = self.log.offset_for_time(topic, partition, timestamp)
        if found is None:
            return -1, -1
        records, _ = self.log.read(topic, partition, found, max_bytes=1, upto=marks.hwm)
        return found, (records[0].timestamp if records else -1)
