"""What moving a log between engines shares (``eventlane migrate-log``): reading a partition
whole, and the per-topic loop around an engine's own partition copy.

Invariants: a topic that already exists on the target is refused before anything is
written (nothing is overwritten); a topic is created with ``CreateTime`` timestamps while
its records are copied (they keep the source's), and gets its own configuration back after
its last partition; what is copied is what the source holds at that time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from eventlane.errors import TopicExistsError
from eventlane.log.port import Log
from eventlane.log.record import Record
from eventlane.observability import get_logger

log = get_logger("eventlane.log")

C = TypeVar("C")


def records_of(source: Log, topic: str, partition: int, start: int) -> Iterator[Record]:
    """Every record of ``topic[partition]`` from ``start`` to the high-water mark."""
    offset = start
    while True:
        records, _ = source.read(topic, partition, offset)
        if not records:
            return
        yield from records
        offset = records[-1].offset + 1


def migrate_topics(
    source: Log,
    target: Log,
    topics: Sequence[str] | None,
    copy: Callable[[str, int], C],
    *,
    engine: str,
    progress: Callable[[C], None] | None = None,
) -> list[C]:
    """Copy ``topics`` (default: all) with ``copy(topic, partition)`` (module docstring);
    ``engine`` names the target in messages."""
    names = list(topics) if topics is not None else source.list_topics()
    for name in names:
        if target.topic_exists(name):
            raise TopicExistsError(f"topic {name!r} already exists on {engine}", topic=name)
    done: list[C] = []
    for name in names:
        desc = source.describe_topic(name)
        fill_cfg = desc.config.evolve(timestamp_type="CreateTime")
        target.create_topic(name, desc.partitions, fill_cfg)
        for p in range(desc.partitions):
            copied = copy(name, p)
            done.append(copied)
            if progress is not None:
                progress(copied)
        if fill_cfg != desc.config:
            target.alter_topic(name, config=desc.config.to_dict())
        log.info("topic migrated", topic=name, partitions=desc.partitions, to=engine)
    return done
