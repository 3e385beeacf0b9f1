"""Per-key parallelism (``Projector.concurrency``): the rule it enforces, and ``kill -9``
during parallel processing.

The crash test runs real worker processes of ``tests.projection.keyapp`` (a policy with 8
threads folding ticks per key through ``ctx.issue``) and SIGKILLs them mid-work, many
cycles. After every kill it checks, from the raw records of the log, that the committed
position never passed an unfinished event: every tick below a partition's position, and
every tick in the offset map above it, has its effect (a ``Folded`` whose causation id is
the tick's event id) on the log. At the end every key's fold is exactly ``1..N`` in order
(each tick applied once, in key order), with no dead letter.
"""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from projection_kit import Workers, child_env, positions, wait_caught_up

from eventlane.app import Runtime
from eventlane.codec import Envelope
from eventlane.errors import ConfigError, ProjectionError
from eventlane.log import LogStore, TopicPartition
from eventlane.log.partitioner import partition_for_key
from eventlane.projection import EventContext, Projector, ReadModelView, Worker, handles
from eventlane.projection.parallel import DONE_TABLE, ParallelApplier
from eventlane.projection.readmodel import readmodel_path
from tests.projection import keyapp

APP = "tests.projection.keyapp:app"
SESSION_MS = 500


def produce(runtime: Runtime, keys: int, ticks: int, first: int = 1) -> None:
    """Ticks ``first..first+ticks-1`` of ``keys`` sources, interleaved across keys."""
    count = runtime.log.partition_count("ticks")
    batches: dict[int, list[tuple[bytes, bytes, tuple[tuple[str, bytes], ...], None]]] = {}
    for n in range(first, first + ticks):
        for k in range(keys):
            key, value, headers = runtime.codec.encode(Envelope(keyapp.Ticked(n), f"src-{k}", n))
            batches.setdefault(partition_for_key(key, count), []).append(
                (key, value, tuple(headers), None)
            )
    for p, records in batches.items():
        runtime.log.append("ticks", p, records)


def raw(data: Path, topic: str) -> dict[int, list[tuple[int, dict[str, object]]]]:
    """Every record of ``topic`` per partition: ``(offset, JSON value)``, read straight."""
    log = LogStore(data)
    try:
        out: dict[int, list[tuple[int, dict[str, object]]]] = {}
        for p in range(log.partition_count(topic)):
            records, offset = [], log.offsets(topic, p).lwm
            while True:
                batch, _ = log.read(topic, p, offset, max_bytes=1 << 20)
                if not batch:
                    break
                records += [(r.offset, orjson.loads(r.value)) for r in batch]
                offset = batch[-1].offset + 1
            out[p] = records
        return out
    finally:
        log.close()


def done_map(data: Path) -> set[tuple[int, int]]:
    with sqlite3.connect(readmodel_path(data, "folder")) as conn:
        return {(p, o) for p, o in conn.execute(f"SELECT partition, offset FROM {DONE_TABLE}")}


def check_committed_finished(data: Path) -> int:
    """No committed position past an unfinished tick; returns the ticks committed."""
    effects = {v["causation_id"] for recs in raw(data, "folds").values() for _, v in recs}
    pos = positions(data, "folder")
    above = done_map(data)
    committed = 0
    for p, recs in raw(data, "ticks").items():
        position = pos.get(TopicPartition("ticks", p), 0)
        assert all(o >= position for q, o in above if q == p)  # the map holds only what is above
        for offset, value in recs:
            if offset < position or (p, offset) in above:
                committed += 1
                assert value["event_id"] in effects, f"ticks-{p}@{offset} committed unfinished"
    return committed


def check_folds(data: Path, keys: int, ticks: int) -> None:
    """Independent fold: each key's ``Folded`` events are exactly 1..N, one per tick."""
    folds: dict[str, list[int]] = {}
    causes: list[object] = []
    for recs in raw(data, "folds").values():
        for _, v in recs:
            folds.setdefault(str(v["aggregate_id"]), []).append(v["data"]["n"])  # type: ignore[index]
            causes.append(v["causation_id"])
    assert folds == {f"fold-{k}": list(range(1, ticks + 1)) for k in range(keys)}
    tick_ids = {v["event_id"] for recs in raw(data, "ticks").values() for _, v in recs}
    assert len(causes) == len(set(causes)) and set(causes) == tick_ids
    with ReadModelView(readmodel_path(data, "folder")) as view:
        assert view.dead_letter_counts() == {}


@pytest.mark.parametrize("mode", ["threads", "adaptive"])
def test_kill9_during_per_key_parallel_processing(data: Path, workers: Workers, mode: str) -> None:
    """``threads``: the handlers on 8 threads; ``adaptive``: where the probe sends them (the
    polling thread: the handler computes more than it waits), the same commits."""
    keys, ticks, rng = 40, 0, random.Random(15)
    env = child_env(KEYAPP_MODE=mode)
    kills_mid_work = 0
    with keyapp.app.open(data) as runtime:
        for _ in range(8):
            before = sum(positions(data, "folder").values()) if ticks else 0
            if keys * ticks - before < 600:  # keep a backlog: every kill lands mid-work
                produce(runtime, keys, 16, first=ticks + 1)
                ticks += 16
            proc = workers.start(
                "folder",
                app=APP,
                session_timeout_ms=SESSION_MS,
                max_poll_records=rng.choice([30, 200]),
                env=env,
            )
            deadline = time.monotonic() + 120
            while (
                not (data / "readmodels" / "folder.sqlite").exists()
                or sum(positions(data, "folder").values()) <= before
            ):
                assert proc.poll() is None, f"worker died by itself: {proc.returncode}"
                assert time.monotonic() < deadline, "worker made no progress in 120 s"
                time.sleep(0.01)
            time.sleep(rng.uniform(0, 0.2))
            workers.kill9(proc)
            kills_mid_work += check_committed_finished(data) < keys * ticks
    assert kills_mid_work >= 4  # the kills landed on working workers
    final = workers.start("folder", app=APP, session_timeout_ms=SESSION_MS, env=env)
    workers.wait_joined(final, "folder")  # up (its SIGTERM handler too), even with no work left
    wait_caught_up(data, "folder", topic="ticks", timeout=300)
    assert workers.term(final) == 0
    assert check_committed_finished(data) == keys * ticks
    assert done_map(data) == set()  # everything finished: the map is empty
    check_folds(data, keys, ticks)
    probed = "handlers placed" in "".join(
        log.read_text(errors="replace") for log in workers.logs.glob("worker-*.log")
    )
    assert probed is (mode == "adaptive")


def test_concurrency_refuses_a_read_model() -> None:
    with pytest.raises(ConfigError, match="may not write a read model"):

        class Writes(Projector):
            name = "writes"
            topics = ("ticks",)
            concurrency = 4

            def setup(self, db: object) -> None:
                pass

    with pytest.raises(ConfigError, match="int >= 1"):

        class Zero(Projector):
            name = "zero"
            topics = ("ticks",)
            concurrency = 0


class _UsesDb(Projector):
    name = "usesdb"
    topics = (keyapp.Source,)
    concurrency = 2
    handler_attempts = 1

    @handles
    def ticked(self, event: keyapp.Ticked, ctx: EventContext) -> None:
        ctx.db.execute("SELECT 1")


def test_concurrent_handler_touching_the_read_model_is_dead_lettered(data: Path) -> None:
    app = keyapp.App("usesdb", aggregates=[keyapp.Source, keyapp.Fold], projectors=[_UsesDb])
    with app.open(data) as runtime:
        produce(runtime, 3, 2)
        worker = Worker(runtime, "usesdb", poll_timeout=0.2)
        try:
            assert isinstance(worker.applier, ParallelApplier)
            while worker.run_once():
                pass
            with ReadModelView(readmodel_path(data, "usesdb")) as view:
                assert view.dead_letter_counts() == {"dead": 6}
                assert sum(view.positions().values()) == 6
            error = worker.readmodel.conn.execute(
                "SELECT error FROM _eventlane_dead_letters LIMIT 1"
            ).fetchone()[0]
            assert ProjectionError.__name__ in error and "ctx.issue" in error
        finally:
            worker.close()


class _Waits(keyapp.Folder):
    """The keyapp policy, but each tick first waits 20 ms (a remote call): well over the
    CPU its command costs, so the handler mostly waits."""

    name = "waits"
    adaptive = True

    @handles
    def ticked(self, event: keyapp.Ticked, ctx: EventContext) -> None:
        time.sleep(0.02)
        super().ticked(event, ctx)


class _Computes(keyapp.Folder):
    """The keyapp policy, but each tick first computes for 10 ms of CPU: much more than its
    command's waits, so the handler mostly computes (the bare policy is close to half and
    half: under load its probe fell either side). With 5 ms and the other tests of the full
    suite writing to the same disk, fsync waits made up to half of a probe (``ram_data``);
    on tmpfs under the CPU hogs, up to 0.30 was still measured as waiting (another thread
    holding the GIL)."""

    name = "computes"
    adaptive = True

    @handles
    def ticked(self, event: keyapp.Ticked, ctx: EventContext) -> None:
        until = time.thread_time() + 0.010
        while time.thread_time() < until:
            pass
        super().ticked(event, ctx)


@pytest.fixture
def ram_data(data: Path) -> Iterator[Path]:
    """``data``, but on tmpfs where the machine has one: the probe tests compare a handler's
    CPU with its waits, and the command's fsyncs are waits too. With other tests writing to
    the disk (the full suite) they took up to half of the computing handler's probe, and
    the probe sent it to threads."""
    if not Path("/dev/shm").is_dir():
        yield data
        return
    with tempfile.TemporaryDirectory(dir="/dev/shm") as ram:
        yield Path(ram) / "data"


@pytest.mark.parametrize(("projector", "threaded"), [(_Waits, True), (_Computes, False)])
def test_the_probe_sends_waiting_handlers_to_threads_and_computing_ones_not(
    ram_data: Path, projector: type[Projector], threaded: bool
) -> None:
    app = keyapp.App("probe", aggregates=[keyapp.Source, keyapp.Fold], projectors=[projector])
    with app.open(ram_data) as runtime:
        produce(runtime, 40, 3)
        worker = Worker(runtime, projector.name, poll_timeout=0.2)
        try:
            assert isinstance(worker.applier, ParallelApplier)
            while worker.run_once():
                assert worker.applier.threaded is threaded
        finally:
            worker.close()
        folds = {f"fold-{k}": runtime.load(keyapp.Fold, f"fold-{k}").count for k in range(40)}
    assert folds == {f"fold-{k}": 3 for k in range(40)}


@pytest.mark.parametrize(("projector", "threaded"), [(_Waits, True), (_Computes, False)])
def test_the_probe_tells_waiting_from_waiting_for_a_cpu(
    ram_data: Path, projector: type[Projector], threaded: bool
) -> None:
    """On a machine whose CPUs are all busy a computing handler spends much of its wall time
    runnable but off the CPU: that is not waiting (it failed under the full suite's load,
    and with these busy processes, before the probe left run-queue time out)."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(3 * (os.cpu_count() or 1))
    ]
    try:
        test_the_probe_sends_waiting_handlers_to_threads_and_computing_ones_not(
            ram_data, projector, threaded
        )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
