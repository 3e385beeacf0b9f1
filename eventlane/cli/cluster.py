"""``eventlane cluster up|down|check`` (a local NATS JetStream cluster) and
``eventlane migrate-log``.

``up`` starts N ``nats-server`` processes on free ports of ``--host`` (127.0.0.1 unless
given) with their data under ``--dir`` (see :mod:`eventlane.log.jetstream.cluster`), waits
until JetStream is ready, and prints the ``--log`` URL; the servers keep running after the
command exits. ``down`` stops them by the PIDs recorded in ``<dir>/cluster.json``. ``check``
reads each server's durability setting from its monitoring endpoint. ``migrate-log`` copies
the log to a JetStream or Kafka cluster and verifies the copy
(:mod:`eventlane.log.jetstream.migrate`, :mod:`eventlane.log.kafka.migrate`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from eventlane.cli.context import app
from eventlane.log.jetstream.cluster import (
    LOOPBACK,
    STATE_FILE,
    LocalCluster,
    SyncCheck,
    check_sync,
)
from eventlane.log.jetstream.log import JetStreamLog
from eventlane.log.jetstream.migrate import PartitionCopy, migrate
from eventlane.log.port import Log

if TYPE_CHECKING:
    from eventlane.log.kafka.migrate import KafkaCopy

DIR_HELP = "Directory for the cluster's configuration, logs and data."
NAMESPACE_HELP = "Prefix of the cluster's streams and topic registry (several logs per cluster)."


@click.group()
def cluster() -> None:
    """A local JetStream cluster (loopback unless --host) to run eventlane on with --log nats://..."""


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
@click.option(
    "--host",
    default=LOOPBACK,
    show_default=True,
    help="Address the servers bind (client, route and monitoring ports): this host's address"
    " for clients on other hosts, or one inside a network namespace.",
)
def up(nodes: int, directory: Path, host: str) -> None:
    """Start NODES nats-server processes forming one JetStream cluster; print its URL."""
    if (directory / STATE_FILE).exists():
        running = LocalCluster.load(directory)
        if any(n.pid for n in running.nodes):
            raise click.ClickException(
                f"a cluster is already recorded in {directory}; run `eventlane cluster down`"
                f" --dir {directory} first"
            )
    local = LocalCluster.create(directory, nodes, host=host)
    local.start()
    _warn_unsynced(local.check_sync())
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


@cluster.command("check")
@click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path),
    default=None,
    help="A cluster started by `eventlane cluster up` (its monitoring ports).",
)
@click.option(
    "--monitor",
    "monitors",
    multiple=True,
    help="A server's monitoring URL, e.g. http://10.0.0.5:8222 (repeatable).",
)
def check(directory: Path | None, monitors: tuple[str, ...]) -> None:
    """Check that every server fsyncs before it acknowledges (sync_interval: always).

    Prints one line per server; exit status 1 if any does not, or cannot be asked (the
    setting is visible only on a server's monitoring endpoint, /varz)."""
    checks = [check_sync(m) for m in monitors]
    if directory is not None:
        checks += LocalCluster.load(directory).check_sync()
    if not checks:
        raise click.UsageError("name a cluster with --dir or its servers with --monitor")
    for c in checks:
        state = {True: "ok", False: "NOT DURABLE", None: "unknown"}[c.sync_always]
        click.echo(f"{c.monitor} {state}: {c.detail}")
    if not all(c.sync_always for c in checks):
        raise SystemExit(1)


def _warn_unsynced(checks: list[SyncCheck]) -> None:
    for c in checks:
        if not c.sync_always:
            click.echo(f"warning: {c.monitor}: {c.detail}", err=True)


@click.command("migrate-log")
@click.argument("url")
@click.option("--topic", "topics", multiple=True, help="Copy only this topic (repeatable).")
@click.option(
    "--namespace",
    default=None,
    help=NAMESPACE_HELP + "  [default: eventlane for nats://, the URL's for kafka://]",
)
@click.pass_context
def migrate_log(
    ctx: click.Context, url: str, topics: tuple[str, ...], namespace: str | None
) -> None:
    """Copy the log in --data (or --log) to the JetStream or Kafka cluster at URL, then verify.

    nats://...: offsets, keys, values, headers and timestamps are preserved. kafka://...:
    the same, except that Kafka cannot recreate gaps left by compaction: from a
    partition's first gap on, records land below their source offsets and carry the
    header eventlane.source-offset. A topic that already exists on the cluster is refused.
    Exit status 1 if any partition failed verification.
    """
    source = app(ctx).open_log()
    if url.startswith("kafka://"):
        kafka_copies = _migrate_to_kafka(source, url, topics, namespace)
        failed = sum(1 for c in kafka_copies if c.problems)
        copied, partitions = sum(c.records for c in kafka_copies), len(kafka_copies)
    else:
        with JetStreamLog.from_url(url, namespace=namespace or "eventlane") as target:
            copies = migrate(source, target, list(topics) or None, progress=_show_copy)
        failed = sum(1 for c in copies if c.problems)
        copied, partitions = sum(c.records for c in copies), len(copies)
    click.echo(f"copied {copied} records in {partitions} partitions")
    if failed:
        raise click.ClickException(f"{failed} partitions failed verification")


def _migrate_to_kafka(
    source: Log, url: str, topics: tuple[str, ...], namespace: str | None
) -> list[KafkaCopy]:
    from eventlane.log.kafka.log import KafkaLog, parse_url  # noqa: PLC0415 - the kafka extra
    from eventlane.log.kafka.migrate import migrate as to_kafka  # noqa: PLC0415

    options = parse_url(url)
    if namespace is not None:
        options["namespace"] = namespace
    with KafkaLog(**options) as target:
        return to_kafka(source, target, list(topics) or None, progress=_show_kafka_copy)


def _show_kafka_copy(copy: KafkaCopy) -> None:
    status = "ok" if not copy.problems else "; ".join(copy.problems)
    click.echo(
        f"{copy.topic}[{copy.partition}] offsets {copy.lwm}..{copy.hwm}"
        f" records {copy.records} {copy.kept}: {status}"
    )


def _show_copy(copy: PartitionCopy) -> None:
    status = "ok" if not copy.problems else "; ".join(copy.problems)
    click.echo(
        f"{copy.topic}[{copy.partition}] offsets {copy.lwm}..{copy.hwm}"
        f" records {copy.records} gaps kept {copy.fillers}: {status}"
    )
