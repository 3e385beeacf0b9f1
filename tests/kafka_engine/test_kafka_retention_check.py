"""The local cluster's first retention check comes as a broker starts, not 30 s later.

The contract kit stamps records in 2023 (its ``FakeClock``); Kafka applies time retention
(7 days, every topic's default) by the brokers' own clock, so any retention check deletes
them. The test cluster checks hourly, but Kafka's first check came
``log.initial.task.delay.ms`` (30 s) after a broker started: inside the test session, where
it deleted the records of whichever kit test was appending then (the kit's
``test_read_with_cursor_and_small_max_bytes`` failed once in a full run with "offset 0 is
outside [5, 30]"). With the delay 0, the first check finds no records and the next one
comes an hour later.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog
from eventlane.testing.clock import FakeClock


@pytest.mark.soak  # a cluster of its own, watched for 50 s after it started: ~70 s
def test_kit_stamped_records_outlive_a_fresh_clusters_first_minute(tmp_path: Path) -> None:
    """On the code before: the low-water mark went from 0 to 30 about 30-45 s after the
    cluster was ready (every record deleted by the first retention check)."""
    cluster = LocalKafkaCluster.create(tmp_path / "kafka", 1, retention_check_ms=3_600_000)
    cluster.start()
    ready = time.monotonic()
    try:
        with KafkaLog(cluster.bootstrap, namespace="kit", clock=FakeClock()) as log:
            log.create_topic("t", 1, {"segment_bytes": 300})  # several segments, as the kit's
            for i in range(30):
                log.append("t", 0, [(b"k", b"%d" % i, (), None)])
            marks = []
            while time.monotonic() - ready < 50:
                marks.append(log.offsets("t", 0)[:2])
                assert marks[-1] == (0, 30), f"{time.monotonic() - ready:.0f}s after start: {marks}"
                time.sleep(2)
            assert [r.value for r in log.read("t", 0, 0, max_bytes=1 << 20)[0]][:1] == [b"0"]
    finally:
        cluster.stop()
