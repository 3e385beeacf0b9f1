"""Progress reporting of a rebuild: a small protocol the CLI implements with a rich bar."""

from __future__ import annotations

from typing import Protocol

__all__ = ["NO_PROGRESS", "Progress"]


class Progress(Protocol):
    """Told what a rebuild has done; every method is called from the driver's threads."""

    def start(self, partitions: int, offsets: int) -> None:
        """``partitions`` tasks (one per log partition, or per partition and key group) will
        run over ``offsets`` offsets (an upper bound of the records: compaction leaves
        gaps)."""

    def update(self, partitions_done: int, records_done: int) -> None:
        """Totals so far (tasks finished, records read), not increments."""

    def phase(self, name: str) -> None:
        """A new phase started: ``replay``, ``merge``, ``catch-up``, ``pause``, ``swap``, or
        ``waiting for executors`` (a Spark job on a cluster that has none: back to
        ``replay`` when one joins)."""


class _NoProgress:
    def start(self, partitions: int, offsets: int) -> None:
        pass

    def update(self, partitions_done: int, records_done: int) -> None:
        pass

    def phase(self, name: str) -> None:
        pass


NO_PROGRESS: Progress = _NoProgress()
