"""Immediate hand-over on a known death (issue 32 item 2) on the JetStream cluster: the
runner's leave on the dead worker's behalf goes through the KV coordinator's
compare-and-set; the scenario is tests/projection/handover_kit.py."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from framework.app import Runtime
from framework.log import Log
from framework.log.jetstream.cluster import LocalCluster
from framework.log.jetstream.log import JetStreamLog
from framework.log.local import LocalDir

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "projection"))
from handover_kit import kill_one_of_two  # noqa: E402
from projection_kit import Producer, child_env  # noqa: E402

from tests.projection import bankapp  # noqa: E402


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return tmp_path / "host-a"


@pytest.fixture
def js_runtime(cluster: LocalCluster, namespace: str, host: Path) -> Iterator[Runtime]:
    with JetStreamLog.from_url(cluster.url, namespace=namespace, local=LocalDir.at(host)) as js:
        with bankapp.app.open(cast(Log, js)) as rt:
            yield rt


def test_kill9_of_one_worker_of_two_moves_its_partitions_at_once_on_jetstream(
    js_runtime: Runtime, cluster: LocalCluster, namespace: str, host: Path, tmp_path: Path
) -> None:
    producer = Producer(js_runtime)
    env = child_env(EVENTLANE_LOG=f"{cluster.url}?namespace={namespace}")
    figures = kill_one_of_two(js_runtime, host, env, producer.deposits, tmp_path / "workers.log")
    print("hand-over on JetStream:", figures["handover_s"], "s", file=sys.stderr)
    assert figures["handover_s"] < 2.0, figures  # the session timeout is 20 s
    assert [pid for pid, _ in figures["handed_over"]] == [figures["victim"]]
    assert figures["fold_equal"], figures
    assert figures["applied_once"], figures
    assert os.path.exists(host / "readmodels")
