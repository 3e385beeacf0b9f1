"""Hand-off: rebuild into a shadow file, catch it up, and swap it in under the live workers.

Steps (``eventlane rebuild APP --projection NAME --swap``):

1. **build** ``<data>/readmodels/<name>.shadow.sqlite`` at the pinned vector ``E``
   (:func:`~eventlane.replay.rebuild.rebuild`, either engine). Readers of the live file see
   nothing of it: it is another file until step 5.
2. **catch up** the shadow from ``E`` towards the live model's positions with the live
   code path (:class:`~eventlane.projection.BatchApplier`, positions advanced in the same
   transactions), in rounds, until a round applies fewer than ``catch_up_records`` records.
   ``replaying=True``: the live workers already performed these events' side effects.
3. **pause** the live workers (:class:`~eventlane.projection.pause.PauseControl`): request
   the pause and wait until every live member of the projector's group has acknowledged
   it (each has stopped applying and closed the file), or give up after
   ``pause_timeout`` seconds — then the pause is lifted, the shadow deleted, and nothing
   live has changed.
4. **final catch-up** to the live positions now, while nobody writes the live file; the
   shadow's partitions take the live file's group generations (the fencing tokens stay
   valid), and the shadow is sealed (journal mode ``DELETE``, fsynced, no siblings).
5. **swap**: the live file is checkpointed and switched out of WAL mode — which SQLite
   allows only when no other connection has it open, so success proves the file is ours
   alone; its ``-wal``/``-shm`` are gone then and stale copies are deleted — and the shadow
   is renamed over it (atomic; the directory is fsynced). The new file is switched to WAL.
6. **resume**: the pause is lifted; each worker reopens the file at the path, claims its
   partitions again and seeks each to the position stored in the new file.

**PostgreSQL** (a read model in a schema, :mod:`eventlane.projection.postgres`): the shadow
is the schema ``<schema>__shadow`` (:mod:`.pg_build`); no pause files (workers may run on
any host): the live schema's writer lock (the advisory lock every worker transaction
takes) is the pause. Holding it, the swap catches the shadow up to the high-water marks,
copies the live generations and owner into it, and renames the live schema to
``<schema>__old`` and the shadow to the live name in the same transaction; the old schema
is dropped after the commit. A worker's next transaction takes the lock, finds the
schema's OID changed, refuses its batch (:class:`~eventlane.errors.FencedError`), reopens
the read model and seeks to the positions stored in the new schema. The live lock is held
for the final catch-up only (fewer than ``catch_up_records`` records, as the SQLite pause).

**The live positions bound the replay.** ``E`` and every catch-up stop at the positions the
live read model had applied (read again each round, and under the pause), never past them:
an event there is replayed with its side effects suppressed (``ctx.issue``,
``ctx.schedule``, a handler's own behind ``ctx.replaying``), which is right only for an
event the live workers handled already. What the live workers had not reached yet (they lag,
or are stopped) is left to them: they go on from the same positions after the swap and
perform those side effects then, as they would have without the hand-off (a policy's
commands are not lost). Only where there is no live read model at all (no file, no schema:
a first build) does the hand-off build to the high-water marks; a projector with side effects
built that way performs none for the history it was built from.

No gap, no duplicate: the new file's content and positions are one consistent state (every
event below a position applied exactly once, in the same transactions as the positions),
built from the log alone, and the workers continue from exactly those positions. Writes a
worker made to the old file meanwhile went to a file that is no longer live. A worker that
missed the pause notices the replaced inode and reopens before its next batch.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from eventlane.app import Runtime
from eventlane.consumer.admin import describe_group, group_exists
from eventlane.errors import FrameworkError, ReplayError
from eventlane.log import Log, TopicPartition
from eventlane.log.files import fsync_dir
from eventlane.log.local import LocalDir
from eventlane.observability import get_logger
from eventlane.projection import BatchApplier, ReadModel, ReadModelView
from eventlane.projection.pause import PauseControl
from eventlane.projection.postgres import (
    FrameworkConnection,
    PgReadModel,
    connect_admin,
    derived_schema,
    drop_schema,
    schema_name,
)
from eventlane.projection.store import readmodel_url
from eventlane.replay.build import (
    BuildCounts,
    DeadLetterReport,
    dead_letter_report,
    remove_db,
    replay_ranges,
    seal,
)
from eventlane.replay.pg_build import (
    PgTarget,
    schema_dead_letters,
    schema_positions,
    stored_positions,
)
from eventlane.replay.progress import NO_PROGRESS, Progress
from eventlane.replay.ranges import OffsetRange
from eventlane.replay.rebuild import RebuildResult, rebuild

log = get_logger("eventlane.replay")

__all__ = [
    "HandoffResult",
    "catch_up",
    "rebuild_and_swap",
    "shadow_path",
    "swap_file",
    "swap_schema",
]


@attrs.frozen
class HandoffResult:
    rebuild: RebuildResult
    caught_up: int
    """Records applied to the shadow after ``E`` (rounds before the pause and the final one)."""
    final_records: int
    """Records applied while the workers were paused."""
    paused_seconds: float
    members: list[str]
    """Group members that paused and resumed."""
    positions: Mapping[TopicPartition, int]
    """Positions of the swapped-in file: where the live workers went on."""
    dead_letters: list[DeadLetterReport]

    def to_json(self) -> dict[str, Any]:
        return {
            "rebuild": self.rebuild.to_json(),
            "caught_up": self.caught_up,
            "final_records": self.final_records,
            "paused_seconds": round(self.paused_seconds, 3),
            "members": self.members,
            "positions": [
                {"topic": tp.topic, "partition": tp.partition, "offset": off}
                for tp, off in sorted(self.positions.items())
            ],
            "dead_letters": [d.to_json() for d in self.dead_letters],
        }


def shadow_path(data: Path | LocalDir, projection: str) -> Path:
    local = data if isinstance(data, LocalDir) else LocalDir(Path(data))
    return local.shadow(projection)


def catch_up(
    log_: Log,
    applier: BatchApplier,
    topics: tuple[str, ...],
    upto: Mapping[TopicPartition, int] | None = None,
) -> int:
    """Apply to ``applier``'s read model everything between its positions and the current
    high-water marks, or ``upto`` where given (a partition missing there: nothing)
    (partitions it never saw: from their low-water mark). Returns the number of records
    read."""
    positions = applier.readmodel.positions()
    ranges = []
    for topic in sorted(set(topics)):
        if not log_.topic_exists(topic):
            continue
        for p in range(log_.partition_count(topic)):
            tp = TopicPartition(topic, p)
            marks = log_.offsets(topic, p)
            start = positions.get(tp, marks.lwm)
            if start < marks.lwm:
                raise ReplayError(
                    f"retention removed records the shadow had not applied yet (position"
                    f" {start} < low-water mark {marks.lwm})",
                    topic=topic,
                    partition=p,
                    offset=start,
                )
            end = marks.hwm if upto is None else min(upto.get(tp, marks.lwm), marks.hwm)
            if start < end:
                ranges.append(OffsetRange(topic, p, start, end))
    counts: BuildCounts = replay_ranges(log_, applier, ranges)
    return counts.records


def live_members(log_: Log, group: str) -> set[str]:
    """Member ids of the group's live members (expired ones evicted first)."""
    if not group_exists(log_, group):
        return set()
    return {str(m["member_id"]) for m in describe_group(log_, group)["members"]}


def wait_for_pause(
    log_: Log, control: PauseControl, group: str, token: str, timeout: float
) -> list[str]:
    """Wait until every live member acked ``token``; return them. ReplayError on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        members = live_members(log_, group)
        acked = control.acked(token)
        if members <= acked:
            return sorted(members)
        if time.monotonic() > deadline:
            raise ReplayError(
                f"live workers of {group!r} did not pause within {timeout:g}s (not"
                f" acknowledged: {', '.join(sorted(members - acked))}); nothing was swapped"
            )
        time.sleep(0.02)


def swap_file(live: Path, shadow: Path, *, timeout: float = 30.0) -> None:
    """Replace ``live`` by the sealed ``shadow`` atomically (see the module docstring).

    Raises :class:`ReplayError` if another connection keeps ``live`` open past ``timeout``.
    """
    if live.exists():
        conn = sqlite3.connect(live, isolation_level=None, timeout=timeout)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    mode = conn.execute("PRAGMA journal_mode=DELETE").fetchone()[0]
                except sqlite3.OperationalError:
                    mode = None
                if mode == "delete":
                    break
                if time.monotonic() > deadline:
                    raise ReplayError(
                        "another process keeps the live read model open; cannot swap it",
                        path=live,
                    )
                time.sleep(0.05)
        finally:
            conn.close()
        for suffix in ("-wal", "-shm"):
            Path(f"{live}{suffix}").unlink(missing_ok=True)
    os.rename(shadow, live)
    fsync_dir(live.parent)
    conn = sqlite3.connect(live, isolation_level=None, timeout=timeout)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
    finally:
        conn.close()


def rebuild_and_swap(
    runtime: Runtime,
    projection: str,
    *,
    engine: str = "spark",
    pause_timeout: float = 60.0,
    catch_up_records: int = 5_000,
    catch_up_rounds: int = 20,
    progress: Progress = NO_PROGRESS,
    before_swap: Callable[[RebuildResult], None] | None = None,
    carry_letters: bool = False,
    scrub_error: Callable[[bytes | None], bool] | None = None,
    **rebuild_options: Any,
) -> HandoffResult:
    """Rebuild ``projection`` and hand the result to its live workers (module docstring:
    the build and every catch-up stop at the live model's positions).

    ``carry_letters`` (forget's rebuild): the live file's dead-letter history is carried over (an
    event dead-lettered live and applied by the rebuild is marked ``retried``), with the
    error text of letters whose value ``scrub_error`` picks replaced; an event the rebuild
    dead-letters but the live model had applied refuses the swap (ReplayError): a rebuild
    never silently drops a row.

    ``rebuild_options`` go to :func:`~eventlane.replay.rebuild.rebuild` (``spark``,
    ``master``, ``conf``, ``key_groups``). ``before_swap`` is called with the rebuild's
    result before anything else happens (``--verify`` checks it there); raising from it
    deletes the shadow and leaves everything live as it was.
    """
    url = readmodel_url(runtime, projection)
    if url is not None:
        return swap_schema(
            runtime,
            projection,
            url,
            engine=engine,
            catch_up_records=catch_up_records,
            catch_up_rounds=catch_up_rounds,
            progress=progress,
            before_swap=before_swap,
            carry_letters=carry_letters,
            scrub_error=scrub_error,
            **rebuild_options,
        )
    local, stem = runtime.log.local, runtime.names.local(projection)
    live = local.readmodel(stem)
    shadow = local.shadow(stem)
    control = PauseControl(local, stem)
    topics = runtime.topics_of(projection)
    start = _live_positions(live)
    if start is not None:
        rebuild_options["end"] = _live_vector(runtime.log, start, topics)
    result = rebuild(
        runtime, projection, engine=engine, output=shadow, progress=progress, **rebuild_options
    )
    readmodel: ReadModel | None = None
    paused = False
    try:
        if before_swap is not None:
            before_swap(result)
        progress.phase("catch-up")
        readmodel = ReadModel(shadow)
        readmodel.conn.execute("PRAGMA synchronous=OFF")
        projector = runtime.app.projector(projection)()
        applier = BatchApplier(projector, runtime.codec, readmodel, replaying=True)
        caught_up = 0
        for _ in range(catch_up_rounds):
            n = catch_up(runtime.log, applier, topics, _live_positions(live))
            caught_up += n
            if n < catch_up_records:
                break
        progress.phase("pause")
        token = control.request(expires_in=2 * pause_timeout + 300)
        paused = True
        t_pause = time.monotonic()
        members = wait_for_pause(
            runtime.log, control, runtime.names.group(projection), token, pause_timeout
        )
        final = catch_up(runtime.log, applier, topics, _live_positions(live))
        with ReadModelView(live) as view:
            generations = view.generations()
        if carry_letters:
            carry_dead_letters(live, readmodel.conn, scrub_error)
        with readmodel.transaction() as conn:
            conn.executemany(
                "UPDATE _eventlane_positions SET generation=? WHERE topic=? AND partition=?",
                [(g, tp.topic, tp.partition) for tp, g in generations.items()],
            )
        positions = readmodel.positions()
        readmodel.conn.execute("PRAGMA synchronous=FULL")
        seal(readmodel.conn, shadow)
        readmodel = None
        progress.phase("swap")
        swap_file(live, shadow, timeout=pause_timeout)
        control.resume()
        paused = False
        paused_seconds = time.monotonic() - t_pause
    except BaseException:
        if readmodel is not None:
            readmodel.close()
        if paused:
            control.resume()
        remove_db(shadow)
        raise
    conn = sqlite3.connect(live.resolve().as_uri() + "?mode=ro", uri=True, timeout=60)
    try:
        letters = dead_letter_report(conn)
    finally:
        conn.close()
    log.info(
        "read model handed over",
        projector=projection,
        caught_up=caught_up + final,
        final_records=final,
        paused_seconds=round(paused_seconds, 3),
        members=len(members),
    )
    return HandoffResult(
        result, caught_up + final, final, paused_seconds, members, positions, letters
    )


def swap_schema(
    runtime: Runtime,
    projection: str,
    url: str,
    *,
    engine: str,
    catch_up_records: int,
    catch_up_rounds: int,
    progress: Progress,
    before_swap: Callable[[RebuildResult], None] | None,
    carry_letters: bool = False,
    scrub_error: Callable[[bytes | None], bool] | None = None,
    **rebuild_options: Any,
) -> HandoffResult:
    """The hand-off of a read model in PostgreSQL (see the module docstring's PostgreSQL
    section): build ``<schema>__shadow``, catch it up, then, holding the live schema's
    writer lock, catch it up to the live positions, give it the live generations and
    owner, and rename it to the live name in the same transaction. ``carry_letters`` and
    ``scrub_error`` as in :func:`rebuild_and_swap` (the live positions of the final
    catch-up and the dead letters carried over are read under the lock)."""
    local, stem = runtime.log.local, runtime.names.local(projection)
    live, path = schema_name(stem), local.readmodel(stem)
    shadow, old = derived_schema(live, "shadow"), derived_schema(live, "old")
    topics = runtime.topics_of(projection)
    target = PgTarget(url, shadow, path)

    def upto() -> dict[TopicPartition, int] | None:
        with connect_admin(url) as raw:
            return stored_positions(raw, live)

    start = upto()
    if start is not None:
        rebuild_options["end"] = _live_vector(runtime.log, start, topics)
    result = rebuild(
        runtime, projection, engine=engine, output=target, progress=progress, **rebuild_options
    )
    building: PgReadModel | None = None
    holder: PgReadModel | None = None
    try:
        if before_swap is not None:
            before_swap(result)
        progress.phase("catch-up")
        building = PgReadModel(url, shadow, path)
        building.raw.execute("SET synchronous_commit = off")
        projector = runtime.app.projector(projection)()
        applier = BatchApplier(projector, runtime.codec, building, replaying=True)
        caught_up = 0
        for _ in range(catch_up_rounds):
            n = catch_up(runtime.log, applier, topics, upto())
            caught_up += n
            if n < catch_up_records:
                break
        progress.phase("pause")
        holder = PgReadModel(url, live, path)
        t_pause = time.monotonic()
        with holder.transaction():  # the live writer lock: no worker transaction runs now
            raw = holder.raw
            final = catch_up(runtime.log, applier, topics, stored_positions(raw, live))
            applier.close()
            building.close()
            building = None
            if carry_letters:
                carry_schema_dead_letters(raw, live, shadow, scrub_error)
            raw.execute(
                f'UPDATE "{shadow}"._eventlane_positions s SET generation = l.generation'
                f' FROM "{live}"._eventlane_positions l'
                " WHERE s.topic = l.topic AND s.partition = l.partition"
            )
            raw.execute(f'DELETE FROM "{shadow}"._eventlane_owner')
            raw.execute(
                f'INSERT INTO "{shadow}"._eventlane_owner SELECT app FROM "{live}"._eventlane_owner'
            )
            positions = schema_positions(raw, shadow)
            progress.phase("swap")
            raw.execute(f'DROP SCHEMA IF EXISTS "{old}" CASCADE')
            raw.execute(f'ALTER SCHEMA "{live}" RENAME TO "{old}"')
            raw.execute(f'ALTER SCHEMA "{shadow}" RENAME TO "{live}"')
        paused_seconds = time.monotonic() - t_pause
    except BaseException:
        if building is not None:
            building.close()
        drop_schema(url, shadow)
        raise
    finally:
        if holder is not None:
            holder.close()
    try:
        drop_schema(url, old)
    except FrameworkError as exc:  # swapped already; the next swap or a retire drops it
        log.warning("could not drop the swapped-out schema", schema=old, error=str(exc))
    letters = schema_dead_letters(url, live)
    members = sorted(live_members(runtime.log, runtime.names.group(projection)))
    log.info(
        "read model handed over",
        projector=projection,
        schema=live,
        caught_up=caught_up + final,
        final_records=final,
        locked_seconds=round(paused_seconds, 3),
    )
    return HandoffResult(
        result, caught_up + final, final, paused_seconds, members, positions, letters
    )


SCRUBBED_ERROR = (
    "[error text removed by eventlane forget: it may have held personal data of a forgotten"
    " subject]"
)


def _live_positions(live: Path) -> dict[TopicPartition, int] | None:
    """The live file's positions; None where there is no live read model (no file: a first
    build goes to the high-water marks)."""
    if not live.exists():
        return None
    with ReadModelView(live) as view:
        return view.positions()


def _live_vector(
    log_: Log, positions: Mapping[TopicPartition, int], topics: tuple[str, ...]
) -> dict[TopicPartition, int]:
    """The live model's ``positions`` as a full end vector (a partition it never saw: its
    low-water mark, i.e. nothing)."""
    vector = {}
    for topic in sorted(set(topics)):
        if not log_.topic_exists(topic):
            continue
        for p in range(log_.partition_count(topic)):
            tp = TopicPartition(topic, p)
            marks = log_.offsets(topic, p)
            vector[tp] = min(max(positions.get(tp, marks.lwm), marks.lwm), marks.hwm)
    return vector


def carry_dead_letters(
    live: Path,
    shadow: sqlite3.Connection,
    scrub_error: Callable[[bytes | None], bool] | None,
) -> None:
    """Replace the shadow's dead letters by the live file's history (see
    :func:`rebuild_and_swap`, ``carry_letters``); ReplayError if the rebuild dead-lettered an
    event the live model had applied."""
    with ReadModelView(live) as view:
        conn = view.conn
        rows = (
            []
            if conn is None
            else conn.execute(
                f"SELECT {_LETTER_COLUMNS} FROM _eventlane_dead_letters ORDER BY id"
            ).fetchall()
        )
    failed = {
        (t, p, o): status
        for t, p, o, status in shadow.execute(
            "SELECT topic, partition, offset, status FROM _eventlane_dead_letters"
        )
    }
    carried = _carried_letters(rows, failed, scrub_error)
    shadow.execute("BEGIN IMMEDIATE")
    shadow.execute("DELETE FROM _eventlane_dead_letters")
    shadow.executemany(
        f"INSERT INTO _eventlane_dead_letters ({_LETTER_COLUMNS}) VALUES"
        " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        carried,
    )
    shadow.execute("COMMIT")


def carry_schema_dead_letters(
    raw: Any,
    live: str,
    shadow: str,
    scrub_error: Callable[[bytes | None], bool] | None,
) -> None:
    """:func:`carry_dead_letters` between two schemas, inside ``raw``'s transaction (the
    swap's, under the live writer lock); the shadow's id sequence continues after the
    carried ids."""
    conn = FrameworkConnection(raw)
    rows = conn.execute(
        f'SELECT {_LETTER_COLUMNS} FROM "{live}"._eventlane_dead_letters ORDER BY id'
    ).fetchall()
    failed = {
        (t, int(p), int(o)): status
        for t, p, o, status in conn.execute(
            f'SELECT topic, partition, offset, status FROM "{shadow}"._eventlane_dead_letters'
        )
    }
    carried = _carried_letters([tuple(r) for r in rows], failed, scrub_error)
    table = f'"{shadow}"._eventlane_dead_letters'
    conn.execute(f"DELETE FROM {table}")
    conn.executemany(
        f"INSERT INTO {table} ({_LETTER_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        carried,
    )
    raw.execute(
        "SELECT setval(pg_get_serial_sequence(%s, 'id'),"
        f" coalesce((SELECT max(id) FROM {table}), 0) + 1, false)",
        (table,),
    )


_LETTER_COLUMNS = (
    "id, topic, partition, offset, key, value, headers, event_type, error, attempts,"
    " status, created_ms, published"
)


def _carried_letters(
    rows: list[Any],
    failed: Mapping[tuple[str, int, int], str],
    scrub_error: Callable[[bytes | None], bool] | None,
) -> list[list[Any]]:
    """The live model's dead-letter ``rows`` (:data:`_LETTER_COLUMNS`) as the shadow keeps
    them, given the letters the rebuild wrote (``failed``: coordinates to status)."""
    known = {(r[1], r[2], r[3]) for r in rows}
    lost = sorted(c for c in failed if c not in known)
    if lost:
        t, p, o = lost[0]
        raise ReplayError(
            f"the rebuild dead-lettered {len(lost)} event(s) the live read model had applied"
            " (e.g. an upcaster or handler that fails on erased values); not swapped, so no"
            " row is lost",
            topic=t,
            partition=p,
            offset=o,
        )
    carried = []
    for r in rows:
        row = list(r)
        if scrub_error is not None and scrub_error(row[5]):
            row[8] = SCRUBBED_ERROR
        if (row[1], row[2], row[3]) not in failed and row[10] in ("dead", "parked"):
            row[10] = "retried"  # the rebuild applied it
        carried.append(row)
    return carried
