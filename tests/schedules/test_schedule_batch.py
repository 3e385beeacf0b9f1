"""A policy's schedule writes in batches (``ScheduleBatch``): against a reference model of
what each key holds, and against the same requests written one by one (``Schedules``)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from sched_app import Ring, app

from eventlane.testing.clock import T0_MS

Model = dict[str, tuple[str, str]]  # key -> (state, schedule id)


def topic_records(runtime) -> int:  # type: ignore[no-untyped-def]
    topic = runtime.schedules.topic
    log = runtime.log
    return sum(log.offsets(topic, p).hwm for p in range(log.partition_count(topic)))


@pytest.mark.parametrize("seed", range(4))
def test_batched_requests_leave_what_one_by_one_requests_leave(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    keys = [f"k{i}" for i in range(rng.randint(2, 9))]
    steps = []
    for n in range(rng.randint(20, 80)):
        roll = rng.random()
        steps.append(
            ("flush", "", "")
            if roll < 0.15
            else ("cancel", rng.choice(keys), "")
            if roll < 0.5
            else ("schedule", rng.choice(keys), f"event-{seed}-{n}")
        )
    model: Model = {}
    answers: list[object] = []
    with app.open(tmp_path / "batched") as batched, app.open(tmp_path / "plain") as plain:
        batch = batched.schedule_batch()
        for op, key, event_id in steps:
            if op == "flush":
                batch.flush()
                continue
            if op == "schedule":
                cmd = Ring(f"a-{key}", key)
                sid = batch.schedule(cmd, at=T0_MS + 10, key=key, caused_by=event_id)
                assert sid == plain.schedule(cmd, at=T0_MS + 10, key=key, caused_by=event_id)
                model[key] = ("scheduled", sid)
                continue
            held = model.get(key)
            expected = held is not None and held[0] == "scheduled"
            if expected and held is not None:
                model[key] = ("cancelled", held[1])
            answers.append((key, batch.cancel(key), plain.cancel_schedule(key), expected))
        batch.flush()
        for key, got, one_by_one, expected in answers:  # type: ignore[misc]
            assert (key, got, one_by_one) == (key, expected, expected)
        stored = {k: (e.state, e.id) for k, e in batched.schedules.entries().items()}
        assert stored == model
        assert stored == {k: (e.state, e.id) for k, e in plain.schedules.entries().items()}
        # never more records than one by one (a schedule cancelled in its batch: one record)
        assert topic_records(batched) <= topic_records(plain)


def test_a_schedule_cancelled_in_its_own_batch_is_one_record_never_pending(
    tmp_path: Path,
) -> None:
    with app.open(tmp_path / "d") as runtime:
        batch = runtime.schedule_batch()
        batch.schedule(Ring("a1", "k"), at=T0_MS, key="k", caused_by="e-1")
        assert batch.cancel("k") is True
        assert batch.cancel("k") is False
        assert runtime.schedules.entries() == {}  # nothing written before the flush
        batch.flush()
        assert topic_records(runtime) == 1
        assert runtime.schedules.entry("k").state == "cancelled"


def test_a_flush_writes_each_key_once_and_then_nothing(tmp_path: Path) -> None:
    with app.open(tmp_path / "d") as runtime:
        batch = runtime.schedule_batch()
        for i in range(30):
            batch.schedule(Ring(f"a{i}", f"k{i}"), at=T0_MS, key=f"k{i}", caused_by=f"e{i}")
        batch.flush()
        batch.flush()  # nothing left: nothing written
        assert topic_records(runtime) == 30
        assert {e.state for e in runtime.schedules.entries().values()} == {"scheduled"}
