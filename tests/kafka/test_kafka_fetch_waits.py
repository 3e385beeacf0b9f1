"""A long-poll Fetch whose client is gone stops waiting (found by the fuzzer's soak: its rate
fell from ~35 to 6.6 requests a second as Fetches with a hostile ``max_wait_ms`` of 24 days,
abandoned by the fuzzer, piled up in the listener, each holding a worker thread and
re-reading its partitions on every append of every other client).

Measured on a real listener process: its CPU time over the same 300 appends (by another
process) with 40 abandoned long polls must stay near what it is without them.
"""

from __future__ import annotations

import socket
import time

import psutil
from kafka.protocol.consumer import FetchRequest

from eventlane.log import LogStore
from tests.kafka.wire import encode

FOREVER_MS = (1 << 31) - 1
ZOMBIES, APPENDS = 40, 300


def _abandoned_fetch(bootstrap: str, topic: str) -> None:
    """A Fetch that would wait 24 days for a record of an empty partition; then the client
    closes its connection."""
    Topic = FetchRequest.FetchTopic
    request = FetchRequest(
        replica_id=-1,
        max_wait_ms=FOREVER_MS,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        topics=[
            Topic(
                topic=topic,
                partitions=[
                    Topic.FetchPartition(
                        partition=0, fetch_offset=0, log_start_offset=-1, partition_max_bytes=1024
                    )
                ],
            )
        ],
    )
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(encode(request, 4))
        time.sleep(0.05)


def _cpu_over_appends(proc: psutil.Process, log: LogStore) -> float:
    before = proc.cpu_times()
    for i in range(APPENDS):
        log.append("busy", 0, [(None, b"v%d" % i, (), None)])
        time.sleep(0.01)
    time.sleep(0.5)
    after = proc.cpu_times()
    return (after.user + after.system) - (before.user + before.system)


def test_long_polls_of_clients_that_left_stop_costing(kafka) -> None:
    log = LogStore(kafka.data)
    try:
        log.create_topic("quiet", 1, exist_ok=True)
        log.create_topic("busy", 1, exist_ok=True)
        assert kafka.proc is not None
        listener = psutil.Process(kafka.proc.pid)
        baseline = _cpu_over_appends(listener, log)
        for _ in range(ZOMBIES):
            _abandoned_fetch(kafka.bootstrap, "quiet")
        time.sleep(1)
        with_zombies = _cpu_over_appends(listener, log)
        print(
            f"listener CPU over {APPENDS} appends: {baseline:.2f} s alone,"
            f" {with_zombies:.2f} s after {ZOMBIES} abandoned long polls"
        )
        assert with_zombies < 2 * baseline + 0.5, (baseline, with_zombies)
    finally:
        log.close()
