"""The ``eventlane`` command line: admin, produce/consume and maintenance of the log.

The CLI is the top layer: it may import every layer and nothing imports it. Each subcommand
module defines a click command or group and is registered here with one
``main.add_command(...)`` line.

Error contract: every :class:`~framework.errors.FrameworkError` (and an ``OSError`` such as a
permission problem; any other exception too, named by its type) reaching the root is printed as
one ``Error: ...`` line on standard error, naming what was wrong (topic, partition, offset,
file, position), with exit status 1 and no traceback (set ``EVENTLANE_LOG_LEVEL=debug`` to get
the traceback). A bad argument caught while parsing exits with status 2, click's usage error.
Logging is configured once at start (:func:`framework.observability.configure_logging`;
warnings and above by default), on standard error, so standard output carries only the
command's result.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import click

from framework.cli.context import DATA_HELP, AppContext
from framework.cli.demo import demo
from framework.cli.groups import groups
from framework.cli.maintenance import cleanup, compact, dump, verify
from framework.cli.plugins import add_plugins
from framework.cli.project import dlq, migrate, project
from framework.cli.rebuild import rebuild_command
from framework.cli.records import consume, produce
from framework.cli.serve import serve
from framework.cli.topics import topics
from framework.errors import FrameworkError
from framework.log.store import DEFAULT_DATA_DIR
from framework.observability import configure_logging, log_level_name

__all__ = ["main"]


READ_ONLY_HINT = (
    " (this command must write to the data directory; on a read-only one, these work:"
    " topics list/describe, consume without --group, dump, verify, project status,"
    " dlq list/show)"
)


class _RootGroup(click.Group):
    """The root group: turns framework errors into a clean message and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except FrameworkError as err:
            if log_level_name() == "debug":
                raise
            raise click.ClickException(str(err)) from None
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


@click.group(cls=_RootGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--data",
    type=click.Path(path_type=Path),
    envvar="EVENTLANE_DATA",
    default=DEFAULT_DATA_DIR,
    metavar="DIR",
    help=DATA_HELP,
)
@click.version_option(package_name="eventlane", prog_name="eventlane")
@click.pass_context
def main(ctx: click.Context, data: Path) -> None:
    """eventlane: an embedded, partitioned, append-only log with Kafka's semantics.

    Topics are split into partitions; records are appended with a key (which picks the
    partition exactly as Kafka does), read back by offset, retained by time or size, and
    compacted by key. Consumer groups and projectors run on top. See docs/cli.md for every
    command with examples.
    """
    try:
        configure_logging()
    except FrameworkError as err:
        raise click.ClickException(str(err)) from None
    state = AppContext(data)
    ctx.obj = state
    ctx.call_on_close(state.close)


# One line per subcommand module.

main.add_command(topics)
main.add_command(produce)
main.add_command(consume)
main.add_command(groups)
main.add_command(compact)
main.add_command(cleanup)
main.add_command(dump)
main.add_command(verify)
main.add_command(demo)
main.add_command(project)
main.add_command(migrate)
main.add_command(dlq)
main.add_command(rebuild_command)
main.add_command(serve)
add_plugins(main, "eventlane.commands")
add_plugins(demo, "eventlane.demos")
