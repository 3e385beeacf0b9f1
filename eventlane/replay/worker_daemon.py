"""Spark's Python worker daemon for rebuild tasks, with eventlane's replay path imported once.

Spark starts one daemon per executor (``python -m <spark.python.daemon.module>``), which
forks a worker for each task slot; each worker imports what its task runs. Imported here,
before the fork, the replay path (:mod:`eventlane.replay.task` and what it imports: ~0.25 s
of CPU) is inherited by every worker instead of imported by each. Used by the local-mode
sessions a rebuild starts (:func:`eventlane.replay.session.spark_session`, ``rebuild=True``).

Invariant: nothing imported here starts a thread (a forked child keeps only the thread
that forked; Spark's own daemon imports its worker after the fork for that reason).
``tests/replay/test_rebuild_session.py`` checks it.
"""

import pyspark.worker  # noqa: F401 - the worker main each forked worker runs
from pyspark.daemon import manager

import eventlane.replay.task  # noqa: F401 - imported before the fork, inherited by workers

if __name__ == "__main__":
    manager()
