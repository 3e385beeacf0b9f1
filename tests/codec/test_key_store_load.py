"""A key store reading many subjects (a projector's rebuild) reads the key topic a bounded
number of times, not once per subject, with a real :class:`LogStore` on disk: the keys it
answers are the ones written (a dict is the model), no file of the key topic stays open
after, and what another process does afterwards (a forget, a new subject) is seen as
before."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from eventlane.codec.keystore import LogKeyStore
from eventlane.log.embedded.store import LogStore
from tests.codec import test_key_store_model as key_store_model

SUBJECTS = 300
TOPIC = "__eventlane_keys"


def count_key_topic_reads(log: LogStore, counts: Counter[str]) -> None:
    """Count the store's reads of the key topic (the real methods still do the work)."""

    def counted(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(topic: str, *args: Any, **kwargs: Any) -> Any:
            if topic == TOPIC:
                counts[name] += 1
            return real(topic, *args, **kwargs)

        return call

    for name in ("read", "read_key"):
        setattr(log, name, counted(name, getattr(log, name)))


def key_files_open() -> list[str]:
    held = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile (the directory's own descriptor)
        if TOPIC in target and target.endswith(".log"):
            held.append(target)
    return held


def test_reading_many_subjects_reads_the_key_topic_a_bounded_number_of_times(
    tmp_path: Path,
) -> None:
    model: dict[str, tuple[int, bytes]] = {}
    with LogStore(tmp_path) as log_a:
        writer = LogKeyStore(log_a, refresh_ms=0)
        for i in range(SUBJECTS):
            model[f"s{i}"] = writer.current(f"s{i}")
        assert writer.forget("s7")
        del model["s7"]
    with LogStore(tmp_path) as log_b:
        reads: Counter[str] = Counter()
        count_key_topic_reads(log_b, reads)
        reader = LogKeyStore(log_b, refresh_ms=0)
        for subject, (version, key) in model.items():
            assert reader.get(subject, version) == key, subject
        assert reader.get("s7", 1) is None and reader.state("s7") == "forgotten"
        assert sum(reads.values()) <= 20, reads  # was a read_key (and a read) per subject
        assert key_files_open() == []
        # afterwards: another process's forget and new subject are seen as before
        with LogStore(tmp_path) as log_a:
            writer = LogKeyStore(log_a, refresh_ms=0)
            assert writer.forget("s3")
            version, key = writer.current("late")
        assert reader.get("s3", model["s3"][0]) is None
        assert reader.get("late", version) == key
        assert key_files_open() == []


def test_the_key_store_model_holds_when_partitions_are_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two-store model test, with memory for every subject: each store reads the key
    partition whole after a few misses, and every answer still agrees with the model."""
    monkeypatch.setattr(key_store_model, "CACHE", 4096)
    loads: Counter[str] = Counter()
    real = LogKeyStore._load

    def load(self: LogKeyStore, p: int) -> bool:
        loads[str(p)] += 1
        return real(self, p)

    monkeypatch.setattr(LogKeyStore, "_load", load)
    key_store_model.test_two_bounded_key_stores_agree_with_a_model(tmp_path)
    assert loads == {"0": 2}  # once per store


def test_callers_that_find_the_store_stale_together_share_one_catch_up(tmp_path: Path) -> None:
    """Threads (a web app's pool, an async runtime's) that all find the cache older than
    the refresh interval while one of them is catching up wait for that catch-up rather
    than each reading the key topic's marks again in turn (it was one round trip per
    caller, in series behind the lock). What a caller gets is still as fresh as the rule
    asks: a key another store writes before the callers ask is the one they answer."""
    with LogStore(tmp_path) as log_:
        writer = LogKeyStore(log_, refresh_ms=0)
        writer.current("s0")
        store = LogKeyStore(log_, refresh_ms=20)
        assert store.current("s0") == writer.current("s0")
        marks = 0
        offsets = log_.offsets

        def slow_offsets(topic: str, partition: int) -> Any:
            nonlocal marks
            if topic == TOPIC:
                marks += 1
                time.sleep(0.05)  # a round trip of a networked log under load
            return offsets(topic, partition)

        log_.offsets = slow_offsets  # type: ignore[method-assign]
        callers = 8
        for _ in range(3):
            time.sleep(0.03)  # past the refresh interval
            rotated = writer.rotate("s0")  # before any caller asks: each must see it
            before, start = marks, threading.Barrier(callers)

            def ask() -> tuple[int, bytes]:
                start.wait()
                return store.current("s0")

            with ThreadPoolExecutor(callers) as pool:
                answers = list(pool.map(lambda _: ask(), range(callers)))
            assert {version for version, _ in answers} == {rotated}
            assert marks - before <= 2, f"{marks - before} catch-ups for {callers} callers"


def test_marks_read_by_the_caller_count_as_a_catch_up_only_when_they_show_nothing_new(
    tmp_path: Path,
) -> None:
    """An async runtime reads the key topic's marks on its loop and hands them to the store
    (``caught_up``): marks at the store's position make it fresh as of when they were
    asked; marks past it (another store forgot a subject) do not, and the forgotten key is
    refused once the store catches up, as the refresh rule says."""
    with LogStore(tmp_path) as log_:
        writer = LogKeyStore(log_, refresh_ms=0)
        version, _ = writer.current("s0")
        reader = LogKeyStore(log_, refresh_ms=40)
        assert reader.current("s0")[0] == version and reader.holds("s0") and not reader.due
        time.sleep(0.03)  # past the catch-up interval (half of refresh_ms)
        assert reader.due
        asked = time.monotonic()
        hwms = [log_.offsets(TOPIC, p).hwm for p in range(reader.partitions)]
        assert reader.caught_up(hwms, asked) and not reader.due
        assert not reader.caught_up([*hwms, 0], asked)  # not the store's partitions
        assert writer.forget("s0")
        time.sleep(0.03)
        asked = time.monotonic()
        hwms = [log_.offsets(TOPIC, p).hwm for p in range(reader.partitions)]
        assert not reader.caught_up(hwms, asked)
        assert reader.due and reader.holds("s0")  # (not caught up yet)
        reader.catch_up()
        assert not reader.holds("s0") and reader.get("s0", version) is None
