"""The log contract kit (the core and the keyed roles), run against :class:`KafkaLog` on a real 3-broker cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventlane.log import Log
from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog, namespace_for
from eventlane.log.local import LocalDir
from eventlane.log.record import TimestampType
from eventlane.log.types import wall_clock_ms
from eventlane.testing.clock import FakeClock
from eventlane.testing.contracts import KeyedLogContract


class TestKafkaContract(KeyedLogContract):
    refused_appends_leave_gaps = True  # validation by log order (eventlane.log.kafka.order)

    @pytest.fixture(autouse=True)
    def _cluster(self, kafka_cluster: LocalKafkaCluster) -> None:
        self._bootstrap = kafka_cluster.bootstrap

    def make_log(self, directory: Path, clock: FakeClock) -> Log:
        # one namespace per directory: a reopen on the same directory sees the same topics
        return KafkaLog(
            self._bootstrap,
            namespace=namespace_for(directory),
            clock=clock,
            local=LocalDir(directory),
        )

    def test_log_append_time(self, log: Log, clock: FakeClock) -> None:
        """Kafka's LogAppendTime is the leader broker's clock, not the client's: the
        appended record carries the broker's time of the append (not the 42 sent, nor the
        log's clock), and the append's result says the same time as a read."""
        log.create_topic("t", 1, {"timestamp_type": "LogAppendTime"})
        clock.advance(1234)
        before = wall_clock_ms()
        result = log.append("t", 0, [(b"k", b"v", (), 42)])
        after = wall_clock_ms()
        (record,), _ = log.read("t", 0, 0)
        assert list(result.timestamps) == [record.timestamp]
        assert before - 5_000 <= record.timestamp <= after + 5_000  # brokers on this host
        assert record.timestamp_type == TimestampType.LOG_APPEND_TIME
