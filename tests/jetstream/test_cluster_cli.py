"""``eventlane cluster up/down`` start and stop real nats-server processes."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from framework.cli import main
from framework.log.jetstream.cluster import LocalCluster
from framework.log.jetstream.log import JetStreamLog


def test_cluster_up_serves_a_log_and_down_stops_every_server(tmp_path: Path) -> None:
    runner = CliRunner()
    where = str(tmp_path / "js")
    up = runner.invoke(main, ["cluster", "up", "--nodes", "3", "--dir", where])
    pids = [n.pid for n in LocalCluster.load(where).nodes]
    try:
        assert up.exit_code == 0, up.output
        url = up.output.strip()
        assert url.startswith("nats://127.0.0.1:") and url.count(",") == 2
        with JetStreamLog.from_url(url, namespace="cli") as log:
            log.create_topic("t", 2)
            assert log.append("t", 1, [(b"k", b"v", (), None)]).base_offset == 0
        again = runner.invoke(main, ["cluster", "up", "--dir", where])
        assert again.exit_code == 1 and "already" in again.output
    finally:
        down = runner.invoke(main, ["cluster", "down", "--dir", where])
    assert down.exit_code == 0, down.output
    for pid in pids:
        assert pid and not Path(f"/proc/{pid}").exists()  # stopped and reaped
    assert all(n.pid == 0 for n in LocalCluster.load(where).nodes)
