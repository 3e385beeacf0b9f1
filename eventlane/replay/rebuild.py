"""``rebuild``: replay a projection's history into a fresh read-model file.

    result = rebuild(runtime, "invoices", engine="spark", output=Path("invoices.sqlite"))

Steps:

1. pin the end vector ``E``: the high-water mark of every partition of the projector's
   topics, now (or ``end=`` given);
2. replay ``[LWM, E)`` of every partition through the projector's own handlers, with
   ``replaying=True`` and no application (no commands, no side effects): in one process
   (``engine="local"``, :mod:`.local`) or in parallel Spark tasks whose partial files are
   merged by the projector's ``merge_rules`` (``engine="spark"``, :mod:`.spark`);
3. finalize the file (:func:`eventlane.replay.build.finalize`): its positions are exactly
   ``E``; events that failed are in :attr:`RebuildResult.dead_letters` (the report), never
   in the live ``<group>.dlq`` topic.

Nothing live is touched: the output is a new file (default
``<data>/readmodels/<name>.rebuild.sqlite``). :mod:`.handoff` swaps it in. A projection
whose read model is in PostgreSQL is rebuilt (by either engine) into the schema
``<schema>__rebuild`` of its database (:mod:`.pg_build`); ``output`` does not apply.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from eventlane.app import App, Runtime
from eventlane.app.moments import as_of_ms
from eventlane.engine import open_log
from eventlane.errors import ConfigError
from eventlane.log import Log, TopicPartition
from eventlane.log.local import LocalDir
from eventlane.observability import get_logger
from eventlane.projection.postgres import derived_schema, drop_schema, schema_name
from eventlane.projection.store import app_readmodel_url
from eventlane.replay.build import BuildCounts, DeadLetterReport, dead_letter_report, remove_db
from eventlane.replay.local import build_local
from eventlane.replay.merge import MergeStats
from eventlane.replay.pg_build import PgTarget, schema_dead_letters
from eventlane.replay.progress import NO_PROGRESS, Progress
from eventlane.replay.ranges import end_vector, end_vector_at, plan_ranges

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = get_logger("eventlane.replay")

__all__ = ["ENGINES", "RebuildResult", "default_output", "rebuild"]

ENGINES = ("spark", "local")


@attrs.frozen
class RebuildResult:
    """What a rebuild produced. ``end`` is the vector ``E`` the file's positions hold."""

    projection: str
    engine: str
    path: Path
    end: Mapping[TopicPartition, int]
    counts: BuildCounts
    dead_letters: list[DeadLetterReport]
    tasks: int
    seconds: float
    """Replay plus merge and finalize (not the SparkSession start)."""
    replay_seconds: float
    merge: MergeStats | None = None
    retried_tasks: int = 0
    """Spark tasks that succeeded only on a later attempt."""
    schema: str | None = None
    """The PostgreSQL schema built (``path`` is then ``postgresql:<schema>``)."""

    @property
    def events_per_second(self) -> float:
        return self.counts.records / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "projection": self.projection,
            "engine": self.engine,
            "path": str(self.path),
            "schema": self.schema,
            "end": [
                {"topic": tp.topic, "partition": tp.partition, "offset": off}
                for tp, off in sorted(self.end.items())
            ],
            "records": self.counts.records,
            "applied": self.counts.applied,
            "skipped": self.counts.skipped,
            "dead_lettered": self.counts.dead_lettered,
            "dead_letters": [d.to_json() for d in self.dead_letters],
            "tasks": self.tasks,
            "seconds": round(self.seconds, 3),
            "replay_seconds": round(self.replay_seconds, 3),
            "merged_rows": None if self.merge is None else self.merge.rows,
            "merge_seconds": None if self.merge is None else round(self.merge.seconds, 3),
            "retried_tasks": self.retried_tasks,
        }


def default_output(data: Path | LocalDir, projection: str) -> Path:
    local = data if isinstance(data, LocalDir) else LocalDir(Path(data))
    return local.rebuild_output(projection)


def _resolve(target: Runtime | App, data: Path | str | Log | None) -> tuple[App, Log, bool]:
    if isinstance(target, Runtime):
        return target.app, target.log, False
    if isinstance(target, App):
        if data is None:
            raise ConfigError("rebuild(app, ...) needs data= (the data directory, or a log)")
        if not isinstance(data, str | Path):
            return target, data, False  # an open log (e.g. Kafka's core log: no Runtime)
        return target, open_log(data), True
    raise ConfigError(f"rebuild needs a Runtime or an App, got {type(target).__name__}")


def rebuild(
    target: Runtime | App,
    projection: str,
    *,
    engine: str = "spark",
    output: Path | str | PgTarget | None = None,
    data: Path | str | Log | None = None,
    end: Mapping[TopicPartition, int] | None = None,
    spark: SparkSession | None = None,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    key_groups: int | None = None,
    progress: Progress = NO_PROGRESS,
    as_of: datetime | int | None = None,
) -> RebuildResult:
    """Rebuild ``projection`` of ``target`` (a Runtime, or an App with ``data=``).

    ``as_of`` (a timezone-aware datetime, or epoch milliseconds) is time travel: the end
    vector is each partition's first offset stamped after that moment
    (:func:`~eventlane.replay.ranges.end_vector_at`), so the read model is the one the
    projection held then; it cannot be combined with ``end``.

    ``engine="spark"`` uses ``spark`` (or starts a session with ``master``/``conf``, see
    :func:`eventlane.replay.session.spark_session`). ``key_groups`` (Spark, projectors with
    ``state_per_key = True`` only) splits every partition into that many tasks by key;
    default: enough groups for two tasks per core when there are fewer partitions.
    """
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    app, log_, owns_log = _resolve(target, data)
    try:
        cls = app.projector(projection)
        topics = app.names.projector_topics(cls)
        local, stem = log_.local, app.names.local(projection)
        out = _output(app, local, projection, stem, output)
        if isinstance(out, Path):
            out.parent.mkdir(parents=True, exist_ok=True)
        if as_of is not None:
            if end is not None:
                raise ConfigError("rebuild takes as_of or end, not both")
            pinned = end_vector_at(log_, topics, as_of_ms(as_of))
        else:
            pinned = dict(end) if end is not None else end_vector(log_, topics)
        ranges = plan_ranges(log_, topics, end=pinned)
        per_key = cls.state_per_key
        if key_groups is not None and key_groups > 1 and not per_key:
            raise ConfigError(
                f"key_groups needs a projector whose state is per key; {cls.__qualname__}"
                " does not declare state_per_key = True"
            )
        offsets = sum(r.size for r in ranges)
        session = None
        groups = 1
        if engine == "spark":
            # pyspark is an optional extra: imported only for this engine
            from eventlane.replay.session import spark_session  # noqa: PLC0415

            session = spark or spark_session(master, conf, rebuild=True)
            groups = key_groups or (_default_groups(session, len(ranges)) if per_key else 1)
        progress.start(len(ranges) * groups, offsets)
        progress.phase("replay")
        t0 = time.perf_counter()
        log.info(
            "rebuild started",
            projection=projection,
            engine=engine,
            partitions=len(ranges),
            offsets=offsets,
        )
        try:
            if engine == "local":
                counts = build_local(log_, app, projection, ranges, pinned, out, progress=progress)
                merge = None
                tasks = len(ranges)
                retried = 0
                replay_seconds = time.perf_counter() - t0
            else:
                from eventlane.replay.spark import build_spark  # noqa: PLC0415

                assert session is not None
                built = build_spark(
                    session,
                    log_,
                    app,
                    projection,
                    ranges,
                    pinned,
                    out,
                    key_groups=groups,
                    progress=progress,
                )
                counts, merge, tasks = built.counts, built.merge, built.tasks
                replay_seconds = built.replay_seconds
                retried = built.retried
        except BaseException:
            if isinstance(out, PgTarget):
                drop_schema(out.url, out.schema)
            else:
                remove_db(out)
            raise
        seconds = time.perf_counter() - t0
        if isinstance(out, PgTarget):
            letters = schema_dead_letters(out.url, out.schema)
        else:
            conn = sqlite3.connect(out.resolve().as_uri() + "?mode=ro", uri=True)
            try:
                letters = dead_letter_report(conn)
            finally:
                conn.close()
        result = RebuildResult(
            projection,
            engine,
            out.display if isinstance(out, PgTarget) else out,
            pinned,
            counts,
            letters,
            tasks,
            seconds,
            replay_seconds,
            merge,
            retried,
            out.schema if isinstance(out, PgTarget) else None,
        )
        log.info(
            "rebuild done",
            projection=projection,
            engine=engine,
            records=counts.records,
            dead_letters=len(letters),
            seconds=round(seconds, 3),
            path=str(result.path),
        )
        return result
    finally:
        if owns_log:
            log_.close()


def _output(
    app: App,
    local: LocalDir,
    projection: str,
    stem: str,
    output: Path | str | PgTarget | None,
) -> Path | PgTarget:
    """Where the rebuild writes: a file, or (a read model in PostgreSQL) a schema."""
    url = app_readmodel_url(app, projection)
    live = local.readmodel(stem)
    if url is not None:
        if output is None:
            return PgTarget(url, derived_schema(schema_name(stem), "rebuild"), live)
        if not isinstance(output, PgTarget):
            raise ConfigError(
                f"projection {projection!r} has its read model in PostgreSQL: a rebuild writes"
                f" schema {derived_schema(schema_name(stem), 'rebuild')}, not a file (no"
                " --output)"
            )
    if isinstance(output, PgTarget):
        if output.schema == schema_name(stem):
            raise ConfigError(
                "the rebuild output must not be the live read model; use --swap to hand it over"
            )
        return output
    out = Path(output) if output is not None else local.rebuild_output(stem)
    if out.resolve() == live.resolve():
        raise ConfigError(
            "the rebuild output must not be the live read model; use --swap to hand it over",
            path=out,
        )
    return out


def _default_groups(spark: SparkSession, partitions: int) -> int:
    cores = int(spark.sparkContext.defaultParallelism)
    if partitions == 0 or partitions >= 2 * cores:
        return 1
    return -(-2 * cores // partitions)
