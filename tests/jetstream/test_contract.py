"""The log contract kit, run against :class:`JetStreamLog` on a real 3-node cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventlane.log import Log
from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import JetStreamLog
from eventlane.log.local import LocalDir
from eventlane.testing.clock import FakeClock
from eventlane.testing.contracts import (
    FencedLogContract,
    KeyedLogContract,
    MaintainedLogContract,
)


class TestJetStreamContract(KeyedLogContract, MaintainedLogContract, FencedLogContract):
    lazy_compaction = False  # a compacted topic keeps only a key's last record at once

    @pytest.fixture(autouse=True)
    def _cluster(self, cluster: LocalCluster, namespace: str) -> None:
        self._url, self._ns = cluster.url, namespace

    def make_log(self, directory: Path, clock: FakeClock) -> Log:
        return JetStreamLog.from_url(
            self._url, namespace=self._ns, clock=clock, local=LocalDir(directory)
        )
