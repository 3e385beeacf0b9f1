"""Commands contributed by installed applications, through entry points.

An application adds ``eventlane`` subcommands by declaring click commands under the entry
point group ``eventlane.commands`` (top level) or ``eventlane.demos`` (under
``eventlane demo``) in its packaging metadata, e.g. in ``pyproject.toml``::

    [project.entry-points."eventlane.commands"]
    invoicing = "example_apps.invoicing.cli:invoicing"

This keeps the dependency direction: the framework never imports an application. The
plugin API (what a contributed command may use): :func:`data_option` (``--data DIR`` on the
command), :func:`data_dir` (the data directory chosen) and :func:`open_log` (the log in it).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from framework.cli.context import app, data_option
from framework.log import Log
from framework.observability import get_logger

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = ["add_plugins", "data_dir", "data_option", "open_log"]

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


def add_plugins(group: click.Group, entry_point_group: str) -> None:
    """Register every command declared under ``entry_point_group`` on ``group``."""
    for ep in plugin_points(entry_point_group).values():
        command = load_plugin(ep)
        if command is not None:
            group.add_command(command, ep.name)
