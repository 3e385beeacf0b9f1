"""A projector worker whose Kafka log does not answer while it starts exits 1 (the runner
replaces it), not 2 ("cannot start": never replaced).

Found by the invoicing demo on Kafka (tests/kafka_engine/test_kafka_demo.py) at load 94:
every worker of host A timed out creating its topics, exited 2, and the runner left the
projectors without workers, lagging until the demo gave up after 300 s. The log here is a
loopback port nothing listens on: librdkafka's requests time out (KafkaLog's 30 s)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from eventlane.log.processes import free_ports

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.soak  # KafkaLog's 30 s timeout, waited out once
def test_a_worker_whose_log_does_not_answer_exits_to_be_replaced(tmp_path: Path) -> None:
    (port,) = free_ports(1, "127.0.0.1")
    worker = subprocess.run(
        [
            sys.executable,
            "-m",
            "eventlane.cli",
            "--data",
            str(tmp_path / "data"),
            "--log",
            f"kafka://127.0.0.1:{port}",
            "project",
            "worker",
            "tests.projection.bankapp:app",
            "balances",
        ],
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert "Kafka did not answer" in worker.stderr, worker.stderr[-2000:]
    assert worker.returncode == 1, worker.stderr[-2000:]
