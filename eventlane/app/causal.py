"""Causal waits: until a projection reflects a write *and everything policies did because
of it*.

A write's :class:`~eventlane.log.position.Position` names the records it appended. A
policy (a projector with ``policy = True``, issuing commands with ``ctx.issue``) stamps the
events of each command it issues with the triggering event's id as their causation id.
:func:`causal_plan` follows those ids:

1. the *frontier* is the written records;
2. every policy consuming a frontier record's topic is waited for until it has handled it
   (its committed position is past the record): a policy commits an event's position only
   after the commands it issued for the event are stored, so after this wait everything it
   did because of the frontier is in the log;
3. the app's event topics are searched for records whose causation id is a frontier
   record's event id, from the frontier's earliest timestamp (less ``CLOCK_SLACK_MS``: a
   record caused by another is appended after it) to the end of each partition; they are
   the next frontier, and their positions join the target;
4. when the frontier is empty, the projection is waited for until it reaches the target.

Cost: step 3 reads each partition of the app's event topics from the moment of the write
on, once per hop: meant for a web request's wait just after its own write, not for a
token from an hour ago. A policy that is not running makes the wait time out, naming it.

The plan is sans I/O, like the command path (:mod:`eventlane.store.command`): it yields
:class:`~eventlane.store.steps.Call` (blocking reads) and :class:`Reach` (wait until a
read model reaches offsets); :func:`drive_causal` runs it on a thread and the async
runtime's driver on an event loop.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterable, Mapping
from typing import Any, NamedTuple, Protocol

from eventlane import _plans
from eventlane.codec import HEADER_CAUSATION_ID, HEADER_EVENT_ID
from eventlane.errors import InvalidPositionError, WaitTimeoutError
from eventlane.log import Log, Record, RecordMetadata, TopicPartition
from eventlane.log.position import Position
from eventlane.projection.status import wait_for_offsets
from eventlane.projection.store import Location
from eventlane.store.steps import Call


class Runtime(Protocol):
    """What a causal wait needs of the runtime (:class:`eventlane.Runtime`)."""

    @property
    def log(self) -> Log: ...
    @property
    def app(self) -> Any: ...
    @property
    def names(self) -> Any: ...
    def topics_of(self, projector: str) -> tuple[str, ...]: ...
    def readmodel_location(self, projector: str) -> Location: ...


CLOCK_SLACK_MS = 2_000
"""How far before the frontier's earliest timestamp the search for caused records starts
(clock steps between the hosts that append; on one host timestamps do not go back)."""
MAX_HOPS = 64
"""Causal chains longer than this are reported as an error (a policy loop)."""


class Reach(NamedTuple):
    """An I/O request of a causal wait: wait until the read model at ``path`` has applied
    everything below ``offsets``, until ``deadline`` (``time.monotonic()``); the answer is
    whether it did."""

    path: Location
    offsets: Mapping[TopicPartition, int]
    deadline: float


CausalStep = Call | Reach


def _header(record: Record, name: str) -> str | None:
    for key, raw in record.headers:
        if key == name and raw is not None:
            return raw.decode(errors="replace")
    return None


def check_position(log: Log, position: Mapping[TopicPartition, int]) -> None:
    """:class:`~eventlane.errors.InvalidPositionError` when ``position`` names a topic, a
    partition or an offset this log never had (a forged or damaged token: no wait could
    ever reach it). A few cheap calls: the topics' metadata, the partitions' marks."""
    counts: dict[str, int] = {}
    for tp, end in position.items():
        if tp.topic not in counts:
            counts[tp.topic] = log.partition_count(tp.topic) if log.topic_exists(tp.topic) else 0
        count = counts[tp.topic]
        if count == 0:
            raise InvalidPositionError(
                f"position names topic {tp.topic!r}, which this log does not have",
                topic=tp.topic,
            )
        if tp.partition >= count:
            raise InvalidPositionError(
                f"position names partition {tp.partition} of {tp.topic!r}, which has {count}",
                topic=tp.topic,
                partition=tp.partition,
            )
        hwm = log.offsets(tp.topic, tp.partition).hwm
        if end > hwm:
            raise InvalidPositionError(
                f"position names offset {end} of {tp.topic}-{tp.partition}, beyond its"
                f" high-water mark {hwm}: not a position this log has written",
                topic=tp.topic,
                partition=tp.partition,
                offset=end,
            )


def read_written(log: Log, written: Mapping[TopicPartition, range]) -> list[Record]:
    """The records at the offsets ``written`` (what a position names) that the log still
    holds (retention may have removed the first ones)."""
    out: list[Record] = []
    for tp, offsets in written.items():
        lwm = log.offsets(tp.topic, tp.partition).lwm
        offset, cursor = max(offsets.start, lwm), None
        while offset < offsets.stop:
            records, cursor = log.read(tp.topic, tp.partition, offset, cursor=cursor)
            records = [r for r in records if r.offset < offsets.stop]
            if not records:
                break
            out.extend(records)
            offset = records[-1].offset + 1
    return out


def find_caused(log: Log, topics: Iterable[str], ids: set[str], since_ms: int) -> list[Record]:
    """The records of ``topics`` stamped at or after ``since_ms`` whose causation id is in
    ``ids``."""
    out: list[Record] = []
    for topic in topics:
        if not log.topic_exists(topic):
            continue
        for partition in range(log.partition_count(topic)):
            start = log.offset_for_time(topic, partition, since_ms)
            if start is None:
                continue
            hwm = log.offsets(topic, partition).hwm
            offset, cursor = start, None
            while offset < hwm:
                records, cursor = log.read(topic, partition, offset, cursor=cursor, upto=hwm)
                if not records:
                    break
                out.extend(r for r in records if _header(r, HEADER_CAUSATION_ID) in ids)
                offset = records[-1].offset + 1
    return out


def _metadata(records: Iterable[Record]) -> list[RecordMetadata]:
    return [RecordMetadata(r.topic, r.partition, r.offset, r.timestamp) for r in records]


def causal_plan(
    runtime: Runtime, projector: str, position: Position, timeout: float
) -> Generator[CausalStep, Any, Position]:
    """Wait (as I/O requests) until ``projector`` reflects ``position``'s records and all
    that policies did because of them (module docstring). Returns the position reached;
    :class:`~eventlane.errors.WaitTimeoutError` names what was not reached in time."""
    deadline = time.monotonic() + timeout
    log = runtime.log
    policies = [
        (name, set(runtime.topics_of(name)), runtime.readmodel_location(name))
        for name, cls in runtime.app.projectors.items()
        if getattr(cls, "policy", False)
    ]
    topics = [runtime.names.aggregate_topic(cls) for cls in runtime.app.aggregates]
    target = Position(position)
    yield Call(check_position, (log, position))
    frontier: list[Record] = yield Call(read_written, (log, position.written()))
    for _hop in range(MAX_HOPS):
        if not frontier:
            break
        for name, consumed, path in policies:
            wanted: dict[TopicPartition, int] = {}
            for r in frontier:
                if r.topic in consumed:
                    tp = TopicPartition(r.topic, r.partition)
                    wanted[tp] = max(wanted.get(tp, 0), r.offset + 1)
            if wanted and not (yield Reach(path, wanted, deadline)):
                raise WaitTimeoutError(
                    f"policy {name!r} has not handled the records at {Position(wanted).token}"
                    f" within {timeout:g} s (is it running? `eventlane project status`)",
                    topic=frontier[0].topic,
                    partition=frontier[0].partition,
                    offset=frontier[0].offset,
                )
        ids = {i for i in (_header(r, HEADER_EVENT_ID) for r in frontier) if i is not None}
        since = min(r.timestamp for r in frontier) - CLOCK_SLACK_MS
        frontier = yield Call(find_caused, (log, topics, ids, since))
        target = target | Position.of(_metadata(frontier))
    else:
        raise WaitTimeoutError(
            f"the causal chain of {position.token} is longer than {MAX_HOPS} hops (a policy loop?)"
        )
    consumed = set(runtime.topics_of(projector))
    wanted = {tp: off for tp, off in target.items() if tp.topic in consumed}
    if not (yield Reach(runtime.readmodel_location(projector), wanted, deadline)):
        raise WaitTimeoutError(
            f"projection {projector!r} has not reached {Position(wanted).token} within"
            f" {timeout:g} s"
        )
    return target


def drive_causal(plan: Generator[CausalStep, Any, Position], log: Log) -> Position:
    """Run a causal plan on the calling thread."""

    def perform(step: CausalStep) -> Any:
        if isinstance(step, Reach):
            remaining = max(0.0, step.deadline - time.monotonic())
            return not step.offsets or wait_for_offsets(log, step.path, step.offsets, remaining)
        return step.fn(*step.args)

    return _plans.drive(plan, perform)


def as_position(written: Position | str | Iterable[RecordMetadata] | Mapping[Any, int]) -> Position:
    """A position from what a write returned, a token, or ``{partition: next offset}``."""
    if isinstance(written, Position):
        return written
    if isinstance(written, str):
        return Position.parse(written)
    if isinstance(written, Mapping):
        return Position(written)
    return Position.of(written)
