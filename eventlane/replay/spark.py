"""The Spark engine: replay log partitions in parallel tasks, then merge their partials.

Plan (driver, metadata only): one task per offset range ``[LWM, E)`` of each partition of
the projector's topics — or, for a projector that declares ``state_per_key = True``, one
task per partition and key group (``key_groups``), so there can be more tasks than
partitions. Tasks are handed to Spark largest first (they are scheduled in that order), so
two cores finish together.

Tasks (executors): :func:`eventlane.replay.task.run_task` inside ``mapPartitions``: each
opens the log by the locator the driver gives it (the data directory, or the URL of a
JetStream cluster: no log files on the executors then), reads its range, decodes, applies
the projector's unchanged handlers and writes a partial SQLite file, in one Python pass;
records never enter the JVM and never reach the driver. Only a small
:class:`~eventlane.replay.task.TaskResult` is collected.

Merge (driver): the partials, in (topic, partition, key group) order, are merged into the
fresh output file inside SQLite (:func:`eventlane.replay.merge.merge_partials`), then the
output is finalized at ``E``. Task failures are retried by Spark (``spark.task.maxFailures``
on a cluster; ``local[N,F]`` in local mode): each attempt writes its own file from scratch,
so a retried task yields the same partial.

A read model in PostgreSQL (``output`` a :class:`~eventlane.replay.pg_build.PgTarget`):
each task writes a stage schema of the target's database instead of a partial file
(:mod:`.pg_build`); the driver makes the target schema afresh, merges the stages into it
inside the server (:func:`eventlane.replay.merge.merge_schemas`: the same rules and
failures as the files' merge, no row through Python) and finalizes it at ``E``. Stages are
dropped when the build starts and when it ends, however it ends. The parts folder (named
after the schema, beside the live file) then holds only the tasks' progress.

Parts folders (``.<output>.parts-<hex>``, beside the output): each build claims its own
(:func:`claim_parts`) and holds an exclusive ``flock`` on its ``owner.lock`` for as long as
it lives, so a folder whose lock can be taken belongs to a build that is gone. A build
removes its folder when it ends, however it ends, after cancelling its Spark job (a task
still running never re-creates the folder: tasks only write into an existing one); the
folders of builds killed before they could (``kill -9``, a lost host) are removed by the
next build of the same output. A running build's folder is never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from eventlane.app import App
from eventlane.engine import log_locator
from eventlane.errors import ReplayError
from eventlane.log import Log, TopicPartition
from eventlane.observability import get_logger
from eventlane.replay.build import BuildCounts, finalize, open_build
from eventlane.replay.executors import ExecutorWatch
from eventlane.replay.merge import MergeStats, Partial, merge_partials, merge_schemas
from eventlane.replay.pg_build import PgTarget, drop_stages, finalize_schema, open_schema_build
from eventlane.replay.progress import NO_PROGRESS, Progress
from eventlane.replay.ranges import OffsetRange
from eventlane.replay.session import is_local
from eventlane.replay.task import TaskResult, make_tasks, read_progress, run_task

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = get_logger("eventlane.replay")

__all__ = ["SparkBuild", "build_spark"]


class SparkBuild(NamedTuple):
    counts: BuildCounts
    tasks: int
    merge: MergeStats
    replay_seconds: float
    retried: int
    """Tasks whose successful attempt was not the first (Spark retried them)."""


def _run_tasks(
    spark: SparkSession,
    app: App,
    projection: str,
    locator: str,
    data_dir: str,
    work: Path,
    ranges: list[OffsetRange],
    key_groups: int,
    group: str,
    target: PgTarget | None,
) -> list[TaskResult]:
    tasks = make_tasks(ranges, key_groups)
    ordered = sorted(tasks, key=lambda t: (-t.range.size, t.task))
    work_dir = str(work)

    def run(specs: object) -> list[TaskResult]:
        return [
            run_task(spec, app, projection, locator, work_dir, data_dir, target)
            for spec in specs  # type: ignore[attr-defined]
        ]

    sc = spark.sparkContext
    sc.setJobGroup(group, f"eventlane rebuild {projection}: {len(tasks)} tasks", True)
    rdd = sc.parallelize(ordered, len(ordered)).mapPartitions(run)
    results: list[TaskResult] = rdd.collect()
    return sorted(results, key=lambda r: r.task)


def build_spark(
    spark: SparkSession,
    log_: Log,
    app: App,
    projection: str,
    ranges: list[OffsetRange],
    end: Mapping[TopicPartition, int],
    output: Path | PgTarget,
    *,
    key_groups: int = 1,
    progress: Progress = NO_PROGRESS,
) -> SparkBuild:
    """Build ``output`` (a file, or a PostgreSQL schema) from ``ranges`` of ``log_`` with
    Spark (finalized at positions ``end``). The tasks reopen the log by
    :func:`~eventlane.engine.log_locator`."""
    locator = log_locator(log_)
    data_dir = str(log_.local.root)
    target = output if isinstance(output, PgTarget) else None
    if target is not None:
        drop_stages(target.url, target.schema)
    parts = claim_parts(target.path.parent / target.schema if target else Path(str(output)))
    work = parts.path
    group = f"eventlane-rebuild-{work.name}"
    thread: threading.Thread | None = None
    try:
        t0 = time.perf_counter()
        results: list[TaskResult] = []
        failure: list[BaseException] = []

        def job() -> None:
            if not ranges:
                return  # no partition: nothing for Spark to do
            try:
                results.extend(
                    _run_tasks(
                        spark,
                        app,
                        projection,
                        locator,
                        data_dir,
                        work,
                        ranges,
                        key_groups,
                        group,
                        target,
                    )
                )
            except BaseException as exc:
                failure.append(exc)

        sc = spark.sparkContext
        watch = None if is_local(sc.master or "local") else ExecutorWatch(sc, projection, progress)
        thread = threading.Thread(target=job, name="eventlane-rebuild-job", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.5)
            done = sum(1 for _ in work.glob("part-?????.sqlite"))
            done += sum(1 for _ in work.glob("part-?????.done"))  # stage schemas
            progress.update(done, read_progress(work))
            if watch is not None and thread.is_alive():
                watch.check()  # raises after too long without one: the job is cancelled below
        if failure:
            raise ReplayError(
                f"the Spark rebuild of {projection!r} failed: {_short(failure[0])}"
            ) from failure[0]
        replay_seconds = time.perf_counter() - t0
        counts = BuildCounts(0, 0, 0, 0)
        for r in results:
            counts += BuildCounts(*r.counts)
        progress.update(len(results), counts.records)
        progress.phase("merge")
        specs = {t.task: t for t in make_tasks(ranges, key_groups)}
        partials = [Partial(Path(r.path), specs[r.task].label) for r in results]
        rules = app.projector(projection).merge_rules
        if target is not None:
            _projector, pg = open_schema_build(target, app, projection)
            try:
                stats = merge_schemas(pg.raw, target.schema, partials, rules, projector=projection)
                finalize_schema(pg, end)
            finally:
                pg.close()
        else:
            assert isinstance(output, Path)
            _projector, readmodel = open_build(output, app, projection)
            try:
                stats = merge_partials(readmodel.conn, partials, rules, projector=projection)
                finalize(readmodel.conn, output, end)
            finally:
                readmodel.close()
        retried = sum(1 for r in results if r.attempt > 0)
        return SparkBuild(counts, len(results), stats, replay_seconds, retried)
    finally:
        try:
            if thread is not None and thread.is_alive():  # stopped (Ctrl-C): stop the job too
                with contextlib.suppress(Exception):
                    spark.sparkContext.cancelJobGroup(group)
                thread.join(CANCEL_WAIT_S)
        finally:  # a second Ctrl-C during the wait: the parts go all the same
            parts.release()
            if target is not None:
                drop_stages(target.url, target.schema)


CANCEL_WAIT_S = 30.0
"""How long a stopped build waits for its cancelled Spark job before removing its parts."""

_LOCK = "owner.lock"
_ORPHAN_AFTER_S = 60.0
"""A parts folder with no lock file yet is a build's that is just starting, unless older."""


class Parts:
    """A claimed parts folder (module docstring): :meth:`release` removes it and lets go."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    def release(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._fd)  # the flock goes with it


def claim_parts(output: Path) -> Parts:
    """A new parts folder for a build of ``output``, held by this process; the folders of
    earlier builds of ``output`` that are gone are removed first (module docstring)."""
    for old in output.parent.glob(f".{glob.escape(output.name)}.parts-*"):
        _remove_if_orphaned(old)
    work = output.parent / f".{output.name}.parts-{uuid.uuid4().hex[:12]}"
    work.mkdir(parents=True)
    fd = os.open(work / _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a new file: nobody else has it
    return Parts(work, fd)


def _remove_if_orphaned(folder: Path) -> None:
    try:
        fd = os.open(folder / _LOCK, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            if time.time() - folder.stat().st_mtime > _ORPHAN_AFTER_S:
                shutil.rmtree(folder, ignore_errors=True)
        return
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)  # held: a build running now
        return
    try:
        shutil.rmtree(folder, ignore_errors=True)
        log.info("removed the parts of a rebuild that is gone", path=str(folder))
    finally:
        os.close(fd)


_WORKER_DIED = "Python worker exited unexpectedly"
_ATTEMPTS = re.compile(r"failed (\d+) times")
_NO_MODULE = re.compile(r"\b(ModuleNotFoundError|ImportError)\b")
_SHIP_IT = (
    " (in a Spark task: the executors' Python cannot import it; every node needs eventlane and"
    " the application, e.g. a packed environment shipped with --archives and"
    " spark.pyspark.python, or one container image; docs/spark.md, section 9)"
)


def _short(exc: BaseException) -> str:
    """The useful last line of a (Py4J-wrapped) Python traceback; for a Python worker that
    died (the JVM sees only its pipe close: ``java.io.EOFException``), what happened."""
    text = str(exc)
    if _WORKER_DIED in text:
        tries = _ATTEMPTS.search(text)
        each = f" (in each of its {tries.group(1)} attempts)" if tries else ""
        return (
            f"a Python worker running a rebuild task exited unexpectedly{each}: the process"
            " died without a Python error (killed by a signal or the out-of-memory killer,"
            " os._exit, or a crash in native code); Spark's executor log has the details"
        )
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if "Error" in line or "Exception" in line:
            cause = line.strip()[:2000]
            if _NO_MODULE.search(cause) and "Python worker" in text:
                cause += _SHIP_IT
            return cause
    return (lines[-1] if lines else repr(exc))[:2000]
