"""A Spark rebuild's executors, watched while its job runs: a cluster without one is said so.

When the last worker of a standalone cluster dies under a job, Spark logs one "Lost
executor" line and then waits for another worker without end: the job's tasks neither fail
nor progress, and a rebuild's progress bar stood still with no word of why (seen with Spark
4.3: a master and one worker, the worker killed with ``kill -9`` mid-rebuild). A cluster
whose workers are all busy, or that has none yet, looks the same to the driver. So the
driver of a rebuild on a cluster (not in local mode, where the driver is the executor)
counts the application's live executors while its job runs (Spark's status tracker, the
driver's own entry left out), every :data:`CHECK_S`:

* none for :data:`WARN_AFTER_S`: one warning naming the master, since when, and how much
  longer the rebuild waits; the progress phase is ``waiting for executors``;
* one again: an info line and the phase back to ``replay``. Spark runs the tasks it lost
  again on it (each attempt writes its partial from scratch);
* none for ``EVENTLANE_SPARK_EXECUTOR_WAIT`` seconds (default :data:`DEFAULT_WAIT_S`;
  ``inf`` waits without end): :class:`~eventlane.errors.NoExecutorsError` (retriable), and
  the caller cancels the job. Nothing of the live read model was written: a rebuild builds
  a new output.
"""

from __future__ import annotations

import math
import os
import time
from typing import TYPE_CHECKING

from eventlane.errors import ConfigError, NoExecutorsError
from eventlane.observability import get_logger
from eventlane.replay.progress import Progress

if TYPE_CHECKING:
    from pyspark import SparkContext

log = get_logger("eventlane.replay")

WAIT_ENV = "EVENTLANE_SPARK_EXECUTOR_WAIT"
DEFAULT_WAIT_S = 600.0
"""How long a rebuild waits for an executor before it gives up (a YARN queue may take
minutes to grant one)."""
WARN_AFTER_S = 15.0
"""How long without an executor before the warning (Spark's own starvation warning waits
as long)."""
CHECK_S = 2.0
"""How often the executors are counted (a call into the JVM)."""


def wait_limit() -> float:
    """``$EVENTLANE_SPARK_EXECUTOR_WAIT`` in seconds (``inf``: no limit), else the default."""
    text = os.environ.get(WAIT_ENV, "").strip()
    if not text:
        return DEFAULT_WAIT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:  # also NaN
        raise ConfigError(f"{WAIT_ENV}={text!r}: not a positive number of seconds (or inf)")
    return value


class ExecutorWatch:
    """The executors of one rebuild's job on a cluster (module docstring)."""

    def __init__(self, sc: SparkContext, projection: str, progress: Progress) -> None:
        self._sc = sc
        self._projection = projection
        self._progress = progress
        self._limit = wait_limit()
        self._checked_at = -math.inf
        self._none_since: float | None = None
        self._warned = False

    def check(self) -> None:
        """Count the executors (at most every :data:`CHECK_S`); raises
        :class:`~eventlane.errors.NoExecutorsError` once there were none for the limit."""
        now = time.monotonic()
        if now - self._checked_at < CHECK_S:
            return
        self._checked_at = now
        try:
            executors = len(self._sc.statusTracker().getExecutorInfos()) - 1  # less the driver
        except Exception:  # py4j: the JVM going away; the job's own error says why
            return
        if executors > 0:
            if self._warned:
                log.info(
                    "the Spark job has executors again; lost tasks run again",
                    projection=self._projection,
                    executors=executors,
                )
                self._progress.phase("replay")
            self._none_since, self._warned = None, False
            return
        if self._none_since is None:
            self._none_since = now
        waited = now - self._none_since
        master = self._sc.master
        if waited >= self._limit:
            raise NoExecutorsError(
                f"the Spark job of the rebuild of {self._projection!r} had no executor for"
                f" {waited:.0f} s ({master}: its workers are gone, or none has free cores);"
                f" stopped ({WAIT_ENV}={self._limit:g}); the live read model was not touched"
            )
        if waited >= WARN_AFTER_S and not self._warned:
            self._warned = True
            log.warning(
                "the Spark job has no executor: the cluster lost its workers, or none has"
                " free cores; waiting for one",
                projection=self._projection,
                master=master,
                waited_s=round(waited),
                limit_s=self._limit,
            )
            self._progress.phase("waiting for executors")
