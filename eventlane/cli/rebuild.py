"""``eventlane rebuild``: rebuild a projection from the log, verify it, hand it over.

    eventlane rebuild APP --projection NAME [--engine spark|local] [--output PATH]
                          [--swap] [--verify] [--master URL] [--conf spark.x=y ...]

* without ``--swap``: the rebuilt read model is written to ``--output`` (default
  ``<data>/readmodels/<name>.rebuild.sqlite``); nothing live is touched;
* ``--swap``: build a shadow file, catch it up, pause the live workers, swap it in, resume
  them (:mod:`eventlane.replay.handoff`);
* ``--verify``: compare table by table (checksums) with the local engine at the same end
  vector and with the live read model when it stands there; print the results; exit
  status 1 on any difference (before a swap: nothing is swapped then).

A rich progress bar on standard error shows the phase, partitions and records done.
``--json`` prints ``{"rebuild": RESULT, "verify": [COMPARISON], "handoff": HANDOFF|null}``
on standard output, with RESULT as :meth:`RebuildResult.to_json`, COMPARISON
``{"what", "ok", "skipped", "tables": [{"table", "equal", "left_rows", "right_rows",
"left", "right"}]}`` and HANDOFF as :meth:`HandoffResult.to_json`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import orjson
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from eventlane.app import App, load_app
from eventlane.cli.context import (
    CONFIG_PAIR,
    data_option,
    json_option,
    stderr_console,
    stdout_console,
)
from eventlane.cli.context import app as cli_app
from eventlane.cli.project import app_argument, projection_option
from eventlane.consumer.admin import parse_datetime_ms
from eventlane.errors import ConfigError, ReplayError
from eventlane.log.port import KeyedLog, Log, keyed_log
from eventlane.replay.check import check_merge
from eventlane.replay.handoff import HandoffResult, rebuild_and_swap
from eventlane.replay.rebuild import ENGINES, RebuildResult, rebuild
from eventlane.replay.session import validate_master
from eventlane.replay.verify import Comparison, verify_rebuild, verify_replay

__all__ = ["rebuild_command"]


class _Bar:
    """The rebuild's progress as a rich bar: phase, partitions done, records done."""

    def __init__(self, enabled: bool) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.fields[phase]:<9}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("tasks"),
            TextColumn("{task.fields[records]:>12,} records"),
            TimeElapsedColumn(),
            console=stderr_console(),
            disable=not enabled,
            transient=False,
        )
        self.task: TaskID | None = None

    def __enter__(self) -> _Bar:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def start(self, partitions: int, offsets: int) -> None:
        self.task = self.progress.add_task(
            "rebuild", total=max(partitions, 1), phase="replay", records=0
        )

    def update(self, partitions_done: int, records_done: int) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=partitions_done, records=records_done)

    def phase(self, name: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, phase=name)


class _VerificationFailedError(ReplayError):
    """``--verify --swap`` found a difference: the hand-off was abandoned."""


def _spark_conf(pairs: tuple[tuple[str, str], ...]) -> dict[str, str]:
    conf: dict[str, str] = {}
    for key, value in pairs:
        if not key.startswith("spark."):
            raise ConfigError(f"--conf takes spark.* settings, got {key!r}")
        conf[key] = value
    return conf


def _result_table(result: RebuildResult) -> Table:
    table = Table(title=f"rebuild of {result.projection!r} ({result.engine})", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    counts = result.counts
    table.add_row("output", str(result.path))
    table.add_row("records", f"{counts.records:,}")
    table.add_row("applied / skipped", f"{counts.applied:,} / {counts.skipped:,}")
    table.add_row("dead letters", f"{counts.dead_lettered:,}")
    retried = f" ({result.retried_tasks} retried)" if result.retried_tasks else ""
    table.add_row("tasks", f"{result.tasks}{retried}")
    table.add_row("seconds", f"{result.seconds:.2f} (replay {result.replay_seconds:.2f})")
    table.add_row("events/s", f"{result.events_per_second:,.0f}")
    if result.merge is not None and result.merge.seconds > 0:
        rate = result.merge.rows / result.merge.seconds
        table.add_row(
            "merge",
            f"{result.merge.rows:,} rows from {result.merge.partials} partials in"
            f" {result.merge.seconds:.2f}s ({rate:,.0f} rows/s)",
        )
    end = ", ".join(f"{tp.topic}/{tp.partition}:{off}" for tp, off in sorted(result.end.items()))
    table.add_row("positions (E)", end or "-")
    return table


def _dead_letter_table(result: RebuildResult, limit: int = 20) -> Table:
    table = Table(title=f"dead-letter report ({len(result.dead_letters)} events skipped)")
    for col in ("topic", "partition", "offset", "type", "status", "error"):
        table.add_column(col)
    for d in result.dead_letters[:limit]:
        table.add_row(
            d.topic, str(d.partition), str(d.offset), d.event_type or "?", d.status, d.error[:80]
        )
    return table


def _verify_table(comparisons: list[Comparison]) -> Table:
    table = Table(title="verification (table checksums)")
    for col in ("against", "table", "rows", "checksum", "result"):
        table.add_column(col)
    for comp in comparisons:
        if comp.skipped is not None:
            table.add_row(comp.what, "-", "-", "-", f"[yellow]skipped: {comp.skipped}")
            continue
        for d in comp.tables:
            rows = f"{d.left.rows if d.left else '-'} / {d.right.rows if d.right else '-'}"
            sums = f"{d.left.hex if d.left else '-'} / {d.right.hex if d.right else '-'}"
            verdict = "[green]equal" if d.equal else "[red]DIFFERENT"
            table.add_row(comp.what, d.table, rows, sums, verdict)
    return table


def _comparison_json(comp: Comparison) -> dict[str, Any]:
    return {
        "what": comp.what,
        "ok": comp.ok,
        "skipped": comp.skipped,
        "tables": [
            {
                "table": d.table,
                "equal": d.equal,
                "left_rows": d.left.rows if d.left else None,
                "right_rows": d.right.rows if d.right else None,
                "left": d.left.hex if d.left else None,
                "right": d.right.hex if d.right else None,
            }
            for d in comp.tables
        ],
    }


@click.command("rebuild")
@app_argument
@projection_option
@click.option("--engine", type=click.Choice(ENGINES), default="spark", show_default=True)
@click.option(
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write the rebuilt read model here (default <data>/readmodels/NAME.rebuild.sqlite).",
)
@click.option("--swap", is_flag=True, help="Hand the rebuilt model over to the live workers.")
@click.option("--verify", is_flag=True, help="Compare with the local engine and the live model.")
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="Only check that a parallel rebuild merges (merge_rules), in-process, no Spark.",
)
@click.option("--master", metavar="URL", help="Spark master (default local[*]).")
@click.option(
    "--conf",
    "conf_pairs",
    type=CONFIG_PAIR,
    multiple=True,
    metavar="spark.KEY=VALUE",
    help="Any Spark setting (repeatable).",
)
@click.option(
    "--key-groups",
    type=click.IntRange(1, 4096),
    help="Tasks per partition, by key (projectors with state_per_key only).",
)
@click.option(
    "--pause-timeout",
    type=click.FloatRange(1, 3600),
    default=60.0,
    show_default=True,
    help="Seconds to wait for the live workers to pause (--swap).",
)
@click.option(
    "--as-of",
    metavar="TIME",
    help="Time travel: rebuild the read model as of TIME (ISO 8601, UTC unless it names a"
    " zone, or epoch ms) and print the offset vector it stopped at.",
)
@data_option
@json_option
def rebuild_command(
    app_spec: str,
    projection: str,
    engine: str,
    output: Path | None,
    swap: bool,
    verify: bool,
    check_only: bool,
    master: str | None,
    conf_pairs: tuple[tuple[str, str], ...],
    key_groups: int | None,
    pause_timeout: float,
    as_of: str | None,
    as_json: bool,
) -> None:
    """Rebuild projection NAME of APP from the log's low-water marks.

    APP is the application as module:attribute [env EVENTLANE_APP].
    """
    if swap and output is not None:
        raise click.UsageError(
            "--output and --swap exclude each other (--swap replaces the live file)"
        )
    if as_of is not None and swap:
        raise click.UsageError("--as-of builds a past read model: it cannot --swap the live one")
    conf = _spark_conf(conf_pairs)
    if engine == "spark" and master is not None:
        master = validate_master(master)  # before anything is opened or started
    application = load_app(app_spec)
    application.projector(projection)  # an unknown name fails before anything starts
    log = cli_app().open_log(create=False)
    if check_only:
        if swap or verify or output is not None:
            raise click.UsageError("--check builds nothing to keep: no --swap/--verify/--output")
        partials, stats = check_merge(log, cli_app().data, application, projection)
        if as_json:
            click.echo(orjson.dumps({"partials": partials, "merge": stats._asdict()}).decode())
        else:
            click.echo(
                f"merge check of {projection}: {partials} partition partial(s) merge without"
                f" conflict ({stats})"
            )
        return
    comparisons: list[Comparison] = []
    handoff: HandoffResult | None = None
    options: dict[str, Any] = {"key_groups": key_groups}
    if as_of is not None:
        options["as_of"] = int(as_of) if as_of.isdigit() else parse_datetime_ms(as_of)
    if engine == "spark":
        options.update(master=master, conf=conf)
    result: RebuildResult | None
    if not isinstance(log, KeyedLog):  # e.g. Kafka's core log: a replay needs no Runtime
        if swap:
            keyed_log(log, "eventlane rebuild --swap (live workers of the app)")
        with _Bar(not as_json) as bar:
            result = rebuild(
                application, projection, engine=engine, output=output, progress=bar,
                data=log, **options,
            )  # fmt: skip
            if verify:
                comparisons.extend(verify_replay(application, log, result))
    else:
        handoffs: list[HandoffResult] = []
        result = _on_runtime(
            application, log, projection, engine, output, swap, verify, pause_timeout,
            options, as_json, comparisons, handoffs,
        )  # fmt: skip
        handoff = handoffs[0] if handoffs else None
    ok = all(c.ok for c in comparisons)
    if as_json:
        body = {
            "rebuild": None if result is None else result.to_json(),
            "verify": [_comparison_json(c) for c in comparisons],
            "handoff": None if handoff is None else handoff.to_json(),
        }
        click.echo(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode())
    else:
        console = stdout_console()
        if result is not None:
            if as_of is not None:
                vector = ", ".join(
                    f"{tp.topic}/{tp.partition}={off}" for tp, off in sorted(result.end.items())
                )
                console.print(f"as of {as_of}: offsets {vector}")
            console.print(_result_table(result))
            if result.dead_letters:
                console.print(_dead_letter_table(result))
        if comparisons:
            console.print(_verify_table(comparisons))
        if handoff is not None:
            console.print(
                f"handed over: {handoff.caught_up:,} records caught up after E"
                f" ({handoff.final_records:,} while paused), workers paused"
                f" {handoff.paused_seconds:.2f}s, members: {', '.join(handoff.members) or 'none'}"
            )
    if not ok:
        raise click.exceptions.Exit(1)


if __name__ == "__main__":  # pragma: no cover - the spark-submit entry (docs/spark.md)
    import importlib
    import sys

    importlib.import_module("eventlane.cli").main(["rebuild", *sys.argv[1:]])


def _on_runtime(
    application: App,
    log: Log,
    projection: str,
    engine: str,
    output: Path | None,
    swap: bool,
    verify: bool,
    pause_timeout: float,
    options: dict[str, Any],
    as_json: bool,
    comparisons: list[Comparison],
    handoffs: list[HandoffResult],
) -> RebuildResult | None:
    """The rebuild on a runtime of the app (a log it can run on: --swap hands over)."""
    with (
        application.open(keyed_log(log, "eventlane rebuild"), create_topics=False) as runtime,
        _Bar(not as_json) as bar,
    ):

        def check(result: RebuildResult) -> None:
            comparisons.extend(verify_rebuild(runtime, result))
            if not all(c.ok for c in comparisons):
                raise _VerificationFailedError("verification found differences; nothing swapped")

        try:
            if swap:
                handoff = rebuild_and_swap(
                    runtime,
                    projection,
                    engine=engine,
                    pause_timeout=pause_timeout,
                    progress=bar,
                    before_swap=check if verify else None,
                    **options,
                )
                handoffs.append(handoff)
                result: RebuildResult | None = handoff.rebuild
            else:
                result = rebuild(
                    runtime, projection, engine=engine, output=output, progress=bar, **options
                )
                if verify:
                    comparisons.extend(verify_rebuild(runtime, result))
        except _VerificationFailedError:
            result = None
    return result
