"""What the model-based tests of the command path drive: a ledger aggregate whose every
event names the command that recorded it, a log engine that injects faults into appends,
and (run as a script) a child process executing a seeded stream of commands.

* ``Ledger`` (topic ``ledgers``) and ``SnapLedger`` (``snapledgers``, a snapshot every 5
  events): ``enter(tag)`` records ``Entered(tag)``; the state is the tuple of tags in order,
  so a load shows the whole history it was built from and a double effect shows twice.
* ``Ledger2`` and ``SnapLedger2``: the next release of the same aggregates (same topics),
  writing ``Entered`` v2 and reading v1 through an upcaster (:func:`model_app` ``schema=2``).
* :class:`FaultyLog`: the real embedded :class:`LogStore`, except that the appends a test
  arms fail as a partitioned cluster's can: ``stored`` (the records are stored, then
  :class:`OutcomeUnknownError`), ``lost`` (not stored, then OutcomeUnknownError), ``late``
  (OutcomeUnknownError now, stored, if its condition still holds, when the engine is next
  used: a proposal that commits after the client gave up), ``racing`` (OutcomeUnknownError
  now, stored right after the next per-key read has answered: between the command's look
  for it and its next decision) and ``unavailable``
  (:class:`LogUnavailableError`, nothing stored). ``blind`` reads: the next N per-key
  reads raise LogUnavailableError (the log cannot tell what is stored).

Child protocol (``python model_app.py '<json>'``): ``{"data", "seed", "steps", "proc",
"ids", "causes", "cache_events", "faults"}``; ``R`` once open, then it waits for a line on
stdin (so that children start together), then one line per step on stdout: ``A <op> <tag>
<aggregate> <version>`` for an acknowledged command whose last event is at ``version``,
``N <op> <tag> <aggregate>`` for one that stored nothing (an ``issue`` already done),
``S <tag> <aggregate>`` for a command or load of the old release (``schema`` 1) that met an
event of the new one (``UnknownEventTypeError``; nothing stored),
``C <tag> <aggregate>`` for a held save refused (ConcurrencyError), ``L <aggregate>
<version> <tags joined by ,>`` for a load; ``E <tag> <aggregate> <error>`` for an
OutcomeUnknownError (its effect may or may not be stored).
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import orjson
from attrs import frozen

from eventlane.app import App, Runtime
from eventlane.codec import EventRegistry
from eventlane.domain import Aggregate, DomainEvent, applies, event
from eventlane.errors import (
    AggregateNotFoundError,
    ConcurrencyError,
    LogUnavailableError,
    OutcomeUnknownError,
    SerializationError,
)
from eventlane.log import LogStore, Record
from eventlane.log.types import AppendResult

MODES = ("stored", "lost", "late", "racing", "unavailable")


@event("Entered")
@frozen
class Entered(DomainEvent):
    tag: str


class Ledger(Aggregate):
    topic: ClassVar[str] = "ledgers"
    tags: tuple[str, ...]

    def init_state(self) -> None:
        self.tags = ()

    def enter(self, tag: str) -> None:
        self.record_that(Entered(tag))

    @applies(Entered)
    def _entered(self, e: Entered) -> None:
        self.tags = (*self.tags, e.tag)


class SnapLedger(Ledger):
    topic: ClassVar[str] = "snapledgers"
    snapshot_every: ClassVar[int | None] = 5


@event("Entered", version=2)
@frozen
class EnteredV2(DomainEvent):
    """The next release's ``Entered``: it also says which schema wrote it."""

    tag: str
    schema: int = 2


class Ledger2(Aggregate):
    """The next release of :class:`Ledger` (same topic, same state), writing ``Entered``
    v2 and reading v1 through an upcaster."""

    topic: ClassVar[str] = "ledgers"
    tags: tuple[str, ...]

    def init_state(self) -> None:
        self.tags = ()

    def enter(self, tag: str) -> None:
        self.record_that(EnteredV2(tag))

    @applies(EnteredV2)
    def _entered(self, e: EnteredV2) -> None:
        self.tags = (*self.tags, e.tag)


class SnapLedger2(Ledger2):
    topic: ClassVar[str] = "snapledgers"
    snapshot_every: ClassVar[int | None] = 5


CLASSES: tuple[type[Ledger], ...] = (Ledger, SnapLedger)
RELEASES: dict[int, tuple[type[Aggregate], type[Aggregate]]] = {
    1: (Ledger, SnapLedger),
    2: (Ledger2, SnapLedger2),
}
"""Event schema -> the ledger classes of the release that writes it."""


def ledger_class(aggregate_id: str, schema: int = 1) -> Any:
    """Ids starting with ``s`` are snapshotted ledgers, the others plain ones, of the
    release writing ``schema``."""
    plain, snapshotted = RELEASES[schema]
    return snapshotted if aggregate_id.startswith("s") else plain


def _upcast_entered(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "schema": 1}


def model_app(cache_events: int, schema: int = 1) -> App:
    """The application of the release writing ``schema`` (2: with the v1 -> v2 upcaster)."""
    registry = EventRegistry()
    if schema == 2:
        registry.add_upcaster("Entered", 1, _upcast_entered)
    return App(
        "model",
        aggregates=list(RELEASES[schema]),
        partitions=2,
        cache_events=cache_events,
        registry=registry,
    )


class FaultyLog:
    """A real :class:`LogStore` whose armed appends fail (see the module docstring);
    everything else is delegated."""

    def __init__(self, path: Path | str) -> None:
        self._inner = LogStore(path)
        self.path = self._inner.path
        self.armed: list[str] = []
        """Fault modes for the next appends of event topics, first first."""
        self.blind = 0
        """Per-key reads still to fail with LogUnavailableError."""
        self.injected = 0
        self.on_fault: Callable[[], object] | None = None
        """Called after each injected fault (another writer acting meanwhile)."""
        self._late: list[tuple[Any, ...]] = []
        self._racing: list[tuple[Any, ...]] = []

    def _land_late(self, pending: list[tuple[Any, ...]] | None = None) -> None:
        pending = self._late if pending is None else pending
        while pending:
            args, kwargs = pending.pop(0)
            try:
                self._inner.append(*args, **kwargs)
            except ConcurrencyError:
                pass  # its condition no longer holds: it never lands

    def append(self, topic: str, *args: Any, **kwargs: Any) -> AppendResult:
        self._land_late()
        if not self.armed or topic.endswith(".snapshots") or "expect" not in kwargs:
            return self._inner.append(topic, *args, **kwargs)
        mode = self.armed.pop(0)
        self.injected += 1
        partition = args[0]
        if mode == "stored":
            self._inner.append(topic, *args, **kwargs)
        elif mode == "late":
            self._late.append(((topic, *args), kwargs))
        elif mode == "racing":
            self._racing.append(((topic, *args), kwargs))
        if self.on_fault is not None:
            self.on_fault()
        if mode == "unavailable":
            raise LogUnavailableError("injected: no leader", topic=topic, partition=partition)
        raise OutcomeUnknownError(f"injected: {mode}", topic=topic, partition=partition)

    def read_key(self, *args: Any, **kwargs: Any) -> list[Record]:
        self._land_late()
        if self.blind:
            self.blind -= 1
            raise LogUnavailableError("injected: read timed out", topic=args[0])
        records: list[Record] = self._inner.read_key(*args, **kwargs)
        self._land_late(self._racing)
        return records

    def key_head(self, *args: Any, **kwargs: Any) -> int | None:
        self._land_late()
        head: int | None = self._inner.key_head(*args, **kwargs)
        return head

    def close(self) -> None:
        self._land_late()
        self._land_late(self._racing)
        self._inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def open_runtime(data: Path | str, cache_events: int, schema: int = 1) -> tuple[Runtime, FaultyLog]:
    log = FaultyLog(data)
    return model_app(cache_events, schema).open(log), log  # type: ignore[arg-type]


class RawEvent(NamedTuple):
    aggregate_id: str
    version: int
    tag: str
    offset: int
    schema: int
    """The ``Entered`` schema version the record was written with."""


def raw_ledgers(data: Path | str) -> Iterator[RawEvent]:
    """Every ledger event, straight from the log's partitions in offset order (no key
    index, no codec, no cache)."""
    log = LogStore(data)
    try:
        for cls in CLASSES:
            for partition in range(log.partition_count(cls.topic)):
                offsets = log.offsets(cls.topic, partition)
                offset = offsets.lwm
                while offset < offsets.hwm:
                    records, _ = log.read(cls.topic, partition, offset, upto=offsets.hwm)
                    for record in records:
                        assert record.value is not None
                        doc = orjson.loads(record.value)
                        yield RawEvent(
                            doc["aggregate_id"],
                            doc["aggregate_version"],
                            doc["data"]["tag"],
                            record.offset,
                            doc["version"],
                        )
                    offset = records[-1].offset + 1
    finally:
        log.close()


# ---------------------------------------------------------------------- the child process
def _emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def child(args: dict[str, Any]) -> None:
    """A seeded stream of commands and loads against the shared data directory."""
    rng = random.Random(args["seed"])
    proc = args["proc"]
    schema = args.get("schema", 1)
    runtime, log = open_runtime(args["data"], args["cache_events"], schema)
    held: dict[str, Any] = {}
    _emit("R")
    sys.stdin.readline()  # all children start together
    try:
        for step in range(args["steps"]):
            aggregate_id = rng.choice(args["ids"])
            cls = ledger_class(aggregate_id, schema)
            tag = f"p{proc}-{step}"
            if args["faults"] and rng.random() < 0.1:
                log.armed.append(rng.choice(MODES))
            op = rng.choice(("execute", "execute", "issue", "save", "hold", "load"))
            try:
                if op == "execute":
                    ledger = runtime.execute(cls, aggregate_id, lambda a: a.enter(tag), create=True)
                    _emit(f"A execute {tag} {aggregate_id} {ledger.version}")
                elif op == "issue":
                    cause = rng.choice(args["causes"])
                    tag = f"{cause}@{aggregate_id}"
                    written = runtime.issue(
                        cls, aggregate_id, lambda a: a.enter(tag), caused_by=cause
                    )
                    if written:
                        _emit(f"A issue {tag} {aggregate_id} {len(written)}")
                    else:
                        _emit(f"N issue {tag} {aggregate_id}")
                elif op == "hold":
                    try:
                        held[aggregate_id] = runtime.load(cls, aggregate_id)
                    except AggregateNotFoundError:
                        held[aggregate_id] = cls(aggregate_id)
                elif op == "save":
                    ledger = held.pop(aggregate_id, None) or cls(aggregate_id)
                    ledger.enter(tag)
                    try:
                        runtime.save(ledger)
                    except ConcurrencyError:
                        _emit(f"C {tag} {aggregate_id}")
                    else:
                        _emit(f"A save {tag} {aggregate_id} {ledger.version}")
                else:
                    try:
                        ledger = runtime.load(cls, aggregate_id)
                    except AggregateNotFoundError:
                        continue
                    _emit(f"L {aggregate_id} {ledger.version} {','.join(ledger.tags)}")
            except OutcomeUnknownError as exc:
                _emit(f"E {tag} {aggregate_id} {exc}")
            except SerializationError as exc:  # an older release meets newer events
                assert schema == 1, exc
                _emit(f"S {tag} {aggregate_id}")
    finally:
        runtime.close()
        log.close()


if __name__ == "__main__":
    from eventlane.observability import configure_logging

    configure_logging("warning")  # logs on stderr; stdout carries only the protocol
    child(json.loads(sys.argv[1]))
