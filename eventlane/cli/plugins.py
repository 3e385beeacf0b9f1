"""Commands contributed by installed applications, through entry points.

An application adds ``eventlane`` subcommands by declaring click commands under the entry
point group ``eventlane.commands`` (top level) or ``eventlane.demos`` (under
``eventlane demo``) in its packaging metadata, e.g. in ``pyproject.toml``::

    [project.entry-points."eventlane.commands"]
    invoicing = "example_apps.invoicing.cli:invoicing"

This keeps the dependency direction: the framework never imports an application, and a
plugin is imported only when its command runs (or its own ``--help`` is asked for): a group's
``--help`` lists plugins from their entry-point metadata (:class:`LazyGroup`). The
plugin API (what a contributed command may use): :func:`data_option` (``--data DIR`` on the
command), :func:`data_dir` (the data directory chosen) and :func:`open_log` (the log in it).
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from eventlane.cli.context import app, data_option
from eventlane.log import Log
from eventlane.observability import get_logger

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = ["LazyGroup", "data_dir", "data_option", "open_log"]

log = get_logger("eventlane.cli")


def data_dir() -> Path:
    """The data directory of the running command (``--data``, ``$EVENTLANE_DATA`` …)."""
    return app().data


def open_log(*, create: bool = False) -> Log:
    """The log in :func:`data_dir` (``create=False`` refuses a directory that holds none)."""
    return app().open_log(create=create)


def plugin_points(entry_point_group: str) -> dict[str, EntryPoint]:
    """The entry points declared under ``entry_point_group``, by command name."""
    from importlib.metadata import entry_points  # noqa: PLC0415 - slow: only when looked up

    return {ep.name: ep for ep in entry_points(group=entry_point_group)}


def load_plugin(ep: EntryPoint | None) -> click.Command | None:
    """The click command ``ep`` declares; ``None`` (with a warning) when it cannot be loaded."""
    if ep is None:
        return None
    try:
        command = ep.load()
    except Exception as exc:  # a broken plugin must not break the whole CLI
        log.warning("cannot load eventlane plugin", entry_point=ep.value, error=str(exc))
        return None
    return command if isinstance(command, click.Command) else None


def plugin_summary(ep: EntryPoint) -> str:
    """What ``--help`` says of a plugin it has not imported: where it comes from."""
    where = ep.value.partition(":")[0]
    return f"From {ep.dist.name} ({where})." if ep.dist is not None else f"From {where}."


class LazyGroup(click.Group):
    """A group whose subcommands are imported when first looked up, and not to list them.

    ``lazy`` maps a name to ``("module:attribute", summary)``; ``plugins`` names the entry
    point group whose commands are added beside them (a built-in name wins over a plugin's).
    Invariant: listing the commands (``--help``) imports none of them; a command not yet
    imported is described by its ``summary`` (a built-in's, checked against its docstring by
    ``tests/cli/test_cli_startup.py``) or by its entry point's metadata (a plugin's).
    """

    def __init__(
        self,
        *args: Any,
        lazy: dict[str, tuple[str, str]] | None = None,
        plugins: str = "",
        **kwargs: Any,
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
            module, _, attr = self.lazy[cmd_name][0].partition(":")
            command = getattr(import_module(module), attr)
        else:
            command = load_plugin(self._plugin_points().get(cmd_name))
        if not isinstance(command, click.Command):
            return None
        self.add_command(command, cmd_name)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's command list, from summaries and metadata for what is not imported yet."""
        points = self._plugin_points()
        rows: list[tuple[str, click.Command]] = []
        for name in self.list_commands(ctx):
            command = super().get_command(ctx, name)
            if command is None:
                summary = self.lazy[name][1] if name in self.lazy else plugin_summary(points[name])
                command = click.Command(name, help=summary)
            if not command.hidden:
                rows.append((name, command))
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section("Commands"):
                formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in rows])
