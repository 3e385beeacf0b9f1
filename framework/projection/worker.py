"""One projector worker: a consumer-group member applying its partitions to the read model.

The loop: ``poll`` → apply the records in one read-model transaction (with positions, see
:mod:`.applier`) → commit the group offsets (for lag; the read model's positions are the
truth) → publish new dead letters. On assignment a partition is *claimed* in the read model
with the member's group generation and the consumer seeks to the stored position (the
partition's low-water mark the first time), never to the group's committed offset. A worker
whose generation was superseded for a partition (a paused zombie) is refused by the read
model and drops the batch.

SIGTERM / SIGINT: finish the current batch, commit, leave the group (the partitions move at
once), exit 0.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from framework.consumer.group import GroupConsumer
from framework.errors import CommitFailedError, ProjectionError
from framework.log import TopicPartition
from framework.observability import configure_logging
from framework.projection.app import App, Runtime, load_app
from framework.projection.applier import BatchApplier
from framework.projection.dead_letters import publish_dead_letters
from framework.projection.readmodel import FencedError, ReadModel, readmodel_path

log = structlog.get_logger("eventlane.projection")


def pending_migrations(app: App, name: str, readmodel: ReadModel) -> list[str]:
    """Names of the projector's read-model migrations not applied yet."""
    migrations = app.projector(name).migrations
    if migrations is None:
        return []
    return [m.name for m in migrations.pending(readmodel.db)]


def open_readmodel(runtime: Runtime, name: str, *, migrate: bool = False) -> ReadModel:
    """Open a projector's read model, refusing (or applying) pending migrations."""
    readmodel = ReadModel(readmodel_path(runtime.log.path, name))
    pending = pending_migrations(runtime.app, name, readmodel)
    if pending:
        migrations = runtime.app.projector(name).migrations
        if not migrate or migrations is None:
            readmodel.close()
            raise ProjectionError(
                f"read model {name!r} has pending migrations: {', '.join(pending)}; run"
                " `eventlane migrate APP` first",
                path=readmodel.path,
            )
        migrations.apply(readmodel.db)
    return readmodel


class Worker:
    """Runs one projector as a member of its consumer group (``group = projector name``)."""

    def __init__(
        self,
        runtime: Runtime,
        name: str,
        *,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 1_000,
        max_poll_records: int = 2_000,
        poll_timeout: float = 0.5,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        self.runtime = runtime
        self.name = name
        self.projector = runtime.app.projector(name)()
        self.readmodel = open_readmodel(runtime, name)
        self.projector.setup(self.readmodel.db)
        self.applier = BatchApplier(self.projector, runtime.codec, self.readmodel, app=runtime)
        self.max_poll_records = max_poll_records
        self.poll_timeout = poll_timeout
        self.on_batch = on_batch
        self.stopping = threading.Event()
        self._log = log.bind(projector=name, pid=os.getpid())
        for topic in self.projector.topics:
            if not runtime.log.topic_exists(topic):
                runtime.log.create_topic(
                    topic, runtime.partitions_for(topic), {"retention_ms": -1}, exist_ok=True
                )
        self.consumer = GroupConsumer(
            runtime.log,
            group_id=name,
            topics=self.projector.topics,
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=min(heartbeat_interval_ms, session_timeout_ms // 3),
            enable_auto_commit=False,
            auto_offset_reset="error",
            on_assigned=self._assigned,
            on_revoked=self._revoked,
            max_poll_records=max_poll_records,
        )
        self.applied = 0

    def _assigned(self, partitions: list[TopicPartition]) -> None:
        generation = self.consumer.generation
        for tp in partitions:
            lwm = self.runtime.log.offsets(tp.topic, tp.partition).lwm
            try:
                position = self.readmodel.claim(tp, generation, lwm)
            except FencedError:
                self._log.warning(
                    "partition claimed by a newer generation",
                    topic=tp.topic,
                    partition=tp.partition,
                    generation=generation,
                )
                continue
            self.consumer.seek(tp, position)
            self._log.info(
                "partition assigned",
                topic=tp.topic,
                partition=tp.partition,
                offset=position,
                generation=generation,
            )

    def _revoked(self, partitions: list[TopicPartition]) -> None:
        self._commit_group(partitions)

    def _commit_group(self, partitions: list[TopicPartition] | None = None) -> None:
        positions = self.readmodel.positions()
        owned = self.consumer.assignment() if partitions is None else set(partitions)
        offsets = {tp: positions[tp] for tp in owned if tp in positions}
        if not offsets:
            return
        try:
            self.consumer.commit(offsets)
        except CommitFailedError as exc:
            self._log.info("group commit refused (partition moved)", error=str(exc))

    def run_once(self) -> int:
        """Poll once and apply what came; return how many records were polled."""
        records = self.consumer.poll(self.poll_timeout, self.max_poll_records)
        if not records:
            return 0
        generation = self.consumer.generation
        try:
            self.applier.apply(records, generation)
        except FencedError as exc:
            self._log.warning(
                "batch refused: partition owned by a newer generation",
                topic=exc.topic,
                partition=exc.partition,
            )
            return len(records)
        self.applied += len(records)
        self._commit_group()
        if self.applier.readmodel.conn.execute(
            "SELECT 1 FROM _eventlane_dead_letters WHERE published=0 LIMIT 1"
        ).fetchone():
            publish_dead_letters(self.runtime.log, self.name, self.readmodel)
        if self.on_batch is not None:
            self.on_batch(len(records))
        return len(records)

    def run(self, *, until: Callable[[], bool] | None = None) -> None:
        """Loop until :attr:`stopping` is set (or ``until()`` is true), then leave."""
        try:
            while not self.stopping.is_set() and not (until is not None and until()):
                self.run_once()
        finally:
            self.close()

    def install_signal_handlers(self) -> None:
        def stop(signum: int, _frame: Any) -> None:
            self._log.info("stopping after the current batch", signal=signum)
            self.stopping.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)

    def close(self) -> None:
        try:
            self._commit_group()
        except Exception as exc:
            self._log.warning("final group commit failed", error=str(exc))
        self.consumer.close(autocommit=False)
        self.readmodel.close()


def worker_main(app_spec: str, name: str, data: str, session_timeout_ms: int = 10_000) -> None:
    """Entry point of a worker process (``python -m framework.projection.worker``)."""
    configure_logging()
    app = load_app(app_spec)
    with app.open(Path(data)) as runtime:
        worker = Worker(runtime, name, session_timeout_ms=session_timeout_ms)
        worker.install_signal_handlers()
        worker.run()


def wait_for_positions(
    runtime: Runtime, name: str, offsets: dict[TopicPartition, int], timeout: float
) -> bool:
    """Read-your-writes: wait until projector ``name`` has applied everything below
    ``offsets`` (e.g. the offsets a save returned + 1). Returns False on timeout."""
    path = readmodel_path(runtime.log.path, name)
    deadline = time.monotonic() + timeout
    while True:
        seen = runtime.log.wait_seq()
        if path.exists():
            readmodel = ReadModel(path)
            try:
                positions = readmodel.positions()
            finally:
                readmodel.close()
            if all(positions.get(tp, -1) >= off for tp, off in offsets.items()):
                return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        runtime.log.wait(seen, min(remaining, 0.05))


if __name__ == "__main__":  # pragma: no cover - exercised through the runner's processes
    import sys

    worker_main(
        sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 10_000
    )
