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

from importlib.metadata import entry_points
from pathlib import Path

import click
import structlog

from framework.cli.context import app, data_option
from framework.log import Log

__all__ = ["add_plugins", "data_dir", "data_option", "open_log"]

log = structlog.get_logger("eventlane.cli")


def data_dir() -> Path:
    """The data directory of the running command (``--data``, ``$EVENTLANE_DATA`` …)."""
    return app().data


def open_log(*, create: bool = False) -> Log:
    """The log in :func:`data_dir` (``create=False`` refuses a directory that holds none)."""
    return app().open_log(create=create)


def add_plugins(group: click.Group, entry_point_group: str) -> None:
    """Register every command declared under ``entry_point_group`` on ``group``."""
    for ep in entry_points(group=entry_point_group):
        try:
            command = ep.load()
        except Exception as exc:  # a broken plugin must not break the whole CLI
            log.warning("cannot load eventlane plugin", entry_point=ep.value, error=str(exc))
            continue
        if isinstance(command, click.Command):
            group.add_command(command, ep.name)
