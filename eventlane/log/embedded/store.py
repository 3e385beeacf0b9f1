"""``LogStore``: the embedded, file-based implementation of the log port.

Data directory layout (default ``./eventlane-data``, or ``$EVENTLANE_DATA``)::

    <data>/.notify                      wake-up word shared by all processes (:mod:`.state`)
    <data>/topics/<topic>/topic.json    {"name", "partitions", "config": {...}, "created_ms"}
    <data>/topics/<topic>/<partition>/  one directory per partition (:mod:`.partition`)
    <data>/relay.*                      the relay of conditional appends (:mod:`.relay`)

Any number of processes may open the same data directory at once: appends to a partition
are serialized by its file lock, and readers see them as soon as they are durable.
Topic creation and deletion are atomic renames of a whole topic directory. Changes of an
existing topic's ``topic.json`` (``alter_topic``, and ``delete_topic``) are read-modify-writes
serialized across processes by ``<data>/topics/.meta.lock``: the change is computed from the
file as read under the lock and replaces it atomically, so no acknowledged change is lost.

One concept at ~700 lines: the data directory's topics (metadata, creation, alteration,
deletion across processes) and the port's methods over them; partitions, per-key state and
maintenance live in their own modules.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, TypeVar

import orjson

from eventlane._locks import FileLock
from eventlane.errors import (
    ConfigError,
    CorruptRecordError,
    DataLossError,
    FrameworkError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from eventlane.log.config import (
    TopicConfig,
    altered_partitions,
    new_topic_config,
    warn_partitions_increased,
)
from eventlane.log.embedded.partition import GroupedAppend, Partition
from eventlane.log.embedded.retention import apply_retention
from eventlane.log.embedded.state import Notifier, PartitionState
from eventlane.log.files import fsync_dir, write_atomic
from eventlane.log.local import DEFAULT_DATA_DIR as DEFAULT_DATA_DIR  # noqa: PLC0414
from eventlane.log.local import LocalDir, default_data_dir
from eventlane.log.names import check_internal_policy, topic_dir, validate_topic_name
from eventlane.log.record import Record
from eventlane.log.types import (
    AppendResult,
    Clock,
    CompactionReport,
    Cursor,
    Expect,
    FramedRecords,
    KeyIndexReport,
    PartitionDescription,
    Progress,
    RecordTuple,
    RetentionReport,
    StoredBatch,
    wall_clock_ms,
)
from eventlane.log.types import PartitionOffsets as PartitionOffsets  # noqa: PLC0414 (re-exported)
from eventlane.log.types import TopicDescription as TopicDescription  # noqa: PLC0414 (re-exported)
from eventlane.metrics import M
from eventlane.observability import get_logger

if TYPE_CHECKING:  # imported on first use: a command that only lists topics needs neither
    from eventlane.log.embedded.aio import AsyncLogStore
    from eventlane.log.embedded.cleaner import LogCleaner
    from eventlane.log.embedded.keys import KeyIndexes
    from eventlane.log.embedded.relay import Relay

log = get_logger("eventlane.log")

R = TypeVar("R")

_META_TTL_S = 0.5


MaintenanceProgress = Progress
"""``progress(done, total, partition)`` (the port's :class:`~eventlane.log.types.Progress`)."""


def _mark_deleted(directory: Path) -> None:
    """Mark every partition of a topic about to be deleted, under its append lock, so that
    processes holding it open refuse further appends and reads (:mod:`.state`, ``deleted``)."""
    for entry in directory.iterdir():
        state_path = entry / "state"
        if not entry.name.isdigit() or not state_path.exists():
            continue  # never opened: no process can hold it
        lock = FileLock(entry / "lock")
        try:
            with lock:
                state = PartitionState(state_path)
                state.mark_deleted()
                state.close()
        finally:
            lock.close()


def _remove_tree(path: Path) -> None:
    """``shutil.rmtree`` ignoring errors (imported here: only create and delete need it)."""
    import shutil  # noqa: PLC0415 - start-up time of every command that opens a log

    shutil.rmtree(path, ignore_errors=True)


class _TopicMeta(NamedTuple):
    partitions: int
    config: TopicConfig
    checked: float
    stamp: tuple[int, int, int]
    """``(inode, mtime_ns, size)`` of the ``topic.json`` read: every change is a rename of a
    new file, so a change within the file system's timestamp granularity is still seen."""


_NOT_YET = AssertionError("no outcome")


def _short_record(
    records: Sequence[RecordTuple], exc: IndexError, topic: str, partition: int
) -> Exception:
    """The error of an append whose ``IndexError`` may come from a record shorter than 4
    fields (checked only on failure), else ``exc`` itself."""
    bad = next((i for i, r in enumerate(records) if len(r) != 4), None)
    if bad is None or isinstance(exc, FrameworkError):
        return exc
    return InvalidRecordError(
        f"record {bad} is not a 4-tuple (key: bytes|None, value: bytes|None, headers, "
        f"timestamp: int|None): {records[bad]!r:.200}",
        topic=topic,
        partition=partition,
    )


class LogStore:
    """The embedded log: topics of partitions of segment files in one data directory."""

    def __init__(self, path: str | Path | None = None, *, clock: Clock = wall_clock_ms) -> None:
        self.path = Path(path) if path is not None else default_data_dir()
        self.topics_root = self.path / "topics"
        self.topics_root.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        self.notifier = Notifier(self.path / ".notify")
        self._keys: KeyIndexes | None = None
        self._relay: Relay | None = None
        self._relay_allowed = True
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._meta: dict[str, _TopicMeta] = {}
        self._lock = threading.Lock()
        self._meta_lock = FileLock(self.topics_root / ".meta.lock")
        """Serializes changes of existing topics' ``topic.json`` (module docstring)."""
        self._closed = False
        self._cleaner: LogCleaner | None = None

    @property
    def keys(self) -> KeyIndexes:
        """The per-key state (key indexes) of this log, set up on first use."""
        keys = self._keys
        if keys is None:
            from eventlane.log.embedded.keys import KeyIndexes  # noqa: PLC0415 - first use

            with self._lock:
                if self._keys is None:
                    self._keys = KeyIndexes(self, self.local.key_indexes())
                keys = self._keys
        return keys

    @property
    def local(self) -> LocalDir:
        """The data directory: read models, groups and key indexes live beside the topics."""
        return LocalDir(self.path)

    # ------------------------------------------------------------------ topics
    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        config: TopicConfig | Mapping[str, object] | None = None,
        *,
        exist_ok: bool = False,
    ) -> TopicDescription:
        """Create a topic atomically; a bad name or config creates nothing."""
        cfg = new_topic_config(name, partitions, config)
        check_internal_policy(name, cfg.cleanup_policy)
        final = topic_dir(self.topics_root, name)
        if final.exists():
            if exist_ok:
                return self.describe_topic(name)
            raise TopicExistsError(f"topic {name!r} already exists", topic=name)
        staging = self.topics_root / f".creating-{os.urandom(16).hex()}"
        staging.mkdir()
        try:
            for p in range(partitions):
                (staging / str(p)).mkdir()
            self._write_meta(staging, name, partitions, cfg)
            fsync_dir(staging)
            try:
                os.rename(staging, final)
            except OSError as exc:
                if exist_ok and final.exists():
                    return self.describe_topic(name)
                raise TopicExistsError(f"topic {name!r} already exists", topic=name) from exc
        finally:
            if staging.exists():
                _remove_tree(staging)
        fsync_dir(self.topics_root)
        log.info(
            "topic created", topic=name, partitions=partitions, cleanup_policy=cfg.cleanup_policy
        )
        return self.describe_topic(name)

    def _write_meta(self, directory: Path, name: str, partitions: int, cfg: TopicConfig) -> None:
        body = {
            "name": name,
            "partitions": partitions,
            "config": cfg.to_dict(),
            "created_ms": self.clock(),
        }
        write_atomic(directory / "topic.json", orjson.dumps(body, option=orjson.OPT_INDENT_2))

    def list_topics(self) -> list[str]:
        return sorted(
            entry.name
            for entry in self.topics_root.iterdir()
            if not entry.name.startswith(".") and (entry / "topic.json").exists()
        )

    def topic_exists(self, name: str) -> bool:
        validate_topic_name(name)
        return (topic_dir(self.topics_root, name) / "topic.json").exists()

    def _topic_meta(self, name: str, *, fresh: bool = False) -> _TopicMeta:
        now = time.monotonic()
        try:
            meta = self._meta.get(name)
        except TypeError:  # unhashable, so not a name: say so
            validate_topic_name(name)
            raise
        if meta is not None and not fresh and now - meta.checked < _META_TTL_S:
            return meta
        path = topic_dir(self.topics_root, name) / "topic.json"
        try:
            st = path.stat()
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if meta is not None and stamp == meta.stamp:
                meta = meta._replace(checked=now)
            else:
                body = orjson.loads(path.read_bytes())
                meta = _TopicMeta(
                    int(body["partitions"]),
                    TopicConfig.from_mapping(body["config"]),
                    now,
                    stamp,
                )
        except FileNotFoundError:
            self._meta.pop(name, None)
            raise UnknownTopicError(f"topic {name!r} does not exist", topic=name) from None
        self._meta[name] = meta
        return meta

    def partition_count(self, name: str) -> int:
        return self._topic_meta(name).partitions

    def cached_partition_count(self, name: str) -> int | None:
        """The topic's partition count if this object checked its metadata within the last
        half second (no file read), else ``None``."""
        meta = self._meta.get(name)
        if meta is None or time.monotonic() - meta.checked >= _META_TTL_S:
            return None
        return meta.partitions

    def topic_config(self, name: str) -> TopicConfig:
        return self._topic_meta(name).config

    def describe_topic(self, name: str) -> TopicDescription:
        meta = self._topic_meta(name, fresh=True)
        details = []
        for p in range(meta.partitions):
            part = self.partition(name, p)
            marks = part.offsets()
            segs = part.segments()
            details.append(
                PartitionDescription(
                    p,
                    marks.lwm,
                    marks.hwm,
                    marks.leo,
                    len(segs),
                    sum(s.size for s in segs),
                    marks.active_base,
                )
            )
        return TopicDescription(name, meta.partitions, meta.config, tuple(details))

    def alter_topic(
        self,
        name: str,
        *,
        partitions: int | None = None,
        config: Mapping[str, object] | None = None,
    ) -> TopicDescription:
        """Change config values, or increase the partition count (never decrease it).

        More partitions change key → partition placement for new records; a warning is
        logged, as Kafka warns.
        """
        # Bad arguments are refused before the lock (whose file a refused call must not
        # create); the change itself is computed again under the lock, from the file as it is.
        self._altered(name, self._topic_meta(name), partitions, config)
        with self._meta_lock:  # the read-modify-write of topic.json (module docstring)
            self._meta.pop(name, None)  # read the file as it is now, under the lock
            meta = self._topic_meta(name, fresh=True)
            count, cfg = self._altered(name, meta, partitions, config)
            if count > meta.partitions:
                warn_partitions_increased(name, meta.partitions, count)
                for p in range(meta.partitions, count):
                    (topic_dir(self.topics_root, name) / str(p)).mkdir(exist_ok=True)
            self._write_meta(topic_dir(self.topics_root, name), name, count, cfg)
            with self._lock:
                for (topic, _), part in self._partitions.items():
                    if topic == name:
                        part.config = cfg
            self._meta.pop(name, None)
        return self.describe_topic(name)

    @staticmethod
    def _altered(
        name: str,
        meta: _TopicMeta,
        partitions: int | None,
        config: Mapping[str, object] | None,
    ) -> tuple[int, TopicConfig]:
        """The partition count and config ``alter_topic`` makes of ``meta``, or its error."""
        cfg = TopicConfig.from_mapping(config or {}, base=meta.config)
        check_internal_policy(name, cfg.cleanup_policy)
        return altered_partitions(name, meta.partitions, partitions), cfg

    def delete_topic(self, name: str) -> None:
        """Delete a topic and all its records (an atomic rename, then removal)."""
        directory = topic_dir(self.topics_root, name)
        if not (directory / "topic.json").exists():  # refused before the lock's file exists
            raise UnknownTopicError(f"topic {name!r} does not exist", topic=name)
        with self._meta_lock:  # not while another process alters it (module docstring)
            if not (directory / "topic.json").exists():
                raise UnknownTopicError(f"topic {name!r} does not exist", topic=name)
            with self._lock:
                for key in [k for k in self._partitions if k[0] == name]:
                    self._partitions.pop(key).close()
            _mark_deleted(directory)
            trash = self.topics_root / f".deleted-{os.urandom(16).hex()}"
            os.rename(directory, trash)
            fsync_dir(self.topics_root)
        _remove_tree(trash)
        self._meta.pop(name, None)
        log.info("topic deleted", topic=name)

    # ------------------------------------------------------------------ partitions
    def partition(self, topic: str, partition: int) -> Partition:
        """The open partition object (opened, and recovered if needed, on first use)."""
        if isinstance(partition, bool) or not isinstance(partition, int):
            # checked before the cache: True == 1 and 1.0 == 1 would find partition 1
            raise UnknownPartitionError(
                f"partition must be an integer, got {partition!r}", topic=topic
            )
        try:
            part = self._partitions.get((topic, partition))
        except TypeError:  # an unhashable topic is not a name: say so
            validate_topic_name(topic)
            raise
        if part is not None:
            return part
        meta = self._topic_meta(topic)
        if not isinstance(partition, int) or not 0 <= partition < meta.partitions:
            meta = self._topic_meta(topic, fresh=True)
            if not isinstance(partition, int) or not 0 <= partition < meta.partitions:
                raise UnknownPartitionError(
                    f"partition {partition!r} does not exist (topic has {meta.partitions})",
                    topic=topic,
                    partition=partition if isinstance(partition, int) else None,
                )
        with self._lock:
            part = self._partitions.get((topic, partition))
            if part is None:
                part = Partition(
                    topic_dir(self.topics_root, topic) / str(partition),
                    topic,
                    partition,
                    meta.config,
                    self.notifier,
                    self.clock,
                )
                part.on_met = self._met
                self._partitions[(topic, partition)] = part
        return part

    def append_fenced(
        self,
        topic: str,
        partition: int,
        records: Sequence[RecordTuple],
        *,
        precondition: Callable[[int], None],
        atomic: bool = False,
    ) -> AppendResult:
        """The port's :class:`~eventlane.log.port.FencedLog` role: ``precondition`` is
        called with the log end offset under the partition's append lock (of every process)
        and refuses the append by raising."""
        return self.append(topic, partition, records, atomic=atomic, precondition=precondition)

    def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[RecordTuple],
        *,
        expect: Expect | None = None,
        atomic: bool = False,
        precondition: Callable[[int], None] | None = None,
        combine: bool = False,
    ) -> AppendResult:
        """The port's append. ``precondition`` (embedded engine only, not in the port) is
        called with the log end offset under the append lock and refuses the append by
        raising: the file-based group coordination fences its commits with it."""
        part = self.partition(topic, partition)
        try:
            if expect is not None:
                if precondition is not None:
                    raise ConfigError("pass expect= or precondition=, not both", topic=topic)
                relay = self.relay
                if atomic and relay is not None:  # other processes write: :mod:`.relay`
                    (outcome,) = relay.append_group(topic, partition, [(records, expect)])
                    if isinstance(outcome, Exception):
                        raise outcome
                    return outcome
                check, indexed = self.keys.conditional(topic, partition, expect, records)
                # conditional appends of other keys waiting on this partition share one fsync
                return part.append(
                    records, precondition=check, on_appended=indexed, atomic=atomic, combine=True
                )
            keys = self._keys  # no index is open before the key state is first used
            hook = keys.indexing_hook(topic, partition, records) if keys is not None else None
            return part.append(
                records, precondition=precondition, on_appended=hook, atomic=atomic, combine=combine
            )
        except UnknownTopicError:
            self._forget(topic, partition, part)
            raise
        except IndexError as exc:  # a record shorter than 4 fields (checked only on failure)
            raise _short_record(records, exc, topic, partition) from None

    def append_framed(
        self, topic: str, partition: int, records: FramedRecords
    ) -> AppendResult | None:
        """:meth:`append` of records that frame themselves as stored batches without a
        tuple per record (the Kafka listener's produced batches: :mod:`eventlane.kafka.records`).
        Not in the port. ``None`` (nothing written) where the caller must append
        ``records.records()`` instead: a record the log refuses (its error comes from that
        append), or a key index open on the partition (its hook indexes record tuples)."""
        keys = self._keys
        if keys is not None and keys.indexing_hook(topic, partition, ()) is not None:
            return None
        part = self.partition(topic, partition)
        try:
            return part.append_framed(records)
        except UnknownTopicError:
            self._forget(topic, partition, part)
            raise

    def append_group(
        self, topic: str, partition: int, appends: Sequence[tuple[Sequence[RecordTuple], Expect]]
    ) -> list[AppendResult | Exception]:
        """Several conditional appends to one partition, ``(records, expect)`` each, written
        as ``append(..., expect=expect, atomic=True)`` writes one: by the data directory's
        relay while other processes write too (:mod:`.relay`), else directly
        (:meth:`append_group_direct`). The asyncio face's writer (:mod:`.aio`) hands over a
        partition's waiting appends with it."""
        relay = self.relay
        if relay is not None:
            return relay.append_group(topic, partition, appends)
        return self.append_group_direct(topic, partition, appends)

    def _count_relayed(
        self,
        topic: str,
        partition: int,
        appends: Sequence[tuple[Sequence[RecordTuple], Expect]],
        outcomes: Sequence[AppendResult | Exception],
        seconds: float,
    ) -> None:
        """Count what the relay wrote for this process in its metrics, as the appends it
        writes itself are counted (by the partition)."""
        if not M.on:
            return
        part = self.partition(topic, partition)
        for (records, _), outcome in zip(appends, outcomes, strict=True):
            if isinstance(outcome, AppendResult):
                nbytes = sum(len(r[0] or b"") + len(r[1] or b"") for r in records)
                part.count_appended(len(records), nbytes, seconds)

    @property
    def relay(self) -> Relay | None:
        """The data directory's relay as this process sees it (:mod:`.relay`); ``None``
        where it is never used (``EVENTLANE_RELAY=off``, a store with its own clock)."""
        relay = self._relay
        if relay is None and self._relay_allowed:
            from eventlane.log.embedded import relay as relay_module  # noqa: PLC0415

            with self._lock:
                if self._relay is None and not self._closed:
                    if relay_module.enabled() and self.clock is wall_clock_ms:
                        self._relay = relay_module.Relay(
                            self.path, self.append_group_direct, self._count_relayed
                        )
                    else:
                        self._relay_allowed = False
                relay = self._relay
        return relay

    def _met(self) -> None:
        """A partition's append found another process holding its lock."""
        relay = self.relay
        if relay is not None:
            relay.met()

    def append_group_direct(
        self, topic: str, partition: int, appends: Sequence[tuple[Sequence[RecordTuple], Expect]]
    ) -> list[AppendResult | Exception]:
        """:meth:`append_group` written by this process, sharing one fsync
        (:meth:`Partition.append_group`); each one's offsets, or the exception that
        ``append`` would raise."""
        part = self.partition(topic, partition)
        grouped: list[GroupedAppend] = []
        outcomes: list[AppendResult | Exception] = []
        where: list[int] = []
        for i, (records, expect) in enumerate(appends):
            try:
                check, indexed = self.keys.conditional(topic, partition, expect, records)
            except Exception as exc:
                outcomes.append(exc)
                continue
            outcomes.append(_NOT_YET)
            where.append(i)
            grouped.append((records, check, indexed))
        for i, outcome in zip(where, part.append_group(grouped), strict=True):
            if isinstance(outcome, UnknownTopicError):
                self._forget(topic, partition, part)
            outcomes[i] = (
                _short_record(appends[i][0], outcome, topic, partition)
                if isinstance(outcome, IndexError)
                else outcome
            )
        return outcomes

    def async_face(self) -> AsyncLogStore:
        """This log's asyncio face, unopened (``await face.open()`` on the caller's loop):
        reads and appends handed to threads in batches, a partition's waiting conditional
        appends written together under one fsync (:mod:`.aio`)."""
        from eventlane.log.embedded.aio import AsyncLogStore  # noqa: PLC0415 (asyncio only here)

        return AsyncLogStore(self)

    def read_key(
        self, topic: str, partition: int, key: bytes, *, after: int | None = None
    ) -> list[Record]:
        return self.keys.read_key(topic, partition, key, after)

    def key_head(self, topic: str, partition: int, key: bytes) -> int | None:
        return self.keys.head(topic, partition, key)

    def check_keys(
        self, topics: Collection[str] | None = None, *, repair: bool = False
    ) -> list[KeyIndexReport]:
        return self.keys.check(topics, repair=repair)

    def rebuild_keys(self, topic: str, partition: int) -> int:
        return self.keys.rebuild(topic, partition)

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = 1 << 20,
        cursor: Cursor | None = None,
        upto: int | None = None,
    ) -> tuple[list[Record], Cursor | None]:
        _check_read_args(topic, partition, offset, max_bytes, upto)
        return self._read(topic, partition, offset, max_bytes, cursor, upto, in_flight=False)

    def read_batches(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = 1 << 20,
        upto: int | None = None,
    ) -> list[StoredBatch]:
        """:meth:`read` without building records: the stored batches that hold what it
        would return, CRC-checked (see :meth:`.read._ReadPath.read_batches`; the format
        is docs/file-format.md's). Not in the port: for the Kafka listener, which re-frames
        them for the wire without a Python object per record."""
        _check_read_args(topic, partition, offset, max_bytes, upto)
        part = self.partition(topic, partition)
        try:
            return part.read_batches(offset, max_bytes=max_bytes, upto=upto)
        except UnknownTopicError:
            self._forget(topic, partition, part)
            raise

    def read_written(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = 1 << 20,
        cursor: Cursor | None = None,
        upto: int | None = None,
    ) -> tuple[list[Record], Cursor | None]:
        """:meth:`read`, with the records written but not yet durable (between the HWM and
        the LEO; see :mod:`.partition`). Not in the port: for the key index, which indexes
        them under the append lock so that the next conditional append sees them."""
        return self._read(topic, partition, offset, max_bytes, cursor, upto, in_flight=True)

    def end_cursor(self, topic: str, partition: int) -> tuple[int, Cursor]:
        """The partition's log end offset and a read cursor there (not in the port: for the
        key index, which reads others' appends from where its own ended)."""
        return self.partition(topic, partition).end_cursor()

    def _read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int,
        cursor: Cursor | None,
        upto: int | None,
        *,
        in_flight: bool,
    ) -> tuple[list[Record], Cursor | None]:
        part = self.partition(topic, partition)
        try:
            return part.read(
                offset, max_bytes=max_bytes, cursor=cursor, upto=upto, in_flight=in_flight
            )
        except UnknownTopicError:
            self._forget(topic, partition, part)
            raise

    def epoch(self, topic: str, partition: int) -> int:
        """How many times written-but-not-durable records of the partition were thrown away
        (a failed fsync): the key index drops itself when it changes (not in the port).

        Never opens the partition: the key index asks under its own lock, and opening may
        take the append lock, which comes before it (lock order, :mod:`.partition`). A
        partition this process does not have open (its topic was deleted since the index
        touched it, and maybe re-created) raises :class:`UnknownTopicError`."""
        part = self._partitions.get((topic, partition))
        if part is None:
            raise UnknownTopicError(
                f"partition {partition} of topic {topic!r} is not open in this process (its"
                " topic was deleted since it was used)",
                topic=topic,
                partition=partition,
            )
        return part.offsets().epoch

    def _forget(self, topic: str, partition: int, part: Partition) -> None:
        """Drop a partition whose topic was deleted under us: the next call looks again."""
        with self._lock:
            if self._partitions.get((topic, partition)) is part:
                del self._partitions[(topic, partition)]
                part.close()
        self._meta.pop(topic, None)

    def is_open(self, topic: str, partition: int) -> bool:
        """Whether this object has the partition open (its marks then read from memory)."""
        return (topic, partition) in self._partitions

    def offsets(self, topic: str, partition: int) -> PartitionOffsets:
        snap = self.partition(topic, partition).offsets()
        return PartitionOffsets(snap.lwm, snap.hwm, snap.leo)

    def offset_for_time(self, topic: str, partition: int, timestamp: int) -> int | None:
        if not isinstance(timestamp, int) or isinstance(timestamp, bool):
            raise ConfigError(
                f"timestamp must be an integer (ms), got {timestamp!r}",
                topic=topic,
                partition=partition,
            )
        return self.partition(topic, partition).offset_for_time(timestamp)

    def wait_seq(self) -> int:
        """The current wake-up sequence; pass it to :meth:`wait` after checking for data."""
        return self.notifier.value()

    def wait(self, seen: int, timeout: float) -> None:
        """Sleep until anything is appended anywhere after ``seen`` was read, or timeout."""
        self.notifier.wait(seen, timeout)

    def wake(self) -> None:
        """Wake every waiter of this data directory, in every process."""
        self.notifier.bump()

    # ------------------------------------------------------------------ maintenance
    def roll(self, topic: str, partition: int) -> None:
        """Close the active segment of ``topic``/``partition`` (so maintenance can reach its
        records: compaction never touches the active segment)."""
        self.partition(topic, partition).roll()

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        """Kafka's DeleteRecords: advance the low-water mark to ``before_offset`` (records
        below it become unreadable: offset out of range), delete the segments wholly below
        it, and return the new low-water mark. The mark is durable (``log-start-offset``)
        before any file goes; an offset at or below the current mark changes nothing.
        :class:`~eventlane.errors.OffsetOutOfRangeError` above the high-water mark."""
        part = self.partition(topic, partition)
        marks = part.offsets()
        if before_offset < 0 or before_offset > marks.hwm:
            raise OffsetOutOfRangeError(
                f"cannot delete records below {before_offset}: the partition holds"
                f" [{marks.lwm}, {marks.hwm})",
                topic=topic,
                partition=partition,
                offset=before_offset,
                lwm=marks.lwm,
                leo=marks.leo,
            )
        if before_offset > marks.lwm:
            with part.maintenance_lock():
                part.delete_segments_below(before_offset)
            log.info("records deleted", topic=topic, partition=partition, lwm=before_offset)
        return self.offsets(topic, partition).lwm

    def _each_partition(
        self,
        topic: str,
        work: Callable[[Partition], R],
        progress: Progress | None,
    ) -> list[R]:
        count = self.partition_count(topic)
        reports = []
        for p in range(count):
            reports.append(work(self.partition(topic, p)))
            if progress is not None:
                progress(p + 1, count, p)
        return reports

    def compact(self, topic: str, *, progress: Progress | None = None) -> list[CompactionReport]:
        """Compact every partition of ``topic`` now (a no-op unless its policy compacts)."""
        from eventlane.log.embedded.cleaner import compact_partition  # noqa: PLC0415 - first use

        return self._each_partition(topic, compact_partition, progress)

    def cleanup(self, topic: str, *, progress: Progress | None = None) -> list[RetentionReport]:
        """Apply ``topic``'s retention to every partition now (no-op without ``delete``)."""
        return self._each_partition(topic, apply_retention, progress)

    def skip_lost_offsets(self, topic: str, partition: int) -> PartitionOffsets:
        """Repair a partition that refused to open with
        :class:`~eventlane.errors.DataLossError`: recover it keeping the lost acknowledged
        offsets taken (a logged warning names them), so they are skipped, never reused.
        A partition with nothing lost is only recovered again."""
        meta = self._topic_meta(topic, fresh=True)
        if not 0 <= partition < meta.partitions:
            raise UnknownPartitionError(
                f"partition {partition!r} does not exist (topic has {meta.partitions})",
                topic=topic,
                partition=partition,
            )
        with self._lock:
            old = self._partitions.pop((topic, partition), None)
            if old is not None:
                old.close()
            part = Partition(
                topic_dir(self.topics_root, topic) / str(partition),
                topic,
                partition,
                meta.config,
                self.notifier,
                self.clock,
                skip_lost_offsets=True,
            )
            part.on_met = self._met
            self._partitions[(topic, partition)] = part
        snap = part.offsets()
        return PartitionOffsets(snap.lwm, snap.hwm, snap.leo)

    def request_compaction(self, topic: str, partition: int) -> None:
        """Ask the store's background cleaner to compact one partition soon; returns at once.

        Repeated requests for a partition already queued coalesce; failures are logged.
        """
        with self._lock:
            if self._closed:
                return
            if self._cleaner is None:
                from eventlane.log.embedded.cleaner import LogCleaner  # noqa: PLC0415 - first use

                self._cleaner = LogCleaner(self.partition)
            cleaner = self._cleaner
        cleaner.request(topic, partition)

    def verify(
        self,
        topic: str | None = None,
        *,
        progress: Progress | None = None,
        skip_lost_offsets: bool = False,
    ) -> list[Exception]:
        """Check every batch and index entry of ``topic`` (or of all topics); return the
        problems found. A partition that refuses to open is one problem (its
        :class:`~eventlane.errors.DataLossError`, unless ``skip_lost_offsets`` repairs it:
        see :meth:`skip_lost_offsets`)."""
        problems: list[Exception] = []
        for name in [topic] if topic is not None else self.list_topics():
            count = self._topic_meta(name, fresh=True).partitions
            for p in range(count):
                try:
                    try:
                        part = self.partition(name, p)
                    except DataLossError:
                        if not skip_lost_offsets:
                            raise
                        self.skip_lost_offsets(name, p)
                        part = self.partition(name, p)
                    problems.extend(part.verify())
                except CorruptRecordError as err:  # found while opening (recovering) it
                    problems.append(err)
                if progress is not None:
                    progress(p + 1, count, p)
        return problems

    def close(self) -> None:
        if self._closed:
            return
        if self._relay is not None:  # its connections and registration (the relay serves on)
            self._relay.close()
        self._closed = True
        self._meta_lock.close()
        if self._cleaner is not None:
            self._cleaner.stop()
        if self._keys is not None:
            self._keys.close()
        with self._lock:
            for part in self._partitions.values():
                with contextlib.suppress(OSError):
                    part.close()
            self._partitions.clear()
        self.notifier.close()

    def __enter__(self) -> LogStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_read_args(
    topic: str, partition: int, offset: object, max_bytes: object, upto: object
) -> None:
    """A read's ``offset`` and ``max_bytes`` are integers, ``upto`` one or ``None`` (a
    :class:`ConfigError` naming the argument, the topic and the partition otherwise)."""
    for name, value in (("offset", offset), ("max_bytes", max_bytes), ("upto", upto)):
        if name == "upto" and value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            kind = "an integer or None" if name == "upto" else "an integer"
            raise ConfigError(
                f"{name} must be {kind}, got {value!r}", topic=topic, partition=partition
            )
