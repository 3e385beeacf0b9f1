"""Produce takes a lock per partition, not one for the listener (issue 36, item 2).

A real listener process; another process (this test) holds one partition's append lock (its
``flock``), as a slow disk or a long compaction would, so the listener's append there waits.
A produce to another partition, from another connection or in the same request, must still
be answered at once; and once the lock is let go the stuck one is stored too.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from eventlane.log import LogStore
from tests.kafka.conftest import KafkaProcess


def _producer(bootstrap: str) -> Any:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 0,
            "message.timeout.ms": 60_000,
            "enable.idempotence": True,
        }
    )


def _delivered(topic: str, value: bytes, into: dict[str, float], bootstrap: str) -> Any:
    producer = _producer(bootstrap)

    def done(err: object, msg: object) -> None:
        if err is None:
            into[topic] = time.monotonic()

    producer.produce(topic, value=value, partition=0, on_delivery=done)
    return producer


def _wait(producers: list[Any], until: float, want: dict[str, float], names: set[str]) -> None:
    while time.monotonic() < until and not names <= set(want):
        for p in producers:
            p.poll(0.05)


def _until_blocked(kafka: KafkaProcess, until: float) -> None:
    """Until the listener process waits for a ``flock`` (``/proc/locks`` lists a blocked
    waiter as ``N: -> FLOCK ... PID ...``)."""
    assert kafka.proc is not None
    pid = str(kafka.proc.pid)
    while time.monotonic() < until:
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if len(fields) > 5 and fields[1] == "->" and fields[5] == pid:
                return
        time.sleep(0.02)
    raise AssertionError("the listener never waited for the partition's lock")


def test_a_stuck_partition_does_not_hold_up_another(kafka: KafkaProcess) -> None:
    log = LogStore(kafka.data)
    try:
        for name in ("stuck", "free"):
            log.create_topic(name, 1, exist_ok=True)
            log.append(name, 0, [(None, b"first", (), None)])  # opens the partition's files
    finally:
        log.close()
    lock = Path(kafka.data) / "topics" / "stuck" / "0" / "lock"
    fd = os.open(lock, os.O_RDWR)
    acked: dict[str, float] = {}
    producers: list[Any] = []
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        held = time.monotonic()
        producers.append(_delivered("stuck", b"late", acked, kafka.bootstrap))
        _until_blocked(kafka, held + 20)  # the stuck append waits inside the listener now
        producers.append(_delivered("free", b"on time", acked, kafka.bootstrap))
        _wait(producers, held + 20, acked, {"free"})
        assert "free" in acked, "a produce to another partition waited for the stuck one"
        assert "stuck" not in acked, "the stuck partition's append did not wait for its lock"
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    _wait(producers, time.monotonic() + 30, acked, {"stuck"})
    assert "stuck" in acked
    for p in producers:
        assert p.flush(10) == 0
    log = LogStore(kafka.data)
    try:
        assert [r.value for r in log.read("stuck", 0, 0)[0]] == [b"first", b"late"]
        assert [r.value for r in log.read("free", 0, 0)[0]] == [b"first", b"on time"]
    finally:
        log.close()
