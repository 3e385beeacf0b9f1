"""Copy topics from any log (usually the embedded one) onto a JetStream cluster, then verify.

Offsets are preserved: a partition whose head was removed by retention starts at the same
low-water mark (the stream's first sequence is moved there), and gaps left by compaction are
kept by publishing empty filler messages on a reserved subject (``<prefix>.g``) that is
purged once the partition is copied, so every record lands at its source offset and the
high-water marks match. Timestamps, keys, values and headers are copied as they are (a
LogAppendTime topic is filled as CreateTime and switched back afterwards, so the original
times stay).

Verification reads both sides: every record the cluster holds must equal the source record
at that offset, and for a non-compacted topic every source record must be there; for a
compacted topic the latest record of every key must be (the cluster compacts at once, so it
may hold fewer superseded values than the source).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from eventlane.errors import LogError
from eventlane.log.jetstream.log import JetStreamLog
from eventlane.log.migration import migrate_topics, records_of
from eventlane.log.port import Log
from eventlane.log.record import Record
from eventlane.observability import get_logger

log = get_logger("eventlane.log")
CHUNK = 500


class PartitionCopy(NamedTuple):
    topic: str
    partition: int
    records: int
    lwm: int
    hwm: int
    fillers: int
    problems: tuple[str, ...]


def migrate(
    source: Log,
    target: JetStreamLog,
    topics: Sequence[str] | None = None,
    *,
    progress: Callable[[PartitionCopy], None] | None = None,
) -> list[PartitionCopy]:
    """Copy ``topics`` (default: all) from ``source`` to ``target`` and verify each partition.

    Refuses a topic that already exists on the target (nothing is overwritten). Writers to
    the source should be stopped first: what is copied is what is there at the time.
    """
    return migrate_topics(
        source,
        target,
        topics,
        lambda name, p: _copy_partition(source, target, name, p),
        engine="the cluster",
        progress=progress,
    )


def _copy_partition(source: Log, target: JetStreamLog, topic: str, p: int) -> PartitionCopy:
    lwm, hwm, _ = source.offsets(topic, p)
    if lwm > 0:
        target.start_at(topic, p, lwm)
    expected, count, fillers = lwm, 0, 0
    chunk: list[Record] = []

    def flush() -> None:
        nonlocal expected
        if not chunk:
            return
        result = target.append(topic, p, [(r.key, r.value, r.headers, r.timestamp) for r in chunk])
        if (result.base_offset, result.last_offset) != (chunk[0].offset, chunk[-1].offset):
            raise LogError(
                f"copied records landed at {result.base_offset}..{result.last_offset}, not"
                f" {chunk[0].offset}..{chunk[-1].offset}: is another writer using the topic?",
                topic=topic,
                partition=p,
            )
        expected = chunk[-1].offset + 1
        chunk.clear()

    for record in records_of(source, topic, p, lwm):
        if record.offset >= hwm:
            break
        if record.offset != expected + len(chunk):
            flush()
            fillers += target.fill_gap(topic, p, record.offset - expected)
            expected = record.offset
        chunk.append(record)
        count += 1
        if len(chunk) >= CHUNK:
            flush()
    flush()
    if expected < hwm:
        fillers += target.fill_gap(topic, p, hwm - expected)
    if fillers:
        target.purge_fillers(topic, p)
    problems = tuple(_verify(source, target, topic, p, lwm))
    return PartitionCopy(topic, p, count, lwm, hwm, fillers, problems)


def _verify(source: Log, target: JetStreamLog, topic: str, p: int, lwm: int) -> Iterator[str]:
    def shape(r: Record) -> tuple[object, ...]:
        return (r.offset, r.key, r.value, r.headers, r.timestamp)

    src = {r.offset: r for r in records_of(source, topic, p, lwm)}
    tgt = {r.offset: r for r in records_of(target, topic, p, target.offsets(topic, p).lwm)}
    for offset, r in tgt.items():
        if offset not in src or shape(src[offset]) != shape(r):
            yield f"offset {offset}: cluster record differs from the source"
    if target.topic_config(topic).compact:
        latest = {r.key: r.offset for r in src.values()}
        missing = [o for o in latest.values() if o not in tgt]
    else:
        missing = [o for o in src if o not in tgt]
    if missing:
        yield f"{len(missing)} source records missing on the cluster, first at {missing[0]}"
    if source.offsets(topic, p).hwm != target.offsets(topic, p).hwm:
        yield "high-water marks differ"
