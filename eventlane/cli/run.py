"""``eventlane run APP``: every projector and policy of an app (and its scheduler), under one
supervisor.

One :class:`~eventlane.projection.Runner` per projector (policies are projectors), driven
by :class:`~eventlane.projection.supervisor.AppSupervisor`: crashed workers are restarted
with backoff, a dead worker's partitions move at once, SIGTERM stops all cleanly, SIGHUP
rolls every worker one at a time. Status: ``eventlane project status APP`` (or
``eventlane run APP --status``).
"""

from __future__ import annotations

import click

from eventlane.cli.context import data_option, stderr_console
from eventlane.cli.project import (
    _runtime,
    _worker_env,
    app_argument,
    cache_events_option,
    status_command,
    worker_args,
)
from eventlane.errors import FrameworkError
from eventlane.projection import Runner, open_readmodel
from eventlane.projection.supervisor import AppSupervisor

__all__ = ["run"]

SCHEDULER = "scheduler"
"""The name ``--only``/``--projector`` give the app's scheduler (``eventlane schedules run``),
run when the app declares commands."""


def _counts(
    names: list[str], workers: int, only: tuple[str, ...], overrides: tuple[str, ...]
) -> dict[str, int]:
    """Projector -> worker count from ``--workers``, ``--only`` and ``--projector NAME=N``."""
    unknown = [n for n in only if n not in names]
    counts = dict.fromkeys(only or names, workers)
    for item in overrides:
        name, sep, text = item.partition("=")
        if not sep or not text.isdigit() or not 0 <= int(text) <= 64:
            raise click.BadParameter(
                f"{item!r} is not NAME=N (N from 0 to 64)", param_hint="--projector"
            )
        if name not in names:
            unknown.append(name)
        counts[name] = int(text)
    if unknown:
        raise click.BadParameter(
            f"no projector or policy named {', '.join(sorted(set(unknown)))} in this app"
            f" (it has {', '.join(names)})",
            param_hint="--only/--projector",
        )
    return {n: c for n, c in counts.items() if c > 0}


@click.command("run")
@app_argument
@click.option(
    "--workers",
    "-w",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Worker processes per projector and policy.",
)
@click.option(
    "--only",
    multiple=True,
    metavar="NAME",
    help="Run only this projector or policy (repeatable).",
)
@click.option(
    "--projector",
    "overrides",
    multiple=True,
    metavar="NAME=N",
    help="N workers for this projector or policy (repeatable; 0: not run).",
)
@click.option(
    "--session-timeout-ms",
    type=click.IntRange(300, 3_600_000),
    default=10_000,
    show_default=True,
    help="A worker silent this long is evicted (a worker seen to exit leaves at once).",
)
@click.option(
    "--dead-letter-unknown",
    is_flag=True,
    help="Dead-letter events newer than the code (default: wait at them for newer code).",
)
@click.option(
    "--stop-grace",
    type=click.FloatRange(0.1, 3600),
    default=30.0,
    show_default=True,
    metavar="S",
    help="On SIGTERM: seconds for every worker to stop before the rest are killed.",
)
@click.option(
    "--status",
    "show_status",
    is_flag=True,
    help="Print `eventlane project status APP` and exit.",
)
@cache_events_option
@data_option
@click.pass_context
def run(
    ctx: click.Context,
    app_spec: str,
    workers: int,
    only: tuple[str, ...],
    overrides: tuple[str, ...],
    session_timeout_ms: int,
    dead_letter_unknown: bool,
    stop_grace: float,
    show_status: bool,
    cache_events: int,
) -> None:
    """Run every projector and policy of APP (and its scheduler, named `scheduler`, when the
    app declares commands) until SIGTERM / Ctrl-C.

    Workers that crash are restarted (after a growing delay when they keep dying young); a
    worker seen to exit leaves its group at once, so its partitions move within a second.
    SIGHUP restarts the workers one at a time: each new worker has joined its group before
    the old one is stopped (a rolling deploy of new code). Watch it with `eventlane project
    status APP`.
    """
    if show_status:
        ctx.invoke(status_command, app_spec=app_spec, projection=None, as_json=False)
        return
    with _runtime(app_spec, create=True) as runtime:
        names = sorted(runtime.app.projectors)
        if runtime.app.commands:  # an app with commands may schedule them: its scheduler
            names.append(SCHEDULER)
        counts = _counts(names, workers, only, overrides)
        for name in counts:  # pending migrations: refused here, once, as a worker would
            if name == SCHEDULER:
                continue
            try:
                open_readmodel(runtime, name).close()
            except FrameworkError as exc:
                raise click.ClickException(f"{name}: {exc}") from exc
        data = runtime.log.local.root.resolve()
        env = _worker_env()
        runners = {
            name: Runner(
                app_spec,
                name,
                data,
                workers=n,
                restart=True,
                session_timeout_ms=session_timeout_ms,
                env=env,
                readmodel=runtime.readmodel_path(name),
                coordinator=runtime.group_coordinator(name),
                worker_args=worker_args(dead_letter_unknown, cache_events),
            )
            for name, n in counts.items()
            if name != SCHEDULER
        }
        if SCHEDULER in counts:
            runners[SCHEDULER] = Runner(
                app_spec,
                SCHEDULER,
                data,
                workers=counts[SCHEDULER],
                restart=True,
                session_timeout_ms=session_timeout_ms,
                env=env,
                coordinator=runtime.group_coordinator(),
                argv=(
                    "schedules",
                    "run",
                    app_spec,
                    "--session-timeout-ms",
                    str(session_timeout_ms),
                ),
            )
        stderr_console().print(
            f"run: data {data}"
            + (f", log {env['EVENTLANE_LOG']}" if env.get("EVENTLANE_LOG") else "")
            + ", "
            + ", ".join(f"{name} x{n}" for name, n in counts.items()),
            soft_wrap=True,
        )
        supervisor = AppSupervisor(runners, stop_grace=stop_grace)
        try:
            supervisor.run()
        finally:
            for runner in runners.values():
                if runner.coordinator is not None:
                    runner.coordinator.close()
    if supervisor.failures and not any(r.active for r in runners.values()):
        raise click.ClickException(
            "no worker left: "
            + "; ".join(f"{name}: {why}" for name, why in supervisor.failures.items())
        )
