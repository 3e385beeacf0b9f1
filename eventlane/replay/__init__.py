"""Replay: rebuild projections from the low-water mark, locally or with Spark.

Guide: ``docs/spark.md``. The pieces:

* :func:`rebuild` (:mod:`.rebuild`): pin the end vector ``E``, replay ``[LWM, E)`` through
  the projector's own handlers into a fresh read-model file; engines ``local``
  (:mod:`.local`, the reference) and ``spark`` (:mod:`.spark`: one task per partition,
  partial files merged by :mod:`.merge`'s rules);
* :func:`rebuild_and_swap` (:mod:`.handoff`): shadow build, catch-up, pause the live
  workers, atomic swap, resume;
* :func:`forget` (:mod:`.forget`): erase subjects' personal data (crypto-shredding) and
  rebuild the read models that held it; ``rebuild(..., as_of=...)`` and
  :func:`end_vector_at` replay up to a moment (time travel);
* :mod:`.checksum` and :mod:`.verify`: table-by-table content checksums, comparisons with
  the local engine and the live model;
* :mod:`.datasource` (the ``eventlane`` PySpark data source), :mod:`.typed` (typed event
  DataFrames) and :mod:`.session` (a SparkSession for one machine) need the ``spark`` extra
  and are imported only where used: this package imports no pyspark.
"""

from eventlane.replay.build import BuildCounts, DeadLetterReport, KeyGroup
from eventlane.replay.checksum import (
    TableChecksum,
    TableDiff,
    compare,
    file_checksums,
    table_checksums,
)
from eventlane.replay.forget import ForgetReport, forget
from eventlane.replay.handoff import HandoffResult, rebuild_and_swap
from eventlane.replay.merge import MergeConflictError, merge_partials, merge_rows, parse_rule
from eventlane.replay.ranges import OffsetRange, end_vector_at, plan_ranges, read_range
from eventlane.replay.rebuild import ENGINES, RebuildResult, rebuild
from eventlane.replay.verify import Comparison, verify_rebuild

__all__ = [
    "ENGINES",
    "RebuildResult",
    "rebuild",
    "HandoffResult",
    "rebuild_and_swap",
    "ForgetReport",
    "forget",
    "end_vector_at",
    "BuildCounts",
    "DeadLetterReport",
    "KeyGroup",
    "MergeConflictError",
    "merge_partials",
    "merge_rows",
    "parse_rule",
    "OffsetRange",
    "plan_ranges",
    "read_range",
    "TableChecksum",
    "TableDiff",
    "compare",
    "file_checksums",
    "table_checksums",
    "Comparison",
    "verify_rebuild",
]
