"""The ``eventlane`` command line: admin, produce/consume and maintenance of the log.

The CLI is the top layer: it may import every layer and nothing imports it. Each subcommand
module defines a click command or group and is registered here with one entry of
:data:`COMMANDS` (``name: ("module:attribute", summary)``). Subcommand modules, and commands
contributed by installed applications (entry points, see :mod:`eventlane.cli.plugins`), are imported
only when the command line names them (``--help`` lists them from :data:`COMMANDS`' summaries
and the entry points' metadata), so ``eventlane topics list``
never pays for Spark, sqlite-utils or the projection runtime.

Error contract: every :class:`~eventlane.errors.FrameworkError` (and an ``OSError`` such as a
permission problem; any other exception too, named by its type) reaching the root is printed as
one ``Error: ...`` line on standard error, naming what was wrong (topic, partition, offset,
file, position), with exit status 1 and no traceback (set ``EVENTLANE_LOG_LEVEL=debug`` to get
the traceback). Where a retry can help, or a write's outcome is unknown, the line ends with
what to do, e.g. ``[retriable: nothing was written; retry once the log is available]`` or
``[indeterminate: outcome unknown: ...]`` (:meth:`~eventlane.errors.FrameworkError.advice`).
A bad argument caught while parsing exits with status 2, click's usage error.
Logging is configured once at start (:func:`eventlane.observability.configure_logging`;
warnings and above by default; ``--log-level``, ``--log-format``), on standard error, so
standard output carries only the command's result; worker processes get the same settings.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import click

from eventlane.cli.context import DATA_HELP, LOG_HELP, AppContext
from eventlane.cli.plugins import LazyGroup
from eventlane.engine import DEFAULT_DATA_DIR
from eventlane.errors import FrameworkError
from eventlane.observability import LEVELS, configure_logging, log_level_name
from eventlane.tracing import configure_from_env as configure_tracing

__all__ = ["COMMANDS", "main"]

COMMANDS: dict[str, tuple[str, str]] = {
    "topics": (
        "eventlane.cli.topics:topics",
        "Create, list, describe, alter and delete topics.",
    ),
    "produce": (
        "eventlane.cli.records:produce",
        "Append one record per line of standard input to TOPIC.",
    ),
    "consume": (
        "eventlane.cli.records:consume",
        "Print TOPIC's records as JSON lines (with --group: as a consumer-group member).",
    ),
    "groups": (
        "eventlane.cli.groups:groups",
        "List, describe, reset and delete consumer groups.",
    ),
    "compact": (
        "eventlane.cli.maintenance:compact",
        "Compact TOPIC: keep the last record of every key, offsets unchanged.",
    ),
    "cleanup": (
        "eventlane.cli.maintenance:cleanup",
        "Apply TOPIC's retention: delete old segments, advancing the low-water mark.",
    ),
    "dump": (
        "eventlane.cli.maintenance:dump",
        "Print the batches and records of segment FILE (or the entries of a .index/.timeindex).",
    ),
    "verify": (
        "eventlane.cli.maintenance:verify",
        "Check the CRC and framing of every batch of TOPIC (default: every topic), then the"
        " event store's key indexes against the log (--repair rebuilds those that differ),"
        " and the read models in the PostgreSQL database --readmodels names.",
    ),
    "demo": (
        "eventlane.cli.demo:demo",
        "Guided walkthroughs.",
    ),
    "run": (
        "eventlane.cli.run:run",
        "Run every projector and policy of APP (and its scheduler, named `scheduler`, when"
        " the app declares commands) until SIGTERM / Ctrl-C.",
    ),
    "project": (
        "eventlane.cli.project:project",
        "Run projectors as consumer-group workers and watch their lag.",
    ),
    "migrate": (
        "eventlane.cli.project:migrate",
        "Apply the pending read-model migrations of every projector; list what was applied.",
    ),
    "dlq": (
        "eventlane.cli.project:dlq",
        "Inspect and retry a projector's dead letters (events its handlers could not apply).",
    ),
    "rebuild": (
        "eventlane.cli.rebuild:rebuild_command",
        "Rebuild projection NAME of APP from the log's low-water marks.",
    ),
    "forget": (
        "eventlane.cli.forget:forget",
        "Forget SUBJECT... of APP: destroy their keys so their personal data is unreadable.",
    ),
    "console": (
        "eventlane.cli.console:console",
        "Serve the web console for the log (and APP's aggregates, projectors and codec).",
    ),
    "cluster": (
        "eventlane.cli.cluster:cluster",
        "A local JetStream cluster (loopback unless --host) to run eventlane on with --log nats://...",
    ),
    "migrate-log": (
        "eventlane.cli.cluster:migrate_log",
        "Copy the log in --data (or --log) to the JetStream or Kafka cluster at URL, then verify.",
    ),
    "kafka": (
        "eventlane.cli.kafka_cluster:kafka",
        "A local Apache Kafka cluster (KRaft, loopback unless --host) for --log kafka://...",
    ),
    "serve": (
        "eventlane.cli.serve:serve",
        "Serve the Kafka protocol for the data directory until interrupted.",
    ),
    "schedules": (
        "eventlane.cli.schedules:schedules",
        "An app's scheduled commands (deadlines): list them, run the scheduler.",
    ),
}
"""Every built-in subcommand: its name, where it is defined (imported on first use) and the
summary ``--help`` lists it with (its docstring's first sentence, checked by a test)."""

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


class _RootGroup(LazyGroup):
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
    plugins="eventlane.commands",
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
    configure_tracing()  # only with EVENTLANE_TRACES_FILE (eventlane.tracing)
    state = AppContext(data, log_url or None)
    ctx.obj = state
    ctx.call_on_close(state.close)
