"""``eventlane cluster up/down`` start and stop real nats-server processes."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from framework.cli import main
from framework.engine import register_engine
from framework.log.jetstream.cluster import LocalCluster
from framework.log.jetstream.log import JetStreamLog, open_url


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


def test_cli_commands_work_against_the_cluster_with_log_url(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    register_engine("nats", open_url)  # what the entry point eventlane.engines:nats does
    url = f"{cluster.url}?namespace={namespace}"
    runner = CliRunner()
    base = ["--data", str(tmp_path / "local"), "--log", url]
    made = runner.invoke(main, [*base, "topics", "create", "orders", "--partitions", "3"])
    assert made.exit_code == 0, made.output
    sent = runner.invoke(
        main, [*base, "produce", "orders", "--key-separator", ":"], input="k1:hi\n"
    )
    assert sent.exit_code == 0, sent.output
    listed = runner.invoke(main, ["topics", "list", "--log", url])  # on the subcommand too
    assert listed.exit_code == 0 and "orders" in listed.output, listed.output
    with JetStreamLog.from_url(cluster.url, namespace=namespace) as log:
        assert sum(log.offsets("orders", p).hwm for p in range(3)) == 1
