"""The ``eventlane`` command line: admin, produce/consume and maintenance of the log.

The CLI is the top layer: it may import every layer and nothing imports it. Each subcommand
module defines a click command or group and is registered here with one line of
:data:`COMMANDS` (``name: "module:attribute"``). Subcommand modules, and commands contributed
by installed applications (entry points, see :mod:`framework.cli.plugins`), are imported
only when the command line names them (or ``--help`` lists them), so ``eventlane topics list``
never pays for Spark, sqlite-utils or the projection runtime.

Error contract: every :class:`~framework.errors.FrameworkError` (and an ``OSError`` such as a
permission problem; any other exception too, named by its type) reaching the root is printed as
one ``Error: ...`` line on standard error, naming what was wrong (topic, partition, offset,
file, position), with exit status 1 and no traceback (set ``EVENTLANE_LOG_LEVEL=debug`` to get
the traceback). Where a retry can help, or a write's outcome is unknown, the line ends with
what to do, e.g. ``[retriable: nothing was written; retry once the log is available]`` or
``[indeterminate: outcome unknown: ...]`` (:meth:`~framework.errors.FrameworkError.advice`).
A bad argument caught while parsing exits with status 2, click's usage error.
Logging is configured once at start (:func:`framework.observability.configure_logging`;
warnings and above by default; ``--log-level``, ``--log-format``), on standard error, so
standard output carries only the command's result; worker processes get the same settings.
"""

from __future__ import annotations

import errno
import os
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from framework.cli.context import DATA_HELP, LOG_HELP, AppContext
from framework.cli.plugins import add_plugins, load_plugin, plugin_points
from framework.engine import DEFAULT_DATA_DIR
from framework.errors import FrameworkError
from framework.observability import LEVELS, configure_logging, log_level_name
from framework.tracing import configure_from_env as configure_tracing

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = ["COMMANDS", "main"]

COMMANDS: dict[str, str] = {
    "topics": "framework.cli.topics:topics",
    "produce": "framework.cli.records:produce",
    "consume": "framework.cli.records:consume",
    "groups": "framework.cli.groups:groups",
    "compact": "framework.cli.maintenance:compact",
    "cleanup": "framework.cli.maintenance:cleanup",
    "dump": "framework.cli.maintenance:dump",
    "verify": "framework.cli.maintenance:verify",
    "demo": "framework.cli.demo:demo",
    "run": "framework.cli.run:run",
    "project": "framework.cli.project:project",
    "migrate": "framework.cli.project:migrate",
    "dlq": "framework.cli.project:dlq",
    "rebuild": "framework.cli.rebuild:rebuild_command",
    "forget": "framework.cli.forget:forget",
    "console": "framework.cli.console:console",
    "cluster": "framework.cli.cluster:cluster",
    "migrate-log": "framework.cli.cluster:migrate_log",
    "kafka": "framework.cli.kafka_cluster:kafka",
    "serve": "framework.cli.serve:serve",
    "schedules": "framework.cli.schedules:schedules",
}
"""Every built-in subcommand: its name and where it is defined (imported on first use)."""

_PLUGIN_GROUPS = {"": "eventlane.commands", "demo": "eventlane.demos"}
"""Entry point group of the commands installed applications add, per (sub)group path."""


class _LazyGroup(click.Group):
    """A group whose subcommands are imported when first looked up.

    ``lazy`` maps a name to ``"module:attribute"``; ``plugins`` names the entry point group
    whose commands are added beside them (a built-in name wins over a plugin's).
    """

    def __init__(
        self, *args: Any, lazy: dict[str, str] | None = None, plugins: str = "", **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})
        self.plugins = plugins

    def _plugin_points(self) -> dict[str, EntryPoint]:
        return plugin_points(self.plugins) if self.plugins else {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = set(super().list_commands(ctx)) | set(self.lazy)
        return sorted(names | set(self._plugin_points()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        if cmd_name in self.lazy:
            module, _, attr = self.lazy[cmd_name].partition(":")
            command = getattr(import_module(module), attr)
            plugins = _PLUGIN_GROUPS.get(cmd_name, "")
            if plugins and isinstance(command, click.Group):
                add_plugins(command, plugins)
        else:
            command = load_plugin(self._plugin_points().get(cmd_name))
        if not isinstance(command, click.Command):
            return None
        self.add_command(command, cmd_name)
        return command


READ_ONLY_HINT = (
    " (this command must write to the data directory; on a read-only one, these work:"
    " topics list/describe, consume without --group, dump, verify, project status,"
    " dlq list/show)"
)


def error_message(err: FrameworkError) -> str:
    """The one line the CLI prints for ``err``: its message, then what to do next where a
    retry can help or the outcome is unknown (:meth:`FrameworkError.advice`)."""
    advice = err.advice()
    return f"{err} [{err.kind.value}: {advice}]" if advice else str(err)


class _RootGroup(_LazyGroup):
    """The root group: turns framework errors into a clean message and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except FrameworkError as err:
            if log_level_name() == "debug":
                raise
            raise click.ClickException(error_message(err)) from None
        except BrokenPipeError:
            raise  # handled by the command that writes (consumers piped into `head`)
        except OSError as err:
            if log_level_name() == "debug":
                raise
            where = f": {err.filename}" if err.filename else ""
            hint = READ_ONLY_HINT if err.errno == errno.EROFS else ""
            raise click.ClickException(f"{err.strerror or err}{where}{hint}") from None
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as err:  # a bug or a library's error: still one line, status 1
            if log_level_name() == "debug":
                raise
            data = ctx.obj.data if isinstance(ctx.obj, AppContext) else None
            if data is not None and data.is_dir() and not os.access(data, os.W_OK):
                raise click.ClickException(f"{type(err).__name__}: {err}{READ_ONLY_HINT}") from None
            raise click.ClickException(
                f"{type(err).__name__}: {err} (EVENTLANE_LOG_LEVEL=debug shows the traceback)"
            ) from None


@click.group(
    cls=_RootGroup,
    lazy=COMMANDS,
    plugins=_PLUGIN_GROUPS[""],
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option(
    "--data",
    type=click.Path(path_type=Path),
    envvar="EVENTLANE_DATA",
    default=DEFAULT_DATA_DIR,
    metavar="DIR",
    help=DATA_HELP,
)
@click.option("--log", "log_url", envvar="EVENTLANE_LOG", metavar="URL", help=LOG_HELP)
@click.option(
    "--log-level",
    type=click.Choice(list(LEVELS), case_sensitive=False),
    help="Diagnostics on standard error from this level up (default: $EVENTLANE_LOG_LEVEL,"
    " else warning).",
)
@click.option(
    "--log-format",
    type=click.Choice(["console", "json"], case_sensitive=False),
    help="Diagnostics as aligned text or JSON lines (default: $EVENTLANE_LOG_FORMAT, else"
    " console).",
)
@click.version_option(package_name="eventlane", prog_name="eventlane")
@click.pass_context
def main(
    ctx: click.Context,
    data: Path,
    log_url: str | None,
    log_level: str | None,
    log_format: str | None,
) -> None:
    """eventlane: an embedded, partitioned, append-only log with Kafka's semantics.

    Topics are split into partitions; records are appended with a key (which picks the
    partition exactly as Kafka does), read back by offset, retained by time or size, and
    compacted by key. Consumer groups and projectors run on top. See docs/cli.md for every
    command with examples.
    """
    try:
        configure_logging(log_level, None if log_format is None else log_format.lower() == "json")
    except FrameworkError as err:
        raise click.ClickException(str(err)) from None
    configure_tracing()  # only with EVENTLANE_TRACES_FILE (framework.tracing)
    state = AppContext(data, log_url or None)
    ctx.obj = state
    ctx.call_on_close(state.close)
