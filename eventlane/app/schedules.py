"""Deadlines: commands scheduled for a moment, fired once in effect by a scheduler group.

A policy (``ctx.schedule(cmd, at=..., key=...)``) or any code with a runtime
(``runtime.schedule(...)``) asks for a :class:`~eventlane.domain.Command` to run at a moment;
``cancel(key)`` withdraws it. Schedules are records of the app's topic ``<app>.schedules``
(in its namespace), keyed by the schedule's key, so every state change of one schedule lands
in one partition, in order. A record's value is JSON::

    {"state": "scheduled", "id": ID, "at": MS, "command": NAME, "data": {...},
     "caused_by": EVENT_ID | null}
    {"state": "cancelled", ...the same fields}   {"state": "fired", ..., "fired_at": MS}

The latest record of a key is its whole state (a cancelled or fired record repeats what
was scheduled: compaction, and ``read_key`` on a compacted topic, may leave only that
record); scheduling a key again replaces what it held.

**The scheduler** (:class:`Scheduler`, ``eventlane schedules run APP``) is a member of the
consumer group ``<app>.scheduler``: the partitions of the topic are shared among the
scheduler processes and move when one dies. On receiving a partition a member reads it from
the low-water mark (the topic is the whole state: nothing else is stored), then tails it;
it fires a partition's due schedules only once it has read that partition up to its
high-water mark of the moment, so a cancel written before the decision is always seen; each
poll waits at most until the next due schedule (and ``poll_interval``), so a schedule
fires at most one poll interval late while a scheduler runs, and at once after an outage.

**Exactly once in effect.** Firing runs the command with ``issue`` and the schedule's id as
the causation id: the target's stream is checked for an event caused by that id before the
command runs, so firing again (a scheduler killed between the command and its ``fired``
record, a zombie member) appends nothing. Then the ``fired`` record is appended. A schedule
fires no earlier than its moment by the scheduler's clock (epoch milliseconds; injectable,
e.g. :class:`eventlane.testing.FakeClock`).

A schedule's id is derived from its key and the event that asked for it (when asked from a
handler), so a redelivered handler schedules the same thing again, not a second one.
Cancelling after the moment may be too late: a scheduler that already read the schedule as
due fires it (as with any timer).

**A policy's writes go in batches** (:class:`ScheduleBatch`). A worker's handlers schedule
and cancel through a batch that the applier flushes before it commits the positions of the
events that asked (so a committed event's schedules are stored; a crash before the flush
redelivers the events, which ask again, with the same ids): one append per partition of the
topic, the records in the order asked. A cancel of a key scheduled in the same batch replaces
that schedule's record by its ``cancelled`` record (only that one is written: the scheduler
never saw the schedule, so nothing can have fired it); a cancel of a key the batch has not
touched is conditional on the key's last record and written at once, as :meth:`Schedules.cancel`.

Commands in schedule records are stored in clear: a command that is data carries no personal
values (:mod:`eventlane.domain.commands`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple, Protocol, TypeVar

import orjson

from eventlane.app.moments import as_of_ms
from eventlane.app.namespace import Namespace
from eventlane.codec.commands import CommandCodec
from eventlane.consumer.group import GroupConsumer
from eventlane.domain import Aggregate
from eventlane.domain.commands import Command
from eventlane.errors import ConcurrencyError, ConfigError, FrameworkError
from eventlane.log import Expect, KeyedLog, Log, Record, RecordMetadata, TopicPartition
from eventlane.log.partitioner import partition_for_key
from eventlane.observability import get_logger
from eventlane.projection.lifeline import worker_client_id


class Runtime(Protocol):
    """What schedules need of :class:`eventlane.app.Runtime` (named here, not imported:
    the runtime builds on this module)."""

    @property
    def log(self) -> Log: ...
    @property
    def names(self) -> Namespace: ...
    @property
    def app(self) -> Any: ...
    def declared(self, cls: type[A]) -> type[A]: ...
    def issue(
        self,
        cls: type[A],
        aggregate_id: str,
        command: Callable[[A], Any],
        *,
        caused_by: Any,
        create: bool = True,
    ) -> list[RecordMetadata]: ...


__all__ = ["Entry", "ScheduleBatch", "Schedules", "Scheduler", "schedules_topic"]

log = get_logger("eventlane.schedules")

A = TypeVar("A", bound=Aggregate)

_NAMESPACE = uuid.UUID("6f1f6f55-8b3e-4a8e-9b2e-5c8d3f0a7e11")
SCHEDULE_PARTITIONS = 3
SCHEDULES_CONFIG = {"cleanup_policy": "compact"}
"""Compacted: a key's latest record (its state) is all that must be kept."""


class Entry(NamedTuple):
    """The state of one schedule key: its latest record."""

    key: str
    id: str
    state: str
    at: int
    command: str
    data: Any
    caused_by: str | None
    fired_at: int | None
    partition: int
    offset: int


def schedules_topic(runtime: Runtime) -> str:
    return runtime.names.topic(f"{runtime.app.name}.schedules")


def schedule_id(key: str, caused_by: str | None) -> str:
    """Deterministic from the key and the asking event (a fresh one without an event)."""
    if caused_by is None:
        return str(uuid.uuid4())
    return str(uuid.uuid5(_NAMESPACE, f"{caused_by}\x00{key}"))


def fold(entries: dict[str, Entry], record: Record) -> None:
    """Apply one record of the topic to ``entries`` (key -> latest state)."""
    if record.key is None or record.value is None:
        return
    key = record.key.decode()
    body = orjson.loads(record.value)
    state = body["state"]
    if state == "scheduled":
        entries[key] = _entry(key, body, record)
        return
    current = entries.get(key)
    if (current is None or current.id != body["id"]) and "at" in body:
        current = _entry(key, body, record)  # the key's last record alone (compacted)
    if current is None or current.id != body["id"]:
        return  # a cancel or fire of a schedule the key no longer holds
    entries[key] = current._replace(
        state=state, fired_at=body.get("fired_at"), offset=record.offset
    )


def _entry(key: str, body: dict[str, Any], record: Record) -> Entry:
    return Entry(
        key,
        body["id"],
        body["state"],
        int(body["at"]),
        body["command"],
        body["data"],
        body.get("caused_by"),
        body.get("fired_at"),
        record.partition,
        record.offset,
    )


def _body(entry: Entry) -> dict[str, Any]:
    """What a record says of the schedule ``entry`` (its state set by the caller)."""
    return {
        "state": entry.state,
        "id": entry.id,
        "at": entry.at,
        "command": entry.command,
        "data": entry.data,
        "caused_by": entry.caused_by,
    }


class Schedules:
    """Writing and listing an app's schedules (``runtime.schedules``)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.topic = schedules_topic(runtime)
        self.codec = CommandCodec(runtime.app.commands, runtime.app.configure)
        self._ready = False

    def _ensure_topic(self) -> None:
        if not self._ready:
            self.runtime.log.create_topic(
                self.topic, SCHEDULE_PARTITIONS, SCHEDULES_CONFIG, exist_ok=True
            )
            self._ready = True

    def _append(self, key: str, body: dict[str, Any], after: int | None = None) -> None:
        """Append ``body`` to ``key``; with ``after`` (an engine with keyed reads), only if
        the key's last record is still at that offset (else ConcurrencyError)."""
        self._ensure_topic()
        raw = key.encode()
        partition = partition_for_key(raw, self.runtime.log.partition_count(self.topic))
        records = [(raw, orjson.dumps(body), (), None)]
        log_ = self.runtime.log
        if after is not None and isinstance(log_, KeyedLog):
            log_.append(self.topic, partition, records, expect=Expect(raw, after))
        else:
            log_.append(self.topic, partition, records)

    def schedule(
        self,
        cmd: Command[Any],
        *,
        at: datetime | int,
        key: str,
        caused_by: str | None = None,
    ) -> str:
        """Ask for ``cmd`` to run at ``at`` (aware datetime or epoch ms); returns the
        schedule's id. ``key`` names the schedule (one per key: a new one replaces it)."""
        body = self.scheduled_body(cmd, at=at, key=key, caused_by=caused_by)
        self._append(key, body)
        return str(body["id"])

    def scheduled_body(
        self, cmd: Command[Any], *, at: datetime | int, key: str, caused_by: str | None
    ) -> dict[str, Any]:
        """The ``scheduled`` record of ``cmd`` at ``at`` under ``key`` (not written)."""
        if not isinstance(key, str) or not key:
            raise ConfigError(f"a schedule needs a non-empty key, got {key!r}")
        name, data = self.codec.encode(cmd)
        return {
            "state": "scheduled",
            "id": schedule_id(key, caused_by),
            "at": as_of_ms(at),
            "command": name,
            "data": data,
            "caused_by": caused_by,
        }

    def append_bodies(self, bodies: dict[str, dict[str, Any]]) -> None:
        """Append one record per key (unconditionally): one append per partition."""
        if not bodies:
            return
        self._ensure_topic()
        log_ = self.runtime.log
        count = log_.partition_count(self.topic)
        parts: dict[int, list[Any]] = {}
        for key, body in bodies.items():
            raw = key.encode()
            parts.setdefault(partition_for_key(raw, count), []).append(
                (raw, orjson.dumps(body), (), None)
            )
        for partition, records in parts.items():
            log_.append(self.topic, partition, records)

    def cancel(self, key: str) -> bool:
        """Withdraw the schedule ``key`` holds; False when it holds none that is pending.

        On an engine with keyed reads the cancel is appended only if the key's last record
        is still the pending schedule it read: a scheduler that fired it meanwhile (its
        ``fired`` record came first) wins, and the cancel reports False instead of marking a
        fired schedule cancelled."""
        keyed = isinstance(self.runtime.log, KeyedLog)
        while True:
            entry = self.entry(key)
            if entry is None or entry.state != "scheduled":
                return False
            try:
                self._append(
                    key, {**_body(entry), "state": "cancelled"}, entry.offset if keyed else None
                )
            except ConcurrencyError:
                continue  # another record of the key came first: decide again
            return True

    def entry(self, key: str) -> Entry | None:
        """The latest state of schedule ``key``: the key's own records (``read_key`` on an
        engine with keyed reads; else the whole topic is read)."""
        log_ = self.runtime.log
        if not log_.topic_exists(self.topic):
            return None
        if not isinstance(log_, KeyedLog):
            return self.entries().get(key)
        raw = key.encode()
        partition = partition_for_key(raw, log_.partition_count(self.topic))
        entries: dict[str, Entry] = {}
        for record in log_.read_key(self.topic, partition, raw):
            fold(entries, record)
        return entries.get(key)

    def mark_fired(self, entry: Entry, fired_at: int) -> None:
        self._append(entry.key, {**_body(entry), "state": "fired", "fired_at": fired_at})

    def entries(self) -> dict[str, Entry]:
        """Every key's latest state, read from the topic."""
        log_ = self.runtime.log
        if not log_.topic_exists(self.topic):
            return {}
        entries: dict[str, Entry] = {}
        for partition in range(log_.partition_count(self.topic)):
            self._read_partition(partition, entries)
        return entries

    def _read_partition(self, partition: int, entries: dict[str, Entry]) -> None:
        log_ = self.runtime.log
        marks = log_.offsets(self.topic, partition)
        offset = marks.lwm
        while offset < marks.hwm:
            records, _ = log_.read(self.topic, partition, offset, upto=marks.hwm)
            if not records:
                break
            for record in records:
                fold(entries, record)
            offset = records[-1].offset + 1

    def fire(self, entry: Entry, now_ms: int) -> None:
        """Run ``entry``'s command once in effect (causation: the schedule id), then record
        that it fired."""
        cmd = self.codec.decode(entry.command, entry.data)
        self.runtime.issue(
            self.runtime.declared(cmd.aggregate),
            cmd.target(),
            cmd,
            caused_by=entry.id,
            create=cmd.create,
        )
        self.mark_fired(entry, now_ms)


class ScheduleBatch:
    """The schedules and cancels a batch of a policy's handlers asked for, appended by
    :meth:`flush` (module docstring: "A policy's writes go in batches"). Thread-safe: the
    handlers of different keys run on threads.

    Invariant: for each key, the records :meth:`flush` appends say what the key's last
    request in the batch said (a later request of a key replaces an earlier one); a cancel
    this batch did not take over from its own schedule was written when it was asked."""

    def __init__(self, schedules: Schedules) -> None:
        self.schedules = schedules
        self._pending: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def schedule(
        self, cmd: Command[Any], *, at: datetime | int, key: str, caused_by: str | None = None
    ) -> str:
        body = self.schedules.scheduled_body(cmd, at=at, key=key, caused_by=caused_by)
        with self._lock:
            self._pending.pop(key, None)  # the key's records keep the order asked
            self._pending[key] = body
        return str(body["id"])

    def cancel(self, key: str) -> bool:
        """Withdraw ``key``'s schedule: the one this batch holds, else the stored one."""
        with self._lock:
            body = self._pending.get(key)
            if body is not None:
                if body["state"] != "scheduled":
                    return False
                self._pending[key] = {**body, "state": "cancelled"}
                return True
        return self.schedules.cancel(key)

    def flush(self) -> None:
        """Append what the batch holds (one append per partition); on an error what was
        not appended stays, to be appended by the next flush."""
        with self._lock:
            pending, self._pending = self._pending, {}
        try:
            self.schedules.append_bodies(pending)
        except BaseException:
            with self._lock:  # rewritten whole: a record appended twice says the same
                self._pending = {**pending, **self._pending}
            raise


def scheduler_group(runtime: Runtime) -> str:
    """The consumer group of ``runtime``'s app's schedulers."""
    return runtime.names.group(f"{runtime.app.name}.scheduler")


class Scheduler:
    """A member of the app's scheduler group firing due schedules (module docstring)."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        clock: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        poll_interval: float = 0.5,
        session_timeout_ms: int = 10_000,
    ) -> None:
        self.runtime = runtime
        self.schedules = Schedules(runtime)
        self.schedules._ensure_topic()
        self.clock = clock
        self.poll_interval = poll_interval
        self.entries: dict[TopicPartition, dict[str, Entry]] = {}
        self.fired = 0
        self._stop = False
        self.consumer = GroupConsumer(
            runtime.log,
            group_id=scheduler_group(runtime),
            topics=[self.schedules.topic],
            client_id=worker_client_id(),  # a supervisor's tag: see projection.runner
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=max(100, session_timeout_ms // 10),
            on_assigned=self._assigned,
            on_revoked=self._dropped,
            on_lost=self._dropped,
        )

    def _assigned(self, partitions: Any) -> None:
        for tp in partitions:
            self.entries[TopicPartition(*tp)] = {}
            self.consumer.seek_to_beginning(TopicPartition(*tp))

    def _dropped(self, partitions: Any) -> None:
        for tp in partitions:
            self.entries.pop(TopicPartition(*tp), None)

    def _now_ms(self) -> int:
        return int(self.clock())

    def _next_due_ms(self) -> int | None:
        due = [
            e.at for part in self.entries.values() for e in part.values() if e.state == "scheduled"
        ]
        return min(due) if due else None

    def run_once(self) -> int:
        """Poll (at most until the next due schedule), fold, fire what is due; returns the
        number fired."""
        wait = self.poll_interval
        nxt = self._next_due_ms()
        if nxt is not None:
            wait = max(0.0, min(wait, (nxt - self._now_ms()) / 1000))
        for record in self.consumer.poll(wait):
            part = self.entries.setdefault(TopicPartition(record.topic, record.partition), {})
            fold(part, record)
        fired = 0
        now = self._now_ms()
        for tp, part in list(self.entries.items()):
            if not self._caught_up(tp):
                continue  # a later record (a cancel, a new moment) may change what is due
            for entry in sorted(part.values(), key=lambda e: e.at):
                if entry.state != "scheduled" or entry.at > now:
                    continue
                if not self.consumer.owns(tp):
                    break
                try:
                    self.schedules.fire(entry, now)
                except FrameworkError as exc:
                    log.warning(
                        "schedule not fired; will retry",
                        key=entry.key,
                        command=entry.command,
                        error=str(exc),
                        topic=self.schedules.topic,
                        partition=tp.partition,
                        offset=entry.offset,
                    )
                    continue
                part[entry.key] = entry._replace(state="fired", fired_at=now)
                fired += 1
        self.fired += fired
        return fired

    def _caught_up(self, tp: TopicPartition) -> bool:
        """Whether every record of ``tp`` written before now has been folded: only then is
        the state of its schedules known (a cancel appended after the schedule it cancels
        must be seen before the schedule fires)."""
        if not self.consumer.owns(tp):
            return False
        hwm = self.runtime.log.offsets(tp.topic, tp.partition).hwm
        return self.consumer.position(tp) >= hwm

    def run(self, *, until: Callable[[], bool] | None = None) -> None:
        while not self._stop and (until is None or not until()):
            self.run_once()

    def stop(self) -> None:
        self._stop = True

    def close(self) -> None:
        self.consumer.close(autocommit=False)
