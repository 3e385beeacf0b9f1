"""One task of a parallel rebuild: replay one partition (or key group) into a partial file.

Runs inside an executor's Python worker, in one pass: read the range from the log (opened
by its locator, :func:`~eventlane.replay.ranges.open_store`: a data directory or a
``nats://`` URL), decode, run the projector's handlers, write SQLite. Only a
:class:`TaskResult` (a path and four counts) goes back to the driver.

Files in the work directory (shared storage on a cluster)::

    part-<index>.a<attempt>.sqlite    being written by one attempt (never merged)
    part-<index>.sqlite               a finished partial, renamed into place atomically
    part-<index>.done                 a finished stage schema (a PostgreSQL target)
    progress/<index>                  records read so far by the running attempt (decimal)

A failed or killed attempt leaves at most its own ``.a<attempt>`` file; the retry writes a
new one from scratch, so a retried task gives exactly the partial a first-time success
would. Two successful attempts (speculation) rename identical content over each other.

A read model in PostgreSQL (``target``, a :class:`~eventlane.replay.pg_build.PgTarget`):
the partial is the stage schema ``<schema>__p<index>a<attempt>``
(:func:`~eventlane.projection.postgres.stage_schema`) of the target's database, made afresh by
each attempt; the result names the schema (the driver merges the one of the attempt that
Spark reports). The progress file is kept in the work directory as above.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import NamedTuple

from eventlane.app import App
from eventlane.log import Log
from eventlane.observability import get_logger
from eventlane.projection import BatchApplier
from eventlane.projection.postgres import stage_schema
from eventlane.replay.build import BuildCounts, KeyGroup, app_codec, open_build, replay_ranges
from eventlane.replay.pg_build import PgTarget, open_schema_build
from eventlane.replay.ranges import OffsetRange, open_store

__all__ = ["TaskResult", "TaskSpec", "make_tasks", "run_task"]


class TaskSpec(NamedTuple):
    """What one task replays. ``task`` orders the merge (topic, partition, key group)."""

    task: int
    range: OffsetRange
    key_group: KeyGroup

    @property
    def label(self) -> str:
        base = f"{self.range.topic}/{self.range.partition}"
        if self.key_group.groups == 1:
            return base
        return f"{base} keys {self.key_group.group}/{self.key_group.groups}"


class TaskResult(NamedTuple):
    task: int
    path: str
    """The partial file, or (a PostgreSQL target) the stage schema's name."""
    counts: BuildCounts
    attempt: int
    seconds: float


def make_tasks(ranges: list[OffsetRange], key_groups: int = 1) -> list[TaskSpec]:
    """One task per range and key group, indexed in (topic, partition, key group) order.

    >>> [t.label for t in make_tasks([OffsetRange("a", 0, 0, 9)], 2)]
    ['a/0 keys 0/2', 'a/0 keys 1/2']
    """
    out: list[TaskSpec] = []
    for rng in ranges:
        for g in range(key_groups):
            out.append(TaskSpec(len(out), rng, KeyGroup(g, key_groups)))
    return out


def partial_path(work: Path, index: int) -> Path:
    return work / f"part-{index:05d}.sqlite"


def read_progress(work: Path) -> int:
    """Records read so far by all tasks (from their progress files)."""
    total = 0
    folder = work / "progress"
    if not folder.is_dir():
        return 0
    for entry in os.scandir(folder):
        try:
            with open(entry.path) as f:
                total += int(f.read() or 0)
        except (OSError, ValueError):
            continue
    return total


def _attempt() -> int:
    try:
        from pyspark import TaskContext  # noqa: PLC0415 - only inside a Spark task
    except ImportError:  # pragma: no cover - the local engine has no Spark
        return 0
    ctx = TaskContext.get()
    return 0 if ctx is None else int(ctx.attemptNumber())


def run_task(
    spec: TaskSpec,
    app: App,
    projection: str,
    log_: Log | str,
    work: str,
    data_dir: str | None = None,
    target: PgTarget | None = None,
) -> TaskResult:
    """Replay ``spec`` with ``app``'s projector ``projection`` into a partial file (or, with
    ``target``, into a stage schema of the target's database).

    ``log_`` is the log itself (in the driver's process) or its locator
    (:func:`eventlane.engine.log_locator`; in an executor), opened with ``data_dir`` as the
    local directory of a non-embedded engine."""
    t0 = time.perf_counter()
    folder = Path(work)
    attempt = _attempt()
    tmp = folder / f"part-{spec.task:05d}.a{attempt}.sqlite"
    final = partial_path(folder, spec.task)
    progress = folder / "progress" / str(spec.task)
    progress.parent.mkdir(exist_ok=True)  # never the work folder: a finished build removed it
    done = 0

    def report(read: int) -> None:
        nonlocal done
        done += read
        progress.write_text(str(done))

    store = open_store(log_, data_dir) if isinstance(log_, str) else log_
    stage = None
    if target is not None:
        stage = stage_schema(target.schema, spec.task, attempt)
        projector, readmodel = open_schema_build(target._replace(schema=stage), app, projection)
    else:
        projector, readmodel = open_build(tmp, app, projection)  # type: ignore[assignment]
    try:
        applier = BatchApplier(projector, app_codec(app, store), readmodel, replaying=True)
        counts = replay_ranges(
            store, applier, [spec.range], key_group=spec.key_group, progress=report
        )
        if stage is None:
            readmodel.conn.execute("PRAGMA journal_mode=DELETE")
    finally:
        readmodel.close()
    if stage is None:
        os.replace(tmp, final)
    else:
        final.with_suffix(".done").touch()  # the driver's progress counts these
    get_logger("eventlane.replay").debug(
        "rebuild task done",
        topic=spec.range.topic,
        partition=spec.range.partition,
        offset=spec.range.end,
        records=counts.records,
        attempt=attempt,
    )
    return TaskResult(spec.task, stage or str(final), counts, attempt, time.perf_counter() - t0)
