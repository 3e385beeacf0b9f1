"""Copy topics from any log (the embedded one, a JetStream cluster) onto Kafka, then verify.

What Kafka keeps and what it cannot:

* **Offsets up to the first compaction gap are preserved.** A new Kafka partition starts at
  offset 0; a source partition whose head was removed by retention (low-water mark ``L``)
  is recreated by appending ``L`` filler records and deleting them with Kafka's
  DeleteRecords, so the copy's low-water mark is ``L`` and every record lands at its source
  offset. An event topic (no compaction) is therefore copied offset for offset, with the
  same low- and high-water marks, and projector positions stay valid.
* **Gaps left by compaction cannot be recreated.** Kafka assigns offsets densely and offers
  no way to remove one record from the middle of a partition, so from a partition's first
  gap on the copies land below their source offsets. Each such record carries the header
  ``eventlane.source-offset`` (its source offset, decimal ASCII) and the partition's copy
  reports how many were shifted; the high-water mark is lower by the gaps' total size.
  Compacted topics (snapshots, entity state) are read by key, not by offset, which is what
  compaction promises anyway.
* Keys, values, headers and timestamps are copied as they are. A LogAppendTime topic is
  filled as CreateTime and switched back afterwards, so the original times stay.

Verification reads both sides: every record the copy holds must equal the source record at
its source offset (key, value, headers, timestamp); for a non-compacted topic every source
record must be there in order, for a compacted topic the latest record of every key (Kafka's
cleaner may already have removed superseded copies); low-water marks must match, and
high-water marks must match unless offsets were shifted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from eventlane.errors import LogError
from eventlane.log.kafka.log import KafkaLog
from eventlane.log.migration import migrate_topics, records_of
from eventlane.log.port import Log
from eventlane.log.record import Record
from eventlane.log.types import RecordTuple
from eventlane.observability import get_logger

log = get_logger("eventlane.log")
CHUNK = 1000
SOURCE_OFFSET = "eventlane.source-offset"
"""The header a copied record carries when Kafka could not give it its source offset."""
FILLER: RecordTuple = (b"eventlane.filler", b"", (), None)


class KafkaCopy(NamedTuple):
    """One partition's copy: ``shifted`` records landed below their source offsets."""

    topic: str
    partition: int
    records: int
    lwm: int
    hwm: int
    shifted: int
    problems: tuple[str, ...]

    @property
    def kept(self) -> str:
        """What the CLI prints about offsets."""
        if not self.shifted:
            return "offsets kept"
        return f"offsets kept up to the first gap, {self.shifted} shifted (header {SOURCE_OFFSET})"


def migrate(
    source: Log,
    target: KafkaLog,
    topics: Sequence[str] | None = None,
    *,
    progress: Callable[[KafkaCopy], None] | None = None,
) -> list[KafkaCopy]:
    """Copy ``topics`` (default: all) from ``source`` to ``target`` and verify each partition.

    Refuses a topic that already exists on the target (nothing is overwritten). Writers to
    the source should be stopped first: what is copied is what is there at the time.
    """
    return migrate_topics(
        source,
        target,
        topics,
        lambda name, p: _copy_partition(source, target, name, p),
        engine="Kafka",
        progress=progress,
    )


def _copy_partition(source: Log, target: KafkaLog, topic: str, p: int) -> KafkaCopy:
    lwm, hwm, _ = source.offsets(topic, p)
    left = lwm
    while left:  # recreate the head retention removed: fillers, then DeleteRecords
        n = min(left, 10 * CHUNK)
        target.append(topic, p, [FILLER] * n)
        left -= n
    if lwm:
        target.delete_records(topic, p, lwm)
    count = shifted = 0
    chunk: list[RecordTuple] = []
    base = nxt = lwm  # the Kafka offsets the chunk's first and the next record get

    def flush() -> None:
        if not chunk:
            return
        result = target.append(topic, p, chunk)
        if result.base_offset != base:
            raise LogError(
                f"copied records landed at {result.base_offset}, not {base}: is another"
                " writer using the topic?",
                topic=topic,
                partition=p,
            )
        chunk.clear()

    for r in records_of(source, topic, p, lwm):
        if r.offset >= hwm:
            break
        headers = r.headers
        if r.offset != nxt:
            headers = (*headers, (SOURCE_OFFSET, str(r.offset).encode()))
            shifted += 1
        if not chunk:
            base = nxt
        chunk.append((r.key, r.value, headers, r.timestamp))
        nxt += 1
        count += 1
        if len(chunk) >= CHUNK:
            flush()
    flush()
    problems = tuple(verify_partition(source, target, topic, p))
    return KafkaCopy(topic, p, count, lwm, hwm, shifted, problems)


def source_offset(r: Record) -> int:
    """The offset a copied record had in the source log."""
    for name, value in r.headers:
        if name == SOURCE_OFFSET and value is not None:
            return int(value)
    return r.offset


def verify_partition(source: Log, target: KafkaLog, topic: str, p: int) -> Iterator[str]:
    """Problems found comparing ``topic[p]`` on Kafka with the source (none: a true copy)."""

    def shape(r: Record) -> tuple[object, ...]:
        headers = tuple(h for h in r.headers if h[0] != SOURCE_OFFSET)
        return (source_offset(r), r.key, r.value, headers, r.timestamp)

    slwm, shwm, _ = source.offsets(topic, p)
    tlwm, thwm, _ = target.offsets(topic, p)
    src = {r.offset: r for r in records_of(source, topic, p, slwm) if r.offset < shwm}
    copies = list(records_of(target, topic, p, tlwm))
    tgt = [shape(r) for r in copies]
    for got in tgt:
        want = src.get(int(got[0]))  # type: ignore[call-overload]
        if want is None or shape(want) != got:
            yield f"source offset {got[0]}: the Kafka record differs from the source"
    order = [int(s[0]) for s in tgt]  # type: ignore[call-overload]
    if target.topic_config(topic).compact:
        wanted = set({r.key: r.offset for r in src.values()}.values())
    else:
        wanted = set(src)
    if order != sorted(set(order)):
        yield "records out of order (or twice) on Kafka"
    missing = sorted(wanted - set(order))
    if missing:
        yield f"{len(missing)} source records missing on Kafka, first at {missing[0]}"
    if tlwm != slwm:
        yield f"low-water marks differ: source {slwm}, Kafka {tlwm}"
    shifted = any(source_offset(r) != r.offset for r in copies)
    if not shifted and src and thwm != shwm:
        yield f"high-water marks differ: source {shwm}, Kafka {thwm}"
