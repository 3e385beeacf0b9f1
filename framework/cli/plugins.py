"""Commands contributed by installed applications, through entry points.

An application adds ``eventlane`` subcommands by declaring click commands under the entry
point group ``eventlane.commands`` (top level) or ``eventlane.demos`` (under
``eventlane demo``) in its packaging metadata, e.g. in ``pyproject.toml``::

    [project.entry-points."eventlane.commands"]
    invoicing = "example_apps.invoicing.cli:invoicing"

This keeps the dependency direction: the framework never imports an application.
"""

from __future__ import annotations

from importlib.metadata import entry_points

import click
import structlog

log = structlog.get_logger("eventlane.cli")


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
