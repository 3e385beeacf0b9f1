"""``eventlane rebuild --check``: will a parallel rebuild of this projector merge?

A Spark rebuild replays each partition into its own partial read model, then merges the
partials; a row written from two partitions needs a merge rule (``merge_rules``), or the
merge stops with an error naming the table, the key and both partitions. This check runs
that same path in this process, without Spark: one partial per partition (the tasks
Spark would run, :func:`~eventlane.replay.task.run_task`), then
:func:`~eventlane.replay.merge.merge_partials` into a scratch file, which is deleted. It
reads the whole log once, so run it on a copy or at a quiet time on a large one.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from eventlane.app import App
from eventlane.log import Log
from eventlane.replay.build import open_build, remove_db
from eventlane.replay.merge import MergeStats, Partial, merge_partials
from eventlane.replay.ranges import end_vector, plan_ranges
from eventlane.replay.task import make_tasks, run_task

__all__ = ["check_merge"]


def check_merge(log_: Log, data: Path, app: App, projection: str) -> tuple[int, MergeStats]:
    """Replay every partition of ``projection`` into its own partial and merge them all;
    return ``(partials, merge statistics)``, or raise the merge's error (a
    :class:`~eventlane.errors.ReplayError` naming table, key and partitions)."""
    cls = app.projector(projection)
    topics = app.names.projector_topics(cls)
    ranges = plan_ranges(log_, topics, end=end_vector(log_, topics))
    (data / "readmodels").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{projection}.check-", dir=data / "readmodels"))
    try:
        results = [run_task(spec, app, projection, log_, str(work)) for spec in make_tasks(ranges)]
        specs = {t.task: t for t in make_tasks(ranges)}
        partials = [Partial(Path(r.path), specs[r.task].label) for r in results]
        output = work / "merged.sqlite"
        _projector, readmodel = open_build(output, app, projection)
        try:
            stats = merge_partials(readmodel.conn, partials, cls.merge_rules, projector=projection)
        finally:
            readmodel.close()
            remove_db(output)
        return len(partials), stats
    finally:
        shutil.rmtree(work, ignore_errors=True)
