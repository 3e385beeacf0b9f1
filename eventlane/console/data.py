"""Everything the console knows about the log, the groups and the app: the ONE facade over
the framework (the web layer, :mod:`eventlane.console.web`, only calls this); a concept with
a module of its own (:mod:`eventlane.console.schedules`) is read there and served here.

It uses public surfaces only: the log port (:class:`~eventlane.log.Log`), the consumer-group
admin functions, the per-key index of the event store, the app runtime (codec, aggregates,
projector status, dead letters) and the rebuild. So adapting the console to another log
engine, or to a change of those APIs, is a change here.

Every method returns plain JSON-able dicts and lists; the ``/api/...`` endpoints return them
as they are, and the HTML views render the same dicts. Shapes:

* topic: ``{"name", "partitions", "records", "bytes", "cleanup_policy", "retention_ms",
  "config", "partition_details": [{"partition", "lwm", "hwm", "leo", "records", "segments",
  "bytes", "last_append_ms"}]}``;
* record: ``{"topic", "partition", "offset", "timestamp", "key", "headers": [[name, text]],
  "value": text (UTF-8, else spaced hex), "binary": bool, "json": object | null,
  "decoded": envelope | null, "error": text | null}``;
* group: ``{"group", "state", "generation", "members", "lag", "lag_ms", "partitions"}``.

Read-only by construction: nothing here changes state except :meth:`ConsoleData.reset_offsets`
with ``execute=True``, :meth:`ConsoleData.retry_dead_letters` and :meth:`ConsoleData.rebuild`
(which writes a new file beside the live read model, never the live one); the web layer
allows them only with ``--read-write``.

One concept at ~760 lines: the facade is one class on purpose (the web layer's only door);
what has a concept of its own lives beside it (:mod:`.filters`, :mod:`.rebuild_job`,
:mod:`.schedules`) and is re-exported here.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import orjson

from eventlane.app import App, Runtime, load_app
from eventlane.console.filters import Filters
from eventlane.console.rebuild_job import RebuildJob
from eventlane.console.schedules import schedule_rows
from eventlane.consumer.admin import (
    describe_group,
    list_groups,
    parse_datetime_ms,
    reset_offsets,
)
from eventlane.consumer.coordinator import validate_group_id
from eventlane.engine import log_locator
from eventlane.engine import open_log as engine_open_log
from eventlane.errors import (
    AggregateNotFoundError,
    ConfigError,
    FrameworkError,
    OffsetOutOfRangeError,
    ProjectionError,
)
from eventlane.log import KeyedLog, Log, Record
from eventlane.log.names import validate_topic_name
from eventlane.log.partitioner import partition_for_key
from eventlane.log.port import keyed_log
from eventlane.observability import get_logger
from eventlane.projection import (
    get_dead_letter,
    list_dead_letters,
    open_readmodel,
    retry_dead_letters,
    view_of,
)
from eventlane.replay.rebuild import ENGINES, rebuild
from eventlane.replay.verify import verify_rebuild

log = get_logger("eventlane.console")

__all__ = ["ConsoleData", "Filters", "RebuildJob", "open_log"]

PAGE_MAX = 500
"""Most records one browser page shows."""
SCAN_LIMIT = 200_000
"""Most records one filtered page reads before it answers with what it found (and where to
go on): a filter never makes a request unbounded."""
POINT_READ_BYTES = 16 << 10


def open_log(data: Path | None, url: str | None) -> Log:
    """The log named by ``--log URL`` (any engine :func:`eventlane.engine.open_log` knows:
    ``file:///dir``, a plain directory, ``nats://...``) or by ``--data DIR``.

    An embedded log must exist already: a directory that holds none is refused (a wrong path
    is the usual mistake) and nothing is created. For another engine ``--data`` names its
    local directory (read models, group state)."""
    if url is not None and urlsplit(url).scheme in ("", "file"):
        path = Path(unquote(urlsplit(url).path) if "://" in url else url)
        if data is not None and path.resolve() != data.resolve():
            raise ConfigError(f"--log {url!r} and --data {str(data)!r} name different logs")
        data, url = path, None
    if url is not None:
        return engine_open_log(url, data_dir=data)
    if data is None:
        raise ConfigError("give --data DIR or --log URL")
    if not (data / "topics").is_dir():
        raise ConfigError(f"no eventlane data in {str(data)!r}", path=data)
    return engine_open_log(data)


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", errors="replace")


def _shown(raw: bytes | None) -> tuple[str | None, bool]:
    """A value for display and whether it is binary: UTF-8 text as it is, other bytes as
    spaced hex (so cipher text and binary formats show their bytes, not mojibake)."""
    if raw is None:
        return None, False
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        return raw.hex(" "), True


class ConsoleData:
    """The console's view of one log and, optionally, one application (``APP``)."""

    def __init__(self, log_: Log, app_spec: str | None = None) -> None:
        self.log = log_
        self.app: App | None = load_app(app_spec) if app_spec else None
        self.runtime: Runtime | None = (
            self.app.open(keyed_log(log_, "the console"), create_topics=False)
            if self.app is not None
            else None
        )
        self._event_topics = frozenset(
            () if self.app is None else map(self.app.names.aggregate_topic, self.app.aggregates)
        )
        self._jobs: dict[int, RebuildJob] = {}
        self._jobs_lock = threading.Lock()

    def close(self) -> None:
        if self.runtime is not None:
            self.runtime.close()
        self.log.close()

    # ------------------------------------------------------------------ overview
    def backend(self) -> dict[str, Any]:
        return {
            "engine": engine_name(self.log),
            "location": str(self.log.local.root),
            "app": None if self.app is None else self.app.name,
        }

    def overview(self) -> dict[str, Any]:
        topics = self.topics()
        groups = self.groups()
        projectors = self.projectors() if self.app is not None else []
        return {
            "backend": self.backend(),
            "topics": len(topics),
            "partitions": sum(t["partitions"] for t in topics),
            "records": sum(t["records"] for t in topics),
            "bytes": sum(t["bytes"] for t in topics),
            "groups": len(groups),
            "lagging_groups": [g for g in groups if g["lag"]],
            "projectors": [
                {"projector": p["projector"], "status": p["status"], "lag": p["lag"]}
                for p in projectors
            ],
        }

    # ------------------------------------------------------------------ topics
    @staticmethod
    def topic_name(name: str) -> str:
        """``name`` if it is a legal topic name (no ``/``, no ``..``: no path traversal)."""
        return validate_topic_name(name)

    def topics(self) -> list[dict[str, Any]]:
        return [self.topic(name, details=False) for name in self.log.list_topics()]

    def topic(self, name: str, *, details: bool = True) -> dict[str, Any]:
        desc = self.log.describe_topic(self.topic_name(name))
        config = desc.config.to_dict()
        parts = []
        for p in desc.partition_details:
            row = {
                "partition": p.partition,
                "lwm": p.lwm,
                "hwm": p.hwm,
                "leo": p.leo,
                "records": p.hwm - p.lwm,
                "segments": p.segments,
                "bytes": p.bytes,
                "last_append_ms": None,
            }
            if details and p.hwm > p.lwm:
                last = self._record_at(name, p.partition, p.hwm - 1)
                row["last_append_ms"] = None if last is None else last.timestamp
            parts.append(row)
        return {
            "name": desc.name,
            "partitions": desc.partitions,
            "records": sum(r["records"] for r in parts),
            "bytes": sum(r["bytes"] for r in parts),
            "cleanup_policy": config.get("cleanup_policy"),
            "retention_ms": config.get("retention_ms"),
            "config": config,
            "partition_details": parts,
        }

    # ------------------------------------------------------------------ records
    def _record_at(self, topic: str, partition: int, offset: int) -> Record | None:
        """The record at exactly ``offset`` (``None``: compacted away or out of range)."""
        try:
            records, _ = self.log.read(topic, partition, offset, max_bytes=POINT_READ_BYTES)
        except OffsetOutOfRangeError:
            return None
        for r in records:
            if r.offset == offset:
                return r
            if r.offset > offset:
                break
        return None

    def _check_partition(self, topic: str, partition: int) -> int:
        count = self.log.partition_count(self.topic_name(topic))
        if not 0 <= partition < count:
            raise ConfigError(
                f"partition {partition} does not exist (topic has {count})",
                topic=topic,
                partition=partition,
            )
        return count

    def start_offset(self, topic: str, partition: int, start: str, value: str | None) -> int:
        """Where a page starts: ``oldest``, ``newest`` (the last page), ``offset`` N or
        ``timestamp`` (ms since the epoch, or ISO-8601), clamped to ``[lwm, hwm]``."""
        marks = self.log.offsets(topic, partition)
        if start == "oldest":
            return marks.lwm
        if start == "newest":
            return marks.hwm
        if start == "offset":
            if value is None or not value.strip().lstrip("-").isdigit():
                raise ConfigError(f"start=offset needs an integer, got {value!r}", topic=topic)
            return min(max(int(value), marks.lwm), marks.hwm)
        if start == "timestamp":
            when = _parse_time_ms(value)
            found = self.log.offset_for_time(topic, partition, when)
            return marks.hwm if found is None else max(found, marks.lwm)
        raise ConfigError(f"start must be oldest, newest, offset or timestamp, got {start!r}")

    def partition_of(self, topic: str, key: str) -> int:
        """The partition a key's records go to (Kafka's murmur2 placement)."""
        return partition_for_key(key.encode(), self.log.partition_count(self.topic_name(topic)))

    def key_records(self, topic: str, partition: int, key: bytes) -> list[Record] | None:
        """``key``'s records in the partition, in offset order, through the engine's per-key
        reads (the embedded log's key index: a lookup, not a scan); ``None`` where the engine
        has none (the caller then scans)."""
        if not isinstance(self.log, KeyedLog):
            return None
        return self.log.read_key(topic, partition, key)

    def browse(
        self,
        topic: str,
        partition: int,
        *,
        start: str = "oldest",
        value: str | None = None,
        filters: Filters | None = None,
        limit: int = 100,
    ) -> dict[str, Any]:
        """One page of records: ``{"topic", "partition", "lwm", "hwm", "from", "prev", "next",
        "lookup": "index"|"scan"|"none", "scanned", "records": [record]}``.

        ``next`` is the offset the following page starts at (``null`` at the end), ``prev``
        the start of the page before (unfiltered pages only). With a key filter and an
        index, the key's offsets come from the index and only those records are read."""
        self._check_partition(topic, partition)
        filters = filters or Filters()
        limit = max(1, min(limit, PAGE_MAX))
        marks = self.log.offsets(topic, partition)
        begin = self.start_offset(topic, partition, start, value)
        if start == "newest":
            begin = max(marks.lwm, marks.hwm - (limit if not filters.active() else SCAN_LIMIT))
        found: list[Record] = []
        lookup = "none"
        scanned = 0
        nxt: int | None = None
        keyed = (
            self.key_records(topic, partition, filters.key_bytes)
            if filters.key_bytes is not None
            else None
        )
        if keyed is not None:
            lookup = "index"
            wanted = [r for r in keyed if r.offset >= begin]
            for i, record in enumerate(wanted):
                scanned += 1
                if filters.match(record):
                    found.append(record)
                if len(found) >= limit:
                    nxt = wanted[i + 1].offset if i + 1 < len(wanted) else None
                    break
        else:
            lookup = "scan" if filters.active() else "none"
            offset = begin
            while offset < marks.hwm and scanned < SCAN_LIMIT and len(found) < limit:
                records, _ = self.log.read(topic, partition, offset, upto=marks.hwm)
                if not records:
                    break
                for r in records:
                    if r.offset < offset:
                        continue
                    scanned += 1
                    offset = r.offset + 1
                    if filters.match(r):
                        found.append(r)
                    if len(found) >= limit or scanned >= SCAN_LIMIT:
                        break
                else:
                    offset = max(offset, records[-1].offset + 1)
            nxt = offset if offset < marks.hwm else None
        return {
            "topic": topic,
            "partition": partition,
            "lwm": marks.lwm,
            "hwm": marks.hwm,
            "from": begin,
            "prev": None
            if filters.active() or begin <= marks.lwm
            else max(marks.lwm, begin - limit),
            "next": nxt,
            "lookup": lookup,
            "scanned": scanned,
            "filters": filters.to_json(),
            "records": [self.record_json(r) for r in found],
        }

    def export(self, topic: str, partition: int, filters: Filters) -> Iterator[bytes]:
        """Every matching record of the partition as NDJSON lines (the ``consume`` shape)."""
        self._check_partition(topic, partition)
        marks = self.log.offsets(topic, partition)
        offset = marks.lwm
        while offset < marks.hwm:
            records, _ = self.log.read(topic, partition, offset, upto=marks.hwm)
            if not records:
                break
            yield b"".join(
                orjson.dumps(
                    {
                        "topic": r.topic,
                        "partition": r.partition,
                        "offset": r.offset,
                        "key": _text(r.key),
                        "value": _text(r.value),
                        "timestamp": r.timestamp,
                        "headers": [[n, _text(v)] for n, v in r.headers],
                    }
                )
                + b"\n"
                for r in records
                if r.offset >= offset and filters.match(r)
            )
            offset = records[-1].offset + 1

    def record_json(self, r: Record) -> dict[str, Any]:
        """A record for display: raw text, parsed JSON when it is JSON, and the envelope the
        app's codec decodes when an app is given and the record is on one of its event
        topics (``error`` says why one could not be decoded)."""
        parsed: Any = None
        error = None
        if r.value is not None:
            with contextlib.suppress(orjson.JSONDecodeError):
                parsed = orjson.loads(r.value)
        decoded = None
        if self.runtime is not None and r.topic in self._event_topics:
            try:
                decoded = self._decoded(r)
            except FrameworkError as exc:
                error = str(exc)
        value, binary = _shown(r.value)
        return {
            "topic": r.topic,
            "partition": r.partition,
            "offset": r.offset,
            "timestamp": r.timestamp,
            "key": _text(r.key),
            "headers": [[n, _text(v)] for n, v in r.headers],
            "value": value,
            "binary": binary,
            "json": parsed,
            "decoded": decoded,
            "error": error,
        }

    def _unstructure(self, value: object) -> Any:
        assert self.runtime is not None
        try:
            return self.runtime.codec.converter.unstructure(value)
        except Exception:  # a type the converter does not know: show its repr
            return repr(value)

    def _decoded(self, r: Record) -> dict[str, Any]:
        """The envelope of event record ``r``, decoded (and upcast) by the app's codec."""
        assert self.runtime is not None
        env = self.runtime.codec.decode(
            r.key,
            r.value,
            r.headers,  # type: ignore[arg-type]
            topic=r.topic,
            partition=r.partition,
            offset=r.offset,
        )
        return self._envelope_json(env)

    def _envelope_json(self, env: Any) -> dict[str, Any]:
        return {
            "type": env.type_name,
            "schema_version": env.schema_version,
            "aggregate_id": env.aggregate_id,
            "aggregate_version": env.aggregate_version,
            "event_id": str(env.event_id),
            "timestamp": env.timestamp.isoformat(),
            "correlation_id": env.correlation_id,
            "causation_id": env.causation_id,
            "data": self._unstructure(env.event),
        }

    # ------------------------------------------------------------------ live tail
    def positions_at_end(self, topic: str, partition: int | None) -> dict[int, int]:
        count = self.log.partition_count(self.topic_name(topic))
        parts = range(count) if partition is None else [partition]
        return {p: self.log.offsets(topic, p).hwm for p in parts}

    def tail_positions(
        self, topic: str, given: dict[int, int], partition: int | None
    ) -> dict[int, int]:
        """Where a live tail starts: ``given`` (partition -> offset, each partition the
        topic's and each offset >= 0, clamped into ``[lwm, hwm]``), else the end of
        ``partition`` (``None``: of every partition)."""
        if not given:
            if partition is not None:
                self._check_partition(topic, partition)
            return self.positions_at_end(topic, partition)
        out = {}
        for p, offset in given.items():
            self._check_partition(topic, p)
            if offset < 0:
                raise ConfigError(
                    f"a tail starts at an offset >= 0, got {offset}", topic=topic, partition=p
                )
            marks = self.log.offsets(topic, p)
            out[p] = min(max(offset, marks.lwm), marks.hwm)
        return out

    def read_new(
        self, topic: str, positions: dict[int, int], filters: Filters, limit: int = 200
    ) -> list[dict[str, Any]]:
        """Records past ``positions`` (advanced in place) that match ``filters``; a position
        that retention or compaction left below the low-water mark moves up to it."""
        out: list[dict[str, Any]] = []
        for p, start in positions.items():
            offset = start
            marks = self.log.offsets(topic, p)
            hwm = marks.hwm
            offset = max(offset, marks.lwm)
            while offset < hwm and len(out) < limit:
                try:
                    records, _ = self.log.read(topic, p, offset, upto=hwm)
                except OffsetOutOfRangeError:  # deleted under the tail meanwhile
                    offset = max(offset, self.log.offsets(topic, p).lwm)
                    records, _ = self.log.read(topic, p, offset, upto=hwm)
                if not records:
                    break
                out.extend(self.record_json(r) for r in records if filters.match(r))
                offset = records[-1].offset + 1
            positions[p] = offset
        return out

    def wait_seq(self) -> int:
        return self.log.wait_seq()

    def wait(self, seen: int, timeout: float) -> None:
        """Sleep until anything is appended (any process) after ``seen``, or ``timeout``."""
        self.log.wait(seen, timeout)

    # ------------------------------------------------------------------ aggregates
    def aggregate_types(self) -> list[dict[str, str]]:
        if self.app is None:
            return []
        return [
            {"name": c.__name__, "topic": self.app.names.aggregate_topic(c)}
            for c in self.app.aggregates
        ]

    def aggregate(
        self,
        type_name: str,
        aggregate_id: str,
        version: int | None,
        as_of: str | None = None,
    ) -> dict[str, Any]:
        """Every event of one aggregate in order and its state folded at ``version``
        (default: the latest) with the app's aggregate class; or, with ``as_of`` (ISO 8601,
        UTC unless it names a zone, or epoch ms), as it was at that moment (time travel:
        :meth:`Runtime.load` with ``as_of``)."""
        if self.runtime is None or self.app is None:
            raise ConfigError("the aggregate view needs an APP (eventlane console ... APP)")
        classes = {c.__name__: c for c in self.app.aggregates}
        cls = classes.get(type_name)
        if cls is None:
            raise ConfigError(
                f"app {self.app.name!r} has no aggregate {type_name!r}; it has"
                f" {', '.join(sorted(classes))}"
            )
        topic = self.app.names.aggregate_topic(cls)
        partition = self.partition_of(topic, aggregate_id)
        records = self.key_records(topic, partition, aggregate_id.encode()) or []
        if not records:
            raise AggregateNotFoundError(f"{type_name} {aggregate_id!r} has no events")
        events = [{**self._decoded(r), "offset": r.offset} for r in records]
        top = len(events)
        if as_of:
            if version is not None:
                raise ConfigError("give a version or a time (as_of), not both")
            when = int(as_of) if as_of.isdigit() else parse_datetime_ms(as_of)
            agg = self.runtime.load(cls, aggregate_id, as_of=when)
            at = agg.version
        else:
            at = top if version is None else min(max(version, 1), top)
            agg = self.runtime.load(cls, aggregate_id, at)
        state = {name: self._unstructure(getattr(agg, name)) for name in cls.state_fields()}
        return {
            "type": type_name,
            "topic": topic,
            "aggregate_id": aggregate_id,
            "partition": partition,
            "version": at,
            "latest_version": top,
            "as_of": as_of or None,
            "state": state,
            "events": events,
        }

    # ------------------------------------------------------------------ groups
    def groups(self) -> list[dict[str, Any]]:
        """Every group with its total lag (records) and oldest unconsumed record's age."""
        out = []
        for row in list_groups(self.log):
            detail = self.group(row["group"])
            out.append(
                {
                    **row,
                    "lag": detail["lag"],
                    "lag_ms": detail["lag_ms"],
                    "topics": sorted({r["topic"] for r in detail["offsets"]}),
                }
            )
        return out

    def group(self, group: str) -> dict[str, Any]:
        """``groups describe --json`` plus ``lag_ms`` per partition (now minus the timestamp
        of the first record not consumed; 0 when caught up) and the totals."""
        doc = describe_group(self.log, validate_group_id(group))
        now = int(time.time() * 1000)
        for row in doc["offsets"]:
            row["lag_ms"] = None
            if row["lag"] == 0:
                row["lag_ms"] = 0
            elif row["lag"]:
                first = self._record_at(row["topic"], row["partition"], row["committed"])
                row["lag_ms"] = None if first is None else max(0, now - first.timestamp)
        doc["lag"] = sum(r["lag"] or 0 for r in doc["offsets"])
        doc["lag_ms"] = max((r["lag_ms"] or 0 for r in doc["offsets"]), default=0)
        owners = {
            (a["topic"], a["partition"]): m["member_id"]
            for m in doc["members"]
            for a in m["assignment"]
        }
        for row in doc["offsets"]:
            row["owner"] = owners.get((row["topic"], row["partition"]))
        return doc

    def group_lags(self) -> dict[str, int]:
        """Total lag per group (what the lag sampler records)."""
        return {g["group"]: g["lag"] for g in self.groups()}

    def reset_offsets(
        self, group: str, topic: str, mode: str, value: str | None, *, execute: bool
    ) -> list[dict[str, Any]]:
        """Plan (dry run) or commit new offsets; refused while the group has live members."""
        parsed: int | str | None = value
        if mode in ("to-offset", "shift-by"):
            if value is None or not value.strip().lstrip("-").isdigit():
                raise ConfigError(f"{mode} needs an integer, got {value!r}")
            parsed = int(value)
        return reset_offsets(
            self.log,
            validate_group_id(group),
            self.topic_name(topic),
            mode,
            parsed,
            execute=execute,
        )

    # ------------------------------------------------------------------ projectors
    def _projector(self, name: str) -> str:
        if self.app is None:
            raise ConfigError("projector views need an APP (eventlane console ... APP)")
        self.app.projector(name)  # unknown names are refused: no path from user input
        return name

    def projectors(self) -> list[dict[str, Any]]:
        if self.app is None:
            return []
        return [self.projector(name) for name in sorted(self.app.projectors)]

    def projector(self, name: str) -> dict[str, Any]:
        """``project status --json`` of one projector plus ``status``: ``error`` (open dead
        letters or pending migrations), ``paused`` (a pause requested), ``running`` (a live
        member) or ``stopped``; and its source topics."""
        assert self.runtime is not None and self.app is not None
        doc = self.runtime.status(self._projector(name))
        path = Path(doc["readmodel"])
        dead = doc["dead_letters"]
        if doc["pending_migrations"] or dead.get("dead", 0) or dead.get("parked", 0):
            status = "error"
        elif path.with_name(path.name.removesuffix(".sqlite") + ".pause").exists():
            status = "paused"
        elif any(m["alive"] for m in doc["members"]):
            status = "running"
        else:
            status = "stopped"
        with view_of(self.runtime, name) as view:
            tables = view.table_rows()
        return {
            **doc,
            "status": status,
            "topics": list(self.runtime.topics_of(name)),
            "readmodel_tables": tables,
        }

    def dead_letters(self, projector: str, status: str = "all") -> list[dict[str, Any]]:
        with view_of(self.runtime_required(), self._projector(projector)) as view:
            letters = list_dead_letters(view)
        if status == "open":
            letters = [d for d in letters if d.status in ("dead", "parked")]
        elif status != "all":
            letters = [d for d in letters if d.status == status]
        return [d.to_json() for d in letters]

    def dead_letter(self, projector: str, letter_id: int) -> dict[str, Any]:
        with view_of(self.runtime_required(), self._projector(projector)) as view:
            letter = get_dead_letter(view, letter_id)
        if letter is None:
            raise ProjectionError(f"projector {projector!r} has no dead letter {letter_id}")
        return letter.to_json()

    def retry_dead_letters(self, projector: str, ids: Sequence[int]) -> dict[str, Any]:
        runtime = self.runtime_required()
        cls = runtime.app.projector(self._projector(projector))
        readmodel = open_readmodel(runtime, projector)
        try:
            instance = cls()
            instance.setup(readmodel.db)
            report = retry_dead_letters(
                instance, runtime.codec, readmodel, ids=list(ids) or None, app=runtime
            )
        finally:
            readmodel.close()
        return {"succeeded": report.succeeded, "failed": report.failed}

    def runtime_required(self) -> Runtime:
        if self.runtime is None:
            raise ConfigError("this view needs an APP (eventlane console ... APP)")
        return self.runtime

    # ------------------------------------------------------------------ schedules
    def schedules(self, state: str | None = None) -> list[dict[str, Any]]:
        """The app's schedules, read-only (:mod:`eventlane.console.schedules`); none
        without an APP."""
        if self.runtime is None:
            return []
        return schedule_rows(self.runtime, state)

    # ------------------------------------------------------------------ rebuild
    def start_rebuild(self, projector: str, engine: str) -> RebuildJob:
        """Rebuild ``projector`` into ``<name>.rebuild.sqlite`` in a thread, then verify it
        (against the local engine and the live read model where it stands at the same end
        vector). Follow it with :meth:`job`."""
        runtime = self.runtime_required()
        self._projector(projector)
        if engine not in ENGINES:
            raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        with self._jobs_lock:
            if any(j.state == "running" for j in self._jobs.values()):
                raise ConfigError("a rebuild is already running; wait for it to end")
            job = RebuildJob(len(self._jobs) + 1, projector, engine)
            self._jobs[job.id] = job

        def work() -> None:
            try:
                result = rebuild(runtime, projector, engine=engine, progress=job)
                job.phase("verify")
                comparisons = verify_rebuild(runtime, result)
            except Exception as exc:  # shown to the user; the job thread must not die silently
                log.exception("console rebuild failed", projection=projector)
                job.finish("failed", error=f"{type(exc).__name__}: {exc}")
                return
            job.finish(
                "done" if all(c.ok for c in comparisons) else "different",
                result=result.to_json(),
                verify=[
                    {
                        "what": c.what,
                        "ok": c.ok,
                        "skipped": c.skipped,
                        "tables": len(c.tables),
                        "differences": [d.table for d in c.differences],
                    }
                    for c in comparisons
                ],
            )

        threading.Thread(target=work, name=f"console-rebuild-{job.id}", daemon=True).start()
        return job

    def job(self, job_id: int) -> RebuildJob:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise ConfigError(f"no rebuild job {job_id}") from None

    # ------------------------------------------------------------------ read models
    def readmodel_files(self) -> dict[str, Path]:
        """Live read-model files (``<data>/readmodels/<name>.sqlite``) by projector name: what
        Datasette serves. Only the app's projectors, so no name reaches the file system."""
        if self.runtime is None or self.app is None:
            return {}
        out = {}
        for name in sorted(self.app.projectors):
            path = self.runtime.readmodel_path(name)
            if path.exists():
                out[name] = path
        return out


ENGINE_NAMES = {None: "embedded log", "file": "embedded log", "nats": "JetStream"}
"""What the console calls each engine, by the scheme of the URL that opens it."""


def engine_name(log_: Log) -> str:
    """The engine as users know it: ``embedded log``, ``JetStream``, else its URL scheme."""
    try:
        locator = log_locator(log_)
    except ConfigError:
        return type(log_).__name__
    scheme = urlsplit(locator).scheme.lower() if "://" in locator else None
    return ENGINE_NAMES.get(scheme, scheme or "embedded log")


def _parse_time_ms(value: str | None) -> int:
    """Milliseconds since the epoch from digits, or from ISO-8601 (naive = UTC)."""
    text = (value or "").strip()
    return int(text) if text.isdigit() else parse_datetime_ms(text)
