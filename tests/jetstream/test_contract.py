"""The log contract kit, run against :class:`JetStreamLog` on a real 3-node cluster."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "log"))
import test_log_contract as kit

from framework.log import Log
from framework.log.jetstream.cluster import LocalCluster
from framework.log.jetstream.log import JetStreamLog
from framework.log.local import LocalDir

if TYPE_CHECKING:
    from conftest import FakeClock


class TestJetStreamContract(kit.LogContract):
    @pytest.fixture(autouse=True)
    def _cluster(self, cluster: LocalCluster, namespace: str) -> None:
        self._url, self._ns = cluster.url, namespace

    def make_log(self, directory: Path, clock: FakeClock) -> Log:
        return JetStreamLog.from_url(
            self._url, namespace=self._ns, clock=clock, local=LocalDir(directory)
        )
