"""Forgetting subjects: destroy their keys, and scrub every file eventlane wrote about them.

:func:`forget` is the one operation behind ``eventlane forget APP SUBJECT...`` (see
``docs/privacy.md``). ``subjects`` is one subject id (a ``str``) or an iterable of ids; a
``str`` is never taken as a sequence of characters. Steps:

0. a journal ``<data>/forget.journal.json`` names the subjects before anything is
   destroyed; a run that stops half-way (a crash, a read model held open past the swap
   timeout) leaves it, and the next run (with or without subjects) finishes those first.
   It is removed once every place is scrubbed;
1. the records that carry the subjects' cipher texts are found (their coordinates, and,
   while the keys still exist, their personal plain text, kept in memory only to scrub
   the files below);
2. each subject's key record gets a tombstone, if it has a key: an unknown subject, or
   one already forgotten, is reported as such and nothing is appended for it;
3. snapshots keyed by the subject id get tombstones (only where the head is not one);
4. the app's ``on_forget`` hooks run (copies the app made itself);
5. the key topic (and every snapshot topic that got a tombstone) is rolled and compacted;
6. every projector that handles an event class with personal fields and has a live read
   model is rebuilt **up to the live model's positions** and swapped in
   (:func:`~eventlane.replay.handoff.rebuild_and_swap` with ``carry_letters``): events the
   live model had not applied keep their side effects for its workers; its dead-letter
   history is carried over, with the error text of the subjects' letters removed;
7. the other files: ``<group>.dlq`` records of the subjects' events get their
   ``dlq-error`` replaced (a new record per key, then compaction), breaker records and
   worker logs under ``readmodels/`` lose the subjects' plain text, and rebuild outputs
   (``NAME.rebuild.sqlite``) and partial Spark parts (``.NAME*.parts-*``) are deleted; a
   hand-off's ``NAME.shadow.sqlite`` is reported as not scrubbed (another process may be
   building it), so the run fails until it is gone;
8. per PostgreSQL database holding such read models (the same steps 6 and 7 for schemas:
   the rebuild swaps ``<schema>__shadow`` in, ``<schema>__rebuild`` with its Spark stages,
   ``__verify`` and ``__old`` are dropped, a ``<schema>__shadow`` is reported): the
   copies the dropped tables left are erased
   (:func:`~eventlane.projection.postgres.erase_dropped`: the statistics catalogs
   rewritten, the WAL retired), or what may still hold them is reported.

:class:`ForgetReport` lists every place scrubbed and every place that could not be
(``not_scrubbed``; the CLI then exits 1 and the journal stays). Forgetting is idempotent:
a second forget destroys nothing, appends no tombstone and removes no snapshot.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
from attrs import frozen

from eventlane.codec.keystore import LogKeyStore
from eventlane.codec.privacy import CIPHER_MARK, redact
from eventlane.domain.privacy import personal_fields
from eventlane.errors import ConfigError, FrameworkError
from eventlane.log.partitioner import partition_for_key
from eventlane.log.port import maintained_log
from eventlane.observability import get_logger
from eventlane.projection.breaker import breaker_path, load_tripped, save_tripped
from eventlane.projection.dead_letters import dlq_topic
from eventlane.projection.postgres import (
    connect_admin,
    derived_schema,
    drop_schema,
    erase_dropped,
    schema_exists,
    schema_name,
    stage_schemas,
)
from eventlane.projection.store import readmodel_url
from eventlane.replay.handoff import SCRUBBED_ERROR, rebuild_and_swap
from eventlane.replay.pg_build import drop_stages
from eventlane.replay.progress import NO_PROGRESS, Progress

if TYPE_CHECKING:
    from eventlane.app import Runtime
    from eventlane.log import Log

log = get_logger("eventlane.replay")

__all__ = ["ForgetReport", "forget", "personal_projectors", "subject_ids"]

JOURNAL = "forget.journal.json"


@frozen
class ForgetReport:
    """What :func:`forget` did."""

    subjects: tuple[str, ...]
    keys_destroyed: tuple[str, ...]
    """Subjects whose key this run destroyed."""
    already_forgotten: tuple[str, ...]
    """Subjects whose key record was already a tombstone."""
    unknown: tuple[str, ...]
    """Subjects with no key record here (never had personal data, or forgotten so long ago
    that the tombstone is compacted away)."""
    snapshots_removed: int
    unreadable: dict[str, int]
    """Records per topic that carry cipher texts of the subjects (empty without ``scan``)."""
    rebuilt: tuple[str, ...]
    """Read models rebuilt and swapped in."""
    scrubbed: tuple[str, ...] = ()
    """Every other place scrubbed or deleted (a line each)."""
    not_scrubbed: tuple[str, ...] = ()
    """Places that may still hold the subjects' data, and why (non-empty: the run failed)."""

    @property
    def ok(self) -> bool:
        return not self.not_scrubbed

    def to_dict(self) -> dict[str, object]:
        return {
            "subjects": list(self.subjects),
            "keys_destroyed": list(self.keys_destroyed),
            "already_forgotten": list(self.already_forgotten),
            "unknown": list(self.unknown),
            "snapshots_removed": self.snapshots_removed,
            "unreadable": dict(self.unreadable),
            "rebuilt": list(self.rebuilt),
            "scrubbed": list(self.scrubbed),
            "not_scrubbed": list(self.not_scrubbed),
            "ok": self.ok,
        }


def subject_ids(subjects: str | Iterable[str]) -> tuple[str, ...]:
    """One subject id or an iterable of ids, as a tuple without duplicates; a ``str`` is one
    id, never its characters. ConfigError for an empty id or one that is not a str."""
    raw: object = subjects
    if isinstance(raw, bytes | bytearray):
        raise ConfigError("forget takes subject ids as str, not bytes")
    found = (subjects,) if isinstance(subjects, str) else tuple(dict.fromkeys(subjects))
    for s in found:
        if not isinstance(s, str) or not s:
            raise ConfigError(f"a subject id is a non-empty str, got {s!r}")
    return found


def personal_projectors(runtime: Runtime) -> list[str]:
    """Names of the app's projectors that handle an event class with personal fields."""
    return [
        name
        for name, cls in runtime.app.projectors.items()
        if any(personal_fields(event_cls) for event_cls in cls.handled_types())
    ]


def forget(
    runtime: Runtime,
    subjects: str | Iterable[str],
    *,
    engine: str = "local",
    scan: bool = True,
    rebuild_readmodels: bool = True,
    progress: Progress = NO_PROGRESS,
    swap_timeout: float = 60.0,
) -> ForgetReport:
    """Forget ``subjects`` (see the module docstring); returns a :class:`ForgetReport`."""
    wanted = subject_ids(subjects)
    keys = runtime.codec.keys
    if not isinstance(keys, LogKeyStore):
        raise ConfigError(
            f"app {runtime.app.name!r} keeps no keys in its log: no event class declares "
            "personal fields (eventlane.personal), so there is nothing to forget"
        )
    root = runtime.log.local.root
    journal = root / JOURNAL
    subjects_ = tuple(dict.fromkeys((*_pending(journal), *wanted)))
    if not subjects_:
        raise ConfigError("forget needs one or more subject ids (and no journal is pending)")
    _write_journal(journal, subjects_)
    carriers = _needles(subjects_)

    def carries(value: bytes | None) -> bool:
        return value is not None and any(n in value for n in carriers)

    found, streams, plain = _find(runtime, carries)
    states = {s: keys.state(s) for s in subjects_}
    destroyed = tuple(s for s in subjects_ if states[s] == "live" and keys.forget(s))
    for s in subjects_:
        if s in destroyed:
            log.warning("subject forgotten: its key is destroyed", subject=s, topic=keys.topic)
        elif states[s] == "forgotten":
            log.info("subject already forgotten: nothing to destroy", subject=s)
        else:
            log.warning("unknown subject: no key record", subject=s, topic=keys.topic)
    snapshot_topics, removed = _drop_snapshots(runtime, subjects_, streams)
    for hook in runtime.app.on_forget:
        for s in subjects_:
            hook(runtime, s)
    keys.erase_history()
    maintained = maintained_log(runtime.log, "forget (erasing by compaction)")
    for topic in snapshot_topics:
        for p in range(maintained.partition_count(topic)):
            maintained.roll(topic, p)
        maintained.compact(topic)
    # Other processes stop decrypting the subjects once their key stores catch up: let them
    # before rebuilding, so no worker writes a just-forgotten value into a live read model.
    time.sleep(keys.refresh_seconds * 2)
    rebuilt: list[str] = []
    scrubbed: list[str] = []
    failed: list[str] = []
    local = runtime.log.local
    databases: dict[str, list[str]] = {}  # PostgreSQL URL -> its projections' schemas
    for name in personal_projectors(runtime):
        url = readmodel_url(runtime, name)
        stem = runtime.names.local(name)
        if url is None:
            where = f"read model {local.readmodel(stem)}"
            exists = local.readmodel(stem).exists()
        else:
            databases.setdefault(url, []).append(schema_name(stem))
            where = f"read model {name!r} in PostgreSQL (schema {schema_name(stem)})"
            exists = _schema_exists(url, schema_name(stem), where, failed)
        if not exists:
            continue  # nothing applied yet: its workers will do everything, side effects too
        if not rebuild_readmodels:
            failed.append(f"{where}: not rebuilt (--no-rebuild)")
            continue
        try:
            rebuild_and_swap(
                runtime,
                name,
                engine=engine,
                progress=progress,
                carry_letters=True,
                scrub_error=carries,
                pause_timeout=swap_timeout,
            )
        except FrameworkError as exc:
            failed.append(f"{where}: not rebuilt: {exc}")
            continue
        rebuilt.append(name)
    for name in personal_projectors(runtime):
        _scrub_dlq(runtime.log, runtime.names.group(name), carries, scrubbed)
    _scrub_files(local.readmodels(), plain, found, scrubbed, failed)
    for url, schemas in databases.items():
        _scrub_postgres(url, schemas, scrubbed, failed)
    unreadable = _count(found) if scan else {}
    report = ForgetReport(
        subjects_,
        destroyed,
        tuple(s for s in subjects_ if states[s] == "forgotten"),
        tuple(s for s in subjects_ if states[s] == "unknown"),
        removed,
        unreadable,
        tuple(rebuilt),
        tuple(scrubbed),
        tuple(failed),
    )
    if report.ok:
        journal.unlink(missing_ok=True)
        log.info("forget done", **report.to_dict())
    else:
        log.error("forget incomplete: run it again", **report.to_dict())
    return report


# -- the journal --------------------------------------------------------------------------
def _pending(journal: Path) -> tuple[str, ...]:
    try:
        doc = orjson.loads(journal.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return ()
    found = doc.get("subjects") if isinstance(doc, dict) else None
    return tuple(s for s in found if isinstance(s, str) and s) if isinstance(found, list) else ()


def _write_journal(journal: Path, subjects: tuple[str, ...]) -> None:
    journal.parent.mkdir(parents=True, exist_ok=True)
    tmp = journal.with_suffix(f".{os.getpid()}.tmp")
    with tmp.open("wb") as f:
        f.write(orjson.dumps({"subjects": list(subjects), "started_ms": time.time_ns() // 10**6}))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, journal)


# -- finding the subjects' records --------------------------------------------------------
def _needles(subjects: tuple[str, ...]) -> list[bytes]:
    """How the codec writes the subjects' cipher objects: ``"$eventlane":["enc4","<s>"``
    (enc4, enc3) and ``"$eventlane":"enc2","s":"<s>"`` (enc2, and enc1 objects)."""
    return [
        *(
            orjson.dumps({CIPHER_MARK: [scheme, s]})[1:-2]
            for s in subjects
            for scheme in ("enc4", "enc3")
        ),
        *(
            orjson.dumps({CIPHER_MARK: scheme, "s": s})[1:-1]
            for s in subjects
            for scheme in ("enc2", "enc1")
        ),
    ]


Coordinates = set[tuple[str, int, int]]
Streams = set[tuple[str, bytes]]


def _schema_exists(url: str, schema: str, where: str, failed: list[str]) -> bool:
    try:
        with connect_admin(url) as raw:
            return schema_exists(raw, schema)
    except FrameworkError as exc:
        failed.append(f"{where}: {exc}")
        return False


def _scrub_postgres(url: str, schemas: list[str], scrubbed: list[str], failed: list[str]) -> None:
    """The rebuild schemas beside the live ones in one PostgreSQL database, then its WAL.

    A ``<schema>__rebuild`` (a rebuild's output), the stage schemas of a Spark build of it
    (a killed task's), a ``<schema>__verify`` (``--verify``'s scratch build) and a
    ``<schema>__old`` (a swap's leftover) are dropped; a ``<schema>__shadow`` and the stages
    of its Spark build are reported (a hand-off may be building them now). The swapped-out
    live schemas were dropped by the swaps; what is left of their rows (statistics, WAL)
    :func:`~eventlane.projection.postgres.erase_dropped` erases."""
    names = ", ".join(schemas)
    try:
        for schema in schemas:
            for suffix in ("rebuild", "verify", "old"):
                derived = derived_schema(schema, suffix)
                if drop_schema(url, derived):
                    scrubbed.append(f"PostgreSQL schema {derived}: dropped (a rebuild output)")
            for stage in drop_stages(url, derived_schema(schema, "rebuild")):
                scrubbed.append(f"PostgreSQL schema {stage}: dropped (a Spark task's stage)")
            shadow = derived_schema(schema, "shadow")
            with connect_admin(url) as raw:
                building = [shadow] if schema_exists(raw, shadow) else []
                building += stage_schemas(raw, shadow)
            for name in building:
                failed.append(
                    f"PostgreSQL schema {name}: a hand-off's shadow read model or its stage"
                    " (left by an interrupted rebuild, or one running now) may hold the"
                    " subjects' data: drop it while no rebuild runs, then run forget again"
                )
    except FrameworkError as exc:
        failed.append(f"PostgreSQL database of schemas {names}: {exc}")
        return
    problems = erase_dropped(url)
    for problem in problems:
        failed.append(f"PostgreSQL database of schemas {names}: {problem}")
    if not problems:
        scrubbed.append(
            f"PostgreSQL database of schemas {names}: the statistics catalogs rewritten and the"
            " WAL that held the dropped rows retired"
        )


def _find(
    runtime: Runtime, carries: Callable[[bytes | None], bool]
) -> tuple[Coordinates, Streams, list[str]]:
    """The coordinates of the event records that carry the subjects' cipher texts, the
    streams (topic, aggregate id) they are in, and their personal plain text (while the
    keys exist), longest first."""
    found: Coordinates = set()
    streams: Streams = set()
    plain: set[str] = set()
    log_ = runtime.log
    for topic in sorted({runtime.names.aggregate_topic(c) for c in runtime.app.aggregates}):
        if not log_.topic_exists(topic):
            continue
        for p in range(log_.partition_count(topic)):
            for record in _records(log_, topic, p):
                if carries(record.value):
                    found.add((topic, p, record.offset))
                    if record.key is not None:
                        streams.add((topic, record.key))
                    plain.update(runtime.codec.plain_values(record.value))
    return found, streams, sorted(plain, key=len, reverse=True)


def _records(log_: Log, topic: str, p: int):  # type: ignore[no-untyped-def]
    offsets = log_.offsets(topic, p)
    position = offsets.lwm
    while position < offsets.hwm:
        records, _ = log_.read(topic, p, position, upto=offsets.hwm)
        if not records:
            break
        yield from records
        position = records[-1].offset + 1


def _count(found: Coordinates) -> dict[str, int]:
    counts: dict[str, int] = {}
    for topic, _, _ in found:
        counts[topic] = counts.get(topic, 0) + 1
    return counts


def _drop_snapshots(
    runtime: Runtime, subjects: tuple[str, ...], streams: Streams
) -> tuple[list[str], int]:
    """Tombstones for live snapshots keyed by a subject id, and for those of every stream
    that holds a subject's event (a snapshot sealed under another subject's key may hold a
    copy of its data); the snapshot topics touched."""
    from eventlane.store.stream import snapshot_topic  # noqa: PLC0415

    touched: list[str] = []
    removed = 0
    log_ = runtime.log
    for cls in runtime.app.aggregates:
        topic = snapshot_topic(runtime.names.aggregate_topic(cls))
        if not log_.topic_exists(topic):
            continue
        count = log_.partition_count(topic)
        source = runtime.names.aggregate_topic(cls)
        wanted = [s.encode() for s in subjects]
        wanted += sorted(k for t, k in streams if t == source and k not in wanted)
        for key in wanted:
            p = partition_for_key(key, count)
            head = log_.key_head(topic, p, key)
            if head is None:
                continue
            records, _ = log_.read(topic, p, head, upto=head + 1)
            if records and records[0].value is None:
                continue  # already a tombstone: a repeated forget appends nothing
            log_.append(topic, p, [(key, None, (), None)])
            removed += 1
            if topic not in touched:
                touched.append(topic)
    return touched, removed


# -- scrubbing the other files ------------------------------------------------------------
def _scrub_dlq(
    log_: Log, group: str, carries: Callable[[bytes | None], bool], scrubbed: list[str]
) -> None:
    """Replace the ``dlq-error`` of the subjects' dead-letter copies: a new record per
    source key, then roll and compact, so the old error text leaves the files."""
    topic = dlq_topic(group)
    if not log_.topic_exists(topic):
        return
    latest: dict[bytes | None, tuple[bytes | None, tuple[tuple[str, bytes | None], ...]]] = {}
    for p in range(log_.partition_count(topic)):
        for record in _records(log_, topic, p):
            latest[record.key] = (record.value, tuple(record.headers))
    fixes = []
    for key, (value, headers) in latest.items():
        if not carries(value):
            continue
        error = dict(headers).get("dlq-error")
        if error == SCRUBBED_ERROR.encode():
            continue
        new = tuple((n, SCRUBBED_ERROR.encode() if n == "dlq-error" else v) for n, v in headers)
        fixes.append((key, value, new, None))
    if not fixes:
        return
    log_.append(topic, 0, fixes)
    maintained = maintained_log(log_, "forget (erasing dead letters by compaction)")
    for p in range(maintained.partition_count(topic)):
        maintained.roll(topic, p)
    maintained.compact(topic)
    scrubbed.append(f"topic {topic}: error text of {len(fixes)} dead letter(s) removed")


def _scrub_files(
    readmodels: Path,
    plain: list[str],
    found: Coordinates,
    scrubbed: list[str],
    failed: list[str],
) -> None:
    """Breaker records, worker logs, rebuild outputs and partial parts under ``readmodels``."""
    if not readmodels.is_dir():
        return
    for path in sorted(readmodels.iterdir()):
        name = path.name
        try:
            if name.endswith(".breaker.json"):
                _scrub_breaker(path, plain, found, scrubbed)
            elif name.endswith(".log"):
                _scrub_text(path, plain, scrubbed)
            elif ".rebuild.sqlite" in name or ".parts-" in name:
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
                scrubbed.append(f"{path}: deleted (a rebuild output)")
            elif ".shadow.sqlite" in name:  # a hand-off's model, perhaps being built now
                failed.append(
                    f"{path}: a hand-off's shadow read model (left by an interrupted rebuild,"
                    " or one running now) may hold the subjects' data: delete it while no"
                    " rebuild runs, then run forget again"
                )
        except OSError as exc:
            failed.append(f"{path}: {exc}")


def _scrub_breaker(path: Path, plain: list[str], found: Coordinates, scrubbed: list[str]) -> None:
    readmodel = path.with_name(path.name.removesuffix(".breaker.json") + ".sqlite")
    record = load_tripped(readmodel)
    if record is None or breaker_path(readmodel) != path:
        return
    error = str(record.get("error") or "")
    coords = (record.get("topic"), record.get("partition"), record.get("offset"))
    new = SCRUBBED_ERROR if coords in found else redact(error, plain)
    if new != error:
        save_tripped(readmodel, {**record, "error": new})
        scrubbed.append(f"{path}: last error removed")


def _scrub_text(path: Path, plain: list[str], scrubbed: list[str]) -> None:
    """Rewrite a worker log in place (its writers append with O_APPEND, so they go on at
    the new end) without the subjects' plain text."""
    if not plain:
        return
    with path.open("r+b") as f:
        raw = f.read()
        text = raw.decode("utf-8", "surrogateescape")
        new = redact(text, plain)
        if new == text:
            return
        data = new.encode("utf-8", "surrogateescape")
        f.seek(0)
        f.write(data)
        f.truncate()
        f.flush()
        os.fsync(f.fileno())
    scrubbed.append(f"{path}: personal values removed")
