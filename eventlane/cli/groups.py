"""``eventlane groups`` (list, describe, reset-offsets, delete) and ``consume --group``.

``groups describe G --json`` prints exactly::

    {"group", "state", "generation",
     "members": [{"member_id", "instance_id", "client_id", "host",
                  "assignment": [{"topic", "partition"}]}],
     "offsets": [{"topic", "partition", "committed", "hwm", "lag"}]}

(``committed`` and ``lag`` are ``null`` for partitions the group never committed).
``groups list --json`` prints ``[{"group", "state", "generation", "members"}]``.
``groups reset-offsets`` is a dry run unless ``--execute``; both are refused while the group
has live members, as Kafka refuses them.

``consume TOPIC --group G`` joins group G as one member (see :func:`consume_group`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import click
import orjson
from rich.table import Table

from eventlane.cli.context import (
    TOPIC,
    app,
    data_option,
    json_option,
    namespace_option,
    stdout_console,
)
from eventlane.consumer.admin import delete_group, describe_group, list_groups, reset_offsets
from eventlane.consumer.coordinator import validate_group_id
from eventlane.consumer.group import GroupConsumer
from eventlane.errors import FrameworkError
from eventlane.log.record import Record, TopicPartition

if TYPE_CHECKING:
    from eventlane.app.namespace import Namespace

__all__ = ["GROUP", "consume_group", "groups"]


class GroupIdType(click.ParamType):  # type: ignore[type-arg]
    """A group id checked against the naming rule before anything is opened."""

    name = "group"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> str:
        try:
            return validate_group_id(value)
        except FrameworkError as err:
            return self.fail(str(err), param, ctx)


GROUP = GroupIdType()


def _print_json(value: object) -> None:
    click.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


@click.group()
@data_option
def groups() -> None:
    """List, describe, reset and delete consumer groups."""


@groups.command(name="list")
@namespace_option
@json_option
@data_option
def list_(namespace: Namespace | None, as_json: bool) -> None:
    """List consumer groups (with state directories or committed offsets); with
    --namespace NS only those of apps declared with namespace=NS (NS.<projector>)."""
    rows = list_groups(app().open_log())
    rows = [r for r in rows if namespace is None or namespace.owns(r["group"])]
    if as_json:
        _print_json(rows)
        return
    console = stdout_console()
    if not rows:
        where = "on the cluster" if app().log_url else f"in {app().data}"
        console.print(f"no consumer groups {where}")
        return
    table = Table(title="Consumer groups", title_justify="left")
    for name in ("group", "state", "generation", "members"):
        table.add_column(name, justify="left" if name in ("group", "state") else "right")
    for row in rows:
        table.add_row(row["group"], row["state"], str(row["generation"]), str(row["members"]))
    console.print(table)


@groups.command()
@click.argument("group", type=GROUP)
@json_option
@data_option
def describe(group: str, as_json: bool) -> None:
    """Show GROUP's members, their partitions, and committed offsets with lag."""
    doc = describe_group(app().open_log(), group)
    if as_json:
        _print_json(doc)
        return
    console = stdout_console()
    console.print(
        f"[bold]{group}[/bold]: {doc['state']}, generation {doc['generation']},"
        f" {len(doc['members'])} member(s)"
    )
    members = Table(title="Members", title_justify="left")
    for name in ("member id", "instance id", "client id", "host", "partitions"):
        members.add_column(name)
    for m in doc["members"]:
        owned = ", ".join(f"{a['topic']}-{a['partition']}" for a in m["assignment"])
        members.add_row(
            m["member_id"],
            _dash(m["instance_id"]),
            m["client_id"] or "-",
            m["host"] or "-",
            owned or "-",
        )
    console.print(members)
    offsets = Table(title="Offsets", title_justify="left")
    offsets.add_column("topic")
    for name in ("partition", "committed", "HWM", "lag"):
        offsets.add_column(name, justify="right")
    for row in doc["offsets"]:
        offsets.add_row(
            row["topic"],
            str(row["partition"]),
            _dash(row["committed"]),
            _dash(row["hwm"]),
            _dash(row["lag"]),
        )
    console.print(offsets)


@groups.command(name="reset-offsets")
@click.argument("group", type=GROUP)
@click.option("--topic", type=TOPIC, required=True, help="Reset every partition of this topic.")
@click.option("--to-earliest", "mode", flag_value="to-earliest", help="To the low-water mark.")
@click.option("--to-latest", "mode", flag_value="to-latest", help="To the high-water mark.")
@click.option(
    "--to-offset",
    type=click.IntRange(min=0),
    metavar="N",
    help="To offset N (clamped to [LWM, HWM]).",
)
@click.option(
    "--to-datetime",
    metavar="ISO",
    help="To the first record at or after ISO-8601 time ISO (naive = UTC).",
)
@click.option(
    "--shift-by",
    type=int,
    metavar="N",
    help="Move the committed offset by N (negative: back), clamped.",
)
@click.option("--execute", is_flag=True, help="Commit the new offsets (default: dry run).")
@json_option
@data_option
def reset_offsets_(
    group: str,
    topic: str,
    mode: str | None,
    to_offset: int | None,
    to_datetime: str | None,
    shift_by: int | None,
    execute: bool,
    as_json: bool,
) -> None:
    """Move GROUP's committed offsets on TOPIC; a dry run unless --execute.

    Refused while GROUP has live members."""
    chosen: list[tuple[str, int | str | None]] = []
    if mode is not None:
        chosen.append((mode, None))
    if to_offset is not None:
        chosen.append(("to-offset", to_offset))
    if to_datetime is not None:
        chosen.append(("to-datetime", to_datetime))
    if shift_by is not None:
        chosen.append(("shift-by", shift_by))
    if len(chosen) != 1:
        raise click.UsageError(
            "give exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime, --shift-by"
        )
    ((how, value),) = chosen
    rows = reset_offsets(app().open_log(), group, topic, how, value, execute=execute)
    for row in rows:
        if "requested" in row:
            mark = "high" if row["requested"] > row["new"] else "low"
            click.echo(
                f"note: offset {row['requested']} is outside {row['topic']}-{row['partition']}"
                f" (its {mark}-water mark is {row['new']}): {row['new']} instead",
                err=True,
            )
    if as_json:
        _print_json({"group": group, "executed": execute, "offsets": rows})
        return
    table = Table(
        title=f"{'New' if execute else 'Planned (dry run)'} offsets of {group}",
        title_justify="left",
    )
    table.add_column("topic")
    for name in ("partition", "current", "new"):
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(row["topic"], str(row["partition"]), _dash(row["current"]), str(row["new"]))
    console = stdout_console()
    console.print(table)
    if not execute:
        console.print("dry run: nothing changed; add --execute to commit these offsets")


@groups.command()
@click.argument("group", type=GROUP)
@data_option
def delete(group: str) -> None:
    """Delete GROUP: its committed offsets and state. Refused while it has live members."""
    deleted = delete_group(app().open_log(), group)
    click.echo(f"consumer group {group} deleted ({deleted} committed offset(s) removed)")


# ---------------------------------------------------------------------------- consume
def consume_group(
    topic: str,
    group: str,
    *,
    offset: str,
    commit: str,
    session_timeout_ms: int,
    follow: bool,
    timeout: float | None,
    max_records: int | None,
    render: Callable[[Record], bytes],
) -> None:
    """``consume TOPIC --group G``: print records as one member of group G.

    Starts at the group's committed offsets (``--offset earliest|latest`` only decides where
    a partition with no commit starts). ``commit="after"`` commits each poll's records once
    they are printed and flushed (at-least-once: a crash may print some again);
    ``"before"`` commits them before printing (at-most-once: a crash may skip some).
    Without ``--follow``/``--timeout`` it stops once every partition it owns is caught up
    with its high-water mark. Leaving (end, Ctrl-C) hands its partitions to the others.
    """
    log = app().open_log()
    log.partition_count(topic)  # an unknown topic is an error, not an empty group
    consumer = GroupConsumer(
        log,
        group_id=group,
        topics=[topic],
        enable_auto_commit=False,
        auto_offset_reset=offset,
        session_timeout_ms=session_timeout_ms,
        heartbeat_interval_ms=max(1, min(3000, session_timeout_ms // 3)),
    )
    stdout = sys.stdout.buffer
    waiting = follow or timeout is not None
    left = max_records
    idle_since = time.monotonic()
    try:
        while left is None or left > 0:
            wait = 0.2
            if waiting:
                wait = (
                    1.0
                    if timeout is None
                    else max(0.0, min(1.0, idle_since + timeout - time.monotonic()))
                )
            records = consumer.poll(timeout=wait, max_records=min(left or 500, 500))
            if records:
                if commit == "before":
                    consumer.commit(_next_offsets(records))
                stdout.write(b"".join(render(r) + b"\n" for r in records))
                stdout.flush()
                if commit == "after":
                    consumer.commit(_next_offsets(records))
                idle_since = time.monotonic()
                if left is not None:
                    left -= len(records)
                continue
            if timeout is not None and time.monotonic() - idle_since >= timeout:
                break
            if not waiting and all(
                consumer.position(tp) >= log.offsets(tp.topic, tp.partition).hwm
                for tp in consumer.assignment()
            ):
                break  # caught up with every owned partition
    except BrokenPipeError:
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
    except KeyboardInterrupt:
        stdout.flush()
        consumer.close()
        raise click.exceptions.Exit(130) from None
    finally:
        consumer.close()


def _next_offsets(records: list[Record]) -> dict[TopicPartition, int]:
    out: dict[TopicPartition, int] = {}
    for r in records:
        out[TopicPartition(r.topic, r.partition)] = r.offset + 1
    return out
