"""``eventlane topics``: create, list, describe, alter and delete topics.

Every config knob of :class:`~eventlane.log.config.TopicConfig` is reachable through
``--config key=value`` (Kafka's dotted names or ours with ``_``); the most used ones also
have their own options. Config and names are validated before the data directory is touched,
so a refused ``create`` leaves nothing behind.

``topics describe --json`` prints exactly
``{"name", "config": {...}, "partitions": [{"partition", "lwm", "hwm", "leo", "segments",
"bytes"}]}``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
import orjson

from eventlane.cli.context import (
    CONFIG_PAIR,
    PARTITIONS,
    TOPIC,
    app,
    config_key,
    config_mapping,
    data_option,
    json_option,
    namespace_option,
    stderr_console,
    stdout_console,
)
from eventlane.cli.render import config_table, partitions_table, topics_table
from eventlane.errors import ConfigError
from eventlane.log.config import TopicConfig
from eventlane.log.names import refuse_internal

if TYPE_CHECKING:
    from eventlane.app.namespace import Namespace


def _print_json(value: object) -> None:
    click.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())


@click.group()
@data_option
def topics() -> None:
    """Create, list, describe, alter and delete topics."""


@topics.command()
@click.argument("name", type=TOPIC)
@click.option(
    "--partitions", type=PARTITIONS, default=1, show_default=True, help="Number of partitions."
)
@click.option(
    "--compact", is_flag=True, help="cleanup_policy=compact: keep the last record per key."
)
@click.option(
    "--retention-ms", type=int, metavar="MS", help="Delete segments older than MS (-1: never)."
)
@click.option(
    "--retention-bytes",
    type=int,
    metavar="B",
    help="Keep at most about B bytes per partition (-1: no limit).",
)
@click.option(
    "--segment-bytes", type=int, metavar="B", help="Roll to a new segment file after B bytes."
)
@click.option(
    "--config",
    "configs",
    type=CONFIG_PAIR,
    multiple=True,
    help="Any topic config, e.g. --config min.compaction.lag.ms=60000 (repeatable).",
)
@click.option("--if-not-exists", is_flag=True, help="Succeed without change if the topic exists.")
@data_option
def create(
    name: str,
    partitions: int,
    compact: bool,
    retention_ms: int | None,
    retention_bytes: int | None,
    segment_bytes: int | None,
    configs: tuple[tuple[str, str], ...],
    if_not_exists: bool,
) -> None:
    """Create topic NAME."""
    refuse_internal(name, "create it (eventlane creates it on first use)")
    values = config_mapping(configs)
    given = {config_key(k): k for k in values}
    for key, value in (
        ("retention_ms", retention_ms),
        ("retention_bytes", retention_bytes),
        ("segment_bytes", segment_bytes),
    ):
        if value is not None:
            if key in given:
                raise ConfigError(f"--{key.replace('_', '-')} and --config {given[key]} both given")
            values[key] = value
    if compact:
        policy = values.get(given.get("cleanup_policy", ""), "compact")
        if policy not in ("compact", "compact,delete"):
            raise ConfigError(f"--compact contradicts --config cleanup.policy={policy}")
        if "cleanup_policy" not in given:
            values["cleanup_policy"] = "compact"
    config = TopicConfig.from_mapping(values)  # validated before anything exists on disk
    ctx = app()
    log = ctx.open_log(create=True)
    existed = if_not_exists and log.topic_exists(name)
    description = log.create_topic(name, partitions, config, exist_ok=if_not_exists)
    verb = "exists" if existed else "created"
    click.echo(
        f"topic {name} {verb}: {description.partitions} partition(s),"
        f" cleanup_policy={description.config.cleanup_policy}"
    )


@topics.command(name="list")
@namespace_option
@json_option
@data_option
def list_(namespace: Namespace | None, as_json: bool) -> None:
    """List topics (with --namespace NS: only those of apps declared with namespace=NS,
    whose topics are all named NS.*)."""
    log = app().open_log()
    names = [n for n in log.list_topics() if namespace is None or namespace.owns(n)]
    descriptions = [log.describe_topic(name) for name in names]
    if as_json:
        _print_json(
            [
                {"name": d.name, "partitions": d.partitions, "config": d.config.to_dict()}
                for d in descriptions
            ]
        )
        return
    console = stdout_console()
    if not descriptions:
        where = "" if namespace is None else f" in namespace {namespace.prefix}"
        console.print(f"no topics{where} in {app().data}")
        return
    console.print(topics_table(descriptions))


@topics.command()
@click.argument("name", type=TOPIC)
@json_option
@data_option
def describe(name: str, as_json: bool) -> None:
    """Show NAME's config and each partition's LWM, HWM, LEO, segments and size."""
    description = app().open_log().describe_topic(name)
    if as_json:
        _print_json(description.to_dict())
        return
    console = stdout_console()
    console.print(
        f"[bold]{name}[/bold]: {description.partitions} partition(s),"
        f" cleanup_policy={description.config.cleanup_policy}"
    )
    console.print(config_table(description.config))
    console.print(partitions_table(description))


@topics.command()
@click.argument("name", type=TOPIC)
@click.option(
    "--partitions",
    type=PARTITIONS,
    help="New partition count (increase only; changes key placement for new records).",
)
@click.option(
    "--config", "configs", type=CONFIG_PAIR, multiple=True, help="Config to change (repeatable)."
)
@data_option
def alter(name: str, partitions: int | None, configs: tuple[tuple[str, str], ...]) -> None:
    """Change NAME's config, or increase its partition count."""
    if partitions is None and not configs:
        raise click.UsageError("nothing to alter: give --partitions and/or --config")
    values = config_mapping(configs)
    log = app().open_log()
    before = log.describe_topic(name)
    TopicConfig.from_mapping(values, base=before.config)  # refuse bad keys before any change
    if partitions is not None and partitions < before.partitions:
        raise ConfigError(
            f"cannot decrease partitions from {before.partitions} to {partitions}: records"
            " would be lost (Kafka refuses this too)",
            topic=name,
        )
    after = log.alter_topic(name, partitions=partitions, config=values or None)
    if after.partitions > before.partitions:
        stderr_console().print(
            f"[yellow]warning:[/yellow] {name} now has {after.partitions} partitions (was"
            f" {before.partitions}): new records with an existing key may go to a different"
            " partition than that key's older records, so per-key order across old and new"
            " records is no longer guaranteed"
        )
    changed = [k for k, v in after.config.to_dict().items() if before.config.to_dict()[k] != v]
    click.echo(
        f"topic {name} altered: {after.partitions} partition(s)"
        + (f"; changed {', '.join(changed)}" if changed else "")
    )


@topics.command()
@click.argument("name", type=TOPIC)
@data_option
def delete(name: str) -> None:
    """Delete NAME and all its records."""
    app().open_log().delete_topic(name)
    click.echo(f"topic {name} deleted")
