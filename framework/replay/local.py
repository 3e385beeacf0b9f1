"""The local engine: the single-process reference rebuild.

Replays every range of the plan, topic by topic and partition by partition in offset
order, through the projector's handlers into one build file: no partials, no merge, so
its result does not depend on merge rules. It is what ``--verify`` compares the Spark
engine with, and the baseline the Spark engine must beat.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from framework.app import App
from framework.log import Log, TopicPartition
from framework.projection import BatchApplier
from framework.replay.build import BuildCounts, app_codec, finalize, open_build, replay_ranges
from framework.replay.progress import NO_PROGRESS, Progress
from framework.replay.ranges import OffsetRange

__all__ = ["build_local"]


def build_local(
    log: Log,
    app: App,
    projection: str,
    ranges: list[OffsetRange],
    end: Mapping[TopicPartition, int],
    output: Path,
    *,
    progress: Progress = NO_PROGRESS,
) -> BuildCounts:
    """Build ``output`` from ``ranges`` (finalized at positions ``end``)."""
    projector, readmodel = open_build(output, app, projection)
    done = [0, 0]

    def advance(read: int) -> None:
        done[1] += read
        progress.update(done[0], done[1])

    try:
        applier = BatchApplier(projector, app_codec(app), readmodel, replaying=True)
        counts = BuildCounts(0, 0, 0, 0)
        for rng in ranges:
            counts += replay_ranges(log, applier, [rng], progress=advance)
            done[0] += 1
            progress.update(done[0], done[1])
        finalize(readmodel.conn, output, end)
    finally:
        readmodel.close()
    return counts
