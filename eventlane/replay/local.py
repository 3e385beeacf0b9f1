"""The local engine: the single-process reference rebuild.

Replays every range of the plan, topic by topic and partition by partition in offset
order, through the projector's handlers into one build file: no partials, no merge, so
its result does not depend on merge rules. It is what ``--verify`` compares the Spark
engine with, and the baseline the Spark engine must beat. It also builds into a
PostgreSQL schema (:class:`~eventlane.replay.pg_build.PgTarget`, :mod:`.pg_build`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from eventlane.app import App
from eventlane.log import Log, TopicPartition
from eventlane.projection import BatchApplier
from eventlane.replay.build import BuildCounts, app_codec, finalize, open_build, replay_ranges
from eventlane.replay.pg_build import PgTarget, finalize_schema, open_schema_build
from eventlane.replay.progress import NO_PROGRESS, Progress
from eventlane.replay.ranges import OffsetRange

__all__ = ["build_local"]


def build_local(
    log: Log,
    app: App,
    projection: str,
    ranges: list[OffsetRange],
    end: Mapping[TopicPartition, int],
    output: Path | PgTarget,
    *,
    progress: Progress = NO_PROGRESS,
) -> BuildCounts:
    """Build ``output`` (a file, or a PostgreSQL schema) from ``ranges`` (finalized at
    positions ``end``)."""
    projector, readmodel = (
        open_schema_build(output, app, projection)
        if isinstance(output, PgTarget)
        else open_build(output, app, projection)
    )
    done = [0, 0]

    def advance(read: int) -> None:
        done[1] += read
        progress.update(done[0], done[1])

    try:
        applier = BatchApplier(projector, app_codec(app, log), readmodel, replaying=True)
        counts = BuildCounts(0, 0, 0, 0)
        for rng in ranges:
            counts += replay_ranges(log, applier, [rng], progress=advance)
            done[0] += 1
            progress.update(done[0], done[1])
        if isinstance(output, PgTarget):
            finalize_schema(readmodel, end)  # type: ignore[arg-type]
        else:
            finalize(readmodel.conn, output, end)  # type: ignore[arg-type]
    finally:
        readmodel.close()
    return counts
