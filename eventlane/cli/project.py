"""``eventlane project``, ``eventlane migrate`` and ``eventlane dlq``: run projectors, watch
their lag, evolve read-model schemas, and inspect and retry dead letters.

``APP`` is the application object as ``module:attribute`` (or ``$EVENTLANE_APP``); it must
be importable from the current directory or ``PYTHONPATH`` (worker processes import it too).

JSON shapes:

* ``project status --json``: ``{"app", "projectors": [STATUS]}`` with STATUS as documented
  in :mod:`eventlane.projection.status`;
* ``migrate --json``: ``{"app", "applied": {projector: [migration, ...]}}``;
* ``dlq list --json``: ``[LETTER]``; ``dlq show --json``: ``LETTER``, where LETTER is
  ``{"id", "topic", "partition", "offset", "key", "value", "value_base64", "headers",
  "event_type", "error", "traceback", "attempts", "status", "created_ms"}`` (``error``: the
  exception's line; ``traceback``: the handler's stored traceback);
* ``dlq retry --json``: ``{"succeeded": [id], "failed": {id: error}}``.
"""

from __future__ import annotations

import gc
import os
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import click
import orjson
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from eventlane.app import Runtime, load_app
from eventlane.cli.context import app as cli_app
from eventlane.cli.context import data_option, json_option, stderr_console, stdout_console
from eventlane.cli.groups import GROUP
from eventlane.cli.metrics import export_metrics, metrics_options
from eventlane.cli.render import simple_table
from eventlane.errors import ConfigError, FrameworkError, ProjectionError
from eventlane.log.port import keyed_log
from eventlane.metrics import MULTIPROC_ENV
from eventlane.metrics import enable as enable_metrics
from eventlane.observability import logging_env
from eventlane.projection import (
    DeadLetter,
    Runner,
    Worker,
    get_dead_letter,
    list_dead_letters,
    migrate_all,
    open_readmodel,
    retry_dead_letters,
    view_of,
)
from eventlane.projection.breaker import EXIT_BREAKER
from eventlane.projection.breaker import describe as describe_breaker
from eventlane.projection.lifeline import follow_supervisor
from eventlane.projection.retire import retire_projector
from eventlane.projection.store import AnyReadModelView
from eventlane.projection.worker import EXIT_CANNOT_START
from eventlane.store.stream_cache import WORKER_EVENTS

__all__ = ["PROJECTION_COMMANDS", "dlq", "migrate", "project"]

APP_HELP = "The application, as module:attribute [env EVENTLANE_APP]."
STATUSES = ("open", "dead", "parked", "retried", "all")


def _print_json(value: object) -> None:
    click.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())


def app_argument(f: Any) -> Any:
    return click.argument("app_spec", metavar="APP", envvar="EVENTLANE_APP", required=True)(f)


def projection_option(f: Any) -> Any:
    return click.option(
        "--projection", "-p", "projection", required=True, metavar="NAME", help="Projector name."
    )(f)


@contextmanager
def _runtime(app_spec: str, *, create: bool, cache_events: int | None = None) -> Iterator[Runtime]:
    """The app on the command's data directory (``create=False`` refuses a missing one);
    ``cache_events``: the stream cache's bound when not the app's."""
    application = load_app(app_spec)
    log = cli_app().open_log(create=create)
    with application.open(
        keyed_log(log, "eventlane project"), create_topics=create, cache_events=cache_events
    ) as runtime:
        yield runtime


def cache_events_option(f: Any) -> Any:
    return click.option(
        "--cache-events",
        type=click.IntRange(0, 10_000_000),
        default=WORKER_EVENTS,
        show_default=True,
        help="Events each worker keeps decoded from recently used streams (0: none).",
    )(f)


def worker_args(dead_letter_unknown: bool, cache_events: int) -> tuple[str, ...]:
    """The options a runner passes on to each ``project worker`` it starts."""
    dead = ("--dead-letter-unknown",) if dead_letter_unknown else ()
    return (*dead, "--cache-events", str(cache_events))


# ---------------------------------------------------------------------------- project
@click.group()
@data_option
def project() -> None:
    """Run projectors as consumer-group workers and watch their lag."""


@project.command("run")
@app_argument
@projection_option
@click.option("--workers", "-w", type=click.IntRange(1, 64), default=1, show_default=True)
@click.option("--restart", is_flag=True, help="Replace a worker that dies.")
@click.option(
    "--session-timeout-ms",
    type=click.IntRange(300, 3_600_000),
    default=10_000,
    show_default=True,
    help="A worker silent this long is evicted and its partitions move.",
)
@click.option(
    "--dead-letter-unknown",
    is_flag=True,
    help="Dead-letter events newer than the code (default: wait at them for newer code).",
)
@click.option(
    "--live/--no-live",
    default=None,
    help="Live view of positions, lag and workers [default: when stdout is a terminal].",
)
@cache_events_option
@metrics_options
@data_option
def run_command(
    app_spec: str,
    projection: str,
    workers: int,
    restart: bool,
    session_timeout_ms: int,
    dead_letter_unknown: bool,
    live: bool | None,
    cache_events: int,
    metrics_port: int | None,
    metrics_addr: str,
) -> None:
    """Run N worker processes of one projector until SIGTERM / Ctrl-C.

    Each worker is a member of the projector's consumer group: the partitions are shared,
    and move when a worker joins, leaves or dies. Stopping finishes each worker's batch,
    commits and leaves the group. With the live view the workers' logs go to
    <data>/readmodels/NAME.log (NS.NAME.log for an app declared with namespace=NS).
    """
    with _runtime(app_spec, create=True) as runtime, ExitStack() as metrics:
        runtime.app.projector(projection)
        env = _worker_env()
        if metrics_port is not None:
            env[MULTIPROC_ENV] = export_metrics(metrics, runtime, metrics_port, metrics_addr)
        local = runtime.log.local
        data = local.root.resolve()
        # Refuse pending migrations here, once, with the same error a worker would give.
        open_readmodel(runtime, projection).close()
        console = stdout_console()
        show = console.is_terminal if live is None else live
        log_path = local.worker_log(runtime.names.local(projection)) if show else None
        runner = Runner(
            app_spec,
            projection,
            data,
            workers=workers,
            restart=restart,
            session_timeout_ms=session_timeout_ms,
            log_path=log_path,
            readmodel=runtime.readmodel_path(projection),
            env=env,
            coordinator=runtime.group_coordinator(projection),
            worker_args=worker_args(dead_letter_unknown, cache_events),
        )
        started = time.monotonic()
        doc = runtime.status(projection)
        parts = [f"{r['topic']}-{r['partition']}" for r in doc["partitions"]]
        stderr_console().print(
            f"project run: data {data}, projector {projection}"
            + (f" (group {doc['group']})" if doc["group"] != projection else "")
            + f", {len(parts)} partition(s)"
            f" ({', '.join(parts) or 'none yet'}), lag {doc['lag']:,}, {workers} worker(s)",
            soft_wrap=True,
        )
        if show:
            stderr_console().print(f"worker logs: {log_path}")
            with Live(console=console, refresh_per_second=4, transient=False) as view:

                def tick(r: Runner) -> None:
                    view.update(_live_view(runtime, r, started))

                runner.run(tick=tick)
                view.update(_live_view(runtime, runner, started))
        else:
            runner.run()
        assert runner.coordinator is not None
        runner.coordinator.close()
    if runner.failure is not None:
        if "poison-rate breaker" in runner.failure:
            raise click.ClickException(runner.failure)
        raise click.ClickException(f"workers could not start: {runner.failure}")
    if runner.died_out and runner.crashes:
        pid, code = runner.crashes[-1]
        raise click.ClickException(
            f"every worker of {projection} died: worker {pid} exited with status {code}"
            f" ({len(runner.crashes)} worker exit(s) with an error; see the worker log)"
        )


def _worker_env() -> dict[str, str]:
    """The workers' environment: this one, with this command's ``--log`` (the workers must
    run on the log this command opened, not on the embedded log in --data) and its log
    settings (``--log-level``, ``--log-format``)."""
    env = {**os.environ, **logging_env()}
    url = cli_app().log_url
    if url:
        env["EVENTLANE_LOG"] = url
    else:
        env.pop("EVENTLANE_LOG", None)
    return env


@project.command("worker", hidden=True)
@app_argument
@click.argument("name", metavar="NAME")
@click.option("--session-timeout-ms", type=click.IntRange(300, 3_600_000), default=10_000)
@click.option("--max-poll-records", type=click.IntRange(1, 1_000_000), default=2_000)
@click.option("--dead-letter-unknown", is_flag=True, help="Dead-letter events newer than the code.")
@cache_events_option
@data_option
@click.pass_context
def worker_command(
    ctx: click.Context,
    app_spec: str,
    name: str,
    session_timeout_ms: int,
    max_poll_records: int,
    dead_letter_unknown: bool,
    cache_events: int,
) -> None:
    """One worker process of projector NAME, until SIGTERM (what `project run` starts).

    Exit status 2 when it cannot start (bad APP, unknown projector, pending migrations):
    restarting would not help, so the runner does not; 1 when the log did not answer while
    it started (a retriable error: the runner starts another). Exit status 3 when its poison-rate
    breaker tripped (it stopped applying, see eventlane.projection.breaker). It gets SIGTERM
    when `project run` dies, even by SIGKILL (eventlane.projection.lifeline).
    """
    follow_supervisor()  # no orphans: SIGTERM when the supervisor dies
    if os.environ.get(MULTIPROC_ENV):
        enable_metrics()  # the supervisor's /metrics sums its workers' instruments
    with ExitStack() as stack:
        try:
            worker = open_worker(
                stack,
                app_spec,
                name,
                session_timeout_ms=session_timeout_ms,
                max_poll_records=max_poll_records,
                wait_for_newer=not dead_letter_unknown,
                cache_events=cache_events,
            )
        except FrameworkError as exc:
            click.echo(f"Error: {exc}", err=True)
            # a log that did not answer in time (a broker just killed, a loaded machine)
            # may answer the next worker: exit 1, which the runner replaces
            ctx.exit(1 if exc.retriable or exc.indeterminate else EXIT_CANNOT_START)
        worker.install_signal_handlers()
        gc.freeze()  # the start-up heap (modules, classes) is never collected: skip it
        worker.run()
    if worker.tripped is not None:
        ctx.exit(EXIT_BREAKER)


def open_worker(
    stack: ExitStack,
    app_spec: str,
    name: str,
    *,
    session_timeout_ms: int = 10_000,
    max_poll_records: int = 2_000,
    wait_for_newer: bool = True,
    cache_events: int = WORKER_EVENTS,
) -> Worker:
    """What a worker process runs: projector ``name`` of the app on the command's log (the
    runtime closes with ``stack``), keeping at most ``cache_events`` decoded events (a
    policy's commands mostly create aggregates it never loads again:
    :data:`~eventlane.store.stream_cache.WORKER_EVENTS`)."""
    runtime = stack.enter_context(_runtime(app_spec, create=True, cache_events=cache_events))
    return Worker(
        runtime,
        name,
        session_timeout_ms=session_timeout_ms,
        max_poll_records=max_poll_records,
        wait_for_newer=wait_for_newer,
    )


def _live_view(runtime: Runtime, runner: Runner, started: float) -> Group:
    status = runtime.status(runner.name)
    pids = {m["member_id"]: m["pid"] for m in status["members"]}
    partitions = Table(title_justify="left")
    for column in ("partition", "position", "HWM", "lag", "worker pid"):
        partitions.add_column(column, justify="left" if column == "partition" else "right")
    for row in status["partitions"]:
        owner = row["owner"]
        partitions.add_row(
            f"{row['topic']}-{row['partition']}",
            "-" if row["position"] is None else str(row["position"]),
            str(row["hwm"]),
            Text(str(row["lag"]), style="bold red" if row["lag"] else "green"),
            "-" if owner is None else str(pids.get(owner, "?")),
        )
    by_pid = {m["pid"]: m for m in status["members"]}
    workers = Table(title_justify="left")
    for column in ("pid", "state", "partitions", "uptime"):
        workers.add_column(column)
    now = time.monotonic()
    for w in sorted(runner.procs, key=lambda w: w.slot):
        member = by_pid.get(w.pid)
        workers.add_row(
            str(w.pid),
            "member" if member is not None else "joining",
            ", ".join(member["assignment"]) if member else "",
            f"{now - w.started:.0f}s",
        )
    for w in runner.exited[-5:]:
        workers.add_row(str(w.pid), f"exited ({w.exit_code})", "", "")
    dead = status["dead_letters"]
    header = Text.assemble(
        (f"projector {runner.name}", "bold"),
        f"  workers {len(runner.procs)}/{runner.workers}",
        f"  restarts {runner.restarts}",
        f"  generation {status['generation']}",
        ("  lag ", ""),
        (str(status["lag"]), "bold red" if status["lag"] else "bold green"),
        f"  dead letters {dead.get('dead', 0) + dead.get('parked', 0)} open",
        f"  up {now - started:.0f}s",
    )
    return Group(header, partitions, workers)


@project.command("remove")
@click.argument("name", metavar="NAME", type=GROUP)
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
@click.option(
    "--readmodels",
    metavar="URL",
    envvar="EVENTLANE_READMODELS",
    help="The PostgreSQL database (postgresql://...) holding the read model: its schema is"
    " dropped too [env EVENTLANE_READMODELS].",
)
@json_option
@data_option
def remove_command(name: str, dry_run: bool, readmodels: str | None, as_json: bool) -> None:
    """Remove a retired or renamed projector NAME: its consumer group, its read model (with
    its positions and dead letters), its NAME.dlq topic and its other files. Events stay.

    NAME is the projector's group as `groups list` shows it: NS.PROJECTOR for an app
    declared with namespace=NS. Refused while NAME has live workers. Take the projector
    out of the app first, or its workers would start it again from the low-water marks.
    """
    log = cli_app().open_log(create=False)
    report = retire_projector(log, cli_app().data, name, dry_run=dry_run, readmodels=readmodels)
    if as_json:
        _print_json(report.to_json())
        return
    verb = "would remove" if dry_run else "removed"
    lines = [f"{verb}: consumer group {name}"] if report.group else []
    if report.dlq_topic:
        lines.append(f"{verb}: topic {report.dlq_topic}")
    lines += [f"{verb}: {path}" for path in report.files]
    lines += [f"{verb}: PostgreSQL schema {schema}" for schema in report.schemas]
    lines.append(f"{verb}: {report.dead_letters} dead letter(s) with the read model")
    click.echo("\n".join(lines))


@project.command("status")
@app_argument
@click.option("--projection", "-p", "projection", metavar="NAME", help="Only this projector.")
@json_option
@data_option
def status_command(app_spec: str, projection: str | None, as_json: bool) -> None:
    """Per projector: each partition's applied position (from the read model), HWM and lag,
    the group's members, dead letters and pending migrations."""
    with _runtime(app_spec, create=False) as runtime:
        names = [projection] if projection else sorted(runtime.app.projectors)
        docs = [runtime.status(name) for name in names]
    if as_json:
        _print_json({"app": runtime.app.name, "projectors": docs})
        return
    console = stdout_console()
    for doc in docs:
        pids = {m["member_id"]: m["pid"] for m in doc["members"]}
        console.print(
            simple_table(
                f"Projector {doc['projector']}"
                + (f" (group {doc['group']})" if doc["group"] != doc["projector"] else "")
                + f" — lag {doc['lag']}",
                ("partition", "position", "HWM", "lag", "owner pid"),
                [
                    (
                        f"{r['topic']}-{r['partition']}",
                        "-" if r["position"] is None else r["position"],
                        r["hwm"],
                        r["lag"],
                        "-" if r["owner"] is None else pids.get(r["owner"], "?"),
                    )
                    for r in doc["partitions"]
                ],
            )
        )
        if doc["members"]:
            console.print(
                simple_table(
                    "Members",
                    ("member", "pid", "alive", "partitions"),
                    [
                        (
                            m["member_id"],
                            m["pid"],
                            "yes" if m["alive"] else "no (session expired)",
                            ", ".join(m["assignment"]) or "-",
                        )
                        for m in doc["members"]
                    ],
                )
            )
        else:
            console.print("Members: none (no worker running)")
        dead = doc["dead_letters"]
        console.print(
            f"Dead letters: {dead.get('dead', 0)} dead, {dead.get('parked', 0)} parked,"
            f" {dead.get('retried', 0)} retried"
        )
        if doc["pending_migrations"]:
            console.print(
                f"[bold red]Pending migrations[/]: {', '.join(doc['pending_migrations'])}"
                " (run `eventlane migrate APP`)"
            )
        for wait in doc.get("waiting", []):
            console.print(Text(wait["message"], "bold yellow"))
        if doc.get("breaker") is not None:
            console.print(Text(f"BREAKER TRIPPED: {describe_breaker(doc['breaker'])}", "bold red"))
        console.print()


# ---------------------------------------------------------------------------- migrate
@click.command()
@app_argument
@json_option
@data_option
def migrate(app_spec: str, as_json: bool) -> None:
    """Apply the pending read-model migrations of every projector; list what was applied.

    Stop the projector's workers first: a worker refuses to start while one is pending.
    """
    with _runtime(app_spec, create=True) as runtime:
        applied = migrate_all(runtime)
    if as_json:
        _print_json({"app": runtime.app.name, "applied": applied})
        return
    console = stdout_console()
    if not any(applied.values()):
        console.print("Nothing to apply: every read model is up to date.")
        return
    for name, names in applied.items():
        for migration in names:
            console.print(f"{name}: applied {migration}")


# ---------------------------------------------------------------------------- dlq
@click.group()
@data_option
def dlq() -> None:
    """Inspect and retry a projector's dead letters (events its handlers could not apply)."""


def _view(runtime: Runtime, projection: str) -> AnyReadModelView:
    """A read-only view of the projector's read model on its engine (SQLite file or
    PostgreSQL schema: a read-only session with a statement timeout); refuses one that does
    not exist."""
    view = view_of(runtime, projection)
    if view.conn is None:
        view.close()
        raise ConfigError(f"projector {projection!r} has no read model yet", path=view.path)
    return view


def _letters(runtime: Runtime, projection: str, status: str) -> list[DeadLetter]:
    with _view(runtime, projection) as view:
        letters = list_dead_letters(view)
    if status == "open":
        return [d for d in letters if d.status in ("dead", "parked")]
    if status == "all":
        return letters
    return [d for d in letters if d.status == status]


def _short(text: str, width: int = 60) -> str:
    line = text.splitlines()[-1] if text else ""
    return line if len(line) <= width else line[: width - 1] + "…"


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)', re.M)


def _raised_at(error: str) -> str:
    """``file:line in function`` of the innermost frame of a stored traceback, or ``?``."""
    frames = list(_FRAME.finditer(error))
    if not frames:
        return "?"
    last = frames[-1]
    path = Path(last["file"])
    if path.is_relative_to(Path.cwd()):
        path = path.relative_to(Path.cwd())
    return f"{path}:{last['line']} in {last['name']}"


@dlq.command("list")
@app_argument
@projection_option
@click.option(
    "--status",
    type=click.Choice(STATUSES),
    default="all",
    show_default=True,
    help="open = dead or parked.",
)
@json_option
@data_option
def dlq_list(app_spec: str, projection: str, status: str, as_json: bool) -> None:
    """List dead letters: id, source coordinates, key, type, status, attempts, error."""
    with _runtime(app_spec, create=False) as runtime:
        letters = _letters(runtime, projection, status)
    if as_json:
        _print_json([d.to_json() for d in letters])
        return
    table = simple_table(
        f"Dead letters of {projection} ({status}): {len(letters)}",
        ("id", "source", "key", "type", "status", "tries", "error"),
        [
            (
                d.id,
                f"{d.topic}-{d.partition}@{d.offset}",
                "-" if d.key is None else d.key.decode("utf-8", "replace"),
                d.event_type or "?",
                d.status,
                d.attempts,
                _short(d.error),
            )
            for d in letters
        ],
    )
    console = stdout_console()
    _fit_one_line(table, console.width, squeeze=("key", "error"))
    console.print(table)


def _fit_one_line(table: Table, width: int, squeeze: tuple[str, str]) -> None:
    """One line per row within ``width``: every column keeps its widest cell except the two
    ``squeeze`` columns, which share what is left (a third and two thirds) and end in "…"."""
    widths = {c.header: max(len(str(x)) for x in (c.header, *c._cells)) for c in table.columns}
    fixed = sum(w for name, w in widths.items() if name not in squeeze)
    left = max(2 * 8, width - fixed - (3 * len(table.columns) + 1))
    first = min(widths[squeeze[0]], max(8, left // 3))
    room = {squeeze[0]: first, squeeze[1]: max(8, left - first)}
    for column in table.columns:
        column.no_wrap = True
        column.overflow = "ellipsis"
        column.width = min(widths[str(column.header)], room.get(str(column.header), 10**6))


def _render_bytes(data: bytes | None) -> str:
    if data is None:
        return "(null)"
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.hex(" ")


@dlq.command("show")
@app_argument
@click.argument("letter_id", metavar="ID", type=int)
@projection_option
@json_option
@data_option
def dlq_show(app_spec: str, letter_id: int, projection: str, as_json: bool) -> None:
    """One dead letter: raw bytes, headers, source coordinates and the full error."""
    with _runtime(app_spec, create=False) as runtime, _view(runtime, projection) as view:
        letter = get_dead_letter(view, letter_id)
    if letter is None:
        raise ProjectionError(f"projector {projection!r} has no dead letter {letter_id}")
    if as_json:
        _print_json(letter.to_json())
        return
    console = stdout_console()
    console.print(
        simple_table(
            f"Dead letter {letter.id} of {projection}",
            ("field", "value"),
            [
                ("source", f"{letter.topic}-{letter.partition}@{letter.offset}"),
                ("key", _render_bytes(letter.key)),
                ("event type", letter.event_type or "?"),
                ("status", letter.status),
                ("attempts", str(letter.attempts)),
                ("dead-lettered at (ms)", str(letter.created_ms)),
                ("raised at", _raised_at(letter.error)),
            ],
        )
    )
    console.print(
        simple_table(
            "Headers", ("name", "value"), [(n, _render_bytes(v)) for n, v in letter.headers]
        )
    )
    console.print(Text("Value (raw bytes):", style="bold"))
    click.echo(_render_bytes(letter.value))  # unwrapped, exactly as stored
    console.print(Text("Error (traceback, most recent call last):", style="bold"))
    click.echo(letter.error)


@dlq.command("retry")
@app_argument
@projection_option
@click.option("--id", "ids", type=int, multiple=True, help="Only these letters (repeatable).")
@json_option
@data_option
def dlq_retry(app_spec: str, projection: str, ids: tuple[int, ...], as_json: bool) -> None:
    """Re-apply open dead letters with today's code (decode + upcast the raw bytes again,
    run the handler), in source order; print what succeeded and what failed.

    Exits with status 1 when any letter failed again.
    """
    with _runtime(app_spec, create=False) as runtime:
        cls = runtime.app.projector(projection)
        with _view(runtime, projection):  # refuses a read model that does not exist
            pass
        readmodel = open_readmodel(runtime, projection)
        try:
            report = retry_dead_letters(
                cls(), runtime.codec, readmodel, ids=list(ids) or None, app=runtime
            )
        finally:
            readmodel.close()
    if as_json:
        _print_json({"succeeded": report.succeeded, "failed": report.failed})
    else:
        console = stdout_console()
        console.print(f"succeeded: {len(report.succeeded)}  failed: {len(report.failed)}")
        if report.succeeded:
            console.print("retried: " + ", ".join(str(i) for i in report.succeeded))
        for letter_id, error in sorted(report.failed.items()):
            console.print(f"[red]failed[/] {letter_id}: {_short(error, 200)}")
    if report.failed:
        raise SystemExit(1)


PROJECTION_COMMANDS = (project, migrate, dlq)
"""The commands this module adds to the ``eventlane`` root group."""
