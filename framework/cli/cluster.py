"""``eventlane cluster up|down``: a local NATS JetStream cluster for development.

``up`` starts N ``nats-server`` processes on free 127.0.0.1 ports with their data under
``--dir`` (see :mod:`framework.log.jetstream.cluster`), waits until JetStream is ready, and
prints the ``--log`` URL; the servers keep running after the command exits. ``down`` stops
them by the PIDs recorded in ``<dir>/cluster.json``.
"""

from __future__ import annotations

from pathlib import Path

import click

from framework.log.jetstream.cluster import STATE_FILE, LocalCluster

DIR_HELP = "Directory for the cluster's configuration, logs and data."


@click.group()
def cluster() -> None:
    """A local JetStream cluster (loopback only) to run eventlane on with --log nats://..."""


@cluster.command("up")
@click.option("--nodes", type=click.IntRange(1, 9), default=3, show_default=True)
@click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path),
    default="eventlane-cluster",
    show_default=True,
    help=DIR_HELP,
)
def up(nodes: int, directory: Path) -> None:
    """Start NODES nats-server processes forming one JetStream cluster; print its URL."""
    if (directory / STATE_FILE).exists():
        running = LocalCluster.load(directory)
        if any(n.pid for n in running.nodes):
            raise click.ClickException(
                f"a cluster is already recorded in {directory}; run `eventlane cluster down`"
                f" --dir {directory} first"
            )
    local = LocalCluster.create(directory, nodes)
    local.start()
    click.echo(local.url)


@cluster.command("down")
@click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path),
    default="eventlane-cluster",
    show_default=True,
    help=DIR_HELP,
)
def down(directory: Path) -> None:
    """Stop the cluster recorded in DIR (SIGTERM by PID, SIGKILL after 10 s). Data is kept."""
    local = LocalCluster.load(directory)
    local.stop()
    click.echo(f"stopped {len(local.nodes)} nodes")
