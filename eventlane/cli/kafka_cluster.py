"""``eventlane kafka up|down``: a local Apache Kafka cluster (KRaft brokers on loopback).

``up`` formats and starts N combined broker+controller nodes (``kafka.Kafka``, Kafka's jars
from ``make kafka-jars``) with their data under ``--dir``
(:mod:`eventlane.log.kafka.cluster`), waits until a metadata request lists every broker and
prints the ``--log`` URL; the brokers keep running after the command exits. ``down`` stops
them by the PIDs recorded in ``<dir>/cluster.json``.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from eventlane.log.kafka.cluster import STATE_FILE, LocalKafkaCluster
from eventlane.log.processes import LOOPBACK

DIR_HELP = "Directory for the brokers' configuration, logs and data."
LIB_HELP = "Directory of Apache Kafka's jars (default $EVENTLANE_KAFKA_LIB or tools/kafka/lib)."


@click.group()
def kafka() -> None:
    """A local Apache Kafka cluster (KRaft, loopback unless --host) for --log kafka://..."""


@kafka.command("up")
@click.option("--nodes", type=click.IntRange(1, 9), default=3, show_default=True)
@click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path),
    default="eventlane-kafka",
    show_default=True,
    help=DIR_HELP,
)
@click.option("--host", default=LOOPBACK, show_default=True, help="Address every node binds.")
@click.option("--lib", type=click.Path(path_type=Path), default=None, help=LIB_HELP)
@click.option(
    "--retention-check-ms",
    type=click.IntRange(1000),
    default=300_000,
    show_default=True,
    help="How often the brokers apply retention (log.retention.check.interval.ms).",
)
def up(nodes: int, directory: Path, host: str, lib: Path | None, retention_check_ms: int) -> None:
    """Start NODES Kafka nodes (broker and controller) as one cluster; print its URL."""
    if (directory / STATE_FILE).exists():
        recorded = LocalKafkaCluster.load(directory, lib=lib)
        if any(n.pid for n in recorded.nodes):
            raise click.ClickException(
                f"a Kafka cluster is already recorded in {directory}; run `eventlane kafka"
                f" down --dir {directory}` first"
            )
        local = recorded  # restart on its data, ports and cluster id
    else:
        local = LocalKafkaCluster.create(
            directory, nodes, host=host, lib=lib, retention_check_ms=retention_check_ms
        )
    started = time.monotonic()
    local.start()
    click.echo(f"{len(local.nodes)} brokers ready in {time.monotonic() - started:.1f}s", err=True)
    click.echo(local.url)


@kafka.command("down")
@click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path),
    default="eventlane-kafka",
    show_default=True,
    help=DIR_HELP,
)
@click.option("--lib", type=click.Path(path_type=Path), default=None, help=LIB_HELP)
def down(directory: Path, lib: Path | None) -> None:
    """Stop the cluster recorded in DIR (SIGTERM by PID, SIGKILL after 30 s). Data is kept."""
    local = LocalKafkaCluster.load(directory, lib=lib)
    local.stop()
    click.echo(f"stopped {len(local.nodes)} nodes")
