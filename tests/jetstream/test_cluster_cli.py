"""``eventlane cluster up/down`` start and stop real nats-server processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner
from ns_hosts import require_namespaces

from eventlane.cli import main
from eventlane.engine import register_engine
from eventlane.log.jetstream.cluster import (
    LocalCluster,
    check_sync,
    free_ports,
    nats_server_binary,
)
from eventlane.log.jetstream.log import JetStreamLog, open_url


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
        assert pid and not _runs_a_node_of(pid, where)  # stopped and reaped
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


def test_cluster_check_tells_a_durable_cluster_from_one_that_syncs_on_a_timer(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    runner = CliRunner()
    good = runner.invoke(
        main, ["cluster", "check", *(f"--monitor=http://127.0.0.1:{n.http}" for n in cluster.nodes)]
    )
    assert good.exit_code == 0, good.output
    assert good.output.count(" ok: sync_interval: always") == 3

    client, http = free_ports(2)
    conf = tmp_path / "lax.conf"  # JetStream's default: fsync every two minutes
    conf.write_text(
        f"listen: 127.0.0.1:{client}\nhttp: 127.0.0.1:{http}\n"
        f"jetstream {{ store_dir: {json.dumps(str(tmp_path / 'lax'))} }}\n"
    )
    server = subprocess.Popen(
        [nats_server_binary(), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        monitor = f"http://127.0.0.1:{http}"
        deadline = time.monotonic() + 20
        while check_sync(monitor).sync_always is None and time.monotonic() < deadline:
            time.sleep(0.1)
        lax = runner.invoke(main, ["cluster", "check", "--monitor", monitor])
        assert lax.exit_code == 1, lax.output
        assert "NOT DURABLE" in lax.output and "120s" in lax.output
    finally:
        server.kill()  # by its PID
        server.wait()
    gone = runner.invoke(main, ["cluster", "check", "--monitor", monitor])
    assert gone.exit_code == 1 and "unknown: cannot read" in gone.output


def test_cluster_up_binds_the_given_host(tmp_path: Path) -> None:
    """``--host``: the servers bind an address inside a network namespace of the test's own
    and serve clients there (nothing listens on loopback)."""
    require_namespaces("the --host test")
    ns, addr = f"elh{os.getpid() % 100000}", "10.211.9.1"
    where = str(tmp_path / "js")
    cli = [str(Path(sys.executable).parent / "eventlane")]
    inside = ["ip", "netns", "exec", ns]
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "-n", ns, "addr", "add", f"{addr}/32", "dev", "lo"], check=True)
        up = subprocess.run(
            [*inside, *cli, "cluster", "up", "--nodes", "2", "--dir", where, "--host", addr],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert up.returncode == 0, up.stderr
        url = up.stdout.strip()
        assert url.startswith(f"nats://{addr}:") and url.count(addr) == 2, url
        assert all(n.host == addr for n in LocalCluster.load(where).nodes)
        checked = subprocess.run(
            [*inside, *cli, "cluster", "check", "--dir", where],
            check=False,
            capture_output=True,
            text=True,
        )
        assert checked.returncode == 0 and checked.stdout.count(" ok: ") == 2, checked.stdout
        append = (
            "from eventlane.log.jetstream.log import JetStreamLog\n"
            f"with JetStreamLog.from_url({url!r}, namespace='host', replicas=2) as log:\n"
            "    log.create_topic('t', 1)\n"
            "    print(log.append('t', 0, [(b'k', b'v', (), None)]).base_offset)\n"
        )
        done = subprocess.run(
            [*inside, sys.executable, "-c", append],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "0" in done.stdout.splitlines(), done.stderr  # (log lines: issue 26, defect 6)
    finally:
        subprocess.run(
            [*inside, *cli, "cluster", "down", "--dir", where], check=False, capture_output=True
        )
        subprocess.run(["ip", "netns", "del", ns], check=False)


def _runs_a_node_of(pid: int, where: str) -> bool:
    """Whether ``pid`` is still a nats-server of the cluster in ``where`` (PIDs wrap at 32,768
    on these machines: the suite's other processes may take the number at once)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return where.encode() in cmdline
