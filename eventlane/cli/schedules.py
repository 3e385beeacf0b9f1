"""``eventlane schedules``: an app's deadlines (:mod:`eventlane.app.schedules`): list them, and
run the scheduler that fires them."""

from __future__ import annotations

import signal
from datetime import UTC, datetime
from typing import Any

import click
import orjson

from eventlane.cli.context import data_option, json_option, stderr_console, stdout_console
from eventlane.cli.project import _runtime, app_argument
from eventlane.cli.render import simple_table
from eventlane.projection.lifeline import follow_supervisor

__all__ = ["schedules"]

STATES = ("scheduled", "fired", "cancelled", "all")


@click.group()
@data_option
def schedules() -> None:
    """An app's scheduled commands (deadlines): list them, run the scheduler."""


def _when(ms: int | None) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


@schedules.command("list")
@app_argument
@click.option(
    "--state",
    type=click.Choice(STATES),
    default="scheduled",
    show_default=True,
    help="Which schedules.",
)
@json_option
@data_option
def list_command(app_spec: str, state: str, as_json: bool) -> None:
    """The app's schedules: key, state, moment, command, target, fired at."""
    with _runtime(app_spec, create=False) as runtime:
        entries = sorted(runtime.schedules.entries().values(), key=lambda e: (e.at, e.key))
        rows: list[dict[str, Any]] = [
            {
                "key": e.key,
                "id": e.id,
                "state": e.state,
                "at": e.at,
                "command": e.command,
                "data": e.data,
                "caused_by": e.caused_by,
                "fired_at": e.fired_at,
                "partition": e.partition,
                "offset": e.offset,
            }
            for e in entries
            if state in ("all", e.state)
        ]
    if as_json:
        click.echo(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode())
        return
    table = simple_table(
        f"{len(rows)} schedule(s)",
        ["key", "state", "at (UTC)", "command", "fired at (UTC)"],
        [(r["key"], r["state"], _when(r["at"]), r["command"], _when(r["fired_at"])) for r in rows],
    )
    stdout_console().print(table)


@schedules.command("run")
@app_argument
@click.option(
    "--poll-interval",
    type=click.FloatRange(0.05, 60),
    default=0.5,
    show_default=True,
    metavar="S",
    help="Longest wait between polls: how late a schedule may fire while the scheduler runs.",
)
@click.option(
    "--session-timeout-ms",
    type=click.IntRange(300, 3_600_000),
    default=10_000,
    show_default=True,
    help="A scheduler silent this long is evicted and its partitions move.",
)
@data_option
def run_command(app_spec: str, poll_interval: float, session_timeout_ms: int) -> None:
    """Fire the app's due schedules until SIGTERM / Ctrl-C: a member of the app's scheduler
    group (run several for failover: the partitions of the schedules topic are shared)."""
    from eventlane.app.schedules import Scheduler  # noqa: PLC0415

    follow_supervisor()  # under `eventlane run`: SIGTERM when the supervisor dies
    with _runtime(app_spec, create=True) as runtime:
        scheduler = Scheduler(
            runtime, poll_interval=poll_interval, session_timeout_ms=session_timeout_ms
        )

        def stop(_signum: int, _frame: object) -> None:
            scheduler.stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        stderr_console().print(
            f"scheduler of {runtime.app.name}: topic {scheduler.schedules.topic}", highlight=False
        )
        try:
            scheduler.run()
        finally:
            scheduler.close()
        stderr_console().print(f"scheduler stopped: {scheduler.fired} fired", highlight=False)
